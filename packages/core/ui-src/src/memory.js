// A job's Memory page: what the trace engine computes from the allocator events of the
// detailed traces (per-rank peaks, a timeline per rank and device with the step starts, what
// was live at the highest peak, per-step peaks, growth, allocating operators).
import { el, exposeChart, fmt } from './api.js';
import { lineChart } from './charts.js';
import { section, tableCard as pageTableCard, tracePage } from './job.js';

const tableCard = (title, id, t) => pageTableCard('memory', title, id, t);

export async function memoryView(root, job) {
  const opened = await tracePage(root, job, 'memory', 'Memory');
  if (!opened) return;
  const [m, wrap] = opened;
  wrap.append(tableCard('Peak memory per rank and device (MiB; the highest profiled step)', 'ranks', m.ranks));
  for (const [rank, line] of Object.entries(m.timelines)) {
    for (const [device, d] of Object.entries(line.devices)) {
      const box = el('div', { class: 'chart' });
      const series = { 'allocated (MiB)': d.allocated };
      if (d.reserved.some((v) => v > 0)) series['reserved (MiB)'] = d.reserved;
      wrap.append(section(`Memory over time: ${rank}, ${device}`, `memory-timeline-${rank.replace(' ', '')}-${device.replace(':', '')}`, box,
        el('p', { class: 'muted' }, `${d.t.length} points; dashed lines: starts of steps ${line.steps.join(', ')}`)));
      lineChart(box, `memory:${rank}:${device}`, { x: d.t, series, xLabel: 'seconds into the window', yLabel: 'MiB', marks: line.step_starts });
      exposeChart(`memory:${rank}:${device}`, { ...d, step_starts: line.step_starts, steps: line.steps });
    }
  }
  const p = m.peak;
  wrap.append(tableCard(`Live at the highest peak: rank ${p.rank}, ${p.device}, step ${p.step} (${fmt.num(p.allocated / 1048576)} MiB), by operator`, 'peak', p.live));
  for (const [name, t] of Object.entries(m.tables)) wrap.append(tableCard(name, name.split(' ')[0].toLowerCase(), t));
}

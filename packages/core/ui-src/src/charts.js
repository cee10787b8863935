// Drawing only: every number arrives computed from the server.
import uPlot from 'uplot';
import { el, exposeChart } from './api.js';

const PALETTE = ['#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2', '#ca8a04', '#db2777', '#4b5563', '#65a30d'];
export const color = (i) => PALETTE[i % PALETTE.length];

function width(container) { return Math.max(320, (container.clientWidth || 640) - 8); }

// Cards reflow as more are added to the grid: follow the container's width.
function follow(container, chart, height) {
  let last = width(container);
  new ResizeObserver(() => {
    const next = width(container);
    if (Math.abs(next - last) > 2) { last = next; chart.setSize({ width: next, height }); }
  }).observe(container);
  return chart;
}

// Wall-clock ticks as HH:MM:SS (UTC), spaced so that two labels never touch; with ticks
// under a second apart (a job with two samples half a second apart) the tenths, hundredths
// or milliseconds that tell them apart, not six labels reading the same second.
function clockTicks(u, splits) {
  let step = Infinity;
  for (let i = 1; i < splits.length; i++) if (splits[i] !== null && splits[i - 1] !== null) step = Math.min(step, Math.abs(splits[i] - splits[i - 1]));
  const decimals = step >= 0.999 ? 0 : step >= 0.0999 ? 1 : step >= 0.00999 ? 2 : 3;  // (splits carry float error: 0.0999...)
  return splits.map((v) => (v === null ? '' : new Date(v * 1000).toISOString().slice(11, decimals ? 20 + decimals : 19)));
}

// Steps are whole numbers: no tick at step 1.5.
const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7];

// Log-axis ticks that stay readable across decades (uPlot's default rounds 1e-5 to "0").
const logTicks = (u, splits) => splits.map((v) => (v === null || v === undefined ? '' : v >= 1e4 || v < 1e-2 ? v.toExponential(0) : String(Number(v.toPrecision(3)))));

// Values on a log axis: zeros, negatives and denormals are not drawn (counted instead).
const TINY = 1.1754943508222875e-38;
export function forLog(values) {
  let dropped = 0;
  const out = values.map((v) => { if (v === null || v === undefined || !Number.isFinite(v)) return null; if (v <= TINY) { dropped += 1; return null; } return v; });
  return { values: out, dropped };
}

// Whether positive values span more than two decades (then a log axis reads better).
export function spansDecades(values) {
  const pos = values.filter((v) => v !== null && Number.isFinite(v) && v > TINY);
  return pos.length >= 2 && Math.max(...pos) / Math.min(...pos) > 100;
}

// At most n series named in a legend: every `keep` one (the tensors a rule flagged), then the
// largest by their maximum; the rest are still drawn, thin and grey, without a legend entry.
export function topSeries(series, n, keep = []) {
  const names = Object.keys(series);
  if (names.length <= n) return { named: names, caption: '' };
  const score = (vs) => Math.max(-Infinity, ...vs.filter((v) => v !== null && Number.isFinite(v)));
  const forced = names.filter((k) => keep.includes(k));
  const ranked = names.filter((k) => !forced.includes(k)).sort((a, b) => score(series[b]) - score(series[a]));
  const chosen = new Set([...forced, ...ranked.slice(0, Math.max(0, n - forced.length))]);
  return { named: names.filter((k) => chosen.has(k)), caption: `legend: top ${chosen.size} of ${names.length} by max` + (forced.length ? `, with the ${forced.length} a rule flagged` : '') };
}

export function lineChart(container, id, { x, series, xLabel = '', yLabel = '', xTime = false, points = null, logY = false, height = 220, named = null, marks = [] }) {
  const names = Object.keys(series);
  // What the chart shows, for tests: its data, and once drawn its x range and time ticks.
  const exposed = { x, series, points, logY, named };
  exposeChart(id, exposed);
  const data = [x, ...names.map((n) => series[n])];
  const shown = named ? new Set(named) : null;
  let colour = 0;
  const line = (n) => {
    if (shown && !shown.has(n)) return { label: n, stroke: '#cbd5e1', width: 0.75, spanGaps: true, points: { show: false }, class: 'unnamed' };
    return { label: n, stroke: color(colour++), width: 1.5, spanGaps: true, points: { show: x.length < 60, size: x.length === 1 ? 9 : 5 } };
  };
  const opts = {
    width: width(container), height,
    scales: { x: { time: xTime }, y: logY ? { distr: 3 } : {} },
    axes: [xTime ? { label: xLabel || 'time (UTC)', space: 90, values: (u, splits) => (exposed.xTicks = clockTicks(u, splits)) } : x.every(Number.isInteger) ? { label: xLabel, incrs: STEP_INCRS } : { label: xLabel }, logY ? { label: yLabel, size: 60, values: logTicks } : { label: yLabel, size: 60 }],
    series: [{ label: xLabel || (xTime ? 'time' : 'x'), value: xTime ? (u, v) => (v === null ? '-' : new Date(v * 1000).toISOString().slice(11, 23)) : undefined }, ...names.map(line)],
  };
  // One sample: a point in the middle, not an empty axis. (The range is built from the one
  // value: for a time scale uPlot passes a max 8.64e7 s past it, and the axis spanned years
  // with the point at its left edge and every tick at midnight.)
  if (x.length === 1) opts.scales.x = { time: xTime, range: (u, lo) => [lo - 1, lo + 1] };
  // Room on the right for the last time tick, centred on the plot's edge (HH:MM:SS.ss).
  if (xTime) opts.padding = [null, 40, null, null];
  opts.hooks = { ready: [(u) => { exposed.xRange = [u.scales.x.min, u.scales.x.max]; }] };
  // Vertical dashed lines at the x values of `marks` (step starts, say).
  if (marks.length) opts.hooks.draw = [(u) => drawMarks(u, marks)];
  if (points) {
    data.push(points.y);
    opts.series.push({ label: points.label, stroke: '#dc2626', fill: '#dc2626', width: 0, paths: () => null, points: { show: true, size: 8, fill: '#dc2626' } });
  }
  const chart = follow(container, new uPlot(opts, data, container), height);
  if (shown) {  // the legend names only the top series: hide the others' entries
    chart.root.querySelectorAll('.u-legend .u-series').forEach((row, i) => { if (i > 0 && i <= names.length && !shown.has(names[i - 1])) row.style.display = 'none'; });
  }
  return chart;
}

function drawMarks(u, marks) {
  const { ctx } = u;
  const { top, height } = u.bbox;
  ctx.save();
  ctx.strokeStyle = '#9ca3af';
  ctx.setLineDash([4, 4]);
  ctx.lineWidth = 1;
  for (const x of marks) {
    const px = Math.round(u.valToPos(x, 'x', true));
    ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, top + height); ctx.stroke();
  }
  ctx.restore();
}

export function barChart(container, id, { edges, counts, xLabel = '', height = 200, apart = [] }) {
  exposeChart(id, { edges, counts, apart });
  if (!counts.length) { container.append(el('p', { class: 'muted' }, 'no data')); return null; }
  const centers = counts.map((_, i) => (edges[i] + edges[i + 1]) / 2);
  const opts = {
    width: width(container), height,
    scales: { x: { time: false, range: [edges[0], edges[edges.length - 1]] } },
    axes: [{ label: xLabel }, { label: 'count' }],
    series: [{ label: xLabel }, { label: 'count', fill: 'rgba(37,99,235,0.5)', stroke: '#2563eb', paths: uPlot.paths.bars({ size: [0.9, Infinity] }), points: { show: false } }],
  };
  return follow(container, new uPlot(opts, [centers, counts], container), height);
}

export function pieChart(container, id, shares, { title = '' } = {}) {
  const entries = Object.entries(shares).filter(([, v]) => v > 0);
  exposeChart(id, shares);
  const total = entries.reduce((a, [, v]) => a + v, 0);
  if (!total) { container.append(el('p', { class: 'muted' }, 'no data')); return; }
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('viewBox', '-1.1 -1.1 2.2 2.2');
  svg.setAttribute('class', 'pie');
  let angle = -Math.PI / 2;
  const legend = el('ul', { class: 'legend' });
  entries.forEach(([name, value], i) => {
    const frac = value / total;
    const next = angle + frac * 2 * Math.PI;
    const path = document.createElementNS(ns, frac >= 0.9999 ? 'circle' : 'path');
    if (frac >= 0.9999) { path.setAttribute('r', '1'); }
    else {
      const large = frac > 0.5 ? 1 : 0;
      path.setAttribute('d', `M0 0 L${Math.cos(angle)} ${Math.sin(angle)} A1 1 0 ${large} 1 ${Math.cos(next)} ${Math.sin(next)} Z`);
    }
    path.setAttribute('fill', color(i));
    const tip = document.createElementNS(ns, 'title');
    tip.textContent = `${name}: ${(100 * frac).toFixed(1)} %`;
    path.append(tip);
    svg.append(path);
    legend.append(el('li', { 'data-name': name, 'data-value': value }, el('span', { class: 'swatch', style: `background:${color(i)}` }), `${name} ${(100 * frac).toFixed(1)} %`));
    angle = next;
  });
  container.append(el('div', { class: 'pie-wrap', title }, svg, legend));
}

// A heatmap on a canvas: rows x columns of values, colour on a log scale when asked.
// Beyond HEATMAP_ROWS rows the labels would overlap: rows are merged per module (the name
// without its last part, "layer3.0.conv1.weight" -> "layer3.0.conv1"... up a level until
// they fit), each cell the largest of its members, and the note says so.
const HEATMAP_ROWS = 30;
function byModule(rows, values) {
  for (let cut = 1; cut < 8; cut++) {
    const groups = new Map();
    rows.forEach((name, r) => { const parts = name.split(/[./]/); const key = parts.slice(0, Math.max(1, parts.length - cut)).join('.'); (groups.get(key) || groups.set(key, []).get(key)).push(r); });
    if (groups.size <= HEATMAP_ROWS || cut === 7) {
      const names = [...groups.keys()];
      return { rows: names.map((k) => `${k} (${groups.get(k).length})`), values: names.map((k) => values[0].map((_, c) => {
        const vs = groups.get(k).map((r) => values[r][c]).filter((v) => v !== null);
        return vs.length ? Math.max(...vs) : null;
      })) };
    }
  }
  return { rows, values };
}

export function heatmap(container, id, { rows, columns, values, log = true }) {
  exposeChart(id, { rows, columns, values });
  if (!rows.length || !columns.length) { container.append(el('p', { class: 'muted' }, 'no data')); return; }
  let merged = null;
  if (rows.length > HEATMAP_ROWS) { const total = rows.length; ({ rows, values } = byModule(rows, values)); merged = `${total} tensors merged into ${rows.length} rows by module (each cell: the largest of the module's tensors)`; }
  Object.assign(window.stepscope.charts[id], { drawnRows: rows, drawnValues: values });
  const flat = values.flat().filter((v) => v !== null && (log ? v > 0 : true));
  const tr = (v) => (log ? Math.log10(v) : v);
  const lo = Math.min(...flat.map(tr)), hi = Math.max(...flat.map(tr));
  const labelW = 220, cellH = Math.max(13, Math.min(18, 360 / rows.length));
  const canvas = el('canvas', { class: 'heatmap' });
  const w = width(container), h = rows.length * cellH + 24;
  canvas.width = w; canvas.height = h;
  const ctx = canvas.getContext('2d');
  const cellW = (w - labelW) / columns.length;
  ctx.font = '11px sans-serif';
  rows.forEach((name, r) => {
    ctx.fillStyle = '#111';
    ctx.fillText(name.length > 34 ? '…' + name.slice(-33) : name, 2, r * cellH + cellH * 0.75);
    values[r].forEach((v, c) => {
      if (v === null || (log && !(v > 0))) { ctx.fillStyle = '#eee'; }
      else {
        const t = hi > lo ? (tr(v) - lo) / (hi - lo) : 0.5;
        ctx.fillStyle = `hsl(${240 - 240 * t}, 80%, ${35 + 20 * t}%)`;
      }
      ctx.fillRect(labelW + c * cellW, r * cellH, Math.ceil(cellW), cellH - 1);
    });
  });
  ctx.fillStyle = '#333';
  ctx.fillText(`step ${columns[0]}`, labelW, h - 6);
  ctx.fillText(`step ${columns[columns.length - 1]}`, w - 70, h - 6);
  canvas.addEventListener('mousemove', (ev) => {
    const c = Math.floor((ev.offsetX - labelW) / cellW), r = Math.floor(ev.offsetY / cellH);
    canvas.title = c >= 0 && r >= 0 && r < rows.length && c < columns.length ? `${rows[r]} @ step ${columns[c]}: ${values[r][c]}` : '';
  });
  const shown = (v) => Number(log ? 10 ** v : v).toPrecision(3);
  container.append(canvas, el('p', { class: 'muted' }, `colour: ${log ? 'log scale' : 'linear'}, blue ${shown(lo)} … red ${shown(hi)}` + (merged ? `; ${merged}` : '')));
}

// TensorBoard-style histograms over steps: one outline per step, later steps lower and darker.
export function ridgeline(container, id, { steps, edges, counts, mode = null }) {
  exposeChart(id, { steps, edges, counts, mode });
  if (!steps.length) { container.append(el('p', { class: 'muted' }, 'no values')); return; }
  const w = width(container), rowH = 14, peakH = 48;
  const h = steps.length * rowH + peakH + 24;
  const canvas = el('canvas', { class: 'ridgeline' });
  canvas.width = w; canvas.height = h;
  const ctx = canvas.getContext('2d');
  const lo = edges[0], hi = edges[edges.length - 1];
  const xOf = (v) => 60 + ((v - lo) / (hi - lo)) * (w - 80);
  const peak = Math.max(1, ...counts.flat());
  steps.forEach((step, r) => {
    const base = peakH + r * rowH;
    ctx.beginPath();
    ctx.moveTo(xOf(lo), base);
    counts[r].forEach((c, b) => ctx.lineTo(xOf((edges[b] + edges[b + 1]) / 2), base - (c / peak) * peakH));
    ctx.lineTo(xOf(hi), base);
    const t = steps.length > 1 ? r / (steps.length - 1) : 1;
    ctx.fillStyle = `hsla(20, 85%, ${75 - 35 * t}%, 0.85)`;
    ctx.strokeStyle = '#fff';
    ctx.fill(); ctx.stroke();
    if (r % Math.ceil(steps.length / 10) === 0) { ctx.fillStyle = '#333'; ctx.font = '10px sans-serif'; ctx.fillText(String(step), 2, base); }
  });
  ctx.fillStyle = '#333';
  ctx.fillText(lo.toPrecision(3), 60, h - 4);
  ctx.fillText(hi.toPrecision(3), w - 60, h - 4);
  container.append(canvas);
}

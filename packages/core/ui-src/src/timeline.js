// The timeline: a canvas drawing what the server sends for the visible range at the canvas
// width (intervals wide enough to see, the rest summed per pixel bucket by the server).
// Zoom: wheel or W/S; pan: drag or A/D; click an interval for its details.
import { api, el, fmt, jobPath } from './api.js';

const LABEL_W = 170, SLICE_H = 16, COUNTER_H = 34, GROUP_H = 18, AXIS_H = 22, BUCKET_PX = 3;

function hue(name) {
  let h = 0;
  for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) % 360;
  return h;
}

export function timelineView(root, job) {
  const base = `/api/jobs/${jobPath(job)}`;
  const canvas = el('canvas', { id: 'timeline-canvas', tabindex: '0' });
  const details = el('div', { id: 'timeline-details', class: 'details' }, el('p', { class: 'muted' }, 'click an interval for its details'));
  const rangeLabel = el('span', { id: 'timeline-range', class: 'muted' });
  const perfetto = el('a', { class: 'button', id: 'open-perfetto', download: `${job.replace(/\//g, '_')}.trace.json` }, 'Open in Perfetto (download)');
  const help = el('span', { class: 'muted' }, ' W/S zoom, A/D pan, wheel zoom, drag pan, 0 reset');
  const reset = el('button', { onclick: () => { state.t0 = null; state.t1 = null; load(); } }, 'Reset');
  root.append(el('div', { class: 'toolbar' }, reset, perfetto, rangeLabel, help), el('div', { class: 'timeline-wrap' }, canvas), details);
  const state = { t0: null, t1: null, data: null, hits: [], seq: 0, loading: false, jobStart: 0, jobEnd: 0 };
  window.stepscope.timeline = state;
  const ctx = canvas.getContext('2d');

  function plotWidth() { return Math.max(300, Math.floor((canvas.parentElement.clientWidth || 1000) - LABEL_W - 4)); }

  async function load() {
    const seq = ++state.seq;
    const params = new URLSearchParams({ width: String(plotWidth()) });
    if (state.t0 !== null) params.set('start', String(Math.round(state.t0)));
    if (state.t1 !== null) params.set('end', String(Math.round(state.t1)));
    state.loading = true;
    const data = await api(`${base}/timeline?${params}`);
    if (seq !== state.seq) return;
    state.loading = false;
    state.data = data;
    state.t0 = data.t0; state.t1 = data.t1; state.jobStart = data.job_start; state.jobEnd = data.job_end;
    state.loads = (state.loads || 0) + 1;
    rangeLabel.textContent = ` ${fmt.ms((data.t1 - data.t0) / 1e6)} visible of ${fmt.ms((data.job_end - data.job_start) / 1e6)}; ${data.events} intervals in the job`;
    perfetto.setAttribute('href', `${base}/perfetto?start=${Math.round(data.t0)}&end=${Math.round(data.t1)}`);
    draw();
  }

  function draw() {
    const data = state.data;
    if (!data) return;
    const W = plotWidth();
    let h = AXIS_H;
    let group = null;
    for (const lane of data.lanes) { if (lane.group !== group) { h += GROUP_H; group = lane.group; } h += lane.kind === 'counter' ? COUNTER_H : SLICE_H * 2 + 4; }
    canvas.width = LABEL_W + W; canvas.height = h + 4;
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.font = '11px sans-serif';
    const usPerPx = (data.t1 - data.t0) / 1e3 / W;
    const xOf = (us) => LABEL_W + us / usPerPx;
    // time axis, relative to the job start
    ctx.fillStyle = '#333';
    for (let i = 0; i <= 5; i++) {
      const x = LABEL_W + (i * W) / 5;
      const rel = (data.t0 - data.job_start) / 1e6 + ((data.t1 - data.t0) / 1e6) * (i / 5);
      ctx.fillText(fmt.ms(rel), Math.min(x, LABEL_W + W - 50), 14);
      ctx.fillRect(x, 16, 1, 5);
    }
    state.hits = [];
    state.laneY = {};
    let y = AXIS_H;
    group = null;
    for (const lane of data.lanes) {
      if (lane.group !== group) {
        group = lane.group;
        ctx.fillStyle = '#e5e7eb'; ctx.fillRect(0, y, LABEL_W + W, GROUP_H - 2);
        ctx.fillStyle = '#111'; ctx.font = 'bold 11px sans-serif'; ctx.fillText(group, 4, y + 12); ctx.font = '11px sans-serif';
        y += GROUP_H;
      }
      ctx.fillStyle = '#374151'; ctx.fillText(lane.label, 8, y + 12);
      state.laneY[lane.id] = y;
      if (lane.kind === 'counter') {
        ctx.strokeStyle = '#0891b2'; ctx.fillStyle = 'rgba(8,145,178,0.25)';
        ctx.beginPath(); ctx.moveTo(LABEL_W, y + COUNTER_H - 2);
        lane.t.forEach((t, i) => ctx.lineTo(xOf(t), y + COUNTER_H - 2 - (Math.min(100, lane.v[i]) / 100) * (COUNTER_H - 6)));
        ctx.lineTo(xOf(lane.t[lane.t.length - 1] ?? 0), y + COUNTER_H - 2); ctx.closePath(); ctx.fill(); ctx.stroke();
        state.hits.push({ kind: 'counter', lane, y0: y, y1: y + COUNTER_H });
        y += COUNTER_H;
        continue;
      }
      const s = lane.slices;
      for (let i = 0; i < s.s.length; i++) {
        const x0 = Math.max(LABEL_W, xOf(s.s[i])), x1 = Math.min(LABEL_W + W, xOf(s.s[i] + s.d[i]));
        const yy = y + s.z[i] * SLICE_H;
        const name = data.names[s.n[i]];
        ctx.fillStyle = `hsl(${hue(name)}, 55%, ${s.z[i] ? 65 : 50}%)`;
        ctx.fillRect(x0, yy, Math.max(1, x1 - x0 - 0.5), SLICE_H - 2);
        if (x1 - x0 > 40) { ctx.fillStyle = '#fff'; ctx.fillText(name.slice(0, Math.floor((x1 - x0) / 6)), x0 + 2, yy + 11); }
        state.hits.push({ kind: 'slice', lane: lane.id, row: s.i[i], x0, x1, y0: yy, y1: yy + SLICE_H, name });
      }
      const a = lane.agg;
      for (let i = 0; i < a.b.length; i++) {
        const x0 = LABEL_W + a.b[i] * BUCKET_PX, yy = y + a.z[i] * SLICE_H;
        ctx.fillStyle = `hsla(${hue(data.names[a.n[i]])}, 55%, 45%, ${0.25 + 0.75 * a.f[i] / 100})`;
        ctx.fillRect(x0, yy, BUCKET_PX, SLICE_H - 2);
        state.hits.push({ kind: 'bucket', x0, x1: x0 + BUCKET_PX, y0: yy, y1: yy + SLICE_H, count: a.c[i], busy: a.f[i], name: data.names[a.n[i]] });
      }
      y += SLICE_H * 2 + 4;
    }
    // the selected GPU activity's launch: an arrow from the runtime call to the activity
    const sel = state.selected;
    if (sel && sel.launch) {
      const hostLane = state.laneY[sel.launch.lane], gpuLane = state.laneY[sel.laneId];
      if (hostLane !== undefined && gpuLane !== undefined) {
        const x0 = xOf((Number(sel.launch.start_ns) - data.t0) / 1e3 + sel.launch.duration_us), x1 = xOf((Number(sel.start_ns) - data.t0) / 1e3);
        ctx.strokeStyle = '#111'; ctx.fillStyle = '#111'; ctx.lineWidth = 1.5;
        ctx.beginPath(); ctx.moveTo(x0, hostLane + SLICE_H / 2); ctx.lineTo(x1, gpuLane + SLICE_H / 2); ctx.stroke();
        ctx.beginPath(); ctx.arc(x1, gpuLane + SLICE_H / 2, 3, 0, 2 * Math.PI); ctx.fill();
        ctx.lineWidth = 1;
      }
    }
    ctx.strokeStyle = 'rgba(220,38,38,0.8)'; ctx.fillStyle = '#b91c1c';
    let lastLabel = -Infinity;
    for (const m of data.markers) {
      const x = xOf(m.t);
      ctx.beginPath(); ctx.moveTo(x, AXIS_H); ctx.lineTo(x, y); ctx.stroke();
      if (x - lastLabel > ctx.measureText(m.label).width + 16) { ctx.fillText('▼ ' + m.label, x + 2, AXIS_H + 10); lastLabel = x; }
      state.hits.push({ kind: 'marker', x0: x - 3, x1: x + 3, y0: AXIS_H, y1: AXIS_H + 14, name: m.label });
    }
  }

  function zoom(factor, atPx) {
    const W = plotWidth();
    const frac = atPx === undefined ? 0.5 : Math.min(1, Math.max(0, (atPx - LABEL_W) / W));
    const span = state.t1 - state.t0, center = state.t0 + span * frac;
    const next = Math.max(1000, Math.min(span * factor, (state.jobEnd - state.jobStart) * 1.2 + 1000));
    state.t0 = center - next * frac; state.t1 = state.t0 + next;
    load();
  }
  function pan(fraction) {
    const span = state.t1 - state.t0;
    state.t0 += span * fraction; state.t1 += span * fraction;
    load();
  }
  canvas.addEventListener('keydown', (ev) => {
    const key = ev.key.toLowerCase();
    if (key === 'w') zoom(0.7); else if (key === 's') zoom(1 / 0.7);
    else if (key === 'a') pan(-0.2); else if (key === 'd') pan(0.2);
    else if (key === '0') { state.t0 = null; state.t1 = null; load(); } else return;
    ev.preventDefault();
  });
  canvas.addEventListener('wheel', (ev) => { ev.preventDefault(); zoom(ev.deltaY < 0 ? 0.8 : 1.25, ev.offsetX); }, { passive: false });
  let drag = null;
  canvas.addEventListener('mousedown', (ev) => { drag = { x: ev.offsetX, t0: state.t0, t1: state.t1, moved: false }; canvas.focus(); });
  window.addEventListener('mouseup', () => { if (drag && drag.moved) load(); drag = null; });
  canvas.addEventListener('mousemove', (ev) => {
    if (!drag) return;
    const dx = ev.offsetX - drag.x;
    if (Math.abs(dx) < 3 && !drag.moved) return;
    drag.moved = true;
    const shift = (-dx / plotWidth()) * (drag.t1 - drag.t0);
    state.t0 = drag.t0 + shift; state.t1 = drag.t1 + shift;
  });
  canvas.addEventListener('click', async (ev) => {
    if (drag && drag.moved) return;
    const hit = state.hits.find((h) => h.kind !== 'counter' && ev.offsetX >= h.x0 && ev.offsetX <= h.x1 && ev.offsetY >= h.y0 && ev.offsetY < h.y1);
    if (!hit) return;
    if (hit.kind === 'marker') { details.replaceChildren(el('h4', {}, 'Rule fired'), el('p', {}, hit.name)); return; }
    if (hit.kind === 'bucket') {
      details.replaceChildren(el('h4', {}, `${hit.count} short intervals`), el('p', {}, `busy ${hit.busy} % of this pixel range; first: ${hit.name}. Zoom in (W) to see them one by one.`));
      return;
    }
    const info = await api(`${base}/timeline/event?lane=${encodeURIComponent(hit.lane)}&i=${hit.row}`);
    info.laneId = hit.lane;
    state.selected = info;
    draw();
    const launch = info.launch ? el('p', { id: 'selected-launch' }, `launched by ${info.launch.call} (${fmt.ms(info.launch.duration_us / 1000)}); started ${fmt.ms(info.launch.delay_us / 1000)} after the call returned (launch delay)`) : null;
    details.replaceChildren(el('h4', { id: 'selected-name' }, info.name), launch,
      el('table', { class: 'grid kv' }, el('tbody', {}, Object.entries(info).map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', { 'data-key': k }, typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v)))))));
  });
  window.addEventListener('resize', () => load());
  load();
  // live: a view reaching the job's end follows it as the job grows
  // (the start stays, the end is the job's new end)
  return { refresh: () => { if (state.t1 !== null && state.t1 >= state.jobEnd) state.t1 = null; load(); } };
}

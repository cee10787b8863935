// One job's pages: dashboard, training health, statistics (the timeline has its own module).
import { api, el, exposeChart, fmt, jobPath } from './api.js';
import { barChart, forLog, heatmap, lineChart, pieChart, ridgeline, spansDecades, topSeries } from './charts.js';

export const section = (title, id, ...body) => el('section', { class: 'card', id }, el('h3', {}, title), ...body);

// The start of a page over one trace-engine endpoint (`/api/jobs/<job>/<page>`): its cards
// container, or a card with the engine's reason when the job has no such data. Resolves to
// [data, wrap], or null when there is nothing more to draw.
export async function tracePage(root, job, page, title) {
  const data = await api(`/api/jobs/${jobPath(job)}/${page}`);
  const wrap = el('div', { class: 'cards' });
  root.append(wrap);
  if (data.available) return [data, wrap];
  wrap.append(section(title, `${page}-none`, el('p', { class: 'muted' }, data.reason)));
  return null;
}

// A card holding one table of the trace engine ({columns, rows}), exposed to the tests as
// `${page}-table:${id}`; the memory and ranks pages share it.
export function tableCard(page, title, id, t) {
  exposeChart(`${page}-table:${id}`, t);
  return section(title, `${page}-${id}`, el('div', { class: 'table-scroll' }, simpleTable(t.columns, t.rows, null, `${page}-table-${id}`)));
}

export async function dashboardView(root, job) {
  const base = `/api/jobs/${jobPath(job)}`;
  const d = await api(`${base}/dashboard`);
  const wrap = el('div', { class: 'cards' });
  root.append(wrap);

  // System utilization per node
  for (const [node, sys] of Object.entries(d.system)) {
    const box = el('div', { class: 'chart' });
    wrap.append(section(`Utilization over time: ${node}`, `system-${node}`, box));
    lineChart(box, `system:${node}`, { x: sys.t, series: sys.series, xTime: true, yLabel: '%' });
  }
  if (!Object.keys(d.system).length) wrap.append(section('Utilization over time', 'system-none', el('p', { class: 'muted' }, 'no system metrics')));

  // Step time over steps, outliers marked (StepOutlier's limit)
  for (const s of d.steps) {
    const box = el('div', { class: 'chart' });
    const outlierSet = new Set(s.outliers);
    const points = { label: 'outliers', y: s.steps.map((step, i) => (outlierSet.has(step) ? s.duration_ms[i] : null)) };
    wrap.append(section(`Step time: ${s.key}`, `steps-${s.key}`, box,
      el('p', { class: 'muted step-outliers', 'data-outliers': s.outliers.join(','), 'data-limit-ms': s.limit_ms === null ? '' : String(s.limit_ms) },
        `${s.steps.length} steps; outliers (> ${s.limit_ms === null ? '-' : fmt.ms(s.limit_ms)}, StepOutlier): ${s.outliers.length ? s.outliers.join(', ') : 'none'}`)));
    lineChart(box, `steps:${s.key}`, { x: s.steps, series: { 'step time (ms)': s.duration_ms }, xLabel: `global step (${s.mode} steps)`, yLabel: s.log_y ? 'ms (log)' : 'ms', points, logY: s.log_y });
    if (s.log_y) box.after(el('p', { class: 'muted scale-note' }, 'log scale: the step times span more than two decades (a compile or first step)'));
  }

  const hist = el('div', { class: 'chart' });
  wrap.append(section(`Step-time histogram${d.step_histogram.mode ? ` (${d.step_histogram.mode} steps, every rank)` : ''}`, 'step-histogram', hist, summaryLine(d.step_histogram),
    d.step_histogram.apart_note ? el('p', { class: 'muted apart', id: 'step-histogram-apart' }, d.step_histogram.apart_note) : null));
  barChart(hist, 'step-histogram', { ...d.step_histogram, xLabel: 'step time (ms)' });

  const pie = el('div');
  wrap.append(section('Host time by phase', 'cpu-time', pie));
  pieChart(pie, 'cpu-time', d.cpu_time);

  // Any annotation's durations
  const annot = el('div', { class: 'chart' });
  const picker = el('select', { id: 'annotation-picker', onchange: async () => {
    const next = await api(`${base}/dashboard?phase=${encodeURIComponent(picker.value)}`);
    annot.replaceChildren();
    barChart(annot, 'annotation-histogram', { ...next.annotation.histogram, xLabel: `${picker.value} (ms)` });
    if (next.annotation.histogram.apart_note) annot.append(el('p', { class: 'muted apart' }, next.annotation.histogram.apart_note));
  } }, d.annotation.names.map((n) => el('option', { value: n, selected: n === d.annotation.chosen }, n)));
  wrap.append(section('Annotation durations', 'annotation', el('label', {}, 'annotation ', picker), annot));
  if (d.annotation.chosen) barChart(annot, 'annotation-histogram', { ...d.annotation.histogram, xLabel: `${d.annotation.chosen} (ms)` });
  if (d.annotation.histogram.apart_note) annot.append(el('p', { class: 'muted apart' }, d.annotation.histogram.apart_note));

  const gpu = el('div');
  wrap.append(section('GPU: active time, kernels, memory operations, precision', 'gpu', gpu));
  const drawGpu = (g) => {
    gpu.replaceChildren();
    if (!g.available) { gpu.append(el('p', { class: 'muted empty-section' }, g.reason)); return; }
    const k = el('input', { type: 'number', id: 'top-k', min: '1', max: '100', value: String(g.k), onchange: async () => drawGpu((await api(`${base}/dashboard?k=${k.value}`)).gpu) });
    gpu.append(el('label', {}, 'top k ', k));
    if (g.gpu_activity === false) gpu.append(el('p', { class: 'muted', id: 'gpu-none' }, 'The profiled window has no GPU activity (a CPU-only job): its CPU operators are below. Profile on a GPU for kernels, copies and GPU idle time.'));
    for (const [rank, p] of Object.entries(g.gpu_activity === false ? {} : g.pies)) {
      const a = el('div'), b = el('div'), c = el('div');
      gpu.append(el('h4', {}, rank), el('div', { class: 'pies' }, el('div', {}, el('p', { class: 'muted' }, 'GPU time'), a),
        el('div', {}, el('p', { class: 'muted' }, 'GPU idle, by cause'), b), el('div', {}, el('p', { class: 'muted' }, 'kernel time by precision'), c)));
      pieChart(a, `gpu-time:${rank}`, p.time);
      pieChart(b, `gpu-idle:${rank}`, p.idle);
      pieChart(c, `gpu-precision:${rank}`, p.precision);
    }
    const empty = [];
    for (const [name, t] of Object.entries(g.tables)) {
      window.stepscope.charts[`gpu-table:${name}`] = t;
      if (!t.rows.length) { empty.push(name); continue; }  // one line for all of them, below
      gpu.append(el('h4', {}, name), el('div', { class: 'table-scroll' }, simpleTable(t.columns, t.rows)));
    }
    if (empty.length) gpu.append(el('p', { class: 'muted empty-section', id: 'gpu-empty' }, `No rows in this job's traces: ${empty.join(', ')}` + (g.gpu_activity === false ? ' (they need GPU activity in a profiled window)' : '')));
  };
  drawGpu(d.gpu);

  const rules = el('div', { id: 'rules-list' }, el('p', { class: 'muted' }, 'running rules…'));
  wrap.append(section('Rules', 'rules', rules));
  // a report that could not be read is named below the others (the rest still show)
  api(`${base}/rules`).then((r) => rules.replaceChildren(rulesList(r.rules), ...(r.problems || []).map((p) => el('p', { class: 'error rule-problem' }, `unreadable: ${p}`))),
    (e) => rules.replaceChildren(el('p', { class: 'error' }, e.message)));
}

function summaryLine(h) {
  return el('p', { class: 'muted', id: 'step-histogram-summary' }, h.n ? `n=${h.n}, mean ${fmt.ms(h.mean)}, p50 ${fmt.ms(h.p50)}, p95 ${fmt.ms(h.p95)}, max ${fmt.ms(h.max)}` : 'no steps');
}

// "n of m rules could judge" and, for the others, what to save (rules that lacked evidence say so).
function judgedLine(rules) {
  const judged = rules.filter((r) => r.judged).length;
  const needs = new Map();
  rules.filter((r) => !r.judged && r.to_save).forEach((r) => needs.set(r.to_save, [...(needs.get(r.to_save) || []), r.rule]));
  const hints = [...needs].map(([what, names]) => `${what} (${names.join(', ')})`).join('; ');
  return el('p', { class: 'muted', id: 'rules-judged' }, `${judged} of ${rules.length} rules could judge` + (judged < rules.length && hints ? `; for the others save: ${hints}` : ''));
}

export function rulesList(rules) {
  if (!rules.length) return el('p', { class: 'muted' }, 'no rules ran (run `stepscope check` on the job)');
  return el('div', {}, judgedLine(rules), el('ul', { class: 'rules' }, rules.map((r) => el('li', { class: `rule ${r.fired ? 'fired' : r.status.replace(/ /g, '-')}`, 'data-rule': r.rule },
    el('div', { class: 'rule-head' }, el('strong', {}, r.rule), el('span', { class: `status ${r.fired ? 'failed' : r.judged ? 'finished' : 'nodata'}` }, r.status), el('span', { class: 'muted' }, ` ${r.kind}, ${r.source}`)),
    el('div', { class: 'rule-summary' }, r.summary),
    r.fired && r.causes.length ? el('div', { class: 'causes' }, el('strong', {}, 'Likely causes: '), el('ul', {}, r.causes.map((c) => el('li', {}, c)))) : null,
    r.fired && r.advice.length ? el('div', { class: 'advice' }, el('strong', {}, 'Advice: '), el('ul', {}, r.advice.map((a) => el('li', {}, a)))) : null,
    r.evidence.length ? el('details', {}, el('summary', {}, `evidence (${r.violations} violation${r.violations === 1 ? '' : 's'})`),
      el('table', { class: 'grid evidence' }, el('thead', {}, el('tr', {}, ['where', 'tensor', 'value', 'threshold', 'message'].map((h) => el('th', {}, h)))),
        el('tbody', {}, r.evidence.map((e) => el('tr', {}, el('td', {}, e.where ?? ''), el('td', {}, e.tensor ?? ''), el('td', {}, e.value ?? ''), el('td', {}, e.threshold ?? ''), el('td', {}, e.message ?? '')))))) : null,
    r.definition ? el('details', {}, el('summary', {}, 'what this rule checks'), el('p', {}, r.definition)) : null,
  ))));
}

// The tensors the rules' evidence names, so a chart that names only some always names these.
async function flaggedTensors(base) {
  try {
    const { rules } = await api(`${base}/rules`);
    return [...new Set(rules.filter((r) => r.fired).flatMap((r) => r.evidence.map((e) => e.tensor)).filter(Boolean))];
  } catch { return []; }
}

// Under a loss or metric chart whose values turned NaN or infinite: how many, and from
// which step (the line ends there; ExplodingTensor's finding says why).
function nonFiniteNote({ nan, inf, first_step: first }) {
  const kinds = [nan ? `${nan} NaN` : '', inf ? `${inf} infinite` : ''].filter(Boolean).join(', ');
  return `${nan + inf} value${nan + inf === 1 ? '' : 's'} not drawn (${kinds}), the first at global step ${first}`;
}

export async function healthView(root, job) {
  const base = `/api/jobs/${jobPath(job)}`;
  const h = await api(`${base}/health`);
  const wrap = el('div', { class: 'cards' });
  root.append(wrap);
  const byTensor = {};
  for (const c of h.curves) (byTensor[c.tensor] = byTensor[c.tensor] || []).push(c);
  for (const [tensor, curves] of Object.entries(byTensor)) {
    for (const c of curves) {
      const box = el('div', { class: 'chart' });
      wrap.append(section(`${tensor} (${c.mode})`, `curve-${tensor}-${c.mode}`, box));
      lineChart(box, `curve:${tensor}:${c.mode}`, { x: c.steps, series: { [tensor]: c.values }, xLabel: `global step (${c.mode} steps)` });
      if (c.non_finite) box.append(el('p', { class: 'muted non-finite-note' }, nonFiniteNote(c.non_finite)));
    }
  }
  if (!h.curves.length) wrap.append(section('Loss and metrics', 'curves', el('p', { class: 'muted' }, 'no losses or metrics saved')));
  const hm = el('div');
  wrap.append(section('Gradient norm per layer (L2), at TRAIN steps (global step)', 'gradient-norms', hm));
  heatmap(hm, 'gradient-norms', { rows: h.gradient_norms.tensors, columns: h.gradient_norms.steps, values: h.gradient_norms.values });
  const ur = el('div', { class: 'chart' });
  wrap.append(section('Weight update ratio |Δw| / max(|w|, 1e-3·√n), between saved TRAIN steps', 'update-ratios', ur));
  if (h.update_ratios.series.length) {
    const steps = [...new Set(h.update_ratios.series.flatMap((s) => s.steps))].sort((a, b) => a - b);
    const series = {};
    for (const s of h.update_ratios.series) { const m = new Map(s.steps.map((st, i) => [st, s.values[i]])); series[s.tensor] = steps.map((st) => m.get(st) ?? null); }
    const all = Object.values(series).flat();
    const log = spansDecades(all);
    let dropped = 0;
    if (log) for (const name of Object.keys(series)) { const r = forLog(series[name]); series[name] = r.values; dropped += r.dropped; }
    const flagged = await flaggedTensors(base);
    const { named, caption } = topSeries(series, 8, flagged);
    lineChart(ur, 'update-ratios', { x: steps, series, xLabel: 'global step (TRAIN steps)', yLabel: log ? 'ratio (log)' : 'ratio', logY: log, named: caption ? named : null });
    const notes = [log ? 'log scale: the ratios span more than two decades' : '', dropped ? `${dropped} ratio(s) of 0 (weights that did not move) not drawn on the log axis` : '', caption].filter(Boolean);
    if (notes.length) ur.append(el('p', { class: 'muted scale-note', id: 'update-ratios-note' }, notes.join('; ')));
    // the latest ratio of each weight, as the report's table and the WeightUpdateRatio rule have it
    ur.append(simpleTable(['tensor', 'mode', 'last global step', 'last ratio'],
      h.update_ratios.series.map((s) => [s.tensor, s.mode, s.steps[s.steps.length - 1], s.values[s.values.length - 1]]), null, 'update-ratio-last'));
  } else ur.append(el('p', { class: 'muted' }, 'needs weights saved at two or more steps'));
  const iu = el('div');
  wrap.append(section('Dead / saturated units (% of each layer, per mode; global step)', 'inactive-units', iu));
  if (h.inactive_units.tensors.length) heatmap(iu, 'inactive-units', { rows: h.inactive_units.tensors, columns: h.inactive_units.steps, values: h.inactive_units.values, log: false });
  else iu.append(el('p', { class: 'muted' }, 'no activations saved (save ReLU outputs as *relu_output, tanh/sigmoid inputs as *tanh_input / *sigmoid_input)'));
  const hist = el('div');
  const picker = el('select', { id: 'tensor-picker', onchange: () => drawHist() }, h.tensors.map((n) => el('option', { value: n }, n)));
  // one mode per ridge (TRAIN first): an EVAL step's values are never drawn among TRAIN steps
  const modePicker = el('select', { id: 'histogram-mode', onchange: () => drawHist(modePicker.value) });
  wrap.append(section('Tensor histograms over the steps of one mode (global step)', 'tensor-histograms', el('label', {}, 'tensor ', picker), el('label', {}, ' mode ', modePicker), hist));
  async function drawHist(mode) {
    if (!picker.value) return;
    const data = await api(`${base}/tensor-histograms?tensor=${encodeURIComponent(picker.value)}${mode ? `&mode=${mode}` : ''}`);
    modePicker.replaceChildren(...(data.modes || []).map((m) => el('option', { value: m, selected: m === data.mode }, m)));
    hist.replaceChildren();
    ridgeline(hist, 'tensor-histogram', data);
  }
  if (h.default_tensor) picker.value = h.default_tensor;
  drawHist();
}

export async function statsView(root, job) {
  const base = `/api/jobs/${jobPath(job)}`;
  const { tables } = await api(`${base}/stats`);
  // tables this job has no rows for (the GPU ones of a CPU-only job): one line, not empty grids
  const empty = Object.entries(tables).filter(([, t]) => !t.total).map(([, t]) => t.title);
  for (const [name, t] of Object.entries(tables)) {
    if (!t.total) continue;
    // filtering and sorting run on the server, over every row
    const filter = el('input', { type: 'search', placeholder: 'filter rows', 'data-table': name });
    const holder = el('div', { class: 'table-scroll' });
    const state = { sort: null, desc: true, seq: 0 };
    const draw = async () => {
      const seq = ++state.seq;
      const params = new URLSearchParams({ q: filter.value, limit: '1000' });
      if (state.sort !== null) { params.set('sort', state.sort); params.set('desc', state.desc ? '1' : '0'); }
      const page = await api(`${base}/stats/${name}?${params}`);
      if (seq !== state.seq) return;
      holder.replaceChildren(simpleTable(page.columns, page.rows, (i) => { state.desc = state.sort === page.columns[i] ? !state.desc : true; state.sort = page.columns[i]; draw(); }, `stats-${name}`));
      holder.dataset.matched = String(page.matched);
      if (page.matched > page.rows.length) holder.append(el('p', { class: 'muted' }, `first ${page.rows.length} of ${page.matched} rows; the CSV has all ${page.total}`));
    };
    filter.addEventListener('input', draw);
    root.append(section(`${t.title} (${t.total})`, `stats-section-${name}`,
      el('div', { class: 'toolbar' }, filter, el('a', { href: `${base}/stats/${name}.csv`, download: `${name}.csv`, class: 'button' }, 'CSV')), holder));
    holder.replaceChildren(simpleTable(t.columns, t.rows, null, `stats-${name}`));
    draw();
  }
  if (empty.length) root.append(el('p', { class: 'muted empty-section', id: 'stats-empty' }, `No rows for this job: ${empty.join(', ')}`));
}

export function simpleTable(columns, rows, onSort, id) {
  return el('table', { class: 'grid', id },
    el('thead', {}, el('tr', {}, columns.map((c, i) => el('th', { class: onSort ? 'sortable' : '', onclick: onSort ? () => onSort(i) : undefined }, c)))),
    el('tbody', {}, rows.map((r) => el('tr', {}, r.map((v, i) => el('td', { 'data-value': v, title: typeof v === 'string' && v.length > 40 ? v : undefined }, cell(columns[i], v)))))));
}

// Epoch seconds (the steps table's start) as a UTC time; other numbers with 3 decimals.
function cell(column, v) {
  if (typeof v !== 'number') return v;
  if (column === 'start_s' && v > 1e8) return fmt.clock(v);
  // small ratios (update ratios of 1e-5) would all read 0.000: four significant digits
  if (v !== 0 && Math.abs(v) < 0.01) return Number(v.toPrecision(4)).toExponential();
  return fmt.num(v, 3);
}

// Compare two jobs (/compare?a=JOB&b=JOB): stepscope.diff's sections as tables, B against
// the baseline A; rows that changed first-class, unchanged ones behind a toggle.
import { api, el, exposeChart, jobPath } from './api.js';

const STATUS_LABEL = { same: 'same', changed: 'changed', new: 'new in B', vanished: 'gone in B' };

function cell(value) {
  if (value === null || value === undefined) return '-';
  if (typeof value === 'string') return value;
  const abs = Math.abs(value);
  if (value !== 0 && (abs >= 1e6 || abs < 1e-3)) return value.toPrecision(3);
  // four significant digits below 1000 (0.07321 -> 0.07321, 12.345 -> 12.35); whole numbers above
  return abs < 1000 ? String(Number(value.toPrecision(4))) : value.toLocaleString('en-US', { maximumFractionDigits: 0 });
}

function ratio(row) {
  if (row.ratio === null || row.ratio === undefined) return STATUS_LABEL[row.status] || row.status;
  return `${row.ratio.toFixed(2)}x`;
}

function sectionCard(section, showSame) {
  const rows = showSame ? section.rows : section.rows.filter((r) => r.status !== 'same');
  const hidden = section.rows.length - rows.length;
  return el('div', { class: 'card', id: `compare-${section.name}` },
    el('h3', {}, section.title),
    section.note ? el('p', { class: 'muted' }, section.note) : null,
    rows.length ? el('div', { class: 'table-scroll' }, el('table', { class: 'grid compare' },
      el('thead', {}, el('tr', {}, ['', 'A', 'B', 'B / A', 'unit'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows.map((r) => el('tr', { class: `diff-${r.status}`, 'data-key': r.key },
        el('td', { title: r.key }, r.key), el('td', { class: 'num' }, cell(r.a)), el('td', { class: 'num' }, cell(r.b)),
        el('td', { class: 'num' }, ratio(r)), el('td', {}, r.unit)))))) : null,
    hidden ? el('p', { class: 'muted' }, `${hidden} more unchanged (within ${Math.round(100 * window.stepscope.sameWithin)}%)`) : null,
    !section.rows.length && !section.note ? el('p', { class: 'muted' }, 'nothing to compare') : null);
}

export async function compareView(root) {
  const params = new URLSearchParams(location.search);
  const a = params.get('a') || '', b = params.get('b') || '';
  root.append(el('h2', {}, 'Compare'),
    el('p', {}, 'A (baseline): ', el('a', { href: `/jobs/${jobPath(a)}#dashboard`, id: 'compare-a' }, a),
      ' — B: ', el('a', { href: `/jobs/${jobPath(b)}#dashboard`, id: 'compare-b' }, b)));
  const body = el('div', { id: 'view' });
  const toggle = el('input', { type: 'checkbox', id: 'compare-all' });
  root.append(el('label', { class: 'toolbar' }, toggle, ' show unchanged figures'), body);
  if (!a || !b) { body.append(el('p', { class: 'error' }, 'Choose two jobs on the jobs page.')); return; }
  let diff;
  try {
    diff = await api(`/api/compare?${new URLSearchParams({ a, b })}`);
  } catch (e) {
    body.append(el('p', { class: 'error', id: 'compare-error' }, e.message));
    body.dataset.loaded = String(Date.now());
    return;
  }
  window.stepscope.sameWithin = diff.same_within;
  exposeChart('compare', diff);
  const draw = () => body.replaceChildren(el('div', { class: 'cards' }, diff.sections.map((s) => sectionCard(s, toggle.checked))));
  toggle.addEventListener('change', draw);
  draw();
  body.dataset.loaded = String(Date.now());
}

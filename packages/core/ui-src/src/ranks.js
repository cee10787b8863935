// A job's Ranks page: the ranks side by side (mean step, compute / communication kernel and
// GPU idle time per profiled step, gap to the median rank) and the straggling ranks, from the
// per-rank trace summaries (the report's Distributed section shows the same numbers).
import { api, el, exposeChart, jobPath } from './api.js';
import { simpleTable } from './job.js';

const section = (title, id, ...body) => el('section', { class: 'card', id }, el('h3', {}, title), ...body);

function tableCard(title, id, t) {
  exposeChart(`ranks-table:${id}`, t);
  return section(title, `ranks-${id}`, el('div', { class: 'table-scroll' }, simpleTable(t.columns, t.rows, null, `ranks-table-${id}`)));
}

export async function ranksView(root, job) {
  const r = await api(`/api/jobs/${jobPath(job)}/ranks`);
  const wrap = el('div', { class: 'cards' });
  root.append(wrap);
  if (!r.available) { wrap.append(section('Ranks', 'ranks-none', el('p', { class: 'muted' }, r.reason))); return; }
  wrap.append(tableCard(`Per rank, mean per profiled step (${r.ranks.rows.length} ranks; µs)`, 'compare', r.ranks));
  if (!r.stragglers.rows.length) wrap.append(section('Stragglers', 'ranks-no-stragglers', el('p', { class: 'muted' }, 'No rank is an outlier among the ranks of its steps.')));
  else wrap.append(tableCard(`Stragglers: ${r.stragglers.rows.length} rank(s)`, 'stragglers', r.stragglers));
}

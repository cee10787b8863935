// A job's Ranks page: the ranks side by side (mean step, compute / communication kernel and
// GPU idle time per profiled step, gap to the median rank) and the straggling ranks, from the
// per-rank trace summaries (the report's Distributed section shows the same numbers).
import { api, el, jobPath } from './api.js';
import { section, tableCard as pageTableCard } from './job.js';

const tableCard = (title, id, t) => pageTableCard('ranks', title, id, t);

export async function ranksView(root, job) {
  const r = await api(`/api/jobs/${jobPath(job)}/ranks`);
  const wrap = el('div', { class: 'cards' });
  root.append(wrap);
  if (!r.available) { wrap.append(section('Ranks', 'ranks-none', el('p', { class: 'muted' }, r.reason))); return; }
  wrap.append(tableCard(`Per rank, mean per profiled step (${r.ranks.rows.length} ranks; µs)`, 'compare', r.ranks));
  if (!r.stragglers.rows.length) wrap.append(section('Stragglers', 'ranks-no-stragglers', el('p', { class: 'muted' }, 'No rank is an outlier among the ranks of its steps.')));
  else wrap.append(tableCard(`Stragglers: ${r.stragglers.rows.length} rank(s)`, 'stragglers', r.stragglers));
}

// A job's Ranks page: the ranks side by side (mean step, compute / communication kernel and
// GPU idle time per profiled step, gap to the median rank) and the straggling ranks, from the
// per-rank trace summaries (the report's Distributed section shows the same numbers).
import { el } from './api.js';
import { section, tableCard as pageTableCard, tracePage } from './job.js';

const tableCard = (title, id, t) => pageTableCard('ranks', title, id, t);

export async function ranksView(root, job) {
  const opened = await tracePage(root, job, 'ranks', 'Ranks');
  if (!opened) return;
  const [r, wrap] = opened;
  wrap.append(tableCard(`Per rank, mean per profiled step (${r.ranks.rows.length} ranks; µs)`, 'compare', r.ranks));
  if (!r.stragglers.rows.length) wrap.append(section('Stragglers', 'ranks-no-stragglers', el('p', { class: 'muted' }, 'No rank is an outlier among the ranks of its steps.')));
  else wrap.append(tableCard(`Stragglers: ${r.stragglers.rows.length} rank(s)`, 'stragglers', r.stragglers));
}

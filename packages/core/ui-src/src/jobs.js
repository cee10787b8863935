// The jobs list: filter and sort happen on the server (`q`, `status`, `sort`).
import { api, el, fmt, jobPath } from './api.js';

const COLUMNS = [
  ['id', 'Job'], ['status', 'Status'], ['start', 'Start'], ['duration', 'Duration'],
  ['framework', 'Framework'], ['workers', 'Workers'], ['steps', 'Steps run'], ['saved_steps', 'Saved steps'], [null, 'Rules fired'],
];

export function jobsView(root) {
  const state = { q: '', status: '', sort: '-start' };
  const table = el('table', { class: 'grid', id: 'jobs-table' });
  const search = el('input', { type: 'search', id: 'jobs-filter', placeholder: 'filter by name or framework', oninput: () => { state.q = search.value; load(); } });
  const status = el('select', { id: 'jobs-status', onchange: () => { state.status = status.value; load(); } },
    ...['', 'running', 'finished', 'stopped', 'failed', 'unreadable'].map((s) => el('option', { value: s }, s || 'any status')));
  // two ticked jobs -> the compare page (the first ticked is the baseline A)
  const picked = [];
  const compare = el('button', { id: 'jobs-compare', disabled: true, onclick: () => {
    location.href = `/compare?${new URLSearchParams({ a: picked[0], b: picked[1] })}`;
  } }, 'Compare 2 jobs');
  const pick = (id, on) => {
    const at = picked.indexOf(id);
    if (on && at < 0) picked.push(id);
    if (!on && at >= 0) picked.splice(at, 1);
    compare.disabled = picked.length !== 2;
  };
  root.append(el('h2', {}, 'Jobs'), el('div', { class: 'toolbar' }, search, status, compare), table);

  async function load() {
    const params = new URLSearchParams({ q: state.q, status: state.status, sort: state.sort });
    const { jobs } = await api(`/api/jobs?${params}`);
    table.replaceChildren(
      el('thead', {}, el('tr', {}, el('th', { title: 'tick two jobs to compare them' }, ''), COLUMNS.map(([key, label]) => el('th', {
        class: key ? 'sortable' : '', 'data-key': key,
        onclick: key ? () => { state.sort = state.sort === `-${key}` ? key : `-${key}`; load(); } : undefined,
      }, label, state.sort.replace('-', '') === key ? (state.sort.startsWith('-') ? ' ▼' : ' ▲') : '')))),
      el('tbody', {}, jobs.map((job) => el('tr', { 'data-job': job.id },
        el('td', {}, el('input', { type: 'checkbox', class: 'pick', checked: picked.includes(job.id), 'aria-label': `compare ${job.id}`,
          onchange: (e) => pick(job.id, e.target.checked) })),
        el('td', {}, el('a', { href: `/jobs/${jobPath(job.id)}#dashboard` }, job.id)),
        // an unreadable job says why; a readable one names the files it had to leave out
        el('td', {}, el('span', { class: `status ${job.status}`, title: job.error || (job.skipped || []).join('\n') || undefined }, job.status),
          (job.skipped || []).length ? el('span', { class: 'muted skipped', title: job.skipped.join('\n') }, ` ${job.skipped.length} file(s) skipped`) : null),
        el('td', {}, fmt.time(job.start)),
        el('td', {}, fmt.duration(job.duration)),
        el('td', {}, job.framework || '-'),
        el('td', {}, job.workers),
        el('td', {}, job.steps),
        el('td', {}, job.saved_steps ?? '-'),
        el('td', {}, job.rules_fired.length ? job.rules_fired.join(', ') : '-'),
      ))),
    );
    if (!jobs.length) table.append(el('caption', {}, 'no jobs'));
  }
  load();
  // running jobs move on: look again every 10 s while the page is open
  const timer = setInterval(() => { if (document.visibilityState === 'visible') load().catch(() => {}); }, 10000);
  return { refresh: load, stop: () => clearInterval(timer) };
}

// The app's entry: a header, then the view the URL names. /: jobs; /admin: users;
// /jobs/<job>#dashboard|health|stats|memory|ranks|timeline: one job; /compare?a=&b=: two jobs. A job's page polls the server
// for what the job has published and redraws when something new has landed.
import { api, el } from './api.js';
import { adminView } from './admin.js';
import { compareView } from './compare.js';
import { dashboardView, healthView, statsView } from './job.js';
import { jobsView } from './jobs.js';
import { memoryView } from './memory.js';
import { ranksView } from './ranks.js';
import { timelineView } from './timeline.js';

const POLL_MS = 3000;
const VIEWS = { dashboard: ['Dashboard', dashboardView], health: ['Training health', healthView], stats: ['Statistics', statsView], memory: ['Memory', memoryView], ranks: ['Ranks', ranksView], timeline: ['Timeline', timelineView] };

function header() {
  const user = document.body.dataset.user;
  const csrf = document.querySelector('meta[name="csrf-token"]')?.content || '';
  return el('header', {},
    el('a', { href: '/', class: 'brand' }, 'stepscope'),
    el('nav', {}, el('a', { href: '/' }, 'Jobs'), document.body.dataset.admin === '1' ? el('a', { href: '/admin', id: 'admin-link' }, 'Users') : null),
    el('form', { method: 'post', action: '/logout', class: 'logout' }, el('input', { type: 'hidden', name: 'csrf_token', value: csrf }),
      el('span', { id: 'whoami' }, user), el('button', { type: 'submit' }, 'Sign out')));
}

function jobPage(root, job) {
  const tabs = el('nav', { class: 'tabs' });
  const body = el('div', { id: 'view' });
  const live = el('span', { id: 'live', class: 'muted' });
  root.append(el('h2', {}, job, ' ', live), tabs, body);
  let current = null, tag = null, view = null;
  async function show() {
    const name = (location.hash.slice(1) || 'dashboard');
    const [, render] = VIEWS[name] || VIEWS.dashboard;
    tabs.replaceChildren(...Object.entries(VIEWS).map(([key, [label]]) => el('a', { href: `#${key}`, class: key === name ? 'active' : '', id: `tab-${key}` }, label)));
    current = name;
    body.replaceChildren();
    try { view = await render(body, job); } catch (e) { body.append(el('p', { class: 'error' }, e.message)); }
    body.dataset.loaded = String(Date.now());
  }
  window.addEventListener('hashchange', show);
  show();
  async function poll() {
    try {
      const v = await api(`/api/jobs/${job.split('/').map(encodeURIComponent).join('/')}/version`);
      live.textContent = v.complete ? '(finished)' : `(live: ${v.steps || v.timeline_events} updates seen)`;
      live.dataset.tag = v.tag;
      if (tag !== null && v.tag !== tag) {
        if (current === 'timeline' && view) view.refresh(); else show();
      }
      tag = v.tag;
      if (!v.complete) setTimeout(poll, POLL_MS);
    } catch (e) { setTimeout(poll, POLL_MS * 3); }
  }
  poll();
}

function start() {
  const root = document.getElementById('app');
  document.body.prepend(header());
  const path = decodeURIComponent(location.pathname);
  if (path.startsWith('/jobs/')) jobPage(root, path.slice('/jobs/'.length));
  else if (path === '/admin') adminView(root);
  else if (path === '/compare') compareView(root);
  else jobsView(root);
}

start();

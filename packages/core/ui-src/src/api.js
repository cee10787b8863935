// Talking to the server: every request carries the session cookie (same origin) and, for
// state changes, the CSRF token the page was served with.

const csrf = () => document.querySelector('meta[name="csrf-token"]')?.content || '';

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export async function api(path, { method = 'GET', body } = {}) {
  const headers = { Accept: 'application/json' };
  if (method !== 'GET') headers['X-CSRF-Token'] = csrf();
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), credentials: 'same-origin' });
  if (resp.status === 401) { window.location.href = '/login'; throw new ApiError(401, 'signed out'); }
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new ApiError(resp.status, data.error || resp.statusText);
  return data;
}

export const jobPath = (job) => job.split('/').map(encodeURIComponent).join('/');

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else if (key === 'class') node.className = value;
    // through the CSSOM: the page's CSP (no 'unsafe-inline') blocks style attributes
    else if (key === 'style') node.style.cssText = value;
    else node.setAttribute(key, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export const fmt = {
  ms: (v) => (v === null || v === undefined ? '-' : v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${v.toFixed(v < 10 ? 2 : 1)} ms`),
  num: (v, d = 2) => (v === null || v === undefined ? '-' : Number.isInteger(v) ? String(v) : v.toFixed(d)),
  time: (s) => (s ? new Date(s * 1000).toISOString().replace('T', ' ').slice(0, 19) + ' UTC' : '-'),
  // a wall-clock time with milliseconds (the steps table's start column holds epoch seconds)
  clock: (s) => (s ? new Date(s * 1000).toISOString().replace('T', ' ').slice(0, 23) + ' UTC' : '-'),
  duration: (s) => {
    if (s === null || s === undefined) return '-';
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = Math.round(s % 60);
    return h ? `${h}h ${m}m` : m ? `${m}m ${sec}s` : `${s.toFixed(1)} s`;
  },
};

// Charts register what they draw here, so tests (and curious users) can read the numbers.
window.stepscope = window.stepscope || { charts: {} };
export function exposeChart(id, data) { window.stepscope.charts[id] = data; }

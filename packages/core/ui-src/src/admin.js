// Users, for administrators: the same operations as `stepscope ui users`.
import { api, el } from './api.js';

export function adminView(root) {
  const list = el('div', { id: 'users-list' });
  const out = el('p', { id: 'admin-output', class: 'muted' });
  const name = el('input', { id: 'new-user-name', placeholder: 'name' });
  const prefixes = el('input', { id: 'new-user-prefixes', placeholder: 'prefixes, comma-separated' });
  const admin = el('input', { type: 'checkbox', id: 'new-user-admin' });
  const add = el('button', { id: 'add-user', onclick: async () => {
    try {
      const r = await api('/api/users', { method: 'POST', body: { name: name.value, admin: admin.checked, prefixes: prefixes.value.split(',').map((p) => p.trim()).filter(Boolean) } });
      out.textContent = `created ${r.user.name}; password (shown once): ${r.password}`;
      load();
    } catch (e) { out.textContent = e.message; }
  } }, 'Add user');
  root.append(el('h2', {}, 'Users'), list, el('div', { class: 'toolbar' }, name, prefixes, el('label', {}, admin, ' admin'), add), out);

  async function act(label, fn) { try { out.textContent = await fn(); load(); } catch (e) { out.textContent = `${label}: ${e.message}`; } }
  async function load() {
    const { users } = await api('/api/users');
    list.replaceChildren(el('table', { class: 'grid' },
      el('thead', {}, el('tr', {}, ['User', 'Role', 'Prefixes', ''].map((h) => el('th', {}, h)))),
      el('tbody', {}, users.map((u) => el('tr', { 'data-user': u.name },
        el('td', {}, u.name), el('td', {}, u.admin ? 'admin' : 'user'), el('td', {}, u.prefixes.join(', ') || '-'),
        el('td', {},
          el('button', { onclick: () => { const p = prompt(`prefix to grant ${u.name}`); if (p) act('grant', async () => { await api(`/api/users/${encodeURIComponent(u.name)}/grant`, { method: 'POST', body: { prefixes: [p] } }); return `granted ${p}`; }); } }, 'Grant'),
          el('button', { onclick: () => act('reset', async () => `new password for ${u.name}: ${(await api(`/api/users/${encodeURIComponent(u.name)}/password`, { method: 'POST' })).password}`) }, 'Reset password'),
          el('button', { onclick: () => act('token', async () => `new token for ${u.name}: ${(await api(`/api/users/${encodeURIComponent(u.name)}/token`, { method: 'POST' })).token}`) }, 'New token'),
          el('button', { class: 'danger', onclick: () => { if (confirm(`remove ${u.name}?`)) act('remove', async () => { await api(`/api/users/${encodeURIComponent(u.name)}`, { method: 'DELETE' }); return `removed ${u.name}`; }); } }, 'Remove'),
        ))))));
  }
  load();
}

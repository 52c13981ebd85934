// Administration pages: users, credentials, workers and status (`admin.*`, admin only).
import { h, clear, field, when, confirmDialog, opId } from './dom.js';

function errorLine() {
  return h('p', { class: 'error', role: 'alert' });
}

function table(caption, head, rows, empty) {
  if (!rows.length) return h('p', { class: 'muted' }, empty);
  return h('table', {},
    h('caption', {}, caption),
    h('thead', {}, h('tr', {}, head.map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, rows));
}

export function adminUsers(ctx, view) {
  const list = h('div', { 'aria-live': 'polite' });
  const error = errorLine();
  const email = h('input', { type: 'email', name: 'email', required: true, autocomplete: 'off' });
  const role = h('select', { name: 'role' }, h('option', { value: 'member' }, 'member'), h('option', { value: 'admin' }, 'admin'));
  const password = h('input', { type: 'password', name: 'password', autocomplete: 'new-password', minlength: 12 });
  const form = h('form', { class: 'inline', 'aria-labelledby': 'new-user-h' },
    h('h2', { id: 'new-user-h' }, 'New user'),
    field('Email', email), field('Role', role), field('Password (optional)', password, 'At least 12 characters; leave empty for credential-only access.'),
    h('button', { type: 'submit' }, 'Create user'));

  async function load() {
    try {
      const users = await ctx.conn.call('admin.user.list', {});
      clear(list, table('Users', ['Email', 'Role', 'Password', 'Created', 'State', ''],
        users.map((u) => h('tr', { dataset: { user: u.email } },
          h('td', {}, u.email), h('td', {}, u.role), h('td', {}, u.hasPassword ? 'set' : '—'),
          h('td', {}, when(u.createdAt)), h('td', {}, u.disabled ? 'disabled' : 'active'),
          h('td', { class: 'row' }, u.disabled || u.userId === ctx.me.userId ? null : [
            h('button', { type: 'button', 'aria-label': `Make ${u.email} ${u.role === 'admin' ? 'a member' : 'an admin'}`, onclick: () => setRole(u, u.role === 'admin' ? 'member' : 'admin') },
              u.role === 'admin' ? 'Make member' : 'Make admin'),
            h('button', { type: 'button', class: 'danger', 'aria-label': `Disable ${u.email}`, onclick: () => disable(u) }, 'Disable')]))),
        'No users.'));
    } catch (err) { error.textContent = ctx.describe(err); }
  }

  async function setRole(u, role) {
    if (!await confirmDialog(`Make ${u.email} ${role === 'admin' ? 'an admin' : 'a member'}? Their open connections close; they sign in again with the new role.`, 'Change role')) return;
    error.textContent = '';
    try {
      await ctx.conn.call('admin.user.setRole', { userId: u.userId, role, operationId: opId() });
      await load();
    } catch (err) { error.textContent = ctx.describe(err); }
  }

  async function disable(u) {
    if (!await confirmDialog(`Disable ${u.email}? Their connections close at once and their credentials stop working.`, 'Disable')) return;
    try {
      await ctx.conn.call('admin.user.disable', { userId: u.userId, operationId: opId() });
      await load();
    } catch (err) { error.textContent = ctx.describe(err); }
  }

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    error.textContent = '';
    const params = { email: email.value.trim(), role: role.value, operationId: opId() };
    if (password.value) params.password = password.value;
    try {
      await ctx.conn.call('admin.user.create', params);
      form.reset();
      await load();
    } catch (err) { error.textContent = ctx.describe(err); }
  });

  clear(view, h('h1', {}, 'Users'), error, form, list);
  document.title = 'Users — Berth';
  load();
}

export function adminCredentials(ctx, view) {
  const list = h('div', { 'aria-live': 'polite' });
  const error = errorLine();
  const created = h('div', { 'aria-live': 'polite' });
  const kind = h('select', { name: 'kind' });
  const note = h('input', { name: 'note', maxlength: 500, autocomplete: 'off' });
  const expires = h('input', { name: 'expires', type: 'datetime-local' });
  const form = h('form', { class: 'inline', 'aria-labelledby': 'new-cred-h' },
    h('h2', { id: 'new-cred-h' }, 'New credential'),
    field('For', kind), field('Note', note), field('Expires (optional)', expires),
    h('button', { type: 'submit' }, 'Create credential'));

  async function loadUsers() {
    const users = await ctx.conn.call('admin.user.list', {});
    clear(kind,
      users.filter((u) => !u.disabled).map((u) => h('option', { value: u.userId }, `user ${u.email}`)),
      h('option', { value: 'worker' }, 'a worker (workspace host)'));
  }

  async function load() {
    try {
      const creds = await ctx.conn.call('admin.credential.list', {});
      clear(list, table('Credentials', ['Kind', 'User', 'Note', 'Created', 'Last used', 'Expires', 'State', ''],
        creds.map((c) => h('tr', { dataset: { credential: c.credentialId } },
          h('td', {}, c.kind), h('td', {}, c.userEmail || '—'), h('td', {}, c.note || '—'),
          h('td', {}, when(c.createdAt)), h('td', {}, when(c.lastUsedAt)), h('td', {}, when(c.expiresAt)),
          h('td', {}, c.revokedAt ? h('span', {}, 'revoked ', when(c.revokedAt)) : 'active'),
          h('td', {}, c.revokedAt ? null
            : h('button', { type: 'button', class: 'danger', 'aria-label': `Revoke credential ${c.note || c.credentialId}`, onclick: () => revoke(c) }, 'Revoke')))),
        'No credentials.'));
    } catch (err) { error.textContent = ctx.describe(err); }
  }

  async function revoke(c) {
    const what = c.note ? `“${c.note}”` : c.credentialId;
    if (!await confirmDialog(`Revoke credential ${what}${c.userEmail ? ` of ${c.userEmail}` : ''}? Connections using it close at once.`, 'Revoke')) return;
    try {
      await ctx.conn.call('admin.credential.revoke', { credentialId: c.credentialId, operationId: opId() });
      await load();
    } catch (err) { error.textContent = ctx.describe(err); }
  }

  function showOnce(token) {
    const out = h('input', { class: 'secret', readonly: true, value: token, 'aria-label': 'The new credential', spellcheck: 'false' });
    const status = h('span', { role: 'status' });
    const copy = h('button', { type: 'button' }, 'Copy');
    copy.addEventListener('click', async () => {
      out.select();
      try {
        await navigator.clipboard.writeText(token);
        status.textContent = 'Copied.';
      } catch {
        status.textContent = 'Selected: press Ctrl+C to copy.';
      }
    });
    const dismiss = h('button', { type: 'button', onclick: () => clear(created) }, 'Done');
    clear(created, h('div', { class: 'once' },
      h('p', {}, h('strong', {}, 'Copy this credential now.'), ' It is shown only once and cannot be read again.'),
      h('div', { class: 'row' }, out, copy, dismiss, status)));
    out.focus();
    out.select();
  }

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    error.textContent = '';
    const params = { note: note.value.trim(), operationId: opId() };
    if (kind.value === 'worker') params.worker = true;
    else params.userId = kind.value;
    if (expires.value) params.expiresAt = new Date(expires.value).toISOString();
    try {
      const c = await ctx.conn.call('admin.credential.create', params);
      form.reset();
      showOnce(c.token);
      await load();
    } catch (err) { error.textContent = ctx.describe(err); }
  });

  clear(view, h('h1', {}, 'Credentials'), error, form, created, list);
  document.title = 'Credentials — Berth';
  loadUsers().catch((err) => { error.textContent = ctx.describe(err); });
  load();
}

export function adminWorkers(ctx, view) {
  const error = errorLine();
  const figures = h('div', { 'aria-live': 'polite' });
  const spaces = h('div', { 'aria-live': 'polite' });
  const workers = h('div', { 'aria-live': 'polite' });
  const refresh = h('button', { type: 'button' }, 'Refresh');

  async function load() {
    error.textContent = '';
    try {
      const [status, list, workerList] = await Promise.all([
        ctx.conn.call('admin.status', {}),
        ctx.conn.call('workspace.list', {}),
        ctx.conn.call('admin.worker.list', {}),
      ]);
      clear(figures, h('dl', { class: 'figures' },
        h('div', {}, h('dt', {}, 'Connected workers'), h('dd', { dataset: { figure: 'connectedWorkers' } }, status.connectedWorkers)),
        h('div', {}, h('dt', {}, 'Running turns'), h('dd', { dataset: { figure: 'runningTurns' } }, status.runningTurns)),
        h('div', {}, h('dt', {}, 'Queued prompts'), h('dd', { dataset: { figure: 'queueDepth' } }, status.queueDepth)),
        h('div', {}, h('dt', {}, 'Replicas holding workers'), h('dd', {}, status.replicas.length ? status.replicas.join(', ') : '—')),
        h('div', {}, h('dt', {}, 'This replica'), h('dd', {}, status.replicaId))));
      clear(spaces, table('Workspaces', ['Title', 'Host', 'Path', 'Worker', 'Last seen'],
        list.map((w) => h('tr', {},
          h('td', {}, h('a', { href: `#/workspace/${encodeURIComponent(w.workspaceId)}` }, w.title || w.workspaceId)),
          h('td', {}, w.host), h('td', { class: 'mono' }, w.path),
          h('td', {}, h('span', { class: w.online ? 'ok' : 'off' }, w.online ? 'online' : 'offline')),
          h('td', {}, when(w.lastSeenAt)))),
        'No workspaces yet: start a worker with a worker credential.'));
      const titles = new Map(list.map((w) => [w.workspaceId, w.title || w.workspaceId]));
      clear(workers, table('Workers', ['Worker', 'Host', 'State', 'Replica', 'Connected', 'Last seen', 'Workspaces'],
        workerList.map((w) => h('tr', { dataset: { worker: w.credentialId } },
          h('td', {}, w.note || w.credentialId), h('td', {}, w.host || '—'),
          h('td', {}, w.revokedAt ? h('span', { class: 'off' }, 'revoked') : h('span', { class: w.online ? 'ok' : 'off' }, w.online ? 'online' : 'offline')),
          h('td', { class: 'mono' }, w.replicaId || '—'), h('td', {}, when(w.connectedAt)), h('td', {}, when(w.lastSeenAt)),
          h('td', {}, w.workspaceIds.map((id) => titles.get(id) || id).join(', ') || '—'))),
        'No worker credentials: create one on the Credentials page.'));
    } catch (err) { error.textContent = ctx.describe(err); }
  }
  refresh.addEventListener('click', load);
  clear(view, h('div', { class: 'row' }, h('h1', {}, 'Workers & status'), refresh), error,
    h('h2', {}, 'Status'), figures, spaces, workers);
  document.title = 'Workers — Berth';
  load();
}

export function adminAudit(ctx, view) {
  const error = errorLine();
  const body = h('tbody');
  const more = h('button', { type: 'button', hidden: true }, 'Older entries');
  let before = null;
  async function page() {
    try {
      const r = await ctx.conn.call('admin.audit.list', { before, limit: 100 });
      body.append(...r.entries.map((e) => h('tr', { dataset: { audit: e.auditId } },
        h('td', {}, when(e.at)), h('td', { class: 'mono' }, e.actor), h('td', {}, e.action), h('td', { class: 'mono' }, e.target))));
      before = r.nextBefore ?? null;
      more.hidden = before === null;
    } catch (err) { error.textContent = ctx.describe(err); }
  }
  more.addEventListener('click', page);
  clear(view, h('h1', {}, 'Audit log'), error,
    h('table', {}, h('caption', {}, 'Administrative actions, newest first'),
      h('thead', {}, h('tr', {}, ['When', 'Who', 'Action', 'Target'].map((t) => h('th', { scope: 'col' }, t)))), body),
    more);
  document.title = 'Audit log — Berth';
  page();
}

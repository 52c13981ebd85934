// Member pages: workspaces, and a workspace's sessions (the `session.list` contract).
import { h, clear, field, when, opId } from './dom.js';

export function workspaces(ctx, view) {
  const error = h('p', { class: 'error', role: 'alert' });
  const list = h('div', { 'aria-live': 'polite' });
  clear(view, h('h1', {}, 'Workspaces'), error, list);
  document.title = 'Workspaces — Berth';
  ctx.conn.call('workspace.list', {}).then((spaces) => {
    if (!spaces.length) {
      clear(list, h('p', { class: 'muted' }, 'No workspaces yet: a worker registers them when it connects.'));
      return;
    }
    clear(list, h('ul', { class: 'cards' }, spaces.map((w) => h('li', {},
      h('a', { href: `#/workspace/${encodeURIComponent(w.workspaceId)}` }, w.title || w.workspaceId),
      h('span', { class: w.online ? 'ok' : 'off' }, w.online ? 'online' : 'offline'),
      h('small', { class: 'mono' }, `${w.host}:${w.path}`),
      h('small', {}, 'last seen ', when(w.lastSeenAt))))));
  }).catch((err) => { error.textContent = ctx.describe(err); });
}

export function workspaceSessions(ctx, view, workspaceId) {
  const error = h('p', { class: 'error', role: 'alert' });
  const heading = h('h1', {}, 'Sessions');
  const list = h('div', { 'aria-live': 'polite' });
  const more = h('button', { type: 'button', hidden: true }, 'Older sessions');
  const title = h('input', { name: 'title', autocomplete: 'off', maxlength: 200 });
  const autoApprove = h('input', { type: 'checkbox', name: 'autoApprove' });
  const form = h('form', { class: 'inline', 'aria-labelledby': 'new-session-h' },
    h('h2', { id: 'new-session-h' }, 'New session'),
    field('Title (optional)', title),
    h('div', { class: 'field check' }, autoApprove, h('label', { for: (autoApprove.id = 'auto-approve') }, 'Run tools without asking')),
    h('button', { type: 'submit' }, 'Create session'));
  const body = h('tbody');
  let after = null;

  function row(s) {
    return h('tr', { dataset: { session: s.sessionId } },
      h('td', {}, h('a', { href: `#/session/${encodeURIComponent(s.sessionId)}` }, s.title || '(untitled)')),
      h('td', {}, s.phase), h('td', {}, s.running ? 'yes' : '—'), h('td', {}, s.queued),
      h('td', {}, s.messageCount), h('td', {}, s.effectiveModelId || '—'), h('td', {}, when(s.updatedAt)));
  }

  async function page() {
    try {
      const r = await ctx.conn.call('session.list', { workspaceId, limit: 50, after });
      body.append(...r.entries.map(row));
      after = r.nextAfter || null;
      more.hidden = !after;
      if (!body.children.length) clear(list, h('p', { class: 'muted' }, 'No sessions yet.'));
    } catch (err) { error.textContent = ctx.describe(err); }
  }

  more.addEventListener('click', page);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const params = { workspaceId, operationId: opId() };
    if (title.value.trim()) params.title = title.value.trim();
    if (autoApprove.checked) params.autoApprove = true;
    try {
      const s = await ctx.conn.call('session.create', params);
      ctx.go(`#/session/${encodeURIComponent(s.sessionId)}`);
    } catch (err) { error.textContent = ctx.describe(err); }
  });

  clear(list, h('table', {}, h('caption', {}, 'Sessions, most recently updated first'),
    h('thead', {}, h('tr', {}, ['Title', 'Phase', 'Running', 'Queued', 'Messages', 'Model', 'Updated'].map((t) => h('th', { scope: 'col' }, t)))),
    body));
  clear(view, h('p', {}, h('a', { href: '#/workspaces' }, '← Workspaces')), heading, error, form, list, more);
  document.title = 'Sessions — Berth';
  ctx.conn.call('workspace.get', { workspaceId }).then((w) => {
    heading.textContent = `Sessions in ${w.title || w.workspaceId}`;
    document.title = `${w.title} — Berth`;
  }).catch((err) => { error.textContent = ctx.describe(err); });
  page();
}

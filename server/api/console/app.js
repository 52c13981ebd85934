// The console's shell: sign-in, navigation by URL hash, and the connection's life.
import { h, clear, field } from './dom.js';
import { Connection, login, describe, closeReason } from './rpc.js';
import { adminUsers, adminCredentials, adminWorkers, adminAudit } from './admin.js';
import { workspaces, workspaceSessions } from './sessions.js';
import { sessionView } from './session.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const banner = document.getElementById('banner');

// The only place the signed-in connection (and so the token) lives: this module's memory.
let conn = null;
let cleanup = null;

function showBanner(text, actions) {
  clear(banner, text ? h('div', { class: 'banner' }, h('span', {}, text), actions || null) : null);
}

function signOut(message) {
  if (conn) conn.close();
  conn = null;
  if (cleanup) { cleanup(); cleanup = null; }
  clear(nav);
  clear(who);
  signInPage(message);
}

function signInPage(message) {
  const tenant = h('input', { name: 'tenant', autocomplete: 'organization', value: 'default', required: true });
  const email = h('input', { name: 'email', type: 'email', autocomplete: 'username', required: true });
  const password = h('input', { name: 'password', type: 'password', autocomplete: 'current-password', required: true });
  const token = h('input', { name: 'credential', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false' });
  const error = h('p', { class: 'error', role: 'alert' }, message || '');
  const busy = (form, on) => form.querySelectorAll('button').forEach((b) => { b.disabled = on; });

  const withPassword = h('form', { 'aria-labelledby': 'pw-h' },
    h('h2', { id: 'pw-h' }, 'Sign in with a password'),
    field('Team', tenant), field('Email', email), field('Password', password),
    h('button', { type: 'submit' }, 'Sign in'));
  withPassword.addEventListener('submit', async (e) => {
    e.preventDefault();
    busy(withPassword, true);
    try {
      const jwt = await login(tenant.value.trim(), email.value.trim(), password.value);
      await start(jwt);
    } catch (err) {
      error.textContent = describe(err);
    } finally { busy(withPassword, false); }
  });

  const withToken = h('form', { 'aria-labelledby': 'tok-h' },
    h('h2', { id: 'tok-h' }, 'Sign in with a credential'),
    field('Credential', token, 'A berth_… token an administrator gave you.'),
    h('button', { type: 'submit' }, 'Sign in'));
  withToken.addEventListener('submit', async (e) => {
    e.preventDefault();
    busy(withToken, true);
    try {
      await start(token.value.trim());
    } catch (err) {
      error.textContent = describe(err);
    } finally { busy(withToken, false); }
  });

  showBanner('');
  clear(main, h('section', { class: 'signin' }, h('h1', {}, 'Berth console'), error, h('div', { class: 'cols' }, withPassword, withToken)));
  document.title = 'Sign in — Berth';
}

async function start(token) {
  const c = new Connection();
  try {
    await c.open(token);
  } catch (err) {
    c.close();
    throw err;
  }
  conn = c;
  c.onclose = (ev) => {
    // Keep the page as it is (so the person sees what they were doing) and say why.
    conn = null;
    document.body.classList.add('disconnected');
    showBanner(`Disconnected: ${closeReason(ev)}`,
      h('button', { type: 'button', onclick: () => { document.body.classList.remove('disconnected'); signOut(); } }, 'Sign in again'));
  };
  document.body.classList.remove('disconnected');
  const me = c.me;
  const name = me.email || (me.userId ? `user ${me.userId}` : 'a credential without a user');
  clear(who, h('span', { class: 'me', title: `${me.role} in this team` }, name), ` (${me.role}) · `,
    h('button', { type: 'button', class: 'link', onclick: () => signOut() }, 'Sign out'));
  const links = [['#/workspaces', 'Workspaces']];
  if (me.role === 'admin') {
    links.push(['#/admin/users', 'Users'], ['#/admin/credentials', 'Credentials'], ['#/admin/workers', 'Workers & status'], ['#/admin/audit', 'Audit log']);
  }
  clear(nav, h('ul', {}, links.map(([href, text]) => h('li', {}, h('a', { href }, text)))));
  showBanner('');
  route();
}

const ROUTES = [
  [/^#\/workspaces$/, workspaces],
  [/^#\/workspace\/([^/]+)$/, workspaceSessions],
  [/^#\/session\/([^/]+)$/, sessionView],
  [/^#\/admin\/users$/, adminUsers],
  [/^#\/admin\/credentials$/, adminCredentials],
  [/^#\/admin\/workers$/, adminWorkers],
  [/^#\/admin\/audit$/, adminAudit],
];

function route() {
  if (!conn) return;
  if (cleanup) { cleanup(); cleanup = null; }
  const hash = location.hash || '#/workspaces';
  for (const a of nav.querySelectorAll('a')) {
    if (hash.startsWith(a.getAttribute('href'))) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const found = ROUTES.find(([re]) => re.test(hash));
  if (!found) {
    location.hash = '#/workspaces';
    return;
  }
  const args = hash.match(found[0]).slice(1).map(decodeURIComponent);
  const view = h('div', { class: 'view' });
  clear(main, view);
  const ctx = { conn, me: conn.me, describe, go: (to) => { location.hash = to; } };
  cleanup = found[1](ctx, view, ...args) || null;
  main.focus({ preventScroll: true });
}

window.addEventListener('hashchange', route);
signInPage();

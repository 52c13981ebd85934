// Browser scenarios for the web console, driven by `tests/tests/console.rs` (which starts
// the real stack and passes its coordinates in the environment). Headless Chromium from
// Debian, driven by playwright-core. Prints one `ok <step>` line per step; any failure
// exits non-zero with the reason. Secrets are never printed.
//
//   node scenarios.mjs <admin|member|reading|question>
//
// Environment: BERTH_URL, BERTH_PLAYWRIGHT_CORE (path of playwright-core's index.mjs),
// BERTH_CHROMIUM, BERTH_SHOTS (screenshot dir), and per scenario: BERTH_ADMIN_TOKEN;
// BERTH_MEMBER_EMAIL, BERTH_MEMBER_PASSWORD, BERTH_WORKSPACE_TITLE.

import path from 'node:path';

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const { chromium } = await import(env('BERTH_PLAYWRIGHT_CORE'));
const base = env('BERTH_URL');
const shots = env('BERTH_SHOTS');
const scenario = process.argv[2];
const TIMEOUT = 30_000;

const ok = (step) => console.log(`ok ${step}`);

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

const browser = await chromium.launch({
  executablePath: env('BERTH_CHROMIUM'),
  // Root in CI containers has no user namespaces for Chromium's sandbox.
  args: ['--no-sandbox', '--disable-dev-shm-usage'],
});

/// A fresh page (own context: own memory, no shared state) that fails the run on any
/// console error, uncaught exception or Content-Security-Policy violation.
async function newPage(name) {
  const context = await browser.newContext({ viewport: { width: 1366, height: 860 } });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  page.problems = [];
  page.on('pageerror', (e) => page.problems.push(`${name}: page error: ${e.message}`));
  page.on('console', (m) => {
    // A WebSocket closed by the server is logged by Chromium as an error; it is expected
    // when a credential is revoked.
    if (m.type() === 'error' && !/WebSocket/.test(m.text())) page.problems.push(`${name}: console error: ${m.text()}`);
  });
  await page.addInitScript(() => {
    document.addEventListener('securitypolicyviolation', (e) => {
      console.error(`CSP violation: ${e.violatedDirective} ${e.blockedURI}`);
    });
  });
  return page;
}

function clean(page) {
  check(page.problems.length === 0, page.problems.join('; '));
}

/// A screenshot of a main page, after checking that every control on it has a name a
/// screen reader can read (a <label>, aria-label or aria-labelledby).
async function shot(page, name) {
  const unnamed = await page.evaluate(() => Array.from(document.querySelectorAll('input, select, textarea, button'))
    .filter((el) => !el.hidden && !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
      && !el.getAttribute('aria-labelledby') && !(el.tagName === 'BUTTON' && el.textContent.trim()))
    .map((el) => el.outerHTML.slice(0, 80)));
  check(unnamed.length === 0, `${name}: controls without a name: ${unnamed.join(' | ')}`);
  await page.screenshot({ path: path.join(shots, `${name}.png`), fullPage: true });
}

async function signInWithCredential(page, token) {
  await page.getByLabel('Credential', { exact: true }).fill(token);
  await page.getByRole('form', { name: 'Sign in with a credential' }).getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('button', { name: 'Sign out' }).waitFor();
}

async function signInWithPassword(page, email, password) {
  await page.getByLabel('Email', { exact: true }).fill(email);
  await page.getByLabel('Password', { exact: true }).fill(password);
  await page.getByRole('form', { name: 'Sign in with a password' }).getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('button', { name: 'Sign out' }).waitFor();
}

/// An admin signs in, creates a member and a credential for them; the member signs in with
/// it (so it works over the WebSocket); the admin revokes it; the member's open page says
/// it was disconnected.
async function adminScenario() {
  const admin = await newPage('admin');
  const res = await admin.goto(base + '/');
  check(res.ok(), 'the console loads');
  await admin.getByRole('heading', { name: 'Berth console' }).waitFor();
  await shot(admin, 'signin');

  // A wrong credential is refused with the typed error's wording, not raw JSON.
  await admin.getByLabel('Credential', { exact: true }).fill('berth_not-a-real-token');
  await admin.getByRole('form', { name: 'Sign in with a credential' }).getByRole('button', { name: 'Sign in' }).click();
  await admin.getByRole('alert').filter({ hasText: 'credential is not valid' }).waitFor();
  ok('a wrong credential is refused with a readable error');

  await signInWithCredential(admin, env('BERTH_ADMIN_TOKEN'));
  ok('admin signed in');

  await admin.getByRole('link', { name: 'Users' }).click();
  await admin.getByRole('heading', { name: 'Users', level: 1 }).waitFor();
  const email = 'member@example.com';
  await admin.getByLabel('Email', { exact: true }).fill(email);
  await admin.getByLabel('Role', { exact: true }).selectOption('member');
  await admin.getByRole('button', { name: 'Create user' }).click();
  const userRow = admin.locator(`tr[data-user="${email}"]`);
  await userRow.waitFor();
  check((await userRow.textContent()).includes('member'), 'the new user is a member');
  // A malformed address comes back as the typed bad-params error.
  await admin.getByLabel('Email', { exact: true }).fill('not-an-address@');
  await admin.getByLabel('Email', { exact: true }).evaluate((el) => { el.type = 'text'; el.value = 'no-at-sign'; });
  await admin.getByRole('button', { name: 'Create user' }).click();
  await admin.getByRole('alert').filter({ hasText: 'The request was not valid' }).waitFor();
  await shot(admin, 'users');
  ok('admin created a member');

  await admin.getByRole('link', { name: 'Credentials' }).click();
  await admin.getByRole('heading', { name: 'Credentials', level: 1 }).waitFor();
  await admin.getByLabel('For', { exact: true }).selectOption({ label: `user ${email}` });
  await admin.getByLabel('Note', { exact: true }).fill('member laptop');
  await admin.getByRole('button', { name: 'Create credential' }).click();
  const secret = admin.getByLabel('The new credential', { exact: true });
  await secret.waitFor();
  const token = await secret.inputValue();
  check(/^berth_[0-9a-f]{72}$/.test(token), 'the plaintext credential is shown');
  await admin.getByRole('button', { name: 'Copy' }).click();
  await admin.getByRole('status').filter({ hasText: /Copied|Selected/ }).waitFor();
  const credRow = admin.locator('tr', { hasText: 'member laptop' });
  await credRow.waitFor();
  check((await credRow.textContent()).includes(email), 'the credential is listed with its user');
  await admin.getByRole('button', { name: 'Done' }).click();
  check(await secret.count() === 0, 'the plaintext is gone once dismissed');
  ok('admin created a credential, shown once');

  // The member signs in with the keyboard alone: type the credential, press Enter.
  const member = await newPage('member');
  await member.goto(base + '/');
  await member.getByLabel('Credential', { exact: true }).focus();
  await member.keyboard.type(token);
  await member.keyboard.press('Enter');
  await member.getByRole('button', { name: 'Sign out' }).waitFor();
  await member.getByRole('heading', { name: 'Workspaces' }).waitFor();
  await member.getByRole('link', { name: env('BERTH_WORKSPACE_TITLE') }).waitFor();
  check(await member.getByRole('link', { name: 'Users' }).count() === 0, 'a member sees no admin pages');
  await shot(member, 'workspaces');
  ok("the member's credential works over the WebSocket");

  // Last used now shows; then revoke, with a confirmation.
  await admin.reload();
  await signInWithCredential(admin, env('BERTH_ADMIN_TOKEN'));
  await admin.goto(base + '/#/admin/credentials');
  await credRow.waitFor();
  check(!(await credRow.locator('td').nth(4).textContent()).includes('—'), 'last used is shown');
  await shot(admin, 'credentials');
  await credRow.getByRole('button', { name: /^Revoke/ }).click();
  const dialog = admin.getByRole('dialog');
  await dialog.waitFor();
  check((await dialog.textContent()).includes('member laptop'), 'the confirmation names the credential');
  await dialog.getByRole('button', { name: 'Cancel' }).click();
  check(!(await credRow.textContent()).includes('revoked'), 'cancel keeps the credential');
  await credRow.getByRole('button', { name: /^Revoke/ }).click();
  await admin.getByRole('dialog').getByRole('button', { name: 'Revoke' }).click();
  await credRow.filter({ hasText: 'revoked' }).waitFor();
  ok('admin revoked the credential');

  await member.getByRole('alert').filter({ hasText: 'Disconnected: Your access was revoked' }).waitFor();
  await shot(member, 'revoked');
  ok("the member's open page shows it was disconnected");

  // Signing in again with the revoked credential fails.
  await member.getByRole('button', { name: 'Sign in again' }).click();
  await member.getByLabel('Credential', { exact: true }).fill(token);
  await member.getByRole('form', { name: 'Sign in with a credential' }).getByRole('button', { name: 'Sign in' }).click();
  await member.getByRole('alert').filter({ hasText: 'credential is not valid' }).waitFor();
  ok('the revoked credential no longer signs in');

  await admin.getByRole('link', { name: 'Workers & status' }).click();
  await admin.locator('dd[data-figure="connectedWorkers"]').filter({ hasText: '1' }).waitFor();
  const worker = admin.locator('tr[data-worker]', { hasText: 'test worker' });
  await worker.filter({ hasText: 'online' }).waitFor();
  check((await worker.textContent()).includes('proj'), 'the worker lists its workspace');
  check(/rep_/.test(await worker.textContent()), 'the worker shows its replica');
  await shot(admin, 'workers');
  ok('workers and status show the connected worker, its replica and workspace');

  // Roles: make the member an admin (confirmed), then a member again.
  await admin.getByRole('link', { name: 'Users' }).click();
  await userRow.getByRole('button', { name: `Make ${email} an admin` }).click();
  await admin.getByRole('dialog').getByRole('button', { name: 'Change role' }).click();
  await userRow.getByRole('button', { name: `Make ${email} a member` }).waitFor();
  check((await userRow.locator('td').nth(1).textContent()) === 'admin', 'the member is now an admin');
  await userRow.getByRole('button', { name: `Make ${email} a member` }).click();
  await admin.getByRole('dialog').getByRole('button', { name: 'Change role' }).click();
  await userRow.getByRole('button', { name: `Make ${email} an admin` }).waitFor();
  ok('admin changed the member\'s role and back');

  await userRow.getByRole('button', { name: `Disable ${email}` }).click();
  await admin.getByRole('dialog').getByRole('button', { name: 'Disable' }).click();
  await userRow.filter({ hasText: 'disabled' }).waitFor();
  ok('admin disabled the member, with a confirmation');

  await admin.getByRole('link', { name: 'Audit log' }).click();
  await admin.getByRole('heading', { name: 'Audit log' }).waitFor();
  for (const action of ['user.create', 'credential.create', 'credential.revoke', 'user.role', 'user.disable']) {
    await admin.getByRole('cell', { name: action, exact: true }).first().waitFor();
  }
  await shot(admin, 'audit');
  ok('the audit log shows what the admin did');

  clean(admin);
  clean(member);
}

/// A member signs in with a password, creates a session, sends a prompt, watches the answer
/// stream, approves a tool call, sees the result, searches, and after a reload sees it all.
async function memberScenario() {
  const email = env('BERTH_MEMBER_EMAIL');
  const password = env('BERTH_MEMBER_PASSWORD');
  const page = await newPage('member');
  await page.goto(base + '/');
  await signInWithPassword(page, email, password);
  ok('member signed in with a password');

  await page.getByRole('link', { name: env('BERTH_WORKSPACE_TITLE') }).click();
  await page.getByRole('heading', { name: /^Sessions in/ }).waitFor();
  await page.getByLabel('Title (optional)', { exact: true }).fill('console session');
  await page.getByRole('button', { name: 'Create session' }).click();
  await page.getByRole('heading', { name: 'console session' }).waitFor();
  ok('member created a session');

  await page.getByLabel('Prompt', { exact: true }).fill('Write a greeting file, please.');
  await page.getByLabel('Prompt', { exact: true }).press('Control+Enter');
  await page.locator('li.row.user', { hasText: 'Write a greeting file' }).waitFor();
  await page.locator('.streaming .text', { hasText: 'Let me write' }).waitFor();
  await page.getByRole('status').filter({ hasText: 'Running' }).waitFor();
  await shot(page, 'session-streaming');
  ok('the answer streams');

  const approval = page.getByRole('group', { name: 'Approve write_file?' });
  await approval.waitFor();
  check((await approval.textContent()).includes('greeting.txt'), 'the approval shows the call');
  check(!(await page.getByRole('button', { name: 'Stop turn' }).isDisabled()), 'a running turn can be stopped');
  await shot(page, 'session-approval');

  // While the turn waits, a second prompt is queued; edit it, pause and resume, remove it.
  await page.getByLabel('Prompt', { exact: true }).fill('A second prompt');
  await page.getByRole('button', { name: 'Send', exact: true }).click();
  const queue = page.locator('section.queue');
  await queue.locator('li', { hasText: 'A second prompt' }).waitFor();
  await queue.getByRole('heading', { name: 'Queue (1)' }).waitFor();
  await queue.getByRole('button', { name: 'Edit queued prompt 1' }).click();
  const box = queue.getByLabel('Queued prompt 1', { exact: true });
  check((await box.inputValue()) === 'A second prompt', 'the whole queued prompt is loaded for editing');
  await box.fill('A second prompt, edited');
  await queue.getByRole('button', { name: 'Save' }).click();
  await queue.locator('.preview', { hasText: 'A second prompt, edited' }).waitFor();
  await page.getByRole('button', { name: 'Pause queue' }).click();
  await queue.getByRole('heading', { name: /paused/ }).waitFor();
  await shot(page, 'session-queue');
  await page.getByRole('button', { name: 'Resume queue' }).click();
  await queue.getByRole('heading', { name: 'Queue (1)', exact: true }).waitFor();
  await queue.getByRole('button', { name: 'Remove queued prompt 1' }).click();
  await queue.getByRole('heading', { name: 'Queue (0)' }).waitFor();
  ok('the queue shows, edits, pauses and removes a queued prompt');

  await approval.getByRole('button', { name: 'Approve' }).click();
  await approval.waitFor({ state: 'detached' });
  ok('member approved the tool call');

  await page.locator('li.toolResult', { hasText: 'write_file' }).waitFor();
  await page.locator('li.toolCall .status.completed').waitFor();
  await page.locator('li.row.assistant', { hasText: 'The greeting is written.' }).waitFor();
  await page.locator('li.marker', { hasText: 'Turn completed' }).waitFor();
  await page.getByRole('status').filter({ hasText: 'Idle' }).waitFor();
  ok('the result and the turn end show');

  await page.getByLabel('Search this session', { exact: true }).fill('greeting');
  await page.getByRole('button', { name: 'Search', exact: true }).click();
  await page.getByRole('status').filter({ hasText: /\d+ match/ }).waitFor();
  await page.getByRole('list', { name: 'Search results' }).getByRole('button').first().click();
  await page.locator('li.row.hit').waitFor();
  await shot(page, 'session-search');
  ok('search finds and opens a hit');

  // Reload: the token was in memory only, so sign in again; the page comes back to the session.
  await page.reload();
  await page.getByRole('heading', { name: 'Berth console' }).waitFor();
  await signInWithPassword(page, email, password);
  await page.getByRole('heading', { name: 'console session' }).waitFor();
  await page.locator('li.row.user', { hasText: 'Write a greeting file' }).waitFor();
  await page.locator('li.toolCall .status.completed').waitFor();
  await page.locator('li.toolResult', { hasText: 'write_file' }).waitFor();
  await page.locator('li.row.assistant', { hasText: 'The greeting is written.' }).waitFor();
  check(await page.locator('.streaming').count() === 0, 'no live block after the turn');
  await shot(page, 'session-reloaded');
  ok('after a reload the history shows the result');

  // A turn that hangs is stopped from the page.
  await page.getByLabel('Prompt', { exact: true }).fill('Think forever');
  await page.getByRole('button', { name: 'Send', exact: true }).click();
  await page.locator('.streaming .text', { hasText: 'Thinking about it' }).waitFor();
  // The prompt removed from the queue above ended `cancelled` too (its marker is back after
  // the reload): wait for this turn's, the next one.
  const cancelled = page.locator('li.marker', { hasText: 'Turn cancelled' });
  const before = await cancelled.count();
  await page.getByRole('button', { name: 'Stop turn' }).click();
  await cancelled.nth(before).waitFor();
  await page.getByRole('status').filter({ hasText: 'Idle' }).waitFor();
  check(await page.getByRole('button', { name: 'Stop turn' }).isDisabled(), 'nothing left to stop');
  ok('member stopped a running turn');

  await page.getByRole('link', { name: '← Sessions' }).click();
  const row = page.locator('tr', { hasText: 'console session' });
  await row.waitFor();
  check((await row.textContent()).includes('idle'), 'the session list shows the phase');
  await shot(page, 'sessions');
  ok('the session list shows the session');
  clean(page);
}

/// Issue 52: the model's markdown rendered safely; turn ends marked (a failure with its cause
/// in words), a stopped turn's text kept, live and on reopen; an approval's expiry and
/// fallback; the signed-in email; an unknown session without a composer; a phone's width.
async function readingScenario() {
  const email = env('BERTH_MEMBER_EMAIL');
  const password = env('BERTH_MEMBER_PASSWORD');
  const page = await newPage('reading');
  await page.goto(base + '/');
  await signInWithPassword(page, email, password);
  await page.locator('#who', { hasText: email }).waitFor();
  ok('the signed-in email is shown');

  await page.getByRole('link', { name: env('BERTH_WORKSPACE_TITLE') }).click();
  await page.getByLabel('Title (optional)', { exact: true }).fill('reading session');
  await page.getByRole('button', { name: 'Create session' }).click();
  await page.getByRole('heading', { name: 'reading session' }).waitFor();
  const sessionUrl = page.url();
  const send = async (text) => {
    await page.getByLabel('Prompt', { exact: true }).fill(text);
    await page.getByRole('button', { name: 'Send', exact: true }).click();
    await page.locator('li.row.user', { hasText: text }).waitFor();
  };
  const markers = () => page.locator('li.marker').allTextContents();

  // 1. Markdown, built as nodes: nothing from the model becomes markup or a script.
  await send('Show me markdown');
  const answer = page.locator('li.row.assistant').first();
  await answer.locator('strong', { hasText: 'bold' }).waitFor();
  await page.locator('li.marker', { hasText: 'Turn completed' }).waitFor();
  check(await answer.locator('code', { hasText: 'inline_code' }).count() === 1, 'inline code');
  check(await answer.locator('ul > li').count() === 2, 'a bullet list of two');
  check(await answer.locator('ol > li').count() === 2, 'a numbered list of two');
  check((await answer.locator('pre.code code').textContent()) === 'let x = 1 < 2;', 'a fenced block, verbatim');
  const link = answer.locator('a', { hasText: 'the docs' });
  check((await link.getAttribute('href')) === 'https://example.com/docs', 'a safe link');
  check((await link.getAttribute('rel')).includes('noopener'), 'the link opens without an opener');
  check(await answer.locator('a[href^="javascript"]').count() === 0, 'no javascript: link');
  check((await answer.textContent()).includes('[bad](javascript:alert(1))'), 'an unsafe link stays text');
  check(await page.locator('.log img, .log script').count() === 0, 'no element from the model\'s text');
  check((await answer.textContent()).includes('<img src=x onerror=alert(1)>'), 'markup stays text');
  check((await answer.textContent()).includes('after the traps'), 'lines that could stall the renderer render');
  check(await answer.locator('blockquote').count() > 0, 'a deep quote is quoted');
  await shot(page, 'reading-markdown');
  ok('markdown renders as nodes, links only when safe');

  // 2. A failed turn: its cause in words.
  await send('Fail please');
  await page.locator('li.marker.failed', { hasText: 'the model endpoint answered with an error (provider-status 400)' }).waitFor();
  ok('a failed turn is marked with its cause in words');

  // 3. An approval card says until when and what happens without an answer.
  await send('Write a file');
  const approval = page.getByRole('group', { name: 'Approve write_file?' });
  await approval.waitFor();
  const card = await approval.textContent();
  check(/Answer by .+; if nobody does, it is denied\./.test(card), `expiry and fallback: ${card}`);
  check(await approval.locator('time[datetime]').count() === 1, 'the expiry is a time');
  await shot(page, 'reading-approval');
  await approval.getByRole('button', { name: 'Deny' }).click();
  await page.locator('li.row.assistant', { hasText: 'Not writing it then.' }).waitFor();
  ok('the approval card shows its expiry and fallback');

  // 4. A stopped turn keeps its text, live.
  await send('Think for a long time');
  await page.locator('.streaming .text', { hasText: 'Partial words so far' }).waitFor();
  await page.waitForTimeout(300); // the server stores live text every 50 ms
  await page.getByRole('button', { name: 'Stop turn' }).click();
  await page.locator('li.marker', { hasText: 'Turn cancelled' }).waitFor();
  await page.locator('li.row.assistant:not(.streaming)', { hasText: 'Partial words so far' }).waitFor();
  check(await page.locator('.streaming').count() === 0, 'the live block became the kept row');
  const live = await markers();
  await shot(page, 'reading-stopped');
  ok('a stopped turn keeps its text live');

  // Reopen: the same markers, in their places, and the stopped turn's text.
  await page.reload();
  await signInWithPassword(page, email, password);
  await page.getByRole('heading', { name: 'reading session' }).waitFor();
  await page.locator('li.marker', { hasText: 'Turn cancelled' }).waitFor();
  const reopened = await markers();
  check(JSON.stringify(reopened) === JSON.stringify(live), `the same markers after a reopen: ${JSON.stringify(reopened)} vs ${JSON.stringify(live)}`);
  check(reopened.length === 4, `four turn ends: ${JSON.stringify(reopened)}`);
  await page.locator('li.row.assistant', { hasText: 'Partial words so far' }).waitFor();
  // Each marker follows its turn: the failure sits between the second and third prompts.
  const order = await page.locator('.log > li').evaluateAll((els) => els.map((e) => e.classList.contains('marker') ? 'M' : (e.classList.contains('user') ? 'U' : 'r')).join(''));
  check(/^U[r]*MU[r]*MU[r]*MU[r]*M$/.test(order), `markers after their turns: ${order}`);
  await page.locator('li.row.assistant strong', { hasText: 'bold' }).waitFor();
  await shot(page, 'reading-reopened');
  ok('on reopen: markers in place, the failure\'s cause, the stopped text, markdown');

  // An unknown session: no composer.
  await page.goto(base + '/#/session/ses_doesnotexist');
  await page.getByRole('heading', { name: 'Session not found' }).waitFor();
  check(await page.getByLabel('Prompt', { exact: true }).count() === 0, 'no composer');
  check(await page.getByRole('button', { name: 'Stop turn' }).count() === 0, 'no stop');
  await shot(page, 'reading-unknown-session');
  ok('an unknown session shows no composer');
  clean(page);

  // A phone: 390 px wide, nothing sideways.
  const context = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
  const phone = await context.newPage();
  phone.setDefaultTimeout(TIMEOUT);
  phone.problems = [];
  phone.on('pageerror', (e) => phone.problems.push(`phone: page error: ${e.message}`));
  const fits = async (what) => {
    const width = await phone.evaluate(() => document.documentElement.scrollWidth);
    check(width <= 390, `${what} fits 390 px (scroll width ${width})`);
  };
  await phone.goto(base + '/');
  await phone.getByRole('heading', { name: 'Berth console' }).waitFor();
  await fits('sign-in');
  await shot(phone, 'phone-signin');
  await signInWithPassword(phone, email, password);
  await phone.getByRole('heading', { name: 'Workspaces' }).waitFor();
  await fits('workspaces');
  await phone.goto(sessionUrl);
  await phone.locator('li.marker', { hasText: 'Turn cancelled' }).waitFor();
  await fits('a session');
  const box = await phone.getByLabel('Prompt', { exact: true }).boundingBox();
  check(box && box.x >= 0 && box.x + box.width <= 390, 'the prompt box is on screen');
  await shot(phone, 'phone-session');
  ok('usable at 390 px');
  clean(phone);
}

/// The model asks a question (its ask_user tool): the page shows the question with a button
/// per option, and the member's pick answers it; the turn goes on with the answer.
async function questionScenario() {
  const page = await newPage('question');
  await page.goto(base + '/');
  await signInWithPassword(page, env('BERTH_MEMBER_EMAIL'), env('BERTH_MEMBER_PASSWORD'));
  await page.getByRole('link', { name: env('BERTH_WORKSPACE_TITLE') }).click();
  await page.getByRole('heading', { name: /^Sessions in/ }).waitFor();
  await page.getByLabel('Title (optional)', { exact: true }).fill('question session');
  await page.getByRole('button', { name: 'Create session' }).click();
  await page.getByRole('heading', { name: 'question session' }).waitFor();
  await page.getByLabel('Prompt', { exact: true }).fill('Merge it, please.');
  await page.getByLabel('Prompt', { exact: true }).press('Control+Enter');
  const question = page.getByRole('group', { name: 'Question' });
  await question.waitFor();
  check((await question.textContent()).includes('Which branch?'), 'the question shows its text');
  check(await question.getByRole('button', { name: 'Skip' }).count() === 0, 'allowSkip: false offers no Skip');
  await shot(page, 'session-question');
  await question.getByRole('button', { name: 'dev', exact: true }).click();
  await question.waitFor({ state: 'detached' });
  ok('member answered the question');
  await page.locator('li.row.assistant', { hasText: 'Merged into dev.' }).waitFor();
  await page.locator('li.marker', { hasText: 'Turn completed' }).waitFor();
  ok('the turn went on with the answer');
  clean(page);
}


try {
  if (scenario === 'admin') await adminScenario();
  else if (scenario === 'member') await memberScenario();
  else if (scenario === 'reading') await readingScenario();
  else if (scenario === 'question') await questionScenario();
  else throw new Error(`unknown scenario ${scenario}`);
} catch (e) {
  console.error(`FAILED ${scenario}: ${e.message}`);
  await browser.close();
  process.exit(1);
}
await browser.close();

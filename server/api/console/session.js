// One session: history (`session.history`), then live (`session.watch`): streaming text,
// tool calls and results, turn ends; the prompt box, the queue, approvals, stop, search.
import { h, clear, field, opId, when } from './dom.js';
import { markdown } from './markdown.js';

const enc = new TextEncoder();
const dec = new TextDecoder();
const key = (p) => `${p.sourceSequence}:${p.itemIndex}`;

/// A turn's cause in words (the code stays, for searching).
const CAUSES = {
  'provider-unreachable': 'the model endpoint could not be reached',
  'provider-status': 'the model endpoint answered with an error',
  'provider-timeout': 'the model endpoint did not answer in time',
  'provider-protocol': 'the model endpoint’s answer could not be read',
  'provider-stream-ended': 'the model endpoint’s answer could not be read',
  'provider-rate-limited': 'the model endpoint is rate-limiting requests',
  'provider-unconfigured': 'no model is configured on the server',
  'context-overflow': 'the conversation no longer fits the model’s context',
  'step-limit': 'the turn used up its model steps',
  'tool-failed': 'a tool failed',
  'worker-lost': 'the worker running the turn went away',
  'workspace-offline': 'the workspace’s worker is offline',
  'internal': 'an internal error in Berth',
};

/// A turn end's marker text: `Turn failed: the model endpoint … (provider-status 502)`.
function endText(it) {
  const c = it.cause;
  if (!c) return `Turn ${it.state}`;
  const code = `${c.code}${c.status ? ` ${c.status}` : ''}`;
  return CAUSES[c.code] ? `Turn ${it.state}: ${CAUSES[c.code]} (${code})` : `Turn ${it.state} (${code})`;
}

/// An interaction's outcome when nobody answers, in words.
function fallbackText(f) {
  if (!f) return '';
  if ('approved' in f) return f.approved ? 'approved' : 'denied';
  return f.choice ? `“${f.choice}”` : 'no answer';
}

/// `text` with the UTF-8 byte range [start, end) cut out of it.
function byteSlice(text, start, end) {
  const b = enc.encode(text);
  return dec.decode(b.subarray(start, end));
}

export function sessionView(ctx, view, sessionId) {
  const { conn } = ctx;
  let watch = null;
  let ended = false;
  // The history's fence: watched events up to it were drawn from the history.
  let replayed = 0;
  // Row elements and texts by position, live step blocks by turn and step.
  const rows = new Map();
  const live = new Map();
  let state = { phase: 'idle', queue: [], pendingInteractions: [], paused: false, running: null };

  const error = h('p', { class: 'error', role: 'alert' });
  const title = h('h1', {}, 'Session');
  const phase = h('span', { class: 'phase', role: 'status', 'aria-live': 'polite' });
  const stop = h('button', { type: 'button', class: 'danger', disabled: true }, 'Stop turn');
  const pause = h('button', { type: 'button', 'aria-pressed': 'false' }, 'Pause queue');
  const log = h('ol', { class: 'log', 'aria-label': 'Conversation', 'aria-live': 'polite', 'aria-relevant': 'additions' });
  const approvals = h('section', { class: 'approvals', 'aria-label': 'Waiting for your answer' });
  const queue = h('section', { class: 'queue', 'aria-labelledby': 'queue-h' });
  const prompt = h('textarea', { name: 'prompt', rows: 3, required: true });
  const composer = h('form', { class: 'composer', 'aria-label': 'Send a prompt' },
    field('Prompt', prompt, 'Ctrl+Enter sends. While a turn runs, the prompt is queued.'),
    h('button', { type: 'submit' }, 'Send'));
  const searchBox = h('input', { type: 'search', name: 'query', required: true, autocomplete: 'off' });
  const caseSensitive = h('input', { type: 'checkbox', name: 'caseSensitive', id: 'search-case' });
  const wholeWord = h('input', { type: 'checkbox', name: 'wholeWord', id: 'search-word' });
  const hits = h('ol', { class: 'hits', 'aria-label': 'Search results' });
  const hitStatus = h('p', { role: 'status', class: 'muted' });
  const search = h('form', { class: 'search', role: 'search', 'aria-label': 'Session search' },
    field('Search this session', searchBox),
    h('div', { class: 'field check' }, caseSensitive, h('label', { for: 'search-case' }, 'Match case')),
    h('div', { class: 'field check' }, wholeWord, h('label', { for: 'search-word' }, 'Whole words')),
    h('button', { type: 'submit' }, 'Search'));

  const fail = (err) => { error.textContent = ctx.describe(err); };

  // ---- rows ----

  function rowEl(r) {
    const k = key(r.position);
    const cls = `row ${r.kind}`;
    let body;
    if (r.kind === 'toolCall') {
      let input = r.body;
      try { input = JSON.stringify(JSON.parse(r.body), null, 2); } catch { /* shown as sent */ }
      body = [h('div', { class: 'tool' }, h('span', { class: 'name' }, r.tool?.name || 'tool'), ' ',
        h('span', { class: `status ${r.tool?.status || ''}`, dataset: { status: '' } }, r.tool?.status || '')),
      h('pre', {}, input)];
    } else if (r.kind === 'toolResult') {
      body = [h('div', { class: 'tool' }, 'Result of ', h('span', { class: 'name' }, r.tool?.name || 'tool'),
        r.tool?.status ? ` (${r.tool.status})` : ''), h('pre', {}, r.body)];
    } else {
      body = [r.thinking ? h('details', { class: 'thinking' }, h('summary', {}, 'Thinking'), h('p', {}, r.thinking)) : null,
        r.kind === 'assistant' ? h('div', { class: 'text md' }, markdown(r.body)) : h('p', { class: 'text' }, r.body)];
    }
    const who = { user: 'You', assistant: 'Agent', toolCall: 'Tool call', toolResult: 'Tool result', notice: 'Notice' }[r.kind] || r.kind;
    const el = h('li', { class: cls, tabindex: '-1', dataset: { position: k, kind: r.kind, callId: r.tool?.callId } },
      h('span', { class: 'who' }, who), body);
    const cut = r.truncated?.body;
    if (cut?.truncated) {
      const more = h('button', { type: 'button', class: 'link' }, `Show the rest (${cut.bytes - cut.returned} more bytes)`);
      more.addEventListener('click', async () => {
        try {
          let text = '', offset = cut.returned;
          for (;;) {
            const s = await conn.call('session.source', { sessionId, position: r.position, field: 'body', offset });
            text += s.data;
            if (s.nextOffset === undefined || s.nextOffset === null) break;
            offset = s.nextOffset;
          }
          const target = el.querySelector('pre, .text');
          const whole = rows.get(k).text + text;
          if (target.classList.contains('md')) clear(target, markdown(whole));
          else target.textContent = whole;
          rows.get(k).text = whole;
          more.remove();
        } catch (err) { fail(err); }
      });
      el.appendChild(more);
    }
    return el;
  }

  function addRows(list) {
    for (const r of list || []) {
      if (r.hidden) continue;
      const k = key(r.position);
      if (rows.has(k)) continue;
      const el = rowEl(r);
      rows.set(k, { el, row: r, text: r.body });
      log.appendChild(el);
      if (r.kind === 'toolResult' && r.tool?.callId) setToolStatus(r.tool.callId, r.tool.status);
    }
  }

  function setToolStatus(callId, status) {
    for (const el of log.querySelectorAll('li.toolCall')) {
      if (el.dataset.callId === callId) {
        const s = el.querySelector('.status');
        s.textContent = status;
        s.className = `status ${status}`;
      }
    }
  }

  /// A marker (a turn's end, a notice) in its place in the log: after every row of an
  /// event up to `sequence` (at the end when there is none).
  function marker(text, cls, sequence) {
    const el = h('li', { class: `marker ${cls || ''}`, dataset: { sequence: sequence ?? '' } }, text);
    const seqOf = (x) => {
      if (x.dataset.position) return Number(x.dataset.position.split(':')[0]);
      if (x.dataset.sequence) return Number(x.dataset.sequence);
      return Infinity;
    };
    const after = sequence === undefined ? null : Array.from(log.children).find((x) => seqOf(x) > sequence);
    log.insertBefore(el, after || null);
  }

  // ---- live output ----

  function delta(d) {
    const k = `${d.turnId}:${d.step}`;
    let b = live.get(k);
    if (!b) {
      const text = h('div', { class: 'text md' });
      const thinking = h('p', { class: 'thinking-live' });
      const el = h('li', { class: 'row assistant streaming', dataset: { turn: d.turnId } },
        h('span', { class: 'who' }, 'Agent (writing…)'), thinking, text);
      b = { el, textEl: text, thinkingEl: thinking, text: new Uint8Array(), thinking: new Uint8Array() };
      live.set(k, b);
      log.appendChild(el);
    }
    const merge = (have, offset, piece) => {
      const add = enc.encode(piece);
      const at = Math.min(offset ?? have.length, have.length);
      if (at + add.length <= have.length) return have;
      const out = new Uint8Array(at + add.length);
      out.set(have.subarray(0, at));
      out.set(add, at);
      return out;
    };
    if (d.text) { b.text = merge(b.text, d.textOffset, d.text); clear(b.textEl, markdown(dec.decode(b.text))); }
    if (d.thinking) { b.thinking = merge(b.thinking, d.thinkingOffset, d.thinking); b.thinkingEl.textContent = dec.decode(b.thinking); }
  }

  function dropLive(turnId) {
    for (const [k, b] of live) {
      if (turnId === undefined || k.startsWith(`${turnId}:`)) { b.el.remove(); live.delete(k); }
    }
  }

  // ---- state: phase, queue, approvals ----

  function drawState() {
    const running = state.phase === 'running' && state.running;
    phase.textContent = running ? 'Running' : (state.phase === 'running' ? 'Starting' : 'Idle');
    phase.className = `phase ${state.phase}`;
    stop.disabled = !state.running;
    pause.textContent = state.paused ? 'Resume queue' : 'Pause queue';
    pause.setAttribute('aria-pressed', String(!!state.paused));
    drawQueue();
    drawApprovals();
  }

  function drawQueue() {
    const entries = state.queue || [];
    clear(queue, h('h2', { id: 'queue-h' }, `Queue (${entries.length})${state.paused ? ' — paused' : ''}`),
      entries.length ? h('ol', {}, entries.map((q, i) => {
        const li = h('li', { dataset: { queueId: q.queueId } }, h('span', { class: 'preview' }, q.preview));
        const edit = h('button', { type: 'button', 'aria-label': `Edit queued prompt ${i + 1}` }, 'Edit');
        const up = h('button', { type: 'button', disabled: i === 0, 'aria-label': `Move queued prompt ${i + 1} up` }, 'Move up');
        const remove = h('button', { type: 'button', class: 'danger', 'aria-label': `Remove queued prompt ${i + 1}` }, 'Remove');
        edit.addEventListener('click', async () => {
          try {
            const full = await conn.call('queue.get', { sessionId, queueId: q.queueId });
            const box = h('textarea', { rows: 3, 'aria-label': `Queued prompt ${i + 1}` });
            box.value = full.prompt;
            const save = h('button', { type: 'submit' }, 'Save');
            const cancel = h('button', { type: 'button', onclick: drawQueue }, 'Cancel');
            const f = h('form', { class: 'row' }, box, save, cancel);
            f.addEventListener('submit', async (e) => {
              e.preventDefault();
              try {
                await conn.call('queue.update', { sessionId, queueId: q.queueId, queueRevision: full.queueRevision, prompt: box.value, operationId: opId() });
              } catch (err) { fail(err); }
            });
            clear(li, f);
            box.focus();
          } catch (err) { fail(err); }
        });
        up.addEventListener('click', () => conn.call('queue.move',
          { sessionId, queueId: q.queueId, queueRevision: q.queueRevision, beforeQueueId: entries[i - 1].queueId, operationId: opId() }).catch(fail));
        remove.addEventListener('click', () => conn.call('queue.remove',
          { sessionId, queueId: q.queueId, queueRevision: q.queueRevision, operationId: opId() }).catch(fail));
        li.append(' ', edit, up, remove);
        return li;
      })) : h('p', { class: 'muted' }, 'Nothing queued.'));
  }

  function drawApprovals() {
    const list = state.pendingInteractions || [];
    clear(approvals, list.length ? [h('h2', {}, 'Waiting for your answer'), list.map((it) => {
      const answer = (a) => conn.call('session.respond', { interactionId: it.interactionId, answer: a, operationId: opId() })
        .then(() => { state.pendingInteractions = state.pendingInteractions.filter((x) => x.interactionId !== it.interactionId); drawApprovals(); })
        .catch(fail);
      const input = typeof it.input === 'string' ? it.input : JSON.stringify(it.input, null, 2);
      const expiry = it.expiresAt ? h('p', { class: 'muted expiry' }, 'Answer by ', when(it.expiresAt),
        `; if nobody does, it is ${fallbackText(it.fallback)}.`) : null;
      if (it.kind === 'approval') {
        return h('div', { class: 'interaction', role: 'group', 'aria-label': `Approve ${it.tool?.name || 'tool call'}?`, dataset: { interaction: it.interactionId } },
          h('p', {}, 'The agent wants to run ', h('strong', {}, it.tool?.name || 'a tool'), ':'),
          h('pre', {}, input),
          expiry,
          h('div', { class: 'row' },
            h('button', { type: 'button', class: 'primary', onclick: () => answer({ approved: true }) }, 'Approve'),
            h('button', { type: 'button', class: 'danger', onclick: () => answer({ approved: false }) }, 'Deny')));
      }
      // A question (the model's ask_user): its text, then controls by kind — a button per
      // option (choice), Yes/No (confirm) or a text field (text); Skip unless it may not be.
      const text = typeof it.input?.question === 'string' ? it.input.question : input;
      const skip = it.params?.allowSkip !== false
        ? h('button', { type: 'button', onclick: () => answer({ choice: null }) }, 'Skip') : null;
      let controls;
      if (it.kind === 'text') {
        const field = h('input', { type: 'text', 'aria-label': 'Your answer' });
        controls = [field, h('button', { type: 'button', class: 'primary', onclick: () => field.value.trim() && answer({ choice: field.value.trim() }) }, 'Send')];
      } else if (it.kind === 'confirm') {
        controls = [h('button', { type: 'button', class: 'primary', onclick: () => answer({ choice: 'yes' }) }, 'Yes'),
          h('button', { type: 'button', onclick: () => answer({ choice: 'no' }) }, 'No')];
      } else {
        controls = (it.options || []).map((o) => h('button', { type: 'button', onclick: () => answer({ choice: o }) }, o));
      }
      return h('div', { class: 'interaction', role: 'group', 'aria-label': 'Question', dataset: { interaction: it.interactionId, kind: it.kind } },
        h('p', {}, 'The agent asks:'), h('p', { class: 'question' }, text),
        h('div', { class: 'row' }, controls, skip));
    })] : null);
  }

  // ---- the watch ----

  function onItem(it) {
    // Events the history already drew (the watch replays them from the start): only their
    // turn ends are new, as markers in place; a clear before the history's fence drops the
    // markers before it (their rows are gone too).
    if (it.sequence !== undefined && it.sequence <= replayed) {
      if (it.type === 'turn.ended') marker(endText(it), `ended ${it.state}`, it.sequence);
      if (it.type === 'session.cleared') log.querySelectorAll('li.marker').forEach((m) => m.remove());
      return;
    }
    switch (it.type) {
      case 'model.delta': delta(it); return;
      case 'state':
        state = { ...state, ...it };
        drawState();
        return;
      case 'phase':
        state.phase = it.phase;
        state.running = it.phase === 'running' ? (it.turnId || state.running) : null;
        drawState();
        return;
      case 'resync': dropLive(); return;
      case 'turn.started':
        state.phase = 'running';
        state.running = it.turnId;
        addRows(it.rows);
        drawState();
        return;
      case 'model.completed':
        dropLive(it.turnId);
        addRows(it.rows);
        return;
      case 'tool.status':
      case 'tool.ended':
        setToolStatus(it.callId, it.status);
        addRows(it.rows);
        return;
      case 'turn.ended':
        dropLive(it.turnId);
        addRows(it.rows);
        marker(endText(it), `ended ${it.state}`, it.sequence);
        if (state.running === it.turnId) { state.running = null; state.phase = 'idle'; }
        drawState();
        return;
      case 'queue.changed':
        state.queue = it.queue;
        state.paused = it.paused;
        drawState();
        return;
      case 'interaction.requested':
        if (!state.pendingInteractions.some((x) => x.interactionId === it.interaction.interactionId)) {
          state.pendingInteractions = [...state.pendingInteractions, it.interaction];
        }
        drawApprovals();
        return;
      case 'interaction.resolved':
        state.pendingInteractions = state.pendingInteractions.filter((x) => x.interactionId !== it.interactionId);
        drawApprovals();
        return;
      case 'session.titleChanged':
        title.textContent = it.title || 'Session';
        return;
      case 'session.notice':
        addRows(it.rows);
        marker(`Notice: ${it.code}`, it.level, it.sequence);
        return;
      case 'session.cleared':
        reload();
        return;
      default:
        addRows(it.rows);
    }
  }

  async function load() {
    let snap;
    try {
      snap = await conn.call('session.get', { sessionId });
    } catch (err) {
      // No such session (or not this person's): nothing to write to.
      document.title = 'Session not found — Berth';
      clear(view, h('p', {}, back), h('h1', {}, 'Session not found'), error,
        h('p', {}, `There is no session ${sessionId} here: it may have been removed, or belong to someone else.`));
      fail(err);
      return;
    }
    try {
      title.textContent = snap.title || 'Session';
      document.title = `${snap.title || 'Session'} — Berth`;
      back.href = `#/workspace/${encodeURIComponent(snap.workspaceId)}`;
      state = { ...state, ...snap };
      drawState();
      let after = null, through = null;
      do {
        const page = await conn.call('session.history', { sessionId, through, after, limit: 200 });
        through = page.through;
        addRows(page.rows);
        after = page.nextAfter || null;
      } while (after && !ended);
      if (ended) return;
      // From the start: the turn ends before the fence come back as markers (see onItem).
      replayed = through;
      watch = conn.subscribe('session.watch', { sessionId, after: 0 }, onItem);
      watch.done.then(() => { if (!ended) marker('Stopped following this session.'); }).catch((err) => {
        if (!ended && err.code !== 'disconnected') fail(err);
      });
      log.lastElementChild?.scrollIntoView({ block: 'end' });
    } catch (err) { fail(err); }
  }

  function reload() {
    if (watch) watch.close();
    rows.clear(); live.clear();
    clear(log);
    load();
  }

  // ---- controls ----

  composer.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (!prompt.value.trim()) return;
    error.textContent = '';
    try {
      const r = await conn.call('session.send', { sessionId, prompt: prompt.value, operationId: opId() });
      prompt.value = '';
      if (r.state === 'queued') hitStatus.textContent = '';
    } catch (err) { fail(err); }
  });
  prompt.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); composer.requestSubmit(); }
  });
  stop.addEventListener('click', () => {
    if (!state.running) return;
    conn.call('session.stop', { sessionId, turnId: state.running, operationId: opId() }).catch(fail);
  });
  pause.addEventListener('click', () => {
    conn.call('session.pause', { sessionId, paused: !state.paused, operationId: opId() })
      .then((q) => { state.queue = q.queue; state.paused = q.paused; drawState(); }).catch(fail);
  });
  search.addEventListener('submit', async (e) => {
    e.preventDefault();
    clear(hits);
    hitStatus.textContent = 'Searching…';
    const params = { sessionId, query: searchBox.value, caseSensitive: caseSensitive.checked, wholeWord: wholeWord.checked, after: null };
    const found = [];
    try {
      // Follow the pages (some may have no hits) under the first page's fence, up to a bound.
      for (let pages = 0; pages < 50 && found.length < 200; pages++) {
        const r = await conn.call('session.search', params);
        params.through = r.through;
        found.push(...r.hits);
        if (!r.nextAfter) break;
        params.after = r.nextAfter;
      }
      hitStatus.textContent = found.length ? `${found.length} match${found.length === 1 ? '' : 'es'}` : 'No matches.';
      for (const hit of found) {
        const k = key(hit.position);
        const known = rows.get(k);
        let excerpt = '';
        if (known) {
          const text = hit.field === 'thinking' ? known.row.thinking || '' : known.text || '';
          const before = byteSlice(text, Math.max(0, hit.start - 40), hit.start);
          excerpt = [before, h('mark', {}, byteSlice(text, hit.start, hit.end)), byteSlice(text, hit.end, hit.end + 60)];
        }
        const open = h('button', { type: 'button', class: 'link' }, excerpt || `${hit.field} at ${k}`);
        open.addEventListener('click', async () => {
          const r = rows.get(k);
          if (r) {
            log.querySelectorAll('.hit').forEach((x) => x.classList.remove('hit'));
            r.el.classList.add('hit');
            r.el.scrollIntoView({ block: 'center' });
            r.el.focus();
            return;
          }
          try {
            const page = await conn.call('session.history', { sessionId, through: params.through, target: { kind: 'row', position: hit.position, field: hit.field } });
            const row = page.rows[0];
            if (row) open.replaceWith(h('span', {}, byteSlice(row[hit.field] || '', Math.max(0, hit.start - 40), hit.end + 60)));
          } catch (err) { fail(err); }
        });
        hits.appendChild(h('li', {}, open));
      }
    } catch (err) {
      hitStatus.textContent = '';
      fail(err);
    }
  });

  const back = h('a', { href: '#/workspaces' }, '← Sessions');
  clear(view,
    h('p', {}, back),
    h('div', { class: 'row header' }, title, phase, stop, pause),
    error,
    h('div', { class: 'session' },
      h('div', { class: 'main-col' }, log, approvals, composer),
      h('aside', { class: 'side-col' }, queue, search, hitStatus, hits)));
  load();

  return () => {
    ended = true;
    if (watch) watch.close();
  };
}

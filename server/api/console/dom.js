// Small DOM helpers. Text always goes in as text nodes (never innerHTML), so nothing
// from the server can become markup.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

let nextField = 0;
/// A labelled form field: `<label for=…>text</label>` + the control.
export function field(label, control, hint) {
  const id = control.id || `f${++nextField}`;
  control.id = id;
  if (hint) control.setAttribute('aria-describedby', `${id}-hint`);
  return h('div', { class: 'field' }, h('label', { for: id }, label), control, hint ? h('small', { id: `${id}-hint` }, hint) : null);
}

/// A timestamp for people (local time), or a dash.
export function when(t) {
  if (!t) return '—';
  const d = new Date(t);
  if (Number.isNaN(d.getTime())) return t;
  return h('time', { datetime: t, title: t }, d.toLocaleString());
}

/// Ask before doing something that cannot be undone; resolves true when confirmed.
/// A modal <dialog>: focus moves into it and Escape cancels.
export function confirmDialog(question, action) {
  return new Promise((resolve) => {
    const yes = h('button', { type: 'button', class: 'danger' }, action);
    const no = h('button', { type: 'button' }, 'Cancel');
    const dlg = h('dialog', { 'aria-labelledby': 'confirm-q' }, h('p', { id: 'confirm-q' }, question), h('div', { class: 'row' }, yes, no));
    const done = (v) => { dlg.close(); dlg.remove(); resolve(v); };
    yes.addEventListener('click', () => done(true));
    no.addEventListener('click', () => done(false));
    dlg.addEventListener('cancel', (e) => { e.preventDefault(); done(false); });
    document.body.appendChild(dlg);
    dlg.showModal();
    no.focus();
  });
}

/// A random operation id for a mutation (retries of the same call reuse it).
export function opId() {
  const b = new Uint8Array(12);
  crypto.getRandomValues(b);
  return 'op_' + Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

// Markdown for model text, built as DOM nodes (never innerHTML): fenced code blocks,
// headings, bullet and numbered lists, block quotes, paragraphs; inline `code`, **bold**,
// *emphasis* and [links](https://…). A link opens only http(s) and mailto addresses, in a
// new tab without a referrer; any other target is shown as text. Under the console's CSP
// nothing here can run as code: every piece of model text becomes a text node.
import { h } from './dom.js';

const SAFE_URL = /^(https?:\/\/|mailto:)/i;

/// Inline markup of one paragraph's text, as nodes.
function inline(text) {
  const out = [];
  let i = 0;
  let plain = '';
  const flush = () => { if (plain) { out.push(plain); plain = ''; } };
  while (i < text.length) {
    const c = text[i];
    if (c === '`') {
      const end = text.indexOf('`', i + 1);
      if (end > i + 1) {
        flush();
        out.push(h('code', {}, text.slice(i + 1, end)));
        i = end + 1;
        continue;
      }
    }
    if (c === '*' || c === '_') {
      const strong = text.startsWith(c + c, i);
      const mark = strong ? c + c : c;
      const end = text.indexOf(mark, i + mark.length);
      // Not an empty span, not `a * b`, and `_` only at word edges (snake_case stays text).
      const inner = end > i + mark.length ? text.slice(i + mark.length, end) : '';
      const edge = c === '*' || ((i === 0 || /\W/.test(text[i - 1])) && (end + mark.length >= text.length || /\W/.test(text[end + mark.length])));
      if (inner && !/^\s|\s$/.test(inner) && edge) {
        flush();
        out.push(h(strong ? 'strong' : 'em', {}, inline(inner)));
        i = end + mark.length;
        continue;
      }
    }
    if (c === '[') {
      const close = text.indexOf('](', i + 1);
      const end = close > i ? text.indexOf(')', close + 2) : -1;
      if (close > i + 1 && end > close + 2) {
        const label = text.slice(i + 1, close);
        const url = text.slice(close + 2, end).trim();
        if (SAFE_URL.test(url) && !/\s/.test(url)) {
          flush();
          out.push(h('a', { href: url, target: '_blank', rel: 'noopener noreferrer nofollow' }, inline(label)));
          i = end + 1;
          continue;
        }
      }
    }
    plain += c;
    i++;
  }
  flush();
  return out;
}

const BULLET = /^(\s*)[-*+]\s+(.*)$/;
const NUMBERED = /^(\s*)(\d{1,9})[.)]\s+(.*)$/;
// Every pattern here matches in linear time whatever the model writes: no two runs that
// could share the same characters (`\s*#*\s*$` took minutes on a line of spaces).
const HEADING = /^(#{1,6})[ \t]+(.*)$/;
const FENCE = /^(```|~~~)[ \t]*([\w+#.-]*)$/;
/// How deep quotes nest before the rest is shown as text (each level is a call).
const QUOTE_DEPTH = 8;

/// A fence line (trimmed first, so that the pattern has no trailing run to backtrack over).
const fenceOf = (line) => line.trim().match(FENCE);

/// A heading's text: without the closing `#`s (after a space, as CommonMark has it) and the
/// spaces around.
function headingText(rest) {
  let t = rest.trimEnd();
  let k = t.length;
  while (k > 0 && t[k - 1] === '#') k--;
  if (k < t.length && (k === 0 || t[k - 1] === ' ' || t[k - 1] === '\t')) t = t.slice(0, k).trimEnd();
  return t;
}

/// `text` rendered as block nodes (an array, to append); `depth`: quotes around it.
export function markdown(text, depth = 0) {
  const lines = String(text).split('\n');
  const blocks = [];
  let para = [];
  const endPara = () => {
    if (para.length) blocks.push(h('p', {}, inline(para.join('\n'))));
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = fenceOf(line);
    if (fence) {
      endPara();
      const body = [];
      let j = i + 1;
      while (j < lines.length && !(lines[j].trim().startsWith(fence[1]) && fenceOf(lines[j]))) body.push(lines[j++]);
      const code = h('code', fence[2] ? { class: `language-${fence[2]}` } : {}, body.join('\n'));
      blocks.push(h('pre', { class: 'code' }, code));
      i = j; // the closing fence (or the end: a block still streaming)
      continue;
    }
    const heading = line.match(HEADING);
    if (heading) {
      endPara();
      // Headings in a message stay below the page's own (h1/h2).
      blocks.push(h(`h${Math.min(6, heading[1].length + 2)}`, { class: 'md-h' }, inline(headingText(heading[2]))));
      continue;
    }
    if (BULLET.test(line) || NUMBERED.test(line)) {
      endPara();
      const numbered = NUMBERED.test(line);
      const items = [];
      let j = i;
      for (; j < lines.length; j++) {
        const m = numbered ? lines[j].match(NUMBERED) : lines[j].match(BULLET);
        if (m) { items.push([numbered ? m[3] : m[2]]); continue; }
        // An indented line continues the item before it.
        if (items.length && /^\s{2,}\S/.test(lines[j]) && !BULLET.test(lines[j]) && !NUMBERED.test(lines[j])) {
          items[items.length - 1].push(lines[j].trim());
          continue;
        }
        break;
      }
      const start = numbered ? Number(line.match(NUMBERED)[2]) : null;
      blocks.push(h(numbered ? 'ol' : 'ul', numbered && start !== 1 ? { start } : {},
        items.map((parts) => h('li', {}, inline(parts.join('\n'))))));
      i = j - 1;
      continue;
    }
    if (/^\s*>\s?/.test(line)) {
      endPara();
      const quoted = [];
      let j = i;
      for (; j < lines.length && /^\s*>\s?/.test(lines[j]); j++) quoted.push(lines[j].replace(/^\s*>\s?/, ''));
      const inner = quoted.join('\n');
      blocks.push(h('blockquote', {}, depth < QUOTE_DEPTH ? markdown(inner, depth + 1) : [h('p', {}, inner)]));
      i = j - 1;
      continue;
    }
    if (!line.trim()) { endPara(); continue; }
    para.push(line);
  }
  endPara();
  return blocks;
}

// web/markdown.js — a small Markdown renderer for model output that can never produce HTML.
//
//   parse(text)          → a plain tree of {type, ...} nodes (no DOM needed; tests run it in Node)
//   toDom(tree, doc)     → a DocumentFragment built with createElement / createTextNode only
//   toHtml(tree)         → the same tree as a string in which every text and attribute is escaped
//
// Covers what chat models write: ATX and setext headings, paragraphs, **bold**, *italic*,
// ~~strike~~, `code`, fenced code blocks (text only; an unterminated fence runs to the end, so a
// block being streamed renders as code at once), bullet and ordered lists (nested), block quotes,
// GFM tables, rules, [links](url), <autolinks> and bare http(s) URLs. Raw HTML is not a thing
// here: `<b>` is the three characters it looks like. Link targets must be absolute http(s) or
// mailto URLs, otherwise only the link text is kept. Images become links (the page loads nothing
// a model names). Every search for a closing delimiter that fails is remembered, so a reply full
// of unmatched `*` or `[` still renders in linear time; nesting deeper than MAX_DEPTH is text.

const MAX_DEPTH = 16;

// ---------------------------------------------------------------------------------------------
// Links

// The href to use for a link target, or null when it is not an absolute http(s) or mailto URL.
// Control characters and whitespace are refused outright (browsers strip some of them before
// reading a scheme, which is how `java\tscript:` tricks work).
export function safeHref(raw) {
  const url = String(raw ?? '').trim();
  if (!url || /[\u0000-\u0020\u007f-\u009f\u2028\u2029]/.test(url)) return null;
  if (/^https?:\/\/[^/?#\\]/i.test(url)) return url;
  if (/^mailto:[^/\\]/i.test(url)) return url;
  return null;
}

// ---------------------------------------------------------------------------------------------
// Blocks

const FENCE_OPEN = /^( {0,3})(`{3,}|~{3,})[ \t]*([^\n]*?)[ \t]*$/;
const FENCE_CLOSE = /^ {0,3}(`{3,}|~{3,})[ \t]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const LIST_ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])(?:([ \t]+)(.*))?$/;
const SETEXT = /^ {0,3}(=+|-+)[ \t]*$/;
const TABLE_DELIM = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;

const isBlank = (line) => /^[ \t]*$/.test(line);
const indentOf = (line) => /^ */.exec(line)[0].length;

// Leading tabs become spaces (to the next multiple of 4), so indentation is one number.
function expandTabs(line) {
  const lead = /^[ \t]*/.exec(line)[0];
  if (!lead.includes('\t')) return line;
  let width = 0;
  for (const c of lead) width = c === '\t' ? width + 4 - (width % 4) : width + 1;
  return ' '.repeat(width) + line.slice(lead.length);
}

function dropIndent(line, n) {
  const have = indentOf(line);
  return line.slice(Math.min(have, n));
}

function isFenceOpen(line) {
  const m = FENCE_OPEN.exec(line);
  return !!m && !(m[2][0] === '`' && m[3].includes('`'));
}

// A table row's cells: outer pipes dropped, split on pipes that are not backslash-escaped.
function splitRow(line) {
  let s = line.trim();
  if (s.startsWith('|')) s = s.slice(1);
  if (s.endsWith('|') && !s.endsWith('\\|')) s = s.slice(0, -1);
  const cells = [];
  let cell = '';
  for (let i = 0; i < s.length; i++) {
    if (s[i] === '\\' && s[i + 1] === '|') { cell += '|'; i++; continue; }
    if (s[i] === '|') { cells.push(cell.trim()); cell = ''; continue; }
    cell += s[i];
  }
  cells.push(cell.trim());
  return cells;
}

function isTableStart(lines, i) {
  const head = lines[i], delim = lines[i + 1];
  if (delim === undefined || !head.includes('|') || !delim.includes('|')) return false;
  if (!TABLE_DELIM.test(delim)) return false;
  return splitRow(head).length === splitRow(delim).length;
}

// Whether `line` begins a block that ends a paragraph.
function interruptsParagraph(lines, i) {
  const line = lines[i];
  if (isFenceOpen(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line)) return true;
  const item = LIST_ITEM.exec(line);
  if (item && item[4] !== undefined && item[4].trim() !== '') return true;
  return isTableStart(lines, i);
}

function parseBlocks(lines, depth) {
  const blocks = [];
  if (depth > MAX_DEPTH) {
    const text = lines.join('\n').trim();
    if (text) blocks.push({ type: 'paragraph', children: [{ type: 'text', text }] });
    return blocks;
  }
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (isBlank(line)) { i++; continue; }
    let m;

    if (isFenceOpen(line)) {
      m = FENCE_OPEN.exec(line);
      const indent = m[1].length, fence = m[2];
      const body = [];
      let closed = false;
      for (i++; i < lines.length; i++) {
        const c = FENCE_CLOSE.exec(lines[i]);
        if (c && c[1][0] === fence[0] && c[1].length >= fence.length) { closed = true; i++; break; }
        body.push(dropIndent(lines[i], indent));
      }
      if (!closed) while (body.length && isBlank(body[body.length - 1])) body.pop();
      const lang = /^[\w+#.-]*/.exec(m[3])[0].slice(0, 32);
      blocks.push({ type: 'code', lang, text: body.join('\n'), closed });
      continue;
    }

    if ((m = HEADING.exec(line))) {
      const text = (m[2] || '').replace(/(?:^|[ \t]+)#+$/, '');
      blocks.push({ type: 'heading', level: m[1].length, children: parseInline(text, depth) });
      i++;
      continue;
    }

    if (RULE.test(line)) {
      blocks.push({ type: 'rule' });
      i++;
      continue;
    }

    if (QUOTE.test(line)) {
      const inner = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) { inner.push(m[1]); i++; }
      blocks.push({ type: 'blockquote', children: parseBlocks(inner, depth + 1) });
      continue;
    }

    if ((m = LIST_ITEM.exec(line))) {
      i = parseList(lines, i, depth, blocks);
      continue;
    }

    if (isTableStart(lines, i)) {
      i = parseTable(lines, i, depth, blocks);
      continue;
    }

    // Paragraph: up to a blank line or a block start; a setext underline makes it a heading.
    const para = [line.trim()];
    let heading = 0;
    for (i++; i < lines.length && !isBlank(lines[i]); i++) {
      if ((m = SETEXT.exec(lines[i]))) { heading = m[1][0] === '=' ? 1 : 2; i++; break; }
      if (interruptsParagraph(lines, i)) break;
      para.push(lines[i]);
    }
    const text = para.join('\n').replace(/[ \t]+$/, '');
    blocks.push(heading ? { type: 'heading', level: heading, children: parseInline(text, depth) }
                        : { type: 'paragraph', children: parseInline(text, depth) });
  }
  return blocks;
}

// Items of one list: same bullet character, or same ordered delimiter. An item holds the lines
// indented at least as far as its text starts (stripped of that indent), lazy continuation lines
// of its paragraph, and blank lines that are followed by such indented lines.
function parseList(lines, i, depth, blocks) {
  const first = LIST_ITEM.exec(lines[i]);
  const ordered = /\d/.test(first[2][0]);
  const kind = ordered ? first[2].slice(-1) : first[2];
  const list = { type: 'list', ordered, start: ordered ? parseInt(first[2], 10) : 1, tight: true, items: [] };
  const sameKind = (m) => !!m && (ordered ? /\d/.test(m[2][0]) && m[2].slice(-1) === kind : m[2] === kind);

  while (i < lines.length) {
    const m = LIST_ITEM.exec(lines[i]);
    if (!sameKind(m)) break;
    const gap = m[3] === undefined || m[3].length > 4 ? 1 : m[3].length;
    const contentIndent = m[1].length + m[2].length + gap;
    const itemLines = [m[4] ?? ''];
    for (i++; i < lines.length; i++) {
      const l = lines[i];
      if (isBlank(l)) {
        let j = i;
        while (j < lines.length && isBlank(lines[j])) j++;
        if (j < lines.length && indentOf(lines[j]) >= contentIndent) {
          for (; i < j; i++) itemLines.push('');
          i--;
          continue;
        }
        break;
      }
      if (indentOf(l) >= contentIndent) { itemLines.push(dropIndent(l, contentIndent)); continue; }
      if (LIST_ITEM.test(l) || interruptsParagraph(lines, i) || isBlank(lines[i - 1])) break;
      itemLines.push(l.trim());
    }
    const item = parseBlocks(itemLines, depth + 1);
    if (itemLines.some(isBlank) && item.length > 1) list.tight = false;
    list.items.push(item);
    let j = i;
    while (j < lines.length && isBlank(lines[j])) j++;
    if (j < lines.length && sameKind(LIST_ITEM.exec(lines[j]))) {
      if (j > i) list.tight = false;
      i = j;
    } else {
      break;
    }
  }
  blocks.push(list);
  return i;
}

function parseTable(lines, i, depth, blocks) {
  const head = splitRow(lines[i]);
  const align = splitRow(lines[i + 1]).map((d) =>
    d.startsWith(':') && d.endsWith(':') ? 'center' : d.endsWith(':') ? 'right' : d.startsWith(':') ? 'left' : '');
  const cells = (row) => head.map((_, k) => parseInline(row[k] ?? '', depth));
  const table = { type: 'table', align, head: cells(head), rows: [] };
  for (i += 2; i < lines.length && !isBlank(lines[i]); i++) {
    const l = lines[i];
    if (isFenceOpen(l) || QUOTE.test(l) || HEADING.test(l)) break;
    if (!l.includes('|') && (RULE.test(l) || LIST_ITEM.test(l))) break;
    table.rows.push(cells(splitRow(lines[i])));
  }
  blocks.push(table);
  return i;
}

// ---------------------------------------------------------------------------------------------
// Inline

const PUNCT = /[!-\/:-@\[-`{-~]/;
const isSpace = (c) => c === undefined || /\s/.test(c);
const isWordChar = (c) => c !== undefined && /[\p{L}\p{N}]/u.test(c);
const BARE_URL = /^https?:\/\/[^\s<>"]*[^\s<>"'.,:;!?\]*_~]/i;

function runLength(s, i) {
  let n = 1;
  while (s[i + n] === s[i]) n++;
  return n;
}

// Parses `text` into inline nodes. `noLinks` is set inside a link's label.
export function parseInline(text, depth = 0, noLinks = false) {
  if (depth > MAX_DEPTH) return text ? [{ type: 'text', text }] : [];
  const out = [];
  let buf = '';
  const failed = new Set();  // closer searches that already failed in this string
  const flush = () => { if (buf) { out.push({ type: 'text', text: buf }); buf = ''; } };
  const push = (node) => { flush(); out.push(node); };

  // Position of a closing run of `len` copies of `ch` after `from` (skipping code spans and
  // escapes), or -1. A closer is not preceded by whitespace; `_` closers are not followed by a
  // letter or digit.
  const findCloser = (ch, len, from) => {
    const key = ch + len;
    if (failed.has(key)) return -1;
    for (let k = from; k < text.length;) {
      const c = text[k];
      if (c === '\\') { k += 2; continue; }
      if (c === '`') {
        const n = runLength(text, k);
        const end = text.indexOf('`'.repeat(n), k + n);
        k = end < 0 ? k + n : end + n;
        continue;
      }
      if (c === ch) {
        const n = runLength(text, k);
        if (n === len && k > from && !isSpace(text[k - 1]) && !(ch === '_' && isWordChar(text[k + n]))) return k;
        k += n;
        continue;
      }
      k++;
    }
    failed.add(key);
    return -1;
  };

  // A link at text[i] === '[': {label, href, end} or null.
  // Link scans that fail are not remembered (a later `[` may still close), so they draw on a
  // budget proportional to the text instead: once it is spent, the rest is plain text.
  let linkBudget = 4 * text.length + 4096;
  const matchLink = (i) => {
    if (failed.has('[') || linkBudget <= 0) return null;
    const link = scanLink(i);
    if (!link) linkBudget -= scanned;
    return link;
  };
  let scanned = 0;
  const scanLink = (i) => {
    scanned = 0;
    let level = 0, k = i;
    const limit = Math.min(text.length, i + 4096);  // a label longer than this is not a link
    for (; k < limit; k++) {
      const c = text[k];
      if (c === '\\') { k++; continue; }
      if (c === '`') {
        const n = runLength(text, k);
        const end = text.indexOf('`'.repeat(n), k + n);
        k = (end < 0 ? k + n : end + n) - 1;
        continue;
      }
      if (c === '[') level++;
      else if (c === ']' && --level === 0) break;
    }
    scanned = k - i;
    if (k >= text.length) { failed.add('['); return null; }
    if (k >= limit) return null;
    const label = text.slice(i + 1, k);
    if (text[k + 1] !== '(') return null;
    let p = k + 2;
    while (text[p] === ' ') p++;
    let href = '';
    if (text[p] === '<') {
      const end = text.indexOf('>', p);
      if (end < 0 || text.slice(p, end).includes('\n')) return null;
      href = text.slice(p + 1, end);
      p = end + 1;
    } else {
      let parens = 0;
      for (; p < text.length && !/\s/.test(text[p]); p++) {
        if (text[p] === '\\' && PUNCT.test(text[p + 1] ?? '')) { href += text[++p]; continue; }
        if (text[p] === '(') parens++;
        else if (text[p] === ')' && parens-- === 0) break;
        href += text[p];
      }
    }
    scanned = p - i;
    while (text[p] === ' ' || text[p] === '\n') p++;
    const quote = text[p];
    if (quote === '"' || quote === "'") {
      const end = text.indexOf(quote, p + 1);
      if (end < 0) return null;
      p = end + 1;
      while (text[p] === ' ') p++;
    }
    if (text[p] !== ')') return null;
    return { label, href, end: p + 1 };
  };

  for (let i = 0; i < text.length;) {
    const c = text[i];

    if (c === '\\') {
      const next = text[i + 1];
      if (next === '\n') { push({ type: 'break' }); i += 2; continue; }
      if (next !== undefined && PUNCT.test(next)) { buf += next; i += 2; continue; }
      buf += c;
      i++;
      continue;
    }

    if (c === '\n') {
      buf = buf.replace(/[ \t]+$/, '');
      push({ type: 'break' });
      i++;
      while (text[i] === ' ' || text[i] === '\t') i++;
      continue;
    }

    if (c === '`') {
      const n = runLength(text, i);
      const key = '`' + n;
      let end = -1;
      if (!failed.has(key)) {
        for (let k = text.indexOf('`'.repeat(n), i + n); k >= 0; k = text.indexOf('`'.repeat(n), k + 1)) {
          const run = runLength(text, k);
          if (run === n && text[k - 1] !== '`') { end = k; break; }
          k += run - 1;
        }
        if (end < 0) failed.add(key);
      }
      if (end < 0) { buf += text.slice(i, i + n); i += n; continue; }
      let code = text.slice(i + n, end).replace(/\n/g, ' ');
      if (code.length > 1 && code[0] === ' ' && code[code.length - 1] === ' ' && code.trim()) code = code.slice(1, -1);
      push({ type: 'codespan', text: code });
      i = end + n;
      continue;
    }

    if (c === '!' && text[i + 1] === '[' && !noLinks) {
      const link = matchLink(i + 1);
      if (link) {
        const href = safeHref(link.href);
        const label = link.label || link.href;
        push(href ? { type: 'link', href, children: [{ type: 'text', text: label }] } : { type: 'text', text: label });
        i = link.end;
        continue;
      }
    }

    if (c === '[' && !noLinks) {
      const link = matchLink(i);
      if (link) {
        const href = safeHref(link.href);
        const children = parseInline(link.label, depth + 1, true);
        if (href) push({ type: 'link', href, children });
        else { flush(); out.push(...children); }
        i = link.end;
        continue;
      }
    }

    if (c === '<' && !noLinks) {
      const m = /^<([a-z][a-z0-9+.-]{1,31}:[^\s<>]*|[^\s<>@]+@[^\s<>@]+\.[a-z]{2,})>/i.exec(text.slice(i, i + 2050));
      if (m) {
        const target = m[1].includes(':') ? m[1] : 'mailto:' + m[1];
        const href = safeHref(target);
        push(href ? { type: 'link', href, children: [{ type: 'text', text: m[1] }] } : { type: 'text', text: m[0] });
        i += m[0].length;
        continue;
      }
    }

    if ((c === 'h' || c === 'H') && !noLinks && !isWordChar(text[i - 1])) {
      const m = BARE_URL.exec(text.slice(i, i + 2048));
      if (m) {
        // Trailing punctuation is the sentence's, and a closing parenthesis belongs to the URL
        // only when it balances an opening one.
        let url = m[0];
        const count = (ch) => url.split(ch).length - 1;
        for (;;) {
          if (/[.,:;!?*_~'"]$/.test(url)) url = url.slice(0, -1);
          else if (url.endsWith(')') && count('(') < count(')')) url = url.slice(0, -1);
          else break;
        }
        const href = safeHref(url);
        if (href) {
          push({ type: 'link', href, children: [{ type: 'text', text: url }] });
          i += url.length;
          continue;
        }
      }
    }

    if (c === '*' || c === '_' || c === '~') {
      const n = runLength(text, i);
      const opens = !isSpace(text[i + n]) && !(c === '_' && isWordChar(text[i - 1]));
      if (opens && (c !== '~' || n === 2)) {
        const want = c === '~' ? 2 : Math.min(n, 3);
        const end = findCloser(c, want, i + want);
        if (end >= 0 && n === want) {
          const inner = parseInline(text.slice(i + want, end), depth + 1, noLinks);
          const node = c === '~' ? { type: 'del', children: inner }
                     : want === 1 ? { type: 'em', children: inner }
                     : want === 2 ? { type: 'strong', children: inner }
                     : { type: 'strong', children: [{ type: 'em', children: inner }] };
          push(node);
          i = end + want;
          continue;
        }
      }
      buf += text.slice(i, i + n);
      i += n;
      continue;
    }

    buf += c;
    i++;
  }
  flush();
  return out;
}

export function parse(markdown) {
  const lines = String(markdown ?? '').replace(/\r\n?/g, '\n').split('\n').map(expandTabs);
  return parseBlocks(lines, 0);
}

// ---------------------------------------------------------------------------------------------
// Output. The only element names ever produced are the ones below; the only attributes are href
// (already checked by safeHref), rel, target, start and class (from fixed words or a sanitized
// code language).

const INLINE_TAGS = { strong: 'strong', em: 'em', del: 'del', codespan: 'code', link: 'a', break: 'br' };
const ALIGN_CLASS = { left: 'align-left', center: 'align-center', right: 'align-right' };

// A neutral description of each node as an element: [tag, attributes, children] or a string.
function describe(node) {
  switch (node.type) {
    case 'text': return node.text;
    case 'codespan': return ['code', {}, [node.text]];
    case 'break': return ['br', {}, []];
    case 'link': return ['a', { href: node.href, rel: 'noopener noreferrer nofollow', target: '_blank' }, node.children.map(describe)];
    case 'strong': case 'em': case 'del': return [INLINE_TAGS[node.type], {}, node.children.map(describe)];
    case 'heading': return ['h' + Math.min(6, Math.max(1, node.level | 0)), {}, node.children.map(describe)];
    case 'paragraph': return ['p', {}, node.children.map(describe)];
    case 'rule': return ['hr', {}, []];
    case 'blockquote': return ['blockquote', {}, node.children.map(describe)];
    case 'code': {
      const attrs = node.lang ? { class: 'language-' + node.lang } : {};
      return ['pre', node.closed ? {} : { class: 'open' }, [['code', attrs, [node.text]]]];
    }
    case 'list': {
      const attrs = node.ordered && node.start !== 1 ? { start: String(node.start) } : {};
      // A tight list's paragraphs are not wrapped in <p>.
      const content = (block) => (node.tight && block.type === 'paragraph' ? block.children.map(describe) : [describe(block)]);
      return [node.ordered ? 'ol' : 'ul', attrs, node.items.map((item) => ['li', {}, item.flatMap(content)])];
    }
    case 'table': {
      const cell = (tag, k) => (content) => [tag, ALIGN_CLASS[node.align[k]] ? { class: ALIGN_CLASS[node.align[k]] } : {}, content.map(describe)];
      const row = (tag) => (cells) => ['tr', {}, cells.map((content, k) => cell(tag, k)(content))];
      const parts = [['thead', {}, [row('th')(node.head)]]];
      if (node.rows.length) parts.push(['tbody', {}, node.rows.map(row('td'))]);
      return ['div', { class: 'table-wrap' }, [['table', {}, parts]]];
    }
    default: return '';
  }
}

const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
export const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => ESCAPES[c]);
const VOID = new Set(['br', 'hr']);

function htmlOf(d) {
  if (typeof d === 'string') return escapeHtml(d);
  const [tag, attrs, children] = d;
  const a = Object.entries(attrs).map(([k, v]) => ` ${k}="${escapeHtml(v)}"`).join('');
  return VOID.has(tag) ? `<${tag}${a}>` : `<${tag}${a}>${children.map(htmlOf).join('')}</${tag}>`;
}

function domOf(d, doc) {
  if (typeof d === 'string') return doc.createTextNode(d);
  const [tag, attrs, children] = d;
  const el = doc.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') el.className = v;
    else el.setAttribute(k, v);
  }
  for (const child of children) el.appendChild(domOf(child, doc));
  return el;
}

export function toHtml(tree) {
  return tree.map((node) => htmlOf(describe(node))).join('');
}

export function toDom(tree, doc) {
  const fragment = doc.createDocumentFragment();
  for (const node of tree) fragment.appendChild(domOf(describe(node), doc));
  return fragment;
}

// Convenience: Markdown text straight to an escaped HTML string.
export function renderToHtmlString(markdown) {
  return toHtml(parse(markdown));
}

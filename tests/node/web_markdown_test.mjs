// Unit tests of web/markdown.js in Node (no DOM): the Markdown the page renders model output
// with. The renderer must never turn model text into HTML, so besides the usual Markdown cases
// this checks, for hostile and random inputs and for every prefix of a streamed reply, that the
// output only has the renderer's own tags and attributes, that every href is http(s) or mailto,
// and that toDom (run on a fake document that refuses innerHTML) builds exactly what toHtml says.
// Usage: node tests/node/web_markdown_test.mjs        (exit status 1 on any failure)
import { parse, toHtml, toDom, safeHref, renderToHtmlString as md } from '../../web/markdown.js';
import { mulberry32 } from './kimi_k3.mjs';

let passed = 0;
const failures = [];
function check(name, ok, detail = '') {
  if (ok) passed++;
  else failures.push(`${name}${detail ? `\n    ${detail}` : ''}`);
}
function expectHtml(name, input, want) {
  const got = md(input);
  check(name, got === want, `input ${JSON.stringify(input)}\n    want ${want}\n    got  ${got}`);
}
const A = (href, text = href) => `<a href="${href}" rel="noopener noreferrer nofollow" target="_blank">${text}</a>`;

// ---------------------------------------------------------------------------------------------
// Markdown

expectHtml('heading', '# Title', '<h1>Title</h1>');
expectHtml('heading levels and closing hashes', '### Three ###\n###### six', '<h3>Three</h3><h6>six</h6>');
expectHtml('hash without space is text', '#tag and C#', '<p>#tag and C#</p>');
expectHtml('setext headings', 'Big\n===\nSmall\n---', '<h1>Big</h1><h2>Small</h2>');
expectHtml('paragraphs and line breaks', 'one\ntwo  \nthree\n\nfour', '<p>one<br>two<br>three</p><p>four</p>');
expectHtml('bold, italic, both, strike', '**b** *i* _u_ __B__ ***bi*** ~~s~~',
  '<p><strong>b</strong> <em>i</em> <em>u</em> <strong>B</strong> <strong><em>bi</em></strong> <del>s</del></p>');
expectHtml('nested emphasis', '**bold *and italic* here**', '<p><strong>bold <em>and italic</em> here</strong></p>');
expectHtml('intraword underscores stay', 'snake_case_name and 2*3*4', '<p>snake_case_name and 2<em>3</em>4</p>');
expectHtml('lone stars stay', 'a * b * c and **unclosed', '<p>a * b * c and **unclosed</p>');
expectHtml('inline code keeps markup', 'use `<b>*x*</b>` and ``a ` b``', '<p>use <code>&lt;b&gt;*x*&lt;/b&gt;</code> and <code>a ` b</code></p>');
expectHtml('backslash escapes', '\\*not em\\* \\[x\\](y)', '<p>*not em* [x](y)</p>');
expectHtml('fenced code with language', '```python\nprint("<hi>")\n```\nafter',
  '<pre><code class="language-python">print(&quot;&lt;hi&gt;&quot;)</code></pre><p>after</p>');
expectHtml('tilde fence, longer closer, inner fence text', '~~~\n```\n<x>\n~~~~',
  '<pre><code>```\n&lt;x&gt;</code></pre>');
expectHtml('indented fence strips its indent', '  ```\n  a\n    b\n  ```', '<pre><code>a\n  b</code></pre>');
expectHtml('code language is sanitized', '```js"><script>\nx\n```', '<pre><code class="language-js">x</code></pre>');
expectHtml('unterminated fence runs to the end (streaming)', 'text\n```js\nlet a = 1;\n',
  '<p>text</p><pre class="open"><code class="language-js">let a = 1;</code></pre>');
expectHtml('bullet list, tight', '- a\n- b\n- c', '<ul><li>a</li><li>b</li><li>c</li></ul>');
expectHtml('list interrupts a paragraph', 'Items:\n* one\n* two', '<p>Items:</p><ul><li>one</li><li>two</li></ul>');
expectHtml('nested lists', '1. one\n   - x\n   - y\n2. two', '<ol><li>one<ul><li>x</li><li>y</li></ul></li><li>two</li></ol>');
expectHtml('ordered start', '3. c\n4. d', '<ol start="3"><li>c</li><li>d</li></ol>');
expectHtml('loose list', '- a\n\n- b', '<ul><li><p>a</p></li><li><p>b</p></li></ul>');
expectHtml('list item continuation', '- first line\n  second line\nlazy', '<ul><li>first line<br>second line<br>lazy</li></ul>');
expectHtml('different bullet starts a new list', '- a\n+ b', '<ul><li>a</li></ul><ul><li>b</li></ul>');
expectHtml('code block inside a list', '- x\n  ```\n  <y>\n  ```', '<ul><li>x<pre><code>&lt;y&gt;</code></pre></li></ul>');
expectHtml('blockquote', '> quoted **text**\n> more\n\nout', '<blockquote><p>quoted <strong>text</strong><br>more</p></blockquote><p>out</p>');
expectHtml('rules', '---\n* * *\n___', '<hr><hr><hr>');
expectHtml('table with alignment', '| a | b | c |\n|:--|:-:|--:|\n| 1 | **2** | 3 |',
  '<div class="table-wrap"><table><thead><tr><th class="align-left">a</th><th class="align-center">b</th><th class="align-right">c</th></tr></thead>' +
  '<tbody><tr><td class="align-left">1</td><td class="align-center"><strong>2</strong></td><td class="align-right">3</td></tr></tbody></table></div>');
expectHtml('table without outer pipes, ragged rows, escaped pipe', 'a | b\n--- | ---\n1\n2 | x \\| y | extra',
  '<div class="table-wrap"><table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td></td></tr><tr><td>2</td><td>x | y</td></tr></tbody></table></div>');
expectHtml('table header alone (delimiter streamed)', '| a | b |\n|---|---|', '<div class="table-wrap"><table><thead><tr><th>a</th><th>b</th></tr></thead></table></div>');
expectHtml('half a delimiter row is still a paragraph', '| a | b |\n|--', '<p>| a | b |<br>|--</p>');
expectHtml('table ends at a blank line', '|a|\n|-|\n|1|\n\nafter', '<div class="table-wrap"><table><thead><tr><th>a</th></tr></thead><tbody><tr><td>1</td></tr></tbody></table></div><p>after</p>');

// ---------------------------------------------------------------------------------------------
// Links

expectHtml('link', '[site](https://example.com/a?b=1&c=2 "title")', `<p>${A('https://example.com/a?b=1&amp;c=2', 'site')}</p>`);
expectHtml('link with parentheses and emphasis', '[**x**](https://en.wikipedia.org/wiki/A_(b))', `<p>${A('https://en.wikipedia.org/wiki/A_(b)', '<strong>x</strong>')}</p>`);
expectHtml('mailto link', '[mail](mailto:a@b.org)', `<p>${A('mailto:a@b.org', 'mail')}</p>`);
expectHtml('autolinks', '<https://a.org/x> <me@b.org>', `<p>${A('https://a.org/x')} ${A('mailto:me@b.org', 'me@b.org')}</p>`);
expectHtml('bare URLs drop sentence punctuation', 'See https://a.org/x_(y). Or (http://b.org/z).',
  `<p>See ${A('https://a.org/x_(y)')}. Or (${A('http://b.org/z')}).</p>`);
expectHtml('images become links', '![a cat](https://c.org/cat.png)', `<p>${A('https://c.org/cat.png', 'a cat')}</p>`);
expectHtml('relative links keep only the text', '[home](/index.html) [up](../x) [q](?a) [frag](#x)', '<p>home up q frag</p>');
expectHtml('link label is not re-linked', '[https://a.org](https://b.org)', `<p>${A('https://b.org', 'https://a.org')}</p>`);
expectHtml('unclosed bracket is text', '[not a link and (x)', '<p>[not a link and (x)</p>');
expectHtml('reference-style brackets are text', '[a][b] [c]', '<p>[a][b] [c]</p>');

// ---------------------------------------------------------------------------------------------
// Hostile input

expectHtml('script tag is text', '<script>alert(1)</script>', '<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>');
expectHtml('img onerror is text', '<img src=x onerror="alert(1)">', '<p>&lt;img src=x onerror=&quot;alert(1)&quot;&gt;</p>');
expectHtml('html block is text', '<div onclick=alert(1)>\n<iframe src="x.html"></iframe>\n</div>',
  '<p>&lt;div onclick=alert(1)&gt;<br>&lt;iframe src=&quot;x.html&quot;&gt;&lt;/iframe&gt;<br>&lt;/div&gt;</p>');
expectHtml('html inside a fenced block is text', '```html\n<script>alert(1)</script>\n<img src=x onerror=alert(1)>\n```',
  '<pre><code class="language-html">&lt;script&gt;alert(1)&lt;/script&gt;\n&lt;img src=x onerror=alert(1)&gt;</code></pre>');
expectHtml('javascript: link loses its href', '[click](javascript:alert(1))', '<p>click</p>');
expectHtml('JaVaScRiPt: link loses its href', '[click](JaVaScRiPt:alert(document.cookie))', '<p>click</p>');
expectHtml('javascript: autolink stays text', '<javascript:alert(1)>', '<p>&lt;javascript:alert(1)&gt;</p>');
expectHtml('javascript: image loses its href', '![x](javascript:alert(1))', '<p>x</p>');
expectHtml('data: link loses its href', '[x](data:text/html;base64,PHNjcmlwdD4=)', '<p>x</p>');
expectHtml('vbscript: and file: links lose their href', '[a](vbscript:msgbox) [b](file:///etc/passwd)', '<p>a b</p>');
expectHtml('entity-encoded scheme loses its href', '[x](&#106;avascript:alert(1))', '<p>x</p>');
expectHtml('protocol-relative link loses its href', '[x](//evil.example/)', '<p>x</p>');
expectHtml('escaped scheme separator', '[x](javascript\\:alert(1))', '<p>x</p>');
expectHtml('quote in href cannot break the attribute', '[x](https://a.org/"onmouseover="alert(1))',
  `<p>${A('https://a.org/&quot;onmouseover=&quot;alert(1)', 'x')}</p>`);
expectHtml('angle-bracket href with space and scheme tricks', '[x](< javascript:alert(1)>)', '<p>x</p>');
expectHtml('html in link text and table cells is text', '| <b>h</b> |\n|---|\n| [<i>x</i>](https://a.org) |',
  `<div class="table-wrap"><table><thead><tr><th>&lt;b&gt;h&lt;/b&gt;</th></tr></thead><tbody><tr><td>${A('https://a.org', '&lt;i&gt;x&lt;/i&gt;')}</td></tr></tbody></table></div>`);
expectHtml('html entities are shown as typed', '&lt;b&gt; &amp; &#60;', '<p>&amp;lt;b&amp;gt; &amp;amp; &amp;#60;</p>');

for (const [url, ok] of [
  ['https://a.org', true], ['http://a.org/x?y#z', true], ['mailto:a@b.org', true], ['HTTPS://A.ORG', true],
  ['javascript:alert(1)', false], [' javascript:alert(1)', false], ['java\tscript:alert(1)', false],
  ['java\nscript:alert(1)', false], ['\u0001javascript:x', false], ['https:evil', false], ['https:/evil', false],
  ['https:\\\\evil', false], ['http://a.org/\u2028x', false], ['/local', false], ['//evil.org', false], ['', false],
  ['ftp://a.org', false], ['mailto:/x', false], ['data:image/png;base64,AAA', false], ['blob:https://a/1', false],
]) check(`safeHref ${JSON.stringify(url)}`, (safeHref(url) !== null) === ok);

// ---------------------------------------------------------------------------------------------
// Properties: allowed output only; toDom agrees with toHtml and never touches innerHTML.

const TAGS = new Set(['h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'p', 'br', 'hr', 'strong', 'em', 'del', 'code', 'pre',
  'a', 'ul', 'ol', 'li', 'blockquote', 'div', 'table', 'thead', 'tbody', 'tr', 'th', 'td']);
const ATTRS = new Set(['href', 'rel', 'target', 'start', 'class']);

// Scans the HTML string: every `<` must open or close an allowed tag with allowed, quoted attributes.
function htmlProblem(html) {
  const tagRe = /<(\/?)([a-z0-9]+)((?: [a-z]+="[^"<>]*")*)>/y;
  for (let i = html.indexOf('<'); i >= 0; i = html.indexOf('<', i + 1)) {
    tagRe.lastIndex = i;
    const m = tagRe.exec(html);
    if (!m) return `stray '<' at ${i}: ${html.slice(i, i + 40)}`;
    if (!TAGS.has(m[2])) return `tag <${m[2]}>`;
    for (const a of m[3].matchAll(/ ([a-z]+)="([^"]*)"/g)) {
      if (!ATTRS.has(a[1])) return `attribute ${a[1]}`;
      if (a[1] === 'href' && safeHref(a[2].replace(/&amp;/g, '&').replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&lt;/g, '<').replace(/&gt;/g, '>')) === null) return `href ${a[2]}`;
      if (a[1] === 'class' && !/^(?:language-[\w+#.-]*|align-(?:left|center|right)|open|table-wrap)$/.test(a[2])) return `class ${a[2]}`;
    }
  }
  return null;
}

// A fake document: elements record tag, attributes and children; innerHTML/outerHTML throw.
class FakeNode {
  constructor(tag) { this.tag = tag; this.attrs = {}; this.children = []; }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  set className(v) { this.attrs.class = v; }
  set innerHTML(_) { throw new Error('innerHTML used'); }
  set outerHTML(_) { throw new Error('outerHTML used'); }
  insertAdjacentHTML() { throw new Error('insertAdjacentHTML used'); }
  appendChild(c) { this.children.push(c); return c; }
}
const fakeDocument = {
  createElement: (tag) => new FakeNode(tag),
  createTextNode: (text) => ({ text: String(text) }),
  createDocumentFragment: () => new FakeNode(null),
};
const esc = (s) => s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);
function serialize(node) {
  if ('text' in node) return esc(node.text);
  const inner = node.children.map(serialize).join('');
  if (node.tag === null) return inner;
  const attrs = Object.entries(node.attrs).map(([k, v]) => ` ${k}="${esc(v)}"`).join('');
  return node.tag === 'br' || node.tag === 'hr' ? `<${node.tag}${attrs}>` : `<${node.tag}${attrs}>${inner}</${node.tag}>`;
}

function checkSafe(name, input) {
  let html, dom;
  try {
    const tree = parse(input);
    html = toHtml(tree);
    dom = serialize(toDom(tree, fakeDocument));
  } catch (e) {
    check(name, false, `threw ${e.stack}\n    input ${JSON.stringify(input).slice(0, 300)}`);
    return;
  }
  const problem = htmlProblem(html);
  check(name, problem === null && dom === html,
    `${problem ?? 'toDom differs from toHtml'}\n    input ${JSON.stringify(input).slice(0, 300)}\n    html ${html.slice(0, 300)}\n    dom  ${dom.slice(0, 300)}`);
}

const HOSTILE = [
  '<script>alert(1)</script>', '<img src=x onerror=alert(1)>', '"><svg onload=alert(1)>', "'><a href=javascript:1>",
  '[x](javascript:alert(1))', '[x](<javascript:alert(1)>)', '![x](https://a.org/" onerror="alert(1))',
  '[x](https://a.org/><script>)', '<https://a.org/"onclick="x>', 'https://a.org/<script>', 'http://a.org/"x',
  '```\n</code></pre><script>alert(1)</script>\n```', '`</code><script>`', '| <x> | y |\n|---|---|\n| "q" | \'s\' |',
  '<style>*{display:none}</style>', '<!-- c --> <![CDATA[x]]> <?php ?>', '&#x3C;script&#x3E;', '\u0000\u2028\u2029\ufeff',
  '> <b>\n> - <i>\n>   ```\n>   <u>', '# <h1>\n<h2>\n===',
];
HOSTILE.forEach((input, k) => checkSafe(`hostile input ${k}`, input));

// Every prefix of a reply, as the page re-renders it while tokens arrive.
const REPLY = `## Plan <b>now</b>

Here is **bold _and_ italic**, \`code <x>\`, a [link](https://example.com/a_(b)) and a
[bad one](javascript:alert(1)).

1. First
   - nested *item*
2. Second

| Name | Value |
|:-----|------:|
| \`a\` | <img src=x onerror=alert(1)> |

\`\`\`html
<script>alert("x")</script>
\`\`\`

> quote with https://example.org/path.

Done ~~maybe~~.`;
let prefixFailures = 0;
for (let n = 0; n <= REPLY.length; n++) {
  const before = failures.length;
  checkSafe(`reply prefix ${n}`, REPLY.slice(0, n));
  if (failures.length > before) prefixFailures++;
}
check('unterminated fence mid-stream is an open code block', md('```html\n<script>al').startsWith('<pre class="open"><code class="language-html">&lt;script&gt;al'));
check('unterminated bold mid-stream stays literal', md('**bol') === '<p>**bol</p>');
check('unterminated link mid-stream is not a link yet', md('[a](https://exa') === `<p>[a](${A('https://exa')}</p>`);

// Random soup of Markdown punctuation, tags and scheme fragments.
const rand = mulberry32(20261130);
const PIECES = ['*', '**', '_', '__', '~~', '`', '```', '\n', '\n\n', ' ', '  ', '#', '>', '- ', '1. ', '|', '|---|', '[', ']', '(', ')',
  '<', '>', '"', "'", '&', '\\', '!', 'javascript:', 'https://', 'mailto:', 'http://a.org', 'x', 'word', '<script>', 'onerror=',
  'é', '日本', '😀', '\t', ':', '---'];
for (let t = 0; t < 3000; t++) {
  let s = '';
  const len = 1 + Math.floor(rand() * 40);
  for (let k = 0; k < len; k++) s += PIECES[Math.floor(rand() * PIECES.length)];
  checkSafe(`random input ${t}`, s);
}

// ---------------------------------------------------------------------------------------------
// Linear time on pathological input (every closer search fails once).

const staircase = Array.from({ length: 1000 }, (_, k) => ' '.repeat(2 * k) + '- x').join('\n');
for (const [name, input] of [['stars', '*a '.repeat(60000)], ['brackets', '[a '.repeat(60000)],
                             ['backticks', '`a '.repeat(60000)], ['underscores', '_a '.repeat(60000)],
                             ['link-ish', '[a]('.repeat(60000)], ['nested quotes', '> '.repeat(60000)],
                             ['deeply nested lists', staircase], ['many lines', 'a\n'.repeat(100000)]]) {
  const t0 = process.hrtime.bigint();
  let ok = true;
  try { toHtml(parse(input)); } catch (e) { ok = false; }
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  // No assertion on the milliseconds (a loaded CI machine is slow): a super-linear blow-up on
  // these inputs runs into the test's ctest TIMEOUT (tests/CMakeLists.txt) instead.
  check(`pathological ${name} (${input.length} chars) in ${ms.toFixed(0)} ms`, ok);
  if (process.env.VERBOSE) console.log(`${name}: ${ms.toFixed(0)} ms`);
}

// ---------------------------------------------------------------------------------------------

const total = passed + failures.length;
for (const f of failures) console.error(`FAIL ${f}`);
console.log(`web_markdown_test: ${passed}/${total} checks passed${prefixFailures ? ` (${prefixFailures} reply prefixes failed)` : ''}`);
if (total === 0) console.error('FAIL web_markdown_test: no check ran');
process.exit(failures.length || total === 0 ? 1 : 0);

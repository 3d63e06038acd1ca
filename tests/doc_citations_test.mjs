// tests/doc_citations_test.mjs — every citation of a Markdown file in the sources and docs
// names a file that exists in the repository, and every section it cites ("§3.3", "§5.2–5.3",
// "§1–3, §5", "4.5, 4.9") is a numbered heading of that file ("## 3. …", "### 3.3 …").
//
//   node tests/doc_citations_test.mjs [repository root]      (default: the current directory)
//
// What is read: text files under src/ apps/ tools/ tests/ bench/ docs/ web/ ref/ cmake/
// scripts/, and the top-level README.md, CONTRIBUTING.md, CMakeLists.txt and Makefile (node_modules, build
// trees and data files are skipped). A cited path is looked up beside the citing file, then
// from the repository root. A bare "§N.N" with no file before it refers to the page itself in
// docs/, and elsewhere to the docs/ page cited last before it in the same file (none: not
// checked). Exit status 0 when every citation resolves, 1 otherwise (each failure printed as
// file:line: message).
import fs from 'node:fs';
import path from 'node:path';

const root = path.resolve(process.argv[2] ?? '.');
const DIRS = ['src', 'apps', 'tools', 'tests', 'bench', 'docs', 'web', 'ref', 'cmake', 'scripts'];
const TOP_FILES = ['README.md', 'CONTRIBUTING.md', 'CMakeLists.txt', 'Makefile'];
const TEXT_EXT = new Set(['.h', '.hpp', '.c', '.cc', '.cpp', '.inc', '.mjs', '.js', '.cjs', '.ts',
                          '.sh', '.py', '.md', '.txt', '.cmake', '.html', '.css']);
const SKIP_DIRS = new Set(['node_modules', '.git', 'build', 'data']);  // tests/data: fixtures
const MAX_BYTES = 2 << 20;

function listFiles() {
  const out = [];
  const walk = (dir) => {
    let entries;
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) {
        if (!SKIP_DIRS.has(e.name) && !e.name.startsWith('build')) walk(p);
      } else if (e.isFile() && (TEXT_EXT.has(path.extname(e.name)) || e.name === 'CMakeLists.txt')) {
        out.push(p);
      }
    }
  };
  for (const d of DIRS) walk(path.join(root, d));
  // READMEs of fixture folders are documentation too.
  const data = path.join(root, 'tests', 'data');
  if (fs.existsSync(data))
    for (const e of fs.readdirSync(data, { withFileTypes: true }))
      if (e.isDirectory() && fs.existsSync(path.join(data, e.name, 'README.md')))
        out.push(path.join(data, e.name, 'README.md'));
  for (const f of TOP_FILES) if (fs.existsSync(path.join(root, f))) out.push(path.join(root, f));
  return out;
}

// Numbered headings of a Markdown file: "## 3. Title", "### 3.3 Title", "#### 3.6.1 Title",
// "## §2 Title". Returns a Set of "3", "3.3", "3.6.1".
const sectionCache = new Map();
function sectionsOf(file) {
  if (sectionCache.has(file)) return sectionCache.get(file);
  const set = new Set();
  let inFence = false;
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (/^\s*(```|~~~)/.test(line)) inFence = !inFence;
    if (inFence) continue;
    const m = /^#{1,6}\s+§?\s*(\d+(?:\.\d+)*)\.?(\s|$)/.exec(line);
    if (m) set.add(m[1]);
  }
  sectionCache.set(file, set);
  return set;
}

// Resolves a cited path: beside the citing file, then from the root. null when neither exists
// or when the path leaves the repository.
function resolveCited(cited, fromFile) {
  const candidates = [];
  if (!cited.startsWith('/')) candidates.push(path.resolve(path.dirname(fromFile), cited));
  candidates.push(path.resolve(root, cited.replace(/^\/+/, '')));
  for (const c of candidates) {
    if (c !== root && !c.startsWith(root + path.sep)) continue;
    if (fs.existsSync(c) && fs.statSync(c).isFile()) return c;
  }
  return null;
}

// A section number, a range of them ("5.2–5.3", "1–3", "2.1–§2.5"), and a list of those.
const NUM = String.raw`\d+(?:\.\d+)*`;
const DOTTED = String.raw`\d+(?:\.\d+)+`;
const ITEM = String.raw`(?:§\s?${NUM}|${DOTTED})(?:\s?[–-]\s?§?${NUM})?`;
const LIST_ITEM = String.raw`(?:§\s?${NUM}|${DOTTED})(?:\s?[–-]\s?§?${NUM})?`;
// After a file name: optional closing quote/backtick/bracket, optional "(", then the list.
const AFTER_FILE = new RegExp(String.raw`^[\`'"\]]?\)?\s{0,2}\(?\s{0,2}(${ITEM}(?:\s?(?:,|/|;|and|&)\s?${LIST_ITEM})*)`);
const FILE_RE = /(?<![\w.\/-])((?:\.{1,2}\/|\/)?[\w.\/-]*[\w-]\.md)(?![\w])/g;
const BARE_RE = new RegExp(String.raw`§\s?(${NUM})(?:\s?[–-]\s?§?(${NUM}))?`, 'g');

// The section numbers named by a matched list ("§5.2–5.3, 3.14" → ["5.2", "5.3", "3.14"]).
function numbersIn(list) {
  const nums = [];
  for (const m of list.matchAll(new RegExp(NUM, 'g'))) nums.push(m[0]);
  return nums;
}

const failures = [];
let citations = 0, sections = 0;
for (const file of listFiles()) {
  const stat = fs.statSync(file);
  if (stat.size > MAX_BYTES) continue;
  const text = fs.readFileSync(file, 'utf8');
  if (text.includes('\u0000')) continue;
  const rel = path.relative(root, file);
  const isDoc = rel.startsWith('docs' + path.sep);
  let context = isDoc ? file : null;  // the page bare § numbers refer to
  const lines = text.split('\n');
  lines.forEach((line, i) => {
    const where = `${rel}:${i + 1}`;
    const consumed = [];  // [start, end) spans of § text that belong to a file citation
    for (const m of line.matchAll(FILE_RE)) {
      const cited = m[1];
      const before = line.slice(Math.max(0, m.index - 12), m.index);
      if (/:\/\/\S*$/.test(before) || /https?:\/\/$/.test(before)) continue;  // URLs
      citations++;
      const target = resolveCited(cited, file);
      const end = m.index + m[0].length;
      const after = AFTER_FILE.exec(line.slice(end));
      if (after) consumed.push([end, end + after[0].length]);
      if (!target) {
        failures.push(`${where}: cites ${cited}, which is not a file in the repository`);
        continue;
      }
      if (target.startsWith(path.join(root, 'docs') + path.sep) && !isDoc) context = target;
      if (!after) continue;
      if (!target.endsWith('.md')) continue;
      const have = sectionsOf(target);
      for (const n of numbersIn(after[1])) {
        sections++;
        if (!have.has(n))
          failures.push(`${where}: cites ${cited} §${n}, but ${path.relative(root, target)} has no section ${n}`);
      }
    }
    // Bare § numbers: the page itself (docs/) or the docs page cited last in this file.
    for (const m of line.matchAll(BARE_RE)) {
      if (consumed.some(([a, b]) => m.index >= a && m.index < b)) continue;
      if (!context) continue;
      const have = sectionsOf(context);
      for (const n of [m[1], m[2]].filter(Boolean)) {
        sections++;
        if (!have.has(n))
          failures.push(`${where}: §${n} (read as ${path.relative(root, context)}) is not a section of that page`);
      }
    }
  });
}

for (const f of failures) console.log(f);
console.log(`${citations} citations, ${sections} section references checked; ${failures.length} broken`);
process.exit(failures.length ? 1 : 0);

// Differential fuzz test of `coli tokenize` against OpenAI's tiktoken (npm `tiktoken`, the WASM
// build of the Rust crate) and, on strings short enough for it, against `js-tiktoken` (a second,
// independent BPE running on the JavaScript regex engine). docs/testing.md §2, docs/tokenizer.md §2–3.
//
//   node tests/node/tiktoken_fuzz.mjs <coli binary> <model_dir>
//   (run by ctest as Tokenizer.DifferentialFuzzTiktoken; `make test` installs tests/node/node_modules)
//
// The oracles get the real tiktoken.model, the 256 special tokens of tokenizer_config.json and
// the Kimi split pattern; the harness reproduces Moonshot's pre-chunking (400,000-code-point
// slices, then runs of more than 25,000 code points of one Python-isspace class cut). A few
// thousand strings come from a seeded PRNG (deterministic), plus hand-written edge cases and a few
// long strings. Every string is encoded in both modes (ordinary text / all specials allowed) by
// the oracles and by one `coli tokenize` process per mode; the id lists must be identical, and
// tiktoken's decode of our ids must give back the exact UTF-8 bytes of the input. Mismatches are
// printed (string, both id lists, both piece lists) and minimised; exit status 1 on any.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { KIMI_PATTERN, SLICE_CODE_POINTS, loadVocabulary, mulberry32, prechunk } from './kimi_k3.mjs';

const [coli, modelDir] = process.argv.slice(2);
if (!coli || !modelDir) {
  console.error('usage: node tests/node/tiktoken_fuzz.mjs <coli binary> <model_dir>');
  process.exit(2);
}

let Tiktoken, JsTiktoken;
try {
  ({ Tiktoken } = await import('tiktoken/lite'));
  ({ Tiktoken: JsTiktoken } = await import('js-tiktoken/lite'));
} catch (e) {
  console.error(`FAIL: the npm test oracles are not installed (${e.code ?? e.message}).\n` +
                'Run `make test`: it installs them (npm ci --prefix tests/node) before running ctest.');
  process.exit(1);
}

const t0 = performance.now();
// Fixed seed and count (the test is deterministic); TIKTOKEN_FUZZ_SEED / TIKTOKEN_FUZZ_COUNT
// override them for longer exploratory runs by hand.
const SEED = Number(process.env.TIKTOKEN_FUZZ_SEED ?? 0x4b33_7a1c) >>> 0;
const N_RANDOM = Number(process.env.TIKTOKEN_FUZZ_COUNT ?? 3000);
const JS_TIKTOKEN_MAX_UTF16 = 4_000;  // its BPE is cubic in the piece length: short strings only

// ---- the oracles ----------------------------------------------------------------------------

const { ranksText, rankLines, baseVocabSize: BASE, specials } = loadVocabulary(modelDir);

// The same pattern for JavaScript's `u` regexes (js-tiktoken compiles with flags "ug"): Script
// spelled out, intersection as a lookahead, the case-insensitive group as explicit variants
// (simple case folding adds only U+017F to `s`), and `\s` as Unicode White_Space (JavaScript's
// `\s` lacks U+0085 and adds U+FEFF).
const WS = String.raw`\t\n\v\f\r \x85\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000`;
const S1 = String.raw`(?:(?!\p{sc=Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])`;
const S2 = String.raw`(?:(?!\p{sc=Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])`;
const CONTRACTION = String.raw`(?:'[sS\u017F]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])`;
const JS_PATTERN = [
  String.raw`\p{sc=Han}+`,
  String.raw`[^\r\n\p{L}\p{N}]?${S1}*${S2}+${CONTRACTION}?`,
  String.raw`[^\r\n\p{L}\p{N}]?${S1}+${S2}*${CONTRACTION}?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^${WS}\p{L}\p{N}]+[\r\n]*`,
  String.raw`[${WS}]*[\r\n]+`,
  String.raw`[${WS}]+(?![^${WS}])`,
  String.raw`[${WS}]+`,
].join('|');

const wasm = new Tiktoken(ranksText, specials, KIMI_PATTERN);
// js-tiktoken reads the "compressed" rank format: `<anything> <first rank> <base64> <base64>...`.
const js = new JsTiktoken({
  pat_str: JS_PATTERN,
  special_tokens: specials,
  bpe_ranks: rankLines.map((l) => { const [b64, rank] = l.split(' '); return `! ${rank} ${b64}`; }).join('\n'),
});

function oracleWasm(text, allowSpecial) {
  const ids = [];
  for (const piece of prechunk(text)) {
    for (const id of allowSpecial ? wasm.encode(piece, 'all') : wasm.encode_ordinary(piece)) ids.push(id);
  }
  return ids;
}

function oracleJs(text, allowSpecial) {
  const ids = [];
  for (const piece of prechunk(text)) ids.push(...js.encode(piece, allowSpecial ? 'all' : [], []));
  return ids;
}

// The harness itself (oracle + pre-chunking) must reproduce the Python goldens, computed with
// Moonshot's tokenization_kimi.py on OpenAI's tiktoken; the long_ cases pin the 400k/25k cuts.
{
  const goldenPath = new URL('../data/text/tokenizer_cases.jsonl', import.meta.url);
  let checked = 0;
  for (const line of fs.readFileSync(goldenPath, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    const g = JSON.parse(line);
    if (typeof g.text !== 'string') continue;
    const modes = g.name.startsWith('long_') ? [false] : [false, true];  // long: ordinary only (time)
    for (const allowSpecial of modes) {
      const want = allowSpecial ? g.ids_allow_special : g.ids;
      if (!Array.isArray(want)) continue;
      const got = oracleWasm(g.text, allowSpecial);
      if (got.length !== want.length || got.some((x, i) => x !== want[i])) {
        console.error(`FAIL: the harness disagrees with the golden case ${g.name} ` +
                      `(${allowSpecial ? 'allow_special' : 'ordinary'}): the oracle setup or prechunk() is wrong`);
        process.exit(1);
      }
      checked++;
    }
  }
  if (checked < 200) {
    console.error(`FAIL: only ${checked} golden encodings found in ${goldenPath.pathname}`);
    process.exit(1);
  }
}

// ---- coli -----------------------------------------------------------------------------------

// Odd lines escape every non-ASCII character (\uXXXX, surrogate pairs for astral code points) so
// the JSON reader's escape path is fuzzed too; even lines carry raw UTF-8.
function jsonLine(obj, asciiOnly) {
  const s = JSON.stringify(obj);
  if (!asciiOnly) return s;
  return s.replace(/[\u007f-\uffff]/g, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
}

function runColi(cases, allowSpecial) {
  const input = cases.map((c, i) => jsonLine({ name: c.name, text: c.text }, i % 2 === 1) + '\n').join('');
  const args = ['tokenize', modelDir, ...(allowSpecial ? ['--allow-special'] : [])];
  const r = spawnSync(coli, args, { input, maxBuffer: 1 << 30, encoding: 'utf8' });
  if (r.error || r.status !== 0) {
    console.error(`FAIL: ${coli} ${args.join(' ')} → ${r.error ?? `exit ${r.status}`}\n${r.stderr ?? ""}`);
    process.exit(1);
  }
  const out = r.stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l));
  if (out.length !== cases.length) {
    console.error(`FAIL: coli wrote ${out.length} lines for ${cases.length} inputs\n${r.stderr}`);
    process.exit(1);
  }
  return out.map((o, i) => {
    if (o.name !== cases[i].name || !Array.isArray(o.ids)) {
      console.error(`FAIL: coli line ${i + 1} is ${JSON.stringify(o).slice(0, 300)} ` +
                    `(expected ids for ${cases[i].name})`);
      process.exit(1);
    }
    return o.ids;
  });
}

// ---- deterministic random strings -----------------------------------------------------------

const rand = mulberry32(SEED);
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));  // inclusive
const pick = (arr) => arr[Math.floor(rand() * arr.length)];
const chance = (p) => rand() < p;
const cp = (c) => String.fromCodePoint(c);

// Ranges are [first, last] (or [single]) of code points assigned in Unicode 14 or earlier, so the
// Unicode versions of the engines (Rust regex, our 16.0 tables, Node's ICU) cannot matter.
function fromRanges(ranges) {
  const total = ranges.reduce((n, r) => n + (r.length === 1 ? 1 : r[1] - r[0] + 1), 0);
  return () => {
    let k = Math.floor(rand() * total);
    for (const r of ranges) {
      const size = r.length === 1 ? 1 : r[1] - r[0] + 1;
      if (k < size) return cp(r[0] + k);
      k -= size;
    }
    throw new Error('unreachable');
  };
}

const letters = {
  latinLower: fromRanges([[0x61, 0x7a]]),
  latinUpper: fromRanges([[0x41, 0x5a]]),
  latinAccented: fromRanges([[0xc0, 0xd6], [0xd8, 0xf6], [0xf8, 0x17f], [0x180, 0x24f], [0x1e00, 0x1eff]]),
  titlecase: fromRanges([[0x1c5], [0x1c8], [0x1cb], [0x1f2], [0x1f88, 0x1f8f], [0x1fbc]]),
  greek: fromRanges([[0x386], [0x388, 0x38a], [0x38c], [0x38e, 0x3a1], [0x3a3, 0x3ce], [0x1f00, 0x1f15]]),
  cyrillic: fromRanges([[0x400, 0x481], [0x48a, 0x52f]]),
  armenian: fromRanges([[0x531, 0x556], [0x561, 0x586]]),
  georgian: fromRanges([[0x10d0, 0x10fa], [0x10a0, 0x10c5]]),
  arabic: fromRanges([[0x621, 0x63a], [0x641, 0x64a], [0x64b, 0x652], [0x67e], [0x686], [0x698], [0x6a9],
                      [0x6af], [0x6cc], [0x640]]),
  hebrew: fromRanges([[0x5d0, 0x5ea], [0x5b0, 0x5b9], [0x5bb, 0x5bd], [0x5c1, 0x5c2]]),
  devanagari: fromRanges([[0x901, 0x939], [0x93c, 0x94d], [0x950], [0x958, 0x961]]),
  bengali: fromRanges([[0x985, 0x98c], [0x98f, 0x990], [0x993, 0x9a8], [0x9aa, 0x9b0], [0x9b2], [0x9b6, 0x9b9],
                       [0x9be, 0x9c4], [0x9cd]]),
  tamil: fromRanges([[0xb85, 0xb8a], [0xb8e, 0xb90], [0xb92, 0xb95], [0xb99, 0xb9a], [0xb9c], [0xb9e, 0xb9f],
                     [0xba3, 0xba4], [0xba8, 0xbaa], [0xbae, 0xbb9], [0xbbe, 0xbc2], [0xbc6, 0xbc8], [0xbca, 0xbcd]]),
  thai: fromRanges([[0xe01, 0xe3a], [0xe40, 0xe4e]]),
  khmer: fromRanges([[0x1780, 0x17d3]]),
  ethiopic: fromRanges([[0x1200, 0x1248], [0x1250, 0x1256]]),
  hangul: fromRanges([[0xac00, 0xd7a3], [0x1100, 0x1112], [0x1161, 0x1175], [0x3131, 0x318e]]),
  kana: fromRanges([[0x3041, 0x3096], [0x3099, 0x309f], [0x30a1, 0x30ff], [0x31f0, 0x31ff]]),
  halfwidthKana: fromRanges([[0xff66, 0xff9f]]),
  fullwidthLatin: fromRanges([[0xff21, 0xff3a], [0xff41, 0xff5a]]),
  cherokeeDeseret: fromRanges([[0x13a0, 0x13f5], [0xab70, 0xabbf], [0x10400, 0x1044f]]),
  mathAlnum: fromRanges([[0x1d400, 0x1d454], [0x1d7ce, 0x1d7ff]]),
  modifierLetters: fromRanges([[0x2b0, 0x2c1], [0x2c6, 0x2d1], [0x3005], [0x303b], [0x3031, 0x3035], [0xa015], [0xff70]]),
};
const han = fromRanges([[0x4e00, 0x9fff], [0x4e00, 0x9fff], [0x3400, 0x4dbf], [0x20000, 0x2a6df],
                        [0xf900, 0xfa6d], [0xfa70, 0xfad9], [0x2f800, 0x2fa1d], [0x2a700, 0x2b734]]);
const hanNonLetters = fromRanges([[0x3005], [0x3007], [0x3021, 0x3029], [0x3038, 0x303b], [0x2e80, 0x2e99],
                                  [0x2e9b, 0x2ef3], [0x2f00, 0x2fd5], [0x16fe2], [0x16fe3], [0x16ff0, 0x16ff1]]);
const combining = fromRanges([[0x300, 0x36f], [0x483, 0x489], [0x1ab0, 0x1abe], [0x1dc0, 0x1df9], [0x20d0, 0x20f0],
                              [0xfe20, 0xfe2f], [0xe0100, 0xe0120], [0x302a, 0x302f], [0x3099, 0x309a]]);
const digitsAny = fromRanges([[0x30, 0x39], [0x30, 0x39], [0x30, 0x39], [0x660, 0x669], [0x6f0, 0x6f9], [0x966, 0x96f],
                              [0x9e6, 0x9ef], [0xbe6, 0xbef], [0xe50, 0xe59], [0xff10, 0xff19], [0x1d7ce, 0x1d7d7],
                              [0xb2], [0xb3], [0xb9], [0xbc, 0xbe], [0x2150, 0x2189], [0x2460, 0x249b], [0x3007],
                              [0x3021, 0x3029], [0x4e00], [0x10107, 0x10133]]);
const asciiPunct = '!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\'';
const unicodePunct = fromRanges([[0x3001, 0x3003], [0x3008, 0x3011], [0x3014, 0x301f], [0xff01, 0xff0f], [0xff1a, 0xff20],
                                 [0x2010, 0x2027], [0x2030, 0x205e], [0xa1, 0xbf], [0xd7], [0xf7], [0x2190, 0x21ff],
                                 [0x2200, 0x22ff], [0x2500, 0x257f], [0x20a0, 0x20c0], [0x2ff0, 0x2ffb], [0x30fb],
                                 [0x2e00, 0x2e4e]]);
const emojiSingle = fromRanges([[0x1f600, 0x1f64f], [0x1f300, 0x1f5ff], [0x1f680, 0x1f6c5], [0x1f910, 0x1f96b],
                                [0x1f980, 0x1f9e5], [0x2600, 0x26ff], [0x2700, 0x27bf], [0x1f004], [0x1f0cf]]);
const skinTone = fromRanges([[0x1f3fb, 0x1f3ff]]);
const regionalIndicator = fromRanges([[0x1f1e6, 0x1f1ff]]);
const WHITESPACE_ATOMS = [' ', ' ', ' ', '  ', '   ', '    ', '\t', '\t\t', '\n', '\n', '\n\n', '\r\n', '\r', '\r\n\r\n',
  '\u2028', '\u2029', '\u0085', '\v', '\f', '\u00a0', '\u3000', '\u200b', '\ufeff', '\u001c', '\u001d', '\u001e', '\u001f',
  '\u1680', '\u2000', '\u2003', '\u2009', '\u200a', '\u202f', '\u205f', '\u180e', ' \n', '\n ', ' \t\n', '\t \r\n '];
const controls = fromRanges([[0x0], [0x1, 0x8], [0xe, 0x1b], [0x7f], [0x80, 0x84], [0x86, 0x9f], [0xad], [0xfffd],
                             [0xfffd], [0x200c, 0x200f], [0x2060, 0x2064], [0xe000, 0xf8ff], [0xf0000, 0xf0010],
                             [0xffff0, 0xffffd], [0x100000, 0x100010], [0x10fff0, 0x10fffd], [0xfdd0, 0xfdef],
                             [0xfffe, 0xffff], [0x1fffe, 0x1ffff], [0x10fffe, 0x10ffff], [0xe0001], [0xe0020, 0xe007f]]);
const CONTRACTIONS = ["'s", "'S", "'\u017f", "'t", "'T", "'re", "'RE", "'Re", "'rE", "'ve", "'VE", "'Ve", "'vE", "'m", "'M",
  "'ll", "'LL", "'Ll", "'lL", "'d", "'D", "'x", "'", "''s", "\u2019s", "'\u017ft", " 's", "'sa", "'reed", "'K", "'\u212a"];
const WORDS = ['the', 'The', 'THE', 'engine', 'tokenizer', 'HTTPResponse', 'XMLHttpRequest', 'iPhone', 'macOS',
  'camelCase', 'snake_case', 'don', 'can', 'CAN', 'we', 'I', 'you', 'it', 'Straße', 'naïve', 'café', 'résumé', 'ÜBER',
  'mañana', 'newlines', 'hello', 'world', 'Kimi', 'K3', 'moonshot', 'ǅemal', 'ǈubljana', 'ΣΊΣΥΦΟΣ', 'Москва', 'straße'];
const SPECIAL_SPELLINGS = ['<|open|>', '<|close|>', '<|sep|>', '<|end_of_msg|>', '[BOS]', '[EOS]', '[UNK]', '[PAD]',
  '[EOT]', '[start_header_id]', '[end_header_id]', '<|media_begin|>', '<|media_content|>', '<|media_end|>',
  '<|media_pad|>', '<osagent_mode>', '<|reserved_token_163592|>', '<|reserved_token_163594|>',
  '<|reserved_token_163837|>', '<|reserved_token_163650|>',
  // look-alikes that are not special tokens
  '<|reserved_token_163586|>', '<|reserved_token_163584|>', '<|reserved_token_163840|>', '<|reserved_token_163583|>',
  '<|reserved_token_0163592|>', '<| open |>', '<|OPEN|>', '<|open|', '|open|>', '<open>', '[bos]', '[BOS', 'BOS]',
  '<|im_end|>', '<|end_of_msg|', '<<|open|>>', '[[BOS]]', '<|<|sep|>|>', '<|reserved_token_|>'];

function word(gen, lo = 1, hi = 10) {
  let s = '';
  for (let n = int(lo, hi); n > 0; n--) {
    s += gen();
    if (chance(0.08)) s += combining();
  }
  return s;
}
function latinWord() {
  const letter = () => (chance(0.15) ? letters.latinAccented() : letters.latinLower());
  const base = chance(0.3) ? pick(WORDS) : word(letter, 1, 12);
  switch (int(0, 5)) {
    case 0: return base.toUpperCase();
    case 1: return base.charAt(0).toUpperCase() + base.slice(1);
    case 2: return base + letters.latinUpper() + word(letters.latinLower, 0, 5);  // camelCase
    default: return base;
  }
}
const SCRIPTS = Object.values(letters);
function scriptWord() {
  switch (int(0, 9)) {
    case 0: case 1: case 2: return latinWord();
    case 3: return word(han, 1, 6);
    case 4: return word(letters.kana, 1, 8);
    default: return word(pick(SCRIPTS), 1, 10);
  }
}
function digitRun() {
  const n = pick([1, 2, 3, 4, 5, 6, 7, 10, 13, 20]);
  let s = '';
  for (let i = 0; i < n; i++) s += chance(0.85) ? String(int(0, 9)) : digitsAny();
  return s;
}
function punctRun() {
  if (chance(0.3)) return pick(['//', '\n//', ';\n// c', '...', '---', '```', '->', '=>', '::', '!=', '/*', '*/',
    '#!', '<!--', '-->', '"""', '%%', '\\n', '/// ', '({', '});', '。', '、', '，', '？', '…', '——', '「', '」']);
  let s = '';
  for (let n = int(1, 6); n > 0; n--) s += chance(0.7) ? pick(asciiPunct) : unicodePunct();
  return s;
}
function emoji() {
  switch (int(0, 7)) {
    case 0: return emojiSingle() + skinTone();
    case 1: return regionalIndicator() + regionalIndicator();
    case 2: return pick('#*0123456789') + (chance(0.8) ? '\ufe0f' : '') + '\u20e3';
    case 3: return pick(['\u{1f468}\u200d\u{1f469}\u200d\u{1f467}\u200d\u{1f466}', '\u{1f3f3}\ufe0f\u200d\u{1f308}',
      '\u{1f469}\u{1f3fd}\u200d\u{1f4bb}', '\u{1f3f4}\u{e0067}\u{e0062}\u{e0073}\u{e0063}\u{e0074}\u{e007f}',
      '\u{1f441}\ufe0f\u200d\u{1f5e8}\ufe0f', '\u2764\ufe0f\u200d\u{1f525}', '\u{1f44b}\u{1f3fd}']);
    case 4: return emojiSingle() + '\u200d' + emojiSingle();
    case 5: return emojiSingle() + pick(['\ufe0f', '\ufe0e']);
    default: return emojiSingle();
  }
}
function contraction() {
  const before = pick([latinWord, latinWord, scriptWord, () => word(han, 1, 2), digitRun, () => letters.titlecase(),
    () => ' ', () => '', () => word(letters.modifierLetters, 1, 2), () => combining()])();
  return before + pick(CONTRACTIONS);
}
function whitespace() {
  if (chance(0.1)) return ' '.repeat(int(2, 40));
  if (chance(0.05)) return '\t'.repeat(int(2, 8));
  return pick(WHITESPACE_ATOMS);
}
function specialSpelling() {
  if (chance(0.15)) return `<|reserved_token_${int(163584, 163839)}|>`;
  return pick(SPECIAL_SPELLINGS);
}
function anyAtom() {
  switch (int(0, 15)) {
    case 0: case 1: case 2: return scriptWord();
    case 3: return digitRun();
    case 4: return punctRun();
    case 5: case 6: return whitespace();
    case 7: return emoji();
    case 8: return contraction();
    case 9: return hanNonLetters();
    case 10: return controls();
    case 11: return combining();
    case 12: return specialSpelling();
    case 13: return word(han, 1, 4);
    case 14: return pick(SCRIPTS)();
    default: return pick(asciiPunct);
  }
}

const generators = {
  // words of one script with spaces, punctuation and numbers between them
  prose() {
    const gen = chance(0.4) ? latinWord : (() => { const g = pick([...SCRIPTS, han]); return () => word(g, 1, 8); })();
    let s = '';
    for (let n = int(3, 20); n > 0; n--) {
      s += gen();
      if (chance(0.1)) s += digitRun();
      if (chance(0.2)) s += punctRun();
      if (chance(0.1)) s += pick(CONTRACTIONS);
      s += chance(0.85) ? ' ' : whitespace();
    }
    return chance(0.5) ? s.trimEnd() : s;
  },
  // any atoms, glued together or separated by random whitespace
  mixed() {
    let s = '';
    const glue = chance(0.5);
    for (let n = int(1, 25); n > 0; n--) s += anyAtom() + (glue ? '' : whitespace());
    return s;
  },
  // single code points from every class, in random order
  codepoints() {
    const gens = [...SCRIPTS, han, hanNonLetters, combining, digitsAny, unicodePunct, emojiSingle, controls,
      () => pick(asciiPunct), () => pick(WHITESPACE_ATOMS), skinTone, regionalIndicator];
    let s = '';
    for (let n = int(1, 40); n > 0; n--) s += pick(gens)();
    return s;
  },
  // source-code-like text: indentation, comments after newlines, identifiers, numbers
  code() {
    let s = '';
    for (let lines = int(1, 8); lines > 0; lines--) {
      s += pick(['', '  ', '    ', '\t', '\t\t', '        ']);
      for (let n = int(1, 8); n > 0; n--) {
        s += pick([latinWord, latinWord, digitRun, punctRun, () => ' ', () => '_' + latinWord(),
          () => '"' + scriptWord() + '"',
          () => '// ' + scriptWord(), () => '# ' + latinWord()])();
      }
      s += pick(['\n', '\n', '\r\n', '\n\n', ';\n', ' \n', '{\n', '\n//', '\n/']);
    }
    return chance(0.3) ? s + pick(['  ', '\t', ' \t ', '    ']) : s;
  },
  // whitespace of every kind around short tokens, often trailing
  whitespaceHeavy() {
    let s = '';
    for (let n = int(1, 12); n > 0; n--) {
      s += whitespace();
      if (chance(0.6)) s += pick([scriptWord, digitRun, punctRun, emoji, controls])();
    }
    return s;
  },
  // special-token spellings and look-alikes in context
  special() {
    let s = '';
    for (let n = int(1, 8); n > 0; n--) {
      s += chance(0.5) ? specialSpelling() : anyAtom();
      if (chance(0.3)) s += whitespace();
    }
    return s;
  },
  emoji() {
    let s = '';
    for (let n = int(1, 12); n > 0; n--) s += emoji() + (chance(0.4) ? ' ' : chance(0.3) ? scriptWord() : '');
    return s;
  },
};
const GENERATOR_WEIGHTS = [['prose', 5], ['mixed', 8], ['codepoints', 5], ['code', 3], ['whitespaceHeavy', 3],
  ['special', 2], ['emoji', 2]];
const weightTotal = GENERATOR_WEIGHTS.reduce((n, [, w]) => n + w, 0);
function pickGenerator() {
  let k = rand() * weightTotal;
  for (const [name, w] of GENERATOR_WEIGHTS) { if ((k -= w) < 0) return name; }
  return GENERATOR_WEIGHTS[0][0];
}

// ---- the cases ------------------------------------------------------------------------------

const cases = [];
const add = (name, text) => cases.push({ name: `${String(cases.length).padStart(4, '0')}_${name}`, text });

const EDGE = [
  '', ' ', '\n', 'a', "don'\u017f", "DON'\u017f", "don'\u017fa", "I'll say we've DONE it. HTTPResponse XMLHttpRequest",
  "don't CAN'T it's I'M we'RE you'll", "\u01c5's \u1f88'S x'Ll x'lL \u02b0'd \u0301'm", "\u4e2d's 1's \u00e9's '\u212a",
  '1 12 123 1234 12345 3.14159 -42', '\u3007 \u3005 \u4e00\u4e8c\u4e09 \u3007\u3007\u3007 1\u30072 a\u3005b \u30071',
  '\u2e80\u2e81 !\u2e80 \u2f00\u2f01x \u{16fe2}\u{16fe3}\u{16ff0}\u{16ff1} x\u{16ff0}y a\u{16fe3}b 1\u{16fe2}',
  'x;\n// c', 'x;\n//\n// d\n/// e\r\n// f', ';\r\n//', '\n\n//', 'a\r\nb\rc\n\rd\u2028e\u2029f\u0085g\vh\fi',
  ' \u00a0 \u3000 \u200b \ufeff \u001c \u001d\u001e\u001f x', '\u00a0\u00a0x', '\u3000\u3000\u3000\u6f22',
  'tabs\t\t', 'spaces   ', 'mixed \t \t', 'end \n', 'end\n\n  ', '  indented\n\n\nnewlines\t\ttabs   ',
  '\u0000', 'a\u0000b', '\u0000\u0000\u0000 \u0000', '\u0080\u0081\u009f\u0085\u0086', '\ufffd', 'x\ufffd\ufffdy',
  '\ue000\uf8ff\u{f0000}\u{10fffd}', '\ufdd0\ufffe\uffff\u{1fffe}\u{10ffff}',
  '<|open|>', ' <|open|>', '<|open|><|close|><|sep|>', 'a<|reserved_token_163592|>b', '<|reserved_token_163586|>',
  '[BOS]hello[EOS]', '<| open |>', '<|OPEN|>', '<|open|', '<<|open|>>', '[[BOS]]', '<|end_of_msg|>\n',
  '\u0301A', '\u0301\u0301a', 'e\u0301\u0302\u0303', 'A\u0301B', '\u093f\u0915', 'Z\u0308\u0324a\u0301',
  '\u{1f468}\u200d\u{1f469}\u200d\u{1f467}\u200d\u{1f466} \u{1f1ef}\u{1f1f5} #\ufe0f\u20e3 \u{1f44b}\u{1f3fd}',
  '\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002' +
    '\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3001\u6f22\u5b57\u3082\u3002',
  '\uff76\uff80\uff76\uff85\uff70\uff9e', '\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\ub3c4', '\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35',
  '\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645', '\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd',
  '\u0928\u092e\u0938\u094d\u0924\u0947', '\u09ac\u09be\u0982\u09b2\u09be', '\u0bb5\u0ba3\u0b95\u0bcd\u0b95\u0bae\u0bcd',
  '\u{20000}\u{2a6d6}\u{2f800}\uf900\ufa6d', '\u3400\u4dbf\u9fff',
  'mixed \u4e2d\u6587with no space\u82f1\u6587boundaries\u6d4b\u8bd5',
];
for (const text of EDGE) add('edge', text);

for (let i = 0; i < N_RANDOM; i++) {
  const g = pickGenerator();
  add(`rand_${g}`, generators[g]());
}

// Long strings: the 25,000 run cut and the 400,000-code-point slice.
add('long_26000_spaces', ' '.repeat(26_000));
add('long_26000_spaces_end', ' '.repeat(26_000) + 'end');
add('long_30000_digits', Array.from({ length: 30_000 }, () => String(int(0, 9))).join(''));
add('long_25001_letters', Array.from({ length: 25_001 }, () => pick('abcdefghijklmnopqrstuvwxyz')).join(''));
add('long_25001_multibyte',
    Array.from({ length: 25_001 }, () => pick(['\u00e9', 'a', '\u4e2d', '\u{1f600}', '\u0416'])).join(''));
add('long_isspace_not_ws', 'x' + '\u001f'.repeat(25_003) + 'y\u001c\u001d ' + ' \t'.repeat(13_000));
{
  // > 400,000 code points; astral characters make the UTF-16 index of the cut differ from the
  // code-point index, and a word straddles the cut.
  const unit = ['word ', '\u4e2d\u6587 ', '\u{1f600}x ', 'caf\u00e9 ', '\u{20000}\u{20001}', '\u0416\u0416 ', '12345 ', '\n\n'];
  const parts = [];
  let cps = 0;
  while (cps < SLICE_CODE_POINTS - 3) { const u = pick(unit); parts.push(u); cps += [...u].length; }
  parts.push('abcdefghijklmnop\u{1f600}\u00e9\u4e2d\u{20000} tail ');
  for (let i = 0; i < 2000; i++) parts.push(pick(unit));
  add('long_400k_slice', parts.join(''));
}

// ---- run ------------------------------------------------------------------------------------

function pieces(ids) {
  return ids.map((id) => {
    const b = wasm.decode_single_token_bytes(id);
    const s = Buffer.from(b).toString('utf8');
    return Buffer.from(s, 'utf8').equals(Buffer.from(b)) ? JSON.stringify(s) : `<${Buffer.from(b).toString('hex')}>`;
  });
}
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const show = (text) => (text.length > 600
  ? `${JSON.stringify(text.slice(0, 600))}… (${[...text].length} code points)`
  : JSON.stringify(text));
function window(ids, at) { return ids.slice(Math.max(0, at - 8), at + 12); }

// Smallest substring-by-deletion that still mismatches (ddmin over code points; each round is one
// coli run over all candidates).
function minimise(text, allowSpecial) {
  let cps = [...text];
  if (cps.length > 5000) return null;
  let n = 2;
  for (let round = 0; round < 300 && cps.length > 1; round++) {
    const size = Math.ceil(cps.length / n);
    const cands = [];
    for (let i = 0; i < cps.length; i += size) cands.push(cps.slice(0, i).concat(cps.slice(i + size)));
    const ours = runColi(cands.map((c, i) => ({ name: `min${i}`, text: c.join('') })), allowSpecial);
    const bad = cands.findIndex((c, i) => !same(ours[i], oracleWasm(c.join(''), allowSpecial)));
    if (bad >= 0) {
      cps = cands[bad];
      n = Math.max(n - 1, 2);
    } else if (size === 1) {
      break;
    } else {
      n = Math.min(n * 2, cps.length);
    }
  }
  return cps.join('');
}

let mismatches = 0, totalIds = 0, jsCompared = 0, minimised = 0;
for (const allowSpecial of [false, true]) {
  const mode = allowSpecial ? 'allow_special' : 'ordinary';
  const ours = runColi(cases, allowSpecial);
  cases.forEach((c, i) => {
    const expected = oracleWasm(c.text, allowSpecial);
    totalIds += ours[i].length;
    const problems = [];
    if (!same(ours[i], expected)) {
      const at = ours[i].findIndex((x, k) => x !== expected[k]);
      const k = at < 0 ? Math.min(ours[i].length, expected.length) : at;
      problems.push(`ids differ from tiktoken at index ${k} (ours ${ours[i].length} ids, tiktoken ${expected.length})\n` +
        `    tiktoken: ${JSON.stringify(window(expected, k))}  ${pieces(window(expected, k)).join(' ')}\n` +
        `    coli:     ${JSON.stringify(window(ours[i], k))}  ${pieces(window(ours[i], k)).join(' ')}`);
    }
    if (c.text.length <= JS_TIKTOKEN_MAX_UTF16) {
      jsCompared++;
      const second = oracleJs(c.text, allowSpecial);
      if (!same(second, expected)) {
        problems.push(`the two oracles disagree: js-tiktoken ${JSON.stringify(second)} ${pieces(second).join(' ')}`);
      }
    }
    const bytes = Buffer.from(c.text, 'utf8');
    const decoded = Buffer.from(wasm.decode(Uint32Array.from(ours[i].filter((id) => id >= 0 && id < BASE + 256))));
    if (!decoded.equals(bytes) || ours[i].some((id) => !(id >= 0 && id < BASE + 256))) {
      problems.push('tiktoken\'s decode of our ids is not the input: ' +
                    JSON.stringify(decoded.toString('utf8').slice(0, 300)));
    }
    if (problems.length) {
      mismatches++;
      console.log(`MISMATCH ${c.name} [${mode}] text ${show(c.text)}\n  ${problems.join('\n  ')}`);
      if (!same(ours[i], expected) && minimised < 5) {
        minimised++;
        const m = minimise(c.text, allowSpecial);
        if (m !== null) {
          const e = oracleWasm(m, allowSpecial), o = runColi([{ name: 'min', text: m }], allowSpecial)[0];
          console.log(`  minimised: ${JSON.stringify(m)}\n    tiktoken: ${JSON.stringify(e)}  ${pieces(e).join(' ')}\n` +
                      `    coli:     ${JSON.stringify(o)}  ${pieces(o).join(' ')}`);
        }
      }
    }
  });
}

const seconds = ((performance.now() - t0) / 1000).toFixed(1);
console.log(`${cases.length} strings, ${totalIds} ids, ${mismatches} mismatches ` +
            `(both modes; js-tiktoken on ${jsCompared} of ${2 * cases.length}; seed ${SEED.toString(16)}; ${seconds} s)`);
process.exit(mismatches ? 1 : 0);

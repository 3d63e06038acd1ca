// Strict, independent safetensors reader used by tests to check the shards a repack tool writes.
//
// Written from the safetensors format specification alone (it shares no code with src/io/):
//   8-byte little-endian unsigned header length N, N bytes of UTF-8 JSON, then the data region,
//   which runs to the end of the file. Only the header is read, so multi-GB shards are cheap.
//
// Usage as a module: checkSafetensors(path) -> {headerLength, dataStart, metadata, tensors}.
// Usage as a CLI:    node tests/node/safetensors_strict.mjs FILE...
import fs from 'node:fs';
import { pathToFileURL } from 'node:url';

export const MAX_HEADER_LENGTH = 100_000_000;

// Bytes per element of every dtype the format defines.
export const DTYPE_SIZES = Object.freeze({
  BOOL: 1, U8: 1, I8: 1, F8_E5M2: 1, F8_E4M3: 1, F8_E8M0: 1,
  I16: 2, U16: 2, F16: 2, BF16: 2,
  I32: 4, U32: 4, F32: 4,
  F64: 8, I64: 8, U64: 8,
});

const ENTRY_KEYS = ['dtype', 'shape', 'data_offsets'];
const MAX_DEPTH = 32; // a valid header nests 3 deep; this only guards the recursion
const SIMPLE_ESCAPES = Object.freeze({
  '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t',
});

// A JSON number written with a fraction or exponent ("1.0", "1e3"): never a valid size or offset.
class NonInteger {
  constructor(raw) { this.raw = raw; }
}

// ---- strict JSON parser ---------------------------------------------------------------------
// JSON.parse keeps the last of duplicate keys silently, so the header is parsed here instead.
// Objects become Maps (insertion ordered, no __proto__ surprises); duplicate keys are errors.

function describeValue(v) {
  if (v instanceof NonInteger) return `non-integer number ${v.raw}`;
  if (v instanceof Map) return 'an object';
  if (Array.isArray(v)) return 'an array';
  if (v === null) return 'null';
  return `${typeof v} ${JSON.stringify(v)}`;
}

class JsonParser {
  constructor(text) {
    this.text = text;
    this.pos = 0;
  }

  fail(msg, at = this.pos) {
    throw new Error(`header JSON: ${msg} at character ${at}`);
  }

  skipWs() {
    const t = this.text;
    while (this.pos < t.length) {
      const c = t[this.pos];
      if (c !== ' ' && c !== '\t' && c !== '\n' && c !== '\r') break;
      this.pos++;
    }
  }

  // Parses one value; `where` describes its place (for duplicate-key messages).
  value(depth, where) {
    if (depth > MAX_DEPTH) this.fail('nesting too deep');
    this.skipWs();
    const c = this.text[this.pos];
    if (c === '{') return this.object(depth, where);
    if (c === '[') return this.array(depth, where);
    if (c === '"') return this.string();
    if (c === '-' || (c >= '0' && c <= '9')) return this.number();
    for (const [word, v] of [['true', true], ['false', false], ['null', null]]) {
      if (this.text.startsWith(word, this.pos)) {
        this.pos += word.length;
        return v;
      }
    }
    return this.fail(c === undefined ? 'unexpected end' : `unexpected ${JSON.stringify(c)}`);
  }

  object(depth, where) {
    const map = new Map();
    this.pos++; // '{'
    this.skipWs();
    if (this.text[this.pos] === '}') {
      this.pos++;
      return map;
    }
    for (;;) {
      this.skipWs();
      if (this.text[this.pos] !== '"') this.fail('expected a string key');
      const keyAt = this.pos;
      const key = this.string();
      if (map.has(key)) {
        this.fail(`duplicate key ${JSON.stringify(key)} ${where}`, keyAt);
      }
      this.skipWs();
      if (this.text[this.pos] !== ':') this.fail('expected \':\'');
      this.pos++;
      const inner = depth === 0 ? `in the entry of ${JSON.stringify(key)}` : where;
      map.set(key, this.value(depth + 1, inner));
      this.skipWs();
      const c = this.text[this.pos++];
      if (c === '}') return map;
      if (c !== ',') this.fail('expected \',\' or \'}\'', this.pos - 1);
    }
  }

  array(depth, where) {
    const out = [];
    this.pos++; // '['
    this.skipWs();
    if (this.text[this.pos] === ']') {
      this.pos++;
      return out;
    }
    for (;;) {
      out.push(this.value(depth + 1, where));
      this.skipWs();
      const c = this.text[this.pos++];
      if (c === ']') return out;
      if (c !== ',') this.fail('expected \',\' or \']\'', this.pos - 1);
    }
  }

  // A string literal, escapes decoded. Raw control characters and lone surrogates are refused.
  string() {
    const t = this.text;
    const start = this.pos;
    this.pos++; // opening quote
    let out = '';
    for (;;) {
      if (this.pos >= t.length) this.fail('unterminated string', start);
      const c = t[this.pos];
      const code = c.charCodeAt(0);
      if (c === '"') {
        this.pos++;
        return out;
      }
      if (code < 0x20) this.fail('raw control character in string');
      if (c !== '\\') {
        out += c;
        this.pos++;
        continue;
      }
      const e = t[this.pos + 1];
      if (e !== undefined && Object.hasOwn(SIMPLE_ESCAPES, e)) {
        out += SIMPLE_ESCAPES[e];
        this.pos += 2;
        continue;
      }
      if (e !== 'u') this.fail('invalid escape');
      const unit = this.hex4(this.pos + 2);
      this.pos += 6;
      if (unit >= 0xd800 && unit <= 0xdbff) {
        // A high surrogate must be followed by an escaped low surrogate.
        if (t[this.pos] !== '\\' || t[this.pos + 1] !== 'u') this.fail('lone surrogate escape');
        const low = this.hex4(this.pos + 2);
        if (low < 0xdc00 || low > 0xdfff) this.fail('lone surrogate escape');
        this.pos += 6;
        out += String.fromCharCode(unit, low);
      } else if (unit >= 0xdc00 && unit <= 0xdfff) {
        this.fail('lone surrogate escape');
      } else {
        out += String.fromCharCode(unit);
      }
    }
  }

  hex4(at) {
    const h = this.text.slice(at, at + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(h)) this.fail('invalid \\u escape', at);
    return parseInt(h, 16);
  }

  number() {
    const re = /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
    re.lastIndex = this.pos;
    const m = re.exec(this.text);
    if (!m) this.fail('invalid number');
    this.pos += m[0].length;
    if (m[2] !== undefined || m[3] !== undefined) return new NonInteger(m[0]);
    if (m[0] === '-0') return new NonInteger(m[0]); // not a valid size either
    return Number(m[0]);
  }
}

// ---- checks ---------------------------------------------------------------------------------

function readFully(fd, length, position) {
  const buf = Buffer.alloc(length);
  let done = 0;
  while (done < length) {
    const n = fs.readSync(fd, buf, done, length - done, position + done);
    if (n === 0) throw new Error(`unexpected end of file at byte ${position + done}`);
    done += n;
  }
  return buf;
}

const bytes = (n) => (n === 1 ? '1 byte' : `${n} bytes`);
const isIndex = (v) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

// Validates one tensor entry; returns {name, dtype, shape, begin, end}. Throws without the path.
function checkEntry(name, entry) {
  const bad = (msg) => new Error(`tensor ${JSON.stringify(name)}: ${msg}`);
  if (!(entry instanceof Map)) throw bad(`entry is ${describeValue(entry)}, not an object`);
  for (const key of entry.keys()) {
    if (!ENTRY_KEYS.includes(key)) throw bad(`unexpected key ${JSON.stringify(key)}`);
  }
  for (const key of ENTRY_KEYS) {
    if (!entry.has(key)) throw bad(`missing key ${JSON.stringify(key)}`);
  }
  const dtype = entry.get('dtype');
  if (typeof dtype !== 'string' || !Object.hasOwn(DTYPE_SIZES, dtype)) {
    throw bad(`unknown dtype ${describeValue(dtype)}`);
  }
  const shape = entry.get('shape');
  if (!Array.isArray(shape)) throw bad(`shape is ${describeValue(shape)}, not an array`);
  shape.forEach((d, i) => {
    if (!isIndex(d)) throw bad(`shape[${i}] is ${describeValue(d)}, not a non-negative integer`);
  });
  const offsets = entry.get('data_offsets');
  if (!Array.isArray(offsets) || offsets.length !== 2) {
    throw bad(`data_offsets is ${describeValue(offsets)}, not [begin, end]`);
  }
  offsets.forEach((o, i) => {
    if (!isIndex(o)) {
      throw bad(`data_offsets[${i}] is ${describeValue(o)}, not a non-negative integer`);
    }
  });
  const [begin, end] = offsets;
  if (begin > end) throw bad(`data_offsets begin ${begin} > end ${end}`);
  // BigInt: the element count of a (bogus) shape may exceed 2^53.
  const want = shape.reduce((p, d) => p * BigInt(d), 1n) * BigInt(DTYPE_SIZES[dtype]);
  if (BigInt(end - begin) !== want) {
    throw bad(`data_offsets span ${bytes(end - begin)} but ${dtype} ${JSON.stringify(shape)} ` +
      `needs ${want}`);
  }
  return { name, dtype, shape, begin, end };
}

// Parses and validates the header text; returns {metadata, tensors} (tensors in header order).
function checkHeaderText(text) {
  const parser = new JsonParser(text);
  const root = parser.value(0, 'at the top level');
  // Writers pad the header with spaces; nothing else may follow the object.
  for (let i = parser.pos; i < text.length; i++) {
    if (text[i] !== ' ') {
      throw new Error(`header has ${JSON.stringify(text[i])} after the JSON object at ` +
        `character ${i} (only space padding is allowed)`);
    }
  }
  let metadata = null;
  const tensors = [];
  for (const [key, value] of root) {
    if (key === '__metadata__') {
      if (!(value instanceof Map)) {
        throw new Error(`__metadata__ is ${describeValue(value)}, not an object`);
      }
      for (const [k, v] of value) {
        if (typeof v !== 'string') {
          throw new Error(`__metadata__ ${JSON.stringify(k)} is ${describeValue(v)}, ` +
            'not a string');
        }
      }
      metadata = Object.fromEntries(value);
    } else {
      tensors.push(checkEntry(key, value));
    }
  }
  return { metadata, tensors };
}

// Checks that the tensors, sorted by offset, tile [0, dataSize) exactly. Returns them sorted.
function checkTiling(tensors, dataSize) {
  // Stable sort by (begin, end): an empty tensor sorts before the one that starts at its offset.
  const sorted = [...tensors].sort((a, b) => a.begin - b.begin || a.end - b.end);
  let at = 0;
  let prev = null;
  for (const t of sorted) {
    if (t.begin !== at) {
      const name = JSON.stringify(t.name);
      if (prev === null) throw new Error(`first tensor ${name} begins at ${t.begin}, not 0`);
      const what = t.begin > at ? `hole of ${bytes(t.begin - at)}`
        : `overlap of ${bytes(at - t.begin)}`;
      throw new Error(`tensor ${name} begins at ${t.begin} but the previous tensor ` +
        `${JSON.stringify(prev.name)} ends at ${at} (${what})`);
    }
    at = t.end;
    prev = t;
  }
  if (at !== dataSize) {
    if (prev === null) throw new Error(`no tensors but the data region has ${bytes(dataSize)}`);
    const what = at < dataSize ? `${bytes(dataSize - at)} trailing`
      : `${bytes(at - dataSize)} past the end`;
    throw new Error(`last tensor ${JSON.stringify(prev.name)} ends at ${at} but the data region ` +
      `is ${dataSize} bytes (${what})`);
  }
  return sorted;
}

// Strictly checks one safetensors file. Throws an Error whose message starts with `path`.
export function checkSafetensors(path) {
  try {
    return checkFile(path);
  } catch (e) {
    throw new Error(`${path}: ${e.message}`, { cause: e });
  }
}

function checkFile(path) {
  const st = fs.statSync(path);
  if (!st.isFile()) throw new Error('not a regular file');
  const size = st.size;
  if (size < 8) throw new Error(`file is ${bytes(size)}, shorter than the 8-byte header length`);
  const fd = fs.openSync(path, 'r');
  let header;
  let n;
  try {
    const big = readFully(fd, 8, 0).readBigUInt64LE(0);
    if (big === 0n) throw new Error('header length is 0');
    if (big > BigInt(MAX_HEADER_LENGTH)) {
      throw new Error(`header length ${big} exceeds ${MAX_HEADER_LENGTH}`);
    }
    n = Number(big);
    if (8 + n > size) {
      throw new Error(`header length ${n} runs past the end of the ${size}-byte file`);
    }
    header = readFully(fd, n, 8);
  } finally {
    fs.closeSync(fd);
  }
  if (header[0] !== 0x7b) {
    const hex = header[0].toString(16).padStart(2, '0');
    throw new Error(`header starts with byte 0x${hex}, not '{'`);
  }
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(header);
  } catch {
    throw new Error('header is not valid UTF-8');
  }
  const { metadata, tensors } = checkHeaderText(text);
  const dataStart = 8 + n;
  return { headerLength: n, dataStart, metadata, tensors: checkTiling(tensors, size - dataStart) };
}

// ---- CLI ------------------------------------------------------------------------------------

function main(args) {
  if (args.length === 0 || args.some((a) => a.startsWith('-'))) {
    process.stderr.write('usage: node safetensors_strict.mjs FILE...\n');
    return 2;
  }
  for (const file of args) {
    try {
      const r = checkSafetensors(file);
      process.stdout.write(`ok ${file}: ${r.tensors.length} tensors, data at ${r.dataStart}\n`);
    } catch (e) {
      process.stderr.write(`${e.message}\n`);
      return 1;
    }
  }
  return 0;
}

if (process.argv[1] && import.meta.url === pathToFileURL(fs.realpathSync(process.argv[1])).href) {
  process.exitCode = main(process.argv.slice(2));
}

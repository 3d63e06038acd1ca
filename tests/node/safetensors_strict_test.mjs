// Tests for safetensors_strict.mjs: one valid file, then one small file per rule the reader
// enforces, each of which must be refused with a message naming the file (and the tensor).
//
// Run: node tests/node/safetensors_strict_test.mjs   (exits non-zero on failure)
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { checkSafetensors } from './safetensors_strict.mjs';

const READER = fileURLToPath(new URL('./safetensors_strict.mjs', import.meta.url));
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'safetensors-strict-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

// ---- file builders --------------------------------------------------------------------------

// Writes raw bytes to a fresh file in the temp directory and returns its path.
function writeRaw(name, bytes) {
  const file = path.join(dir, name);
  fs.writeFileSync(file, bytes);
  return file;
}

// Writes a safetensors file. `header` is an object (serialised with JSON.stringify), a string or
// a Buffer (written as is); `data` is a byte count (filled with a pattern) or a Buffer.
// opts.pad: spaces appended to the header; opts.length: a header length field to write instead.
function writeST(name, header, data = 0, opts = {}) {
  let hdr = Buffer.isBuffer(header) ? header
    : Buffer.from(typeof header === 'string' ? header : JSON.stringify(header), 'utf8');
  if (opts.pad) hdr = Buffer.concat([hdr, Buffer.alloc(opts.pad, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(opts.length ?? hdr.length));
  const body = Buffer.isBuffer(data) ? data
    : Buffer.from(Array.from({ length: data }, (_, i) => i));
  return writeRaw(name, Buffer.concat([len, hdr, body]));
}

const entry = (dtype, shape, begin, end) => ({ dtype, shape, data_offsets: [begin, end] });

// A valid two-tensor header (14 data bytes) that the refusal cases below mutate.
const twoTensors = (a = entry('F32', [2], 0, 8), b = entry('U16', [3], 8, 14)) => ({ a, b });

// Asserts that checkSafetensors refuses `file` with a message that starts with the path, matches
// `re` and, when `tensor` is given, names that tensor (quoted, as the reader writes names).
function refuses(file, re, tensor) {
  assert.throws(() => checkSafetensors(file), (e) => {
    assert.ok(e.message.startsWith(`${file}: `), `no path prefix: ${e.message}`);
    assert.match(e.message, re);
    if (tensor !== undefined) {
      assert.ok(e.message.includes(JSON.stringify(tensor)), `tensor not named: ${e.message}`);
    }
    return true;
  });
}

// ---- valid files ----------------------------------------------------------------------------

test('valid file: metadata, several dtypes, space padding, a 0-byte tensor', () => {
  // Header order differs from data order; the result is in data order.
  const header = {
    d: entry('F64', [1], 38, 46),
    __metadata__: { format: 'pt', source: 'repack' },
    b: entry('BF16', [4], 24, 32),
    w: entry('F32', [2, 3], 0, 24),
    m: entry('BOOL', [2], 36, 38),
    z: entry('I64', [0, 5], 24, 24),
    s: entry('U8', [], 32, 33),
    f: entry('F8_E4M3', [3], 33, 36),
  };
  const text = JSON.stringify(header);
  const pad = 8 - (text.length % 8) || 8;
  const file = writeST('valid.safetensors', text, 46, { pad });
  const r = checkSafetensors(file);
  const n = text.length + pad;
  assert.equal(r.headerLength, n);
  assert.equal(r.dataStart, 8 + n);
  assert.deepEqual(r.metadata, { format: 'pt', source: 'repack' });
  assert.deepEqual(r.tensors, [
    { name: 'w', dtype: 'F32', shape: [2, 3], begin: 0, end: 24 },
    { name: 'z', dtype: 'I64', shape: [0, 5], begin: 24, end: 24 },
    { name: 'b', dtype: 'BF16', shape: [4], begin: 24, end: 32 },
    { name: 's', dtype: 'U8', shape: [], begin: 32, end: 33 },
    { name: 'f', dtype: 'F8_E4M3', shape: [3], begin: 33, end: 36 },
    { name: 'm', dtype: 'BOOL', shape: [2], begin: 36, end: 38 },
    { name: 'd', dtype: 'F64', shape: [1], begin: 38, end: 46 },
  ]);
});

test('valid file: every dtype, no metadata', () => {
  const sizes = { BOOL: 1, U8: 1, I8: 1, F8_E5M2: 1, F8_E4M3: 1, F8_E8M0: 1, I16: 2, U16: 2,
    F16: 2, BF16: 2, I32: 4, U32: 4, F32: 4, F64: 8, I64: 8, U64: 8 };
  const header = {};
  let at = 0;
  for (const [dtype, size] of Object.entries(sizes)) {
    header[`t_${dtype}`] = entry(dtype, [3], at, at + 3 * size);
    at += 3 * size;
  }
  const r = checkSafetensors(writeST('dtypes.safetensors', header, at));
  assert.equal(r.metadata, null);
  assert.deepEqual(r.tensors.map((t) => t.dtype), Object.keys(sizes));
});

test('valid file: names with escapes are decoded and are not duplicates', () => {
  // Quotes, backslashes and braces inside keys must not confuse the duplicate-key scanner.
  const text = '{"a\\"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},' +
    '"a\\\\":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},' +
    '"{\\"a\\":1}":{"dtype":"U8","shape":[1],"data_offsets":[2,3]},' +
    '"a":{"dtype":"U8","shape":[1],"data_offsets":[3,4]},' +
    '"\\u00e9\\ud83d\\ude00":{"dtype":"U8","shape":[1],"data_offsets":[4,5]}}';
  const r = checkSafetensors(writeST('escapes.safetensors', text, 5));
  assert.deepEqual(r.tensors.map((t) => t.name), ['a"b', 'a\\', '{"a":1}', 'a', 'é😀']);
});

test('valid file: no tensors and an empty data region', () => {
  const r = checkSafetensors(writeST('empty.safetensors', '{}', 0, { pad: 6 }));
  assert.deepEqual(r.tensors, []);
  assert.equal(r.dataStart, 16);
});

test('valid file: several empty tensors at one offset, and at the end', () => {
  const r = checkSafetensors(writeST('empties.safetensors', {
    e1: entry('F32', [0], 4, 4), a: entry('F32', [1], 0, 4), e2: entry('U8', [2, 0], 4, 4),
  }, 4));
  assert.deepEqual(r.tensors.map((t) => t.name), ['a', 'e1', 'e2']);
});

// ---- layout of the data region --------------------------------------------------------------

test('refuses a hole between tensors', () => {
  const file = writeST('hole.safetensors', twoTensors(undefined, entry('U16', [3], 10, 16)), 16);
  refuses(file, /hole of 2 bytes/, 'b');
});

test('refuses a first tensor that does not start at 0', () => {
  const file = writeST('first.safetensors',
    twoTensors(entry('F32', [2], 2, 10), entry('U16', [3], 10, 16)), 16);
  refuses(file, /first tensor .* begins at 2, not 0/, 'a');
});

test('refuses a trailing byte after the last tensor', () => {
  refuses(writeST('trailing.safetensors', twoTensors(), 15), /\(1 byte trailing\)/, 'b');
});

test('refuses a tensor ending past the end of the file', () => {
  refuses(writeST('short_data.safetensors', twoTensors(), 13), /past the end/, 'b');
});

test('refuses overlapping tensors', () => {
  const file = writeST('overlap.safetensors', twoTensors(undefined, entry('U16', [3], 6, 12)), 12);
  refuses(file, /overlap of 2 bytes/, 'b');
});

test('refuses data with no tensors', () => {
  refuses(writeST('no_tensors.safetensors', '{}', 1), /no tensors but the data region has 1/);
});

// ---- tensor entries -------------------------------------------------------------------------

test('refuses a size that does not match shape and dtype', () => {
  refuses(writeST('size.safetensors', twoTensors(entry('F32', [3], 0, 8)), 14), /needs 12/, 'a');
});

test('refuses an unknown dtype', () => {
  refuses(writeST('dtype.safetensors', twoTensors(entry('Q4_K', [2], 0, 8)), 14),
    /unknown dtype/, 'a');
  refuses(writeST('dtype_case.safetensors', twoTensors(entry('f32', [2], 0, 8)), 14),
    /unknown dtype/, 'a');
});

test('refuses an extra key in an entry', () => {
  const header = twoTensors(undefined, { ...entry('U16', [3], 8, 14), extra: 1 });
  refuses(writeST('extra.safetensors', header, 14), /unexpected key "extra"/, 'b');
});

test('refuses a missing key in an entry', () => {
  const header = twoTensors({ dtype: 'F32', data_offsets: [0, 8] });
  refuses(writeST('missing.safetensors', header, 14), /missing key "shape"/, 'a');
});

test('refuses a negative or non-integer shape', () => {
  refuses(writeST('neg_shape.safetensors', twoTensors(entry('F32', [-2], 0, 8)), 14),
    /shape\[0\] is number -2/, 'a');
  refuses(writeST('frac_shape.safetensors', twoTensors(entry('F32', [2.5], 0, 8)), 14),
    /shape\[0\] is non-integer number 2.5/, 'a');
  refuses(writeST('str_shape.safetensors', twoTensors(entry('F32', ['2'], 0, 8)), 14),
    /shape\[0\] is string/, 'a');
  refuses(writeST('obj_shape.safetensors', twoTensors(entry('F32', 2, 0, 8)), 14),
    /shape is number 2, not an array/, 'a');
});

test('refuses bad data_offsets', () => {
  const raw = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}}';
  refuses(writeST('float_off.safetensors', raw, 8), /data_offsets\[1\] is non-integer/, 'a');
  refuses(writeST('neg_off.safetensors', { a: entry('U8', [0], -1, -1) }, 0),
    /data_offsets\[0\] is number -1/, 'a');
  refuses(writeST('big_off.safetensors', { a: entry('U8', [0], 2 ** 53, 2 ** 53) }, 0),
    /not a non-negative integer/, 'a');
  refuses(writeST('rev_off.safetensors', { a: entry('U8', [0], 8, 0) }, 8),
    /begin 8 > end 0/, 'a');
  refuses(writeST('three_off.safetensors',
    { a: { dtype: 'U8', shape: [1], data_offsets: [0, 1, 2] } }, 1), /not \[begin, end\]/, 'a');
});

test('refuses an entry that is not an object', () => {
  refuses(writeST('not_obj.safetensors', { a: [1, 2] }, 0), /entry is an array/, 'a');
});

// ---- header JSON ----------------------------------------------------------------------------

test('refuses a duplicate top-level key', () => {
  const e = '{"dtype":"U8","shape":[1],"data_offsets":[0,1]}';
  refuses(writeST('dup_top.safetensors', `{"a":${e},"a":${e}}`, 1),
    /duplicate key "a" at the top level/);
  // The same name spelt with an escape is the same key.
  refuses(writeST('dup_escaped.safetensors', `{"a":${e},"\\u0061":${e}}`, 1),
    /duplicate key "a" at the top level/);
  refuses(writeST('dup_meta_top.safetensors', '{"__metadata__":{},"__metadata__":{}}', 0),
    /duplicate key "__metadata__"/);
});

test('refuses a duplicate key inside an entry', () => {
  const raw = '{"a":{"dtype":"F32","shape":[2],"dtype":"F32","data_offsets":[0,8]}}';
  refuses(writeST('dup_entry.safetensors', raw, 8), /duplicate key "dtype" in the entry of/, 'a');
  refuses(writeST('dup_meta.safetensors', '{"__metadata__":{"k":"1","k":"2"}}', 0),
    /duplicate key "k" in the entry of "__metadata__"/);
});

test('refuses a non-string metadata value, and non-object metadata', () => {
  refuses(writeST('meta_num.safetensors', { __metadata__: { format: 'pt', n: 1 } }, 0),
    /__metadata__ "n" is number 1, not a string/);
  refuses(writeST('meta_null.safetensors', { __metadata__: { n: null } }, 0),
    /__metadata__ "n" is null/);
  refuses(writeST('meta_str.safetensors', { __metadata__: 'pt' }, 0),
    /__metadata__ is string "pt", not an object/);
});

test('refuses a header that does not start with {', () => {
  refuses(writeST('lead_space.safetensors', ' {}', 0), /starts with byte 0x20, not '\{'/);
  refuses(writeST('array.safetensors', '[]', 0), /starts with byte 0x5b/);
  refuses(writeST('bom.safetensors', '\ufeff{}', 0), /starts with byte 0xef/);
});

test('refuses a non-space byte after the JSON object', () => {
  refuses(writeST('trail_nl.safetensors', '{}\n', 0), /"\\n" after the JSON object/);
  refuses(writeST('trail_nul.safetensors', '{}  \0', 0), /after the JSON object/);
  refuses(writeST('trail_obj.safetensors', '{}{}', 0), /after the JSON object/);
});

test('refuses malformed JSON', () => {
  for (const [i, raw] of ['{', '{"a":}', '{"a":1,}', "{'a':1}", '{"a":01}', '{"a":"x\ty"}',
    '{"a":"\\x"}', '{"a":"\\ud800"}', '{"a":tru}'].entries()) {
    refuses(writeST(`bad_json_${i}.safetensors`, raw, 0), /header JSON: /);
  }
});

test('refuses invalid UTF-8 in the header', () => {
  const hdr = Buffer.concat([Buffer.from('{"__metadata__":{"k":"'), Buffer.from([0xff]),
    Buffer.from('"}}')]);
  refuses(writeST('utf8.safetensors', hdr, 0), /not valid UTF-8/);
  // An encoded surrogate (CESU-8 style) is not UTF-8 either.
  const cesu = Buffer.concat([Buffer.from('{"__metadata__":{"k":"'),
    Buffer.from([0xed, 0xa0, 0x80]), Buffer.from('"}}')]);
  refuses(writeST('cesu.safetensors', cesu, 0), /not valid UTF-8/);
});

// ---- header length and file size ------------------------------------------------------------

test('refuses a header length past the end of the file', () => {
  refuses(writeST('len_eof.safetensors', '{}', 0, { length: 3 }), /runs past the end/);
  refuses(writeST('len_huge.safetensors', '{}', 0, { length: 2 ** 62 }), /exceeds 100000000/);
});

test('refuses a zero header length', () => {
  refuses(writeST('len_zero.safetensors', '', 0), /header length is 0/);
});

test('refuses a truncated file (under 8 bytes)', () => {
  refuses(writeRaw('short.safetensors', Buffer.from([2, 0, 0, 0, 0])), /file is 5 bytes/);
  refuses(writeRaw('zero.safetensors', Buffer.alloc(0)), /file is 0 bytes, shorter/);
});

test('refuses a missing file or a directory', () => {
  refuses(path.join(dir, 'does_not_exist.safetensors'), /ENOENT/);
  refuses(dir, /not a regular file/);
});

// ---- CLI ------------------------------------------------------------------------------------

test('CLI: exit 0 on good files, 1 at the first bad one, 2 on usage', () => {
  const good = writeST('cli_good.safetensors', twoTensors(), 14);
  const bad = writeST('cli_bad.safetensors', twoTensors(), 15);
  const cli = (...args) => spawnSync(process.execPath, [READER, ...args], { encoding: 'utf8' });

  let r = cli(good, good);
  assert.equal(r.status, 0, r.stderr);
  const dataAt = 8 + JSON.stringify(twoTensors()).length;
  assert.equal(r.stdout, `ok ${good}: 2 tensors, data at ${dataAt}\n`.repeat(2));

  r = cli(good, bad, good);
  assert.equal(r.status, 1);
  assert.equal(r.stdout, `ok ${good}: 2 tensors, data at ${dataAt}\n`);
  assert.ok(r.stderr.startsWith(`${bad}: `), r.stderr);
  assert.match(r.stderr, /1 byte trailing/);

  assert.equal(cli().status, 2);
});

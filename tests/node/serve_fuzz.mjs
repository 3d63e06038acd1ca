// Malformed-input corpus against a real `coli serve` (docs/serving.md §4.5, §4.9): invalid UTF-8,
// lone surrogate escapes, NUL, nesting depth 100k, huge numbers, duplicate keys, wrong types in
// every request field, truncations and byte insertions from a seeded PRNG. Every body is invalid
// by construction, so every answer must be 4xx with the OpenAI error envelope — never 2xx, never
// 5xx, never a dropped connection — and the server must still answer /health and a valid request
// at the end, then exit 143 on SIGTERM.
//
//   node tests/node/serve_fuzz.mjs <path-to-coli>
//   (ctest: Serve.Fuzz; SERVE_FUZZ_SEED overrides the PRNG seed)
import fs from 'node:fs';
import path from 'node:path';
import { mulberry32 } from './kimi_k3.mjs';
import {
  MODEL_ID, Runner, Server, assert, demoModel, globalTimeout, killAll, makeTempDir, request, show,
} from './serve_util.mjs';

const coliArg = process.argv[2];
if (!coliArg) {
  console.error('usage: node tests/node/serve_fuzz.mjs <path-to-coli>');
  process.exit(2);
}
const coli = path.resolve(coliArg);
const cancelTimeout = globalTimeout(Number(process.env.SERVE_TEST_TIMEOUT_S ?? 300) * 1000, 'serve_fuzz');
const SEED = Number(process.env.SERVE_FUZZ_SEED ?? 0x5e7e_f022) >>> 0;
const rand = mulberry32(SEED);
const pick = (a) => a[Math.floor(rand() * a.length)];

// ---- corpus ---------------------------------------------------------------------------------

const cases = [];   // {name, path, body: Buffer|string, stream?}
const add = (name, body, p = '/v1/chat/completions') => cases.push({ name, path: p, body });

const BASE = [
  ['model', `"${MODEL_ID}"`],
  ['messages', '[{"role":"user","content":"hi"}]'],
  ['max_tokens', '1'],
  ['temperature', '0'],
];
const DROP = Symbol('drop');
// A request body as text: BASE with fields overridden (raw JSON text), dropped, or added.
function body(over = {}) {
  const keys = new Set(BASE.map(([k]) => k));
  const pairs = BASE.map(([k, v]) => [k, k in over ? over[k] : v]);
  for (const [k, v] of Object.entries(over)) if (!keys.has(k)) pairs.push([k, v]);
  return '{' + pairs.filter(([, v]) => v !== DROP).map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(',') + '}';
}
const msg = (raw) => body({ messages: `[${raw}]` });
// Splices raw bytes where the marker @@ appears.
const withBytes = (text, bytes) => {
  const [a, b] = text.split('@@');
  return Buffer.concat([Buffer.from(a), Buffer.from(bytes), Buffer.from(b)]);
};

// A. Not a JSON object / not JSON.
const good = body();
for (const [n, t] of [
  ['empty', ''], ['space', ' '], ['null', 'null'], ['true', 'true'], ['number', '42'], ['string', '"str"'],
  ['array', '[]'], ['array_of_object', `[${good}]`], ['open_brace', '{'], ['close_brace', '}'], ['empty_object', '{}'],
  ['dangling_key', '{"model":'], ['trailing_comma', good.slice(0, -1) + ',}'], ['single_quotes', good.replace(/"/g, "'")],
  ['missing_comma', good.replace(',"messages"', ' "messages"')], ['trailing_brace', good + '}'], ['two_objects', good + good],
  ['trailing_text', good + 'x'], ['nan_literal', body({ temperature: 'NaN' })], ['infinity_literal', body({ max_tokens: 'Infinity' })],
  ['comment', '/*c*/' + good], ['line_comment', good + '//c'], ['bad_escape', msg('{"role":"user","content":"\\x41"}')],
  ['short_unicode_escape', msg('{"role":"user","content":"\\u12"}')], ['unterminated_string', good.slice(0, 40)],
  ['raw_newline_in_string', msg('{"role":"user","content":"a\nb"}')], ['raw_tab_in_string', msg('{"role":"user","content":"a\tb"}')],
  ['leading_plus', body({ max_tokens: '+1' })], ['leading_zero', body({ max_tokens: '01' })], ['hex_number', body({ max_tokens: '0x1' })],
  ['bare_dot', body({ temperature: '.5' })], ['missing_model', body({ model: DROP })], ['missing_messages', body({ messages: DROP })],
]) add(`json.${n}`, t);

// B. Invalid UTF-8 at several places.
const BAD_UTF8 = {
  ff: [0xff], fe: [0xfe], overlong_nul: [0xc0, 0x80], overlong_slash: [0xc1, 0xbf], overlong_3: [0xe0, 0x80, 0x80],
  surrogate_d800: [0xed, 0xa0, 0x80], above_10ffff: [0xf4, 0x90, 0x80, 0x80], five_byte: [0xf8, 0x88, 0x80, 0x80, 0x80],
  lone_continuation: [0x80], truncated_3: [0xe2, 0x82], truncated_2: [0xc3],
};
const UTF8_PLACES = {
  content: msg('{"role":"user","content":"a@@b"}'),
  content_end: msg('{"role":"user","content":"ab@@"}'),
  model: body({ model: '"kimi@@-k3"' }),
  key: body({ 'x@@y': '1' }),
  role: msg('{"role":"us@@er","content":"hi"}'),
  outside_string: body({ max_tokens: '1@@' }),
};
for (const [bn, bytes] of Object.entries(BAD_UTF8)) {
  for (const [pn, text] of Object.entries(UTF8_PLACES)) {
    if (pn === 'key' && !['ff', 'surrogate_d800', 'truncated_2'].includes(bn)) continue;
    if (pn === 'outside_string' && !['ff', 'lone_continuation'].includes(bn)) continue;
    add(`utf8.${bn}.${pn}`, withBytes(text, bytes));
  }
}
for (let i = 0; i < 8; i++) {
  const n = 1 + Math.floor(rand() * 4);
  const bytes = Array.from({ length: n }, () => 0x80 + Math.floor(rand() * 0x40));   // continuation bytes alone
  add(`utf8.random_continuations.${i}`, withBytes(msg('{"role":"user","content":"x@@y"}'), bytes));
}

// C. Lone surrogate escapes.
for (const [n, esc] of [['high', '\\ud800'], ['low', '\\udfff'], ['high_then_ascii', '\\ud800\\u0041'], ['low_then_high', '\\udc00\\ud800'],
                       ['high_at_end', 'x\\ud83d'], ['two_highs', '\\ud83d\\ud83d'], ['high_then_text', '\\ud83dabc']]) {
  add(`surrogate.content.${n}`, msg(`{"role":"user","content":"${esc}"}`));
}
add('surrogate.model', body({ model: '"kimi-k3\\ud800"' }));
add('surrogate.system', body({ messages: '[{"role":"system","content":"\\udbff"},{"role":"user","content":"hi"}]' }));
add('surrogate.stop', body({ stop: '["\\ud800"]' }));
add('surrogate.part_text', msg('{"role":"user","content":[{"type":"text","text":"\\udc00"}]}'));
add('surrogate.reasoning', body({ messages: '[{"role":"user","content":"a"},{"role":"assistant","content":"b","reasoning_content":"\\ud800"},{"role":"user","content":"c"}]' }));

// D. NUL.
add('nul.raw_in_string', withBytes(msg('{"role":"user","content":"a@@b"}'), [0x00]));
add('nul.raw_outside', withBytes(good.slice(0, -1) + '@@}', [0x00]));
add('nul.escape_content', msg('{"role":"user","content":"a\\u0000b"}'));
add('nul.escape_model', body({ model: '"kimi-k3\\u0000"' }));
add('nul.escape_role', msg('{"role":"user\\u0000","content":"hi"}'));
add('nul.escape_system', body({ messages: '[{"role":"system","content":"\\u0000"},{"role":"user","content":"hi"}]' }));
add('nul.escape_part_text', msg('{"role":"user","content":[{"type":"text","text":"x\\u0000"}]}'));
add('nul.escape_reasoning', body({ messages: '[{"role":"user","content":"a"},{"role":"assistant","content":"b","reasoning_content":"\\u0000"},{"role":"user","content":"c"}]' }));
add('nul.escape_key', body({ 'a\\u0000b': '1', messages: '[{"role":"user","content":"\\u0000"}]' }));

// E. Nesting.
const D = 100_000;
add('depth.array_100k_closed', body({ x: '['.repeat(D) + ']'.repeat(D) }));
add('depth.array_100k_open', body({ x: '['.repeat(D) }).slice(0, -1));
add('depth.object_100k_closed', body({ x: '{"a":'.repeat(D) + '1' + '}'.repeat(D) }));
add('depth.object_100k_open', '{"x":' + '{"a":'.repeat(D));
add('depth.top_level_100k', '['.repeat(D) + ']'.repeat(D));
add('depth.content_100k', msg(`{"role":"user","content":${'['.repeat(D)}${']'.repeat(D)}}`));
add('depth.messages_100k', body({ messages: '['.repeat(D) + ']'.repeat(D) }));
add('depth.array_65', body({ x: '['.repeat(65) + ']'.repeat(65) }));
add('depth.mixed_1m', '[{"a":'.repeat(200_000));

// F. Wrong types and out-of-range values for every request field.
const FIELD_VALUES = {
  model: ['1', 'true', '[]', '{}', '""', '"   "', 'null'],  // any other name is served (docs/serving.md §3.6.1)
  messages: ['1', '"hi"', '{}', '[]', 'null', 'true', '[1]', '["hi"]', '[null]', '[[]]'],
  max_tokens: ['0', '-1', '1e400', '-1e400', '99999999999999999999999', '2147483648', '1.5', '1e10', '"5"', 'true', '[]', '{}'],
  max_completion_tokens: ['0', '-5', '1e400', '4294967296', '2.5', '"1"', 'false'],
  temperature: ['-0.1', '2.0001', '1e400', '-1e400', '1e308', '"0.5"', 'true', '[]', '{}'],
  top_p: ['0', '-1', '1.0001', '1e400', '"1"', 'false', '[]'],
  top_k: ['-1', '1.5', '1e400', '99999999999999999999', '"3"', '{}'],
  min_p: ['-0.1', '1.1', '1e400', '"0"', 'true'],
  seed: ['1.5', '"1"', '18446744073709551616', '-9223372036854775809', '1e400', 'true', '[]', '{}'],
  n: ['0', '2', '-1', '1e400', '"1"', '1.5', 'true'],
  stream: ['"true"', '1', '0', '[]', '{}', '"false"'],
  stop: ['1', '[1]', '[""]', '""', '[null]', '{}', 'true', '["a",5]', JSON.stringify('x'.repeat(300)),
         JSON.stringify(Array.from({ length: 17 }, (_, i) => `s${i}`)), '[["a"]]'],
  stream_options: ['"yes"', '1', '[]', '{"include_usage":"yes"}', '{"include_usage":1}'],
  chat_template_kwargs: ['"x"', '1', '[]', '{"enable_thinking":"no"}', '{"enable_thinking":1}', '{"enable_thinking":[]}'],
  enable_thinking: ['"true"', '1', '[]', '{}'],
  reasoning_effort: ['"extreme"', '1', 'true', '[]', '""', '"HIGH"'],
  reasoning_format: ['"weird"', '1', '[]'],
  return_progress: ['"yes"', '1', '[]'],
  cache_prompt: ['"no"', '0', '{}'],
  frequency_penalty: ['2.5', '"x"', '1e400', '[]'],
  presence_penalty: ['-2.01', '3', '"y"'],
  repetition_penalty: ['1.5', '"z"'],
  repeat_penalty: ['0', '-1', '10.5', '"1.1"', '[]'],
  repeat_last_n: ['-2', '1.5', '"64"', '1e400'],
  logit_bias: ['{"1":5}', '"x"', '[1]'],
  logprobs: ['"yes"', '1', '[]', '{}'],
  top_logprobs: ['21', '"5"', '-1', '5'],
  response_format: ['{"type":"yaml"}', '"json"', '{"type":"json_schema","json_schema":{}}', '1', '{"type":5}',
                    '{"type":"json_schema","json_schema":{"schema":{"not":{}}}}'],
  json_schema: ['{"type":"string","format":"hostname"}', '{"$ref":"http://x.example/s"}', '"x"'],
  grammar: ['"root ::= x"', '"root ::= (\\"a\\""', '5', '"root ::= root \\"a\\""'],
  tools: ['"x"', '1', '{}', '[1]', '[null]', '[{"type":"function"}]', '[{"type":"function","function":{}}]',
          '[{"type":"function","function":{"name":5}}]', '[{"type":"function","function":{"name":"f","parameters":"x"}}]'],
  tool_choice: ['5', '"bogus"', '[]', 'true'],
};
for (const [field, values] of Object.entries(FIELD_VALUES)) {
  values.forEach((v, i) => add(`field.${field}.${i}`, body({ [field]: v })));
}
// Streaming requests go through the same validation before any SSE byte.
for (const [field, values] of Object.entries(FIELD_VALUES)) {
  if (field === 'stream') continue;
  add(`field_stream.${field}`, body({ [field]: values[0], stream: 'true' }));
}

// G. Message-level wrong types.
for (const [n, m] of [
  ['role_number', '{"role":5,"content":"hi"}'], ['role_null', '{"role":null,"content":"hi"}'],
  ['role_unknown', '{"role":"wizard","content":"hi"}'], ['role_missing', '{"content":"hi"}'], ['empty_object', '{}'],
  ['content_number', '{"role":"user","content":5}'], ['content_bool', '{"role":"user","content":true}'],
  ['content_object', '{"role":"user","content":{}}'], ['content_part_number', '{"role":"user","content":[5]}'],
  ['content_part_empty', '{"role":"user","content":[{}]}'], ['content_part_no_text', '{"role":"user","content":[{"type":"text"}]}'],
  ['content_part_text_number', '{"role":"user","content":[{"type":"text","text":5}]}'],
  ['content_part_type_number', '{"role":"user","content":[{"type":5,"text":"a"}]}'],
  ['content_part_unknown_type', '{"role":"user","content":[{"type":"hologram","text":"a"}]}'],
  ['image_url', '{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://example.invalid/a.png"}}]}'],
  ['image_data_url', '{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}'],
  ['input_audio', '{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}'],
  ['file', '{"role":"user","content":[{"type":"file","file":{"file_id":"f"}}]}'],
  ['message_string', '"hi"'], ['message_number', '7'], ['message_array', '["user","hi"]'],
]) add(`message.${n}`, msg(m));
const hist = (assistant) => body({ messages: `[{"role":"user","content":"a"},${assistant},{"role":"user","content":"c"}]` });
for (const [n, a] of [
  ['reasoning_number', '{"role":"assistant","content":"b","reasoning_content":5}'],
  ['reasoning_object', '{"role":"assistant","content":"b","reasoning_content":{}}'],
  ['reasoning_alias_number', '{"role":"assistant","content":"b","reasoning":[1]}'],
  ['tool_calls_string', '{"role":"assistant","content":null,"tool_calls":"x"}'],
  ['tool_calls_number_item', '{"role":"assistant","content":null,"tool_calls":[1]}'],
  ['tool_call_arguments_number', '{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":5}}]}'],
  ['assistant_content_number', '{"role":"assistant","content":5}'],
]) add(`history.${n}`, hist(a));
add('history.tool_call_id_number', body({ messages: '[{"role":"user","content":"a"},{"role":"tool","tool_call_id":5,"content":"r"}]' }));

// H. Duplicate keys: the last one wins, and the last one is always invalid.
for (const [n, t] of [
  ['model', `{"model":"${MODEL_ID}","model":5,"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`],
  ['max_tokens', `{"model":"${MODEL_ID}","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"max_tokens":-1}`],
  ['messages', `{"model":"${MODEL_ID}","messages":[{"role":"user","content":"hi"}],"messages":"x","max_tokens":1}`],
  ['temperature', `{"model":"${MODEL_ID}","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"temperature":0,"temperature":"hot"}`],
  ['stream', `{"model":"${MODEL_ID}","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":false,"stream":"yes"}`],
  ['role', `{"model":"${MODEL_ID}","messages":[{"role":"user","role":"wizard","content":"hi"}],"max_tokens":1}`],
  ['content', `{"model":"${MODEL_ID}","messages":[{"role":"user","content":"hi","content":5}],"max_tokens":1}`],
  ['n', `{"model":"${MODEL_ID}","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"n":1,"n":3}`],
  ['many_models', `{${Array.from({ length: 1000 }, () => `"model":"${MODEL_ID}"`).join(',')},"model":7,"messages":[{"role":"user","content":"hi"}]}`],
]) add(`dup.${n}`, t);

// I. Tokenizer endpoints.
for (const [n, t] of [
  ['content_number', '{"content":5}'], ['content_null', '{"content":null}'], ['empty_object', '{}'], ['array', '[]'],
  ['not_json', 'x'], ['lone_surrogate', '{"content":"\\ud800"}'],
]) add(`tokenize.${n}`, t, '/tokenize');
add('tokenize.invalid_utf8', withBytes('{"content":"a@@"}', [0xff]), '/tokenize');
for (const [n, t] of [
  ['tokens_string', '{"tokens":"x"}'], ['negative', '{"tokens":[-1]}'], ['fraction', '{"tokens":[1.5]}'], ['huge', '{"tokens":[1e400]}'],
  ['out_of_vocab', '{"tokens":[99999999999]}'], ['int32_overflow', '{"tokens":[2147483648]}'], ['vocab_end', '{"tokens":[163840]}'],
  ['null_item', '{"tokens":[null]}'], ['nested', '{"tokens":[[1]]}'], ['object', '{"tokens":{}}'], ['missing', '{}'],
]) add(`detokenize.${n}`, t, '/detokenize');

// J. Seeded mutations of the valid body, invalid by construction: truncation anywhere, a C0
// control byte that JSON never allows (not \t \n \r), or a lone byte >= 0x80 in an ASCII body.
const CTRL = [0x00, 0x01, 0x02, 0x07, 0x08, 0x0b, 0x0c, 0x0e, 0x1b, 0x1f];
const fancy = body({ stop: '["x"]', top_p: '0.9', seed: '7', stream_options: '{"include_usage":true}', stream: 'true' });
for (let i = 0; i < 30; i++) {
  const src = i % 2 ? fancy : good;
  add(`mutate.truncate.${i}`, src.slice(0, 1 + Math.floor(rand() * (src.length - 1))));
}
for (let i = 0; i < 30; i++) {
  const src = i % 2 ? fancy : good;
  const at = Math.floor(rand() * (src.length + 1));
  add(`mutate.control_byte.${i}`, Buffer.concat([Buffer.from(src.slice(0, at)), Buffer.from([pick(CTRL)]), Buffer.from(src.slice(at))]));
}
for (let i = 0; i < 30; i++) {
  const src = i % 2 ? fancy : good;
  const at = Math.floor(rand() * (src.length + 1));
  add(`mutate.high_byte.${i}`, Buffer.concat([Buffer.from(src.slice(0, at)), Buffer.from([0x80 + Math.floor(rand() * 0x80)]), Buffer.from(src.slice(at))]));
}

if (process.env.SERVE_FUZZ_LIST) {   // print the corpus (name, bytes, first 120 bytes) and stop
  for (const c of cases) {
    const b = Buffer.isBuffer(c.body) ? c.body : Buffer.from(c.body);
    console.log(`${c.name}\t${c.path}\t${b.length}\t${JSON.stringify(b.subarray(0, 120).toString('latin1'))}`);
  }
  console.log(`${cases.length} cases`);
  process.exit(0);
}

// ---- run ------------------------------------------------------------------------------------

const R = new Runner('serve_fuzz');
const tmp = makeTempDir('coli-serve-fuzz-');
const modelDir = demoModel(coli);
let srv = null;
const outcomes = [];   // {name, status, error?, envelope?}

await R.check('fuzz.server_starts', async () => {
  srv = await new Server(coli, modelDir, 'fuzz', []).start();
});

await R.check(`fuzz.corpus_answered (${cases.length} bodies, seed 0x${SEED.toString(16)})`, async () => {
  assert(srv, 'server did not start');
  for (const c of cases) {
    if (srv.exit) { outcomes.push({ name: c.name, status: 0, error: `server exited ${show(srv.exit)}` }); continue; }
    let r;
    try {
      r = await request(srv, { method: 'POST', path: c.path, body: c.body, timeoutMs: 30_000 });
    } catch (e) {
      outcomes.push({ name: c.name, status: 0, error: e.code ?? e.message });
      continue;
    }
    const e = r.json?.error;
    const envelope = e && typeof e.message === 'string' && typeof e.type === 'string' && 'param' in e && 'code' in e;
    outcomes.push({ name: c.name, status: r.status, envelope, text: r.text.slice(0, 200) });
  }
  const dropped = outcomes.filter((o) => o.status === 0);
  assert(dropped.length === 0, () => `${dropped.length} requests got no HTTP answer:\n` +
    dropped.slice(0, 20).map((o) => `${o.name}: ${o.error}`).join('\n'));
});

await R.check('fuzz.never_5xx', async () => {
  const bad = outcomes.filter((o) => o.status >= 500);
  assert(bad.length === 0, () => `${bad.length} answers were 5xx:\n` + bad.slice(0, 30).map((o) => `${o.name}: ${o.status} ${o.text}`).join('\n'));
});

await R.check('fuzz.never_accepted', async () => {   // 5xx are reported by fuzz.never_5xx
  const bad = outcomes.filter((o) => o.status !== 0 && o.status < 400);
  assert(bad.length === 0, () => `${bad.length} invalid bodies were accepted (not refused with 4xx):\n` +
    bad.slice(0, 30).map((o) => `${o.name}: ${o.status} ${o.text}`).join('\n'));
});

await R.check('fuzz.error_envelope', async () => {
  const bad = outcomes.filter((o) => o.status >= 400 && !o.envelope);
  assert(bad.length === 0, () => `${bad.length} error answers lack the OpenAI envelope {error:{message,type,param,code}}:\n` +
    bad.slice(0, 30).map((o) => `${o.name}: ${o.status} ${o.text}`).join('\n'));
});

await R.check('fuzz.server_alive_after', async () => {
  assert(srv && !srv.exit, `server is gone: ${show(srv?.exit)}\n${srv?.logTail()}`);
  const h = await request(srv, { path: '/health' });
  assert(h.status === 200, `/health: ${h.status}`);
  const r = await request(srv, { method: 'POST', path: '/v1/chat/completions', body: { model: MODEL_ID, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 } });
  assert(r.status === 200, `a valid request after the corpus: ${r.status} ${r.text.slice(0, 300)}`);
});

await R.check('fuzz.clean_exit', async () => {
  assert(srv, 'server did not start');
  const e = await srv.stop();
  assert(e && e.code === 143 && e.signal === null, `exit after SIGTERM: ${show(e)}\n${srv.logTail()}`);
});

cancelTimeout();
killAll();
const ok = R.summary();
const byStatus = {};
for (const o of outcomes) byStatus[o.status] = (byStatus[o.status] ?? 0) + 1;
console.log(`status histogram: ${JSON.stringify(byStatus)}`);
// serve_util removes tmp at exit when the run passed, and only its model when it failed.
if (!ok) {
  if (srv) fs.writeFileSync(path.join(tmp, 'fuzz.log'), `${srv.out}\n--- stderr ---\n${srv.err}`);
  console.log(`(server log kept in ${tmp})`);
}
process.exit(ok ? 0 : 1);

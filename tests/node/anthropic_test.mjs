// End-to-end tests of the Anthropic Messages API of `coli serve` (docs/serving.md §3.18) driven by
// the official `@anthropic-ai/sdk` npm client, plus raw HTTP for the exact SSE event order and
// for the refusals the SDK cannot provoke. Written from docs/serving.md and Anthropic's API
// reference, not from the server's code.
//
//   node tests/node/anthropic_test.mjs <path-to-coli>
//   (ctest: Serve.AnthropicClient; `make test` installs tests/node/node_modules)
//
// A random-weight demo model (real K3 tokenizer) answers noise, deterministic at temperature 0;
// a server with --script-ids writes a scripted reply (reasoning, text and a tool call) so the
// thinking and tool_use blocks are known exactly. Environment: SERVE_TEST_TIMEOUT_S (default 400),
// SERVE_TEST_ONLY (a regular expression; runs only the matching checks).
import crypto from 'node:crypto';
import path from 'node:path';
import {
  MODEL_ID, Runner, Server, assert, demoModel, eq, globalTimeout, killAll, postJson, request, show,
  sse,
} from './serve_util.mjs';

const coliArg = process.argv[2];
if (!coliArg) {
  console.error('usage: node tests/node/anthropic_test.mjs <path-to-coli>');
  process.exit(2);
}
const coli = path.resolve(coliArg);

let Anthropic;
try {
  ({ default: Anthropic } = await import('@anthropic-ai/sdk'));
} catch (e) {
  console.error(`FAIL: the npm test oracles are not installed (${e.code ?? e.message}).\n` +
                'Run `make test`: it installs them (npm ci --prefix tests/node) before running ctest.');
  process.exit(1);
}

const cancelTimeout = globalTimeout(Number(process.env.SERVE_TEST_TIMEOUT_S ?? 400) * 1000, 'anthropic_test');
const ONLY = process.env.SERVE_TEST_ONLY ? new RegExp(process.env.SERVE_TEST_ONLY) : null;
const R = new Runner('anthropic_test');
const check = (name, fn) => (ONLY && !ONLY.test(name) ? Promise.resolve() : R.check(name, fn));

const modelDir = demoModel(coli);
const KEY = 'sk-ant-test-' + crypto.randomBytes(12).toString('hex');

// Anthropic clients send x-api-key; the harness's raw requests do too.
class AnthropicServer extends Server {
  get authHeaders() { return { 'x-api-key': this.key, 'anthropic-version': '2023-06-01' }; }
}
const servers = [];
async function start(name, flags) {
  const s = new AnthropicServer(coli, modelDir, name, ['--api-key', KEY, ...flags], { key: KEY });
  servers.push(s);
  return s.start({});
}
const client = (s, opts = {}) => new Anthropic({ apiKey: KEY, baseURL: s.url, maxRetries: 0, timeout: 120_000, ...opts });

const main = await start('main', []);

// The scripted reply: reasoning, then text, then one tool call (docs/chat_format.md §6.8).
const CALL_TEXT = 'Weather needs a tool.<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>' +
  '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>' +
  '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>' +
  '<|open|>argument key="days" type="number"<|sep|>2<|close|>argument<|sep|>' +
  '<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>';
const tk = await postJson(main, '/tokenize', { content: CALL_TEXT, parse_special: true });
if (tk.status !== 200) throw new Error(`/tokenize: ${tk.status} ${tk.text}`);
const scripted = await start('scripted', ['--script-ids', tk.json.tokens.join(',')]);

const TOOLS = [{
  name: 'get_weather',
  description: 'Current weather for a city.',
  input_schema: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'number' } }, required: ['city'] },
}];
const OFF = { thinking: { type: 'disabled' } };
const ON = { thinking: { type: 'enabled', budget_tokens: 1024 } };
const ask = (text, extra = {}) => ({ model: MODEL_ID, max_tokens: 8, temperature: 0, messages: [{ role: 'user', content: text }], ...extra });
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

function checkUsage(u, what = 'usage') {
  for (const k of ['input_tokens', 'output_tokens', 'cache_read_input_tokens', 'cache_creation_input_tokens'])
    assert(Number.isInteger(u?.[k]) && u[k] >= 0, `${what}.${k} not a non-negative integer: ${show(u)}`);
  assert(u.input_tokens + u.cache_read_input_tokens > 0, `${what}: no input tokens`);
}

// The SSE events of a raw POST /v1/messages: [{event, data}] from `event:` / `data:` lines.
async function rawStream(s, body) {
  const st = await sse(s, { ...body, stream: true }, { path: '/v1/messages' });
  eq(st.status, 200, `stream status (${show(st.json ?? st.text)})`);
  assert(String(st.headers['content-type']).startsWith('text/event-stream'), 'content-type');
  assert(st.endedCleanly && st.badUtf8.length === 0, 'the stream ended cleanly, valid UTF-8');
  assert(!st.events.some((e) => e.kind === 'done'), 'an OpenAI [DONE] marker in an Anthropic stream');
  return st.events.map((e) => {
    const m = e.text.match(/^event: (.*)$/m);
    assert(m, () => `an SSE block without an event name: ${show(e.text)}`);
    assert(e.kind === 'data', () => `event ${m[1]} without JSON data: ${show(e.text)}`);
    eq(e.json.type, m[1], `data.type of event ${m[1]}`);
    return { event: m[1], data: e.json };
  });
}
// The event names with consecutive deltas of one block collapsed ("delta*") and the pings after
// the first dropped (a silence of --sse-ping-interval seconds sends one anywhere).
const shape = (events) => events.map((e) => e.event).filter((n, i) => n !== 'ping' || i === 1)
  .filter((n, i, a) => !(n === 'content_block_delta' && a[i - 1] === 'content_block_delta'))
  .map((n) => (n === 'content_block_delta' ? 'delta*' : n));

// ---- checks ---------------------------------------------------------------------------------

await check('create.non_streaming', async () => {
  const m = await client(main).messages.create(ask('Hello there', OFF));
  eq(m.type, 'message', 'type');
  eq(m.role, 'assistant', 'role');
  eq(m.model, MODEL_ID, 'model');
  assert(/^msg_[0-9a-f]{32}$/.test(m.id), `id ${m.id}`);
  eq(m.stop_reason, 'max_tokens', 'stop_reason');
  eq(m.stop_sequence, null, 'stop_sequence');
  eq(m.content.map((b) => b.type), ['text'], 'content block types (thinking disabled)');
  assert(m.content[0].text.length > 0, 'text');
  checkUsage(m.usage);
  eq(m.usage.output_tokens, 8, 'output_tokens');
  const again = await client(main).messages.create(ask('Hello there', OFF));
  eq(textOf(again), textOf(m), 'temperature 0 repeats');
  eq(again.usage.input_tokens + again.usage.cache_read_input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens,
     'the same prompt size');
  // The follow-up turn (the reply sent back as returned) reads the first turn from the cache.
  const next = await client(main).messages.create({ ...ask('Hello there', OFF), messages: [
    { role: 'user', content: 'Hello there' }, { role: 'assistant', content: again.content }, { role: 'user', content: 'And then?' }] });
  const firstPrompt = m.usage.input_tokens + m.usage.cache_read_input_tokens;
  assert(next.usage.cache_read_input_tokens >= firstPrompt - 4,
         () => `turn 2 reads turn 1 from the cache: ${show(next.usage)} (turn 1 prompt ${firstPrompt})`);
});

await check('stream.event_order', async () => {
  const body = ask('Hello there', OFF);
  const events = await rawStream(main, body);
  eq(shape(events), ['message_start', 'ping', 'content_block_start', 'delta*', 'content_block_stop', 'message_delta', 'message_stop'],
     'event order');
  const start = events[0].data.message;
  eq([start.role, start.type, start.stop_reason, start.content.length], ['assistant', 'message', null, 0], 'message_start.message');
  assert(start.usage.input_tokens + start.usage.cache_read_input_tokens > 0, 'message_start usage');
  eq(events[2].data, { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }, 'content_block_start');
  const deltas = events.filter((e) => e.event === 'content_block_delta');
  assert(deltas.every((d) => d.data.index === 0 && d.data.delta.type === 'text_delta'), 'text_delta at index 0');
  const streamed = deltas.map((d) => d.data.delta.text).join('');
  const md = events[events.length - 2].data;
  eq(md.delta.stop_reason, 'max_tokens', 'message_delta.stop_reason');
  eq(md.usage.output_tokens, 8, 'message_delta.usage.output_tokens');
  const whole = await client(main).messages.create(body);
  eq(streamed, textOf(whole), 'streamed text = non-streamed text');
  // The SDK's accumulator and its raw event iterator see the same.
  const final = await client(main).messages.stream(body).finalMessage();
  eq(textOf(final), streamed, 'SDK stream().finalMessage() text');
  eq(final.stop_reason, 'max_tokens', 'SDK final stop_reason');
  const types = [];
  for await (const ev of await client(main).messages.create({ ...body, stream: true })) types.push(ev.type);
  eq(types[0], 'message_start', 'SDK first event');
  eq(types[types.length - 1], 'message_stop', 'SDK last event');
});

await check('thinking.on_and_off', async () => {
  const on = await client(scripted).messages.create(ask('Weather in Paris?', { ...ON, max_tokens: 2048, tools: TOOLS }));
  eq(on.content[0].type, 'thinking', 'first block');
  eq(on.content[0].thinking, 'Weather needs a tool.', 'thinking text');
  assert(typeof on.content[0].signature === 'string' && on.content[0].signature.length > 0, 'signature');
  const events = await rawStream(scripted, ask('Weather in Paris?', { ...ON, max_tokens: 2048, tools: TOOLS }));
  eq(shape(events), ['message_start', 'ping',
    'content_block_start', 'delta*', 'content_block_stop',   // thinking (+ signature_delta)
    'content_block_start', 'delta*', 'content_block_stop',   // text
    'content_block_start', 'delta*', 'content_block_stop',   // tool_use
    'message_delta', 'message_stop'], 'event order');
  const thinking = events.filter((e) => e.event === 'content_block_delta' && e.data.index === 0).map((e) => e.data.delta);
  eq(thinking.map((d) => d.thinking ?? '').join(''), 'Weather needs a tool.', 'thinking_delta text');
  eq(thinking[thinking.length - 1].type, 'signature_delta', 'signature_delta closes the thinking block');
  eq(thinking[thinking.length - 1].signature, on.content[0].signature, 'the same signature');
  // No `thinking` field: the server's default (--reasoning, on), so the reply opens in the think
  // channel.
  const rnd = await client(main).messages.create(ask('Hello there'));
  eq(rnd.content.map((b) => b.type), ['thinking'], 'default thinking: the reply is a thinking block');
  const off = await client(main).messages.create(ask('Hello there', OFF));
  assert(!off.content.some((b) => b.type === 'thinking'), 'thinking disabled: no thinking block');
});

await check('tools.round_trip', async () => {
  const c = client(scripted);
  const first = await c.messages.create(ask('Weather in Paris?', { ...ON, max_tokens: 2048, tools: TOOLS, tool_choice: { type: 'auto' } }));
  eq(first.stop_reason, 'tool_use', 'stop_reason');
  eq(first.content.map((b) => b.type), ['thinking', 'text', 'tool_use'], 'blocks');
  eq(first.content[1].text, 'Checking.', 'text');
  const use = first.content[2];
  eq(use.name, 'get_weather', 'tool name');
  eq(use.input, { city: 'Paris', days: 2 }, 'tool input');
  assert(/^toolu_/.test(use.id), `tool id ${use.id}`);
  // Streaming: the SDK assembles the input from input_json_delta.
  const streamed = await c.messages.stream(ask('Weather in Paris?', { ...ON, max_tokens: 2048, tools: TOOLS })).finalMessage();
  eq(streamed.content.map((b) => b.type), ['thinking', 'text', 'tool_use'], 'streamed blocks');
  eq(streamed.content[2].input, { city: 'Paris', days: 2 }, 'streamed tool input');
  eq(streamed.stop_reason, 'tool_use', 'streamed stop_reason');
  // The result goes back with the assistant turn exactly as returned (thinking and signature
  // included); the answer comes from the unscripted server.
  const history = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: first.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'Sunny, 24 C' }] },
  ];
  const body = { model: MODEL_ID, max_tokens: 6, temperature: 0, tools: TOOLS, messages: history, ...OFF };
  const answer = await client(main).messages.create(body);
  eq(answer.content.map((b) => b.type), ['text'], 'answer blocks');
  eq(answer.stop_reason, 'max_tokens', 'answer stop_reason');
  const counted = await client(main).messages.countTokens({ model: MODEL_ID, tools: TOOLS, messages: history, ...OFF });
  eq(counted.input_tokens, answer.usage.input_tokens + answer.usage.cache_read_input_tokens, 'count_tokens = the answer\'s input');
  const firstCount = await client(main).messages.countTokens({ model: MODEL_ID, tools: TOOLS, messages: [history[0]], ...OFF });
  assert(counted.input_tokens > firstCount.input_tokens + 10, 'the tool round renders into the prompt');
  // tool_choice any / tool are accepted; a tool_result for an unknown id is refused.
  for (const tc of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }, { type: 'none' }])
    await client(main).messages.create({ ...body, tool_choice: tc });
  const bad = await client(main).messages.create({ ...body, messages: [history[0], history[1],
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_nope', content: 'x' }] }] }).catch((e) => e);
  assert(bad instanceof Anthropic.BadRequestError, () => `unknown tool_use_id: ${bad}`);
});

await check('stop_sequences', async () => {
  const c = client(scripted);
  const inText = await c.messages.create(ask('Weather in Paris?', { ...ON, max_tokens: 2048, tools: TOOLS, stop_sequences: ['ing.'] }));
  eq(inText.stop_reason, 'stop_sequence', 'stop_reason');
  eq(inText.stop_sequence, 'ing.', 'stop_sequence');
  eq(inText.content.map((b) => b.type), ['thinking', 'text'], 'blocks (no tool call after the stop)');
  eq(inText.content[1].text, 'Check', 'text before the stop sequence');
  const events = await rawStream(scripted, ask('Weather in Paris?', { ...ON, max_tokens: 2048, tools: TOOLS, stop_sequences: ['XYZ', 'needs'] }));
  const md = events.find((e) => e.event === 'message_delta').data;
  eq([md.delta.stop_reason, md.delta.stop_sequence], ['stop_sequence', 'needs'], 'streamed stop');
  const thinking = events.filter((e) => e.data.delta?.type === 'thinking_delta').map((e) => e.data.delta.thinking).join('');
  eq(thinking, 'Weather ', 'thinking before the stop sequence');
  const plain = await c.messages.create(ask('Weather in Paris?', { ...ON, max_tokens: 2048, tools: TOOLS, stop_sequences: ['never there'] }));
  eq([plain.stop_reason, plain.stop_sequence], ['tool_use', null], 'no match');
});

await check('count_tokens', async () => {
  const body = { model: MODEL_ID, system: 'Answer in French.', messages: [{ role: 'user', content: 'Hello there' }], ...OFF };
  const n = await client(main).messages.countTokens(body);
  assert(Number.isInteger(n.input_tokens) && n.input_tokens > 5, `input_tokens ${show(n)}`);
  const m = await client(main).messages.create({ ...body, max_tokens: 2 });
  eq(n.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens, 'count_tokens = usage input');
  const withSystem = await client(main).messages.countTokens({ ...body, system: [{ type: 'text', text: 'Answer in French, and be brief about it.' }] });
  assert(withSystem.input_tokens > n.input_tokens, 'a longer system prompt counts more');
});

// The SDK raises its own error classes from the envelope; refusals before the handler (key,
// media type, method) come in the same envelope.
await check('errors.anthropic_envelope', async () => {
  const expectAnthropicError = (r, status, type) => {
    eq(r.status, status, `status (${show(r.text)})`);
    eq(r.json?.type, 'error', `envelope type (${show(r.text)})`);
    eq(r.json?.error?.type, type, 'error.type');
    assert(typeof r.json.error.message === 'string' && r.json.error.message.length > 0, 'error.message');
  };
  const wrong = await client(main, { apiKey: 'sk-wrong' }).messages.create(ask('hi', OFF)).catch((e) => e);
  assert(wrong instanceof Anthropic.AuthenticationError, () => `wrong key: ${wrong}`);
  eq(wrong.status, 401, 'status');
  eq(wrong.type, 'authentication_error', 'SDK error.type');
  eq(wrong.errorCode, 'invalid_api_key', 'SDK errorCode');
  const noMax = await client(main).messages.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'hi' }] }).catch((e) => e);
  assert(noMax instanceof Anthropic.BadRequestError, () => `no max_tokens: ${noMax}`);
  eq(noMax.type, 'invalid_request_error', 'type');
  assert(/max_tokens/.test(noMax.apiMessage), `message names max_tokens: ${noMax.apiMessage}`);
  eq(noMax.details?.param, 'max_tokens', 'details.param');
  const image = await client(main).messages.create(ask([{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }])).catch((e) => e);
  assert(image instanceof Anthropic.BadRequestError, () => `image block: ${image}`);
  const badCount = await client(main).messages.countTokens({ model: MODEL_ID, messages: [] }).catch((e) => e);
  assert(badCount instanceof Anthropic.BadRequestError, () => `empty messages: ${badCount}`);
  // Raw: the guards' refusals on the Messages paths.
  expectAnthropicError(await request(main, { method: 'POST', path: '/v1/messages', body: ask('hi'), auth: false }), 401, 'authentication_error');
  expectAnthropicError(await request(main, { method: 'POST', path: '/v1/messages/count_tokens', body: ask('hi'), headers: { 'x-api-key': 'nope' }, auth: false }),
                       401, 'authentication_error');
  expectAnthropicError(await request(main, { method: 'POST', path: '/v1/messages', body: JSON.stringify(ask('hi')), headers: { 'content-type': 'text/plain' } }),
                       415, 'invalid_request_error');
  expectAnthropicError(await request(main, { method: 'POST', path: '/v1/messages', body: '{"model":' }), 400, 'invalid_request_error');
  expectAnthropicError(await request(main, { path: '/v1/messages' }), 405, 'invalid_request_error');
  expectAnthropicError(await request(main, { path: '/v1/messages/batches' }), 404, 'not_found_error');
  // Bearer works as well as x-api-key; the OpenAI paths keep OpenAI's envelope.
  const bearer = await request(main, { method: 'POST', path: '/v1/messages', body: ask('hi', { ...OFF, max_tokens: 1 }), auth: false,
                                       headers: { authorization: `Bearer ${KEY}` } });
  eq(bearer.status, 200, 'Bearer key');
  const openai = await request(main, { path: '/v1/models', auth: false });
  eq([openai.status, typeof openai.json?.error?.code], [401, 'string'], 'OpenAI envelope elsewhere');
});

// Claude Code's model names (claude-sonnet-4-5-…, the small fast claude-haiku-4-5-… of its side
// requests) are served by the one model, and the reply names the served id.
await check('model.any_claude_name', async () => {
  const c = client(main);
  for (const model of ['claude-sonnet-4-5-20250929', 'claude-haiku-4-5-20251001', 'claude-opus-4-1']) {
    const m = await c.messages.create({ ...ask('hi', OFF), model, max_tokens: 2 });
    eq(m.model, MODEL_ID, `${model}: the served id`);
  }
  const final = await c.messages.stream({ ...ask('hi', OFF), model: 'claude-sonnet-4-5-20250929', max_tokens: 2 }).finalMessage();
  eq(final.model, MODEL_ID, 'streamed message_start.message.model');
  const n = await c.messages.countTokens({ model: 'claude-haiku-4-5-20251001', messages: [{ role: 'user', content: 'hi' }] });
  assert(n.input_tokens > 0, 'count_tokens under a Claude name');
});

// A request shaped like Claude Code's main-loop request (claude-code 2.x: POST
// /v1/messages?beta=true, anthropic-beta and anthropic-version headers, the system prompt as text
// blocks with cache_control, content blocks, a tools array with JSON-Schema input schemas,
// max_tokens 32000 over the server's ceiling, stream, metadata.user_id), and its small
// non-streaming side request (a title from the haiku model).
const CLAUDE_CODE_HEADERS = {
  'anthropic-version': '2023-06-01',
  'anthropic-beta': 'claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14',
  'anthropic-dangerous-direct-browser-access': 'true',
  'x-app': 'cli',
  'user-agent': 'claude-cli/2.0.14 (external, cli)',
};
await check('claude_code.request_shape', async () => {
  const s = await start('claude-code', ['--max-tokens', '6']);
  const tools = [
    { name: 'Bash', description: 'Executes a given bash command in a persistent shell session.',
      input_schema: { type: 'object', properties: { command: { type: 'string', description: 'The command to execute' },
        timeout: { type: 'number', description: 'Optional timeout in milliseconds (max 600000)' } },
        required: ['command'], additionalProperties: false, $schema: 'http://json-schema.org/draft-07/schema#' } },
    { name: 'Read', description: 'Reads a file from the local filesystem.',
      input_schema: { type: 'object', properties: { file_path: { type: 'string' }, offset: { type: 'number' }, limit: { type: 'number' } },
        required: ['file_path'], additionalProperties: false, $schema: 'http://json-schema.org/draft-07/schema#' } },
  ];
  const body = {
    model: 'claude-sonnet-4-5-20250929',
    max_tokens: 32000,
    temperature: 1,
    stream: true,
    metadata: { user_id: 'user_0123456789abcdef_account__session_01234567-89ab-cdef-0123-456789abcdef' },
    system: [
      { type: 'text', text: "You are Claude Code, Anthropic's official CLI for Claude.", cache_control: { type: 'ephemeral' } },
      { type: 'text', text: 'You are an interactive CLI tool that helps users with software engineering tasks.', cache_control: { type: 'ephemeral' } },
    ],
    messages: [{ role: 'user', content: [
      { type: 'text', text: "<system-reminder>\nAs you answer the user's questions, you can use the following context.\n</system-reminder>" },
      { type: 'text', text: 'List the files here.', cache_control: { type: 'ephemeral' } },
    ] }],
    tools,
  };
  const st = await sse(s, body, { path: '/v1/messages?beta=true', headers: CLAUDE_CODE_HEADERS });
  eq(st.status, 200, `status (${show(st.json ?? st.text)})`);
  const events = st.events.filter((e) => e.kind === 'data').map((e) => e.json);
  eq(events[0]?.type, 'message_start', 'first event');
  eq(events[0].message.model, MODEL_ID, 'message_start names the served id');
  eq(events[events.length - 1]?.type, 'message_stop', 'last event');
  const delta = events.find((e) => e.type === 'message_delta');
  eq(delta?.usage?.output_tokens, 6, 'max_tokens 32000 clamped to --max-tokens 6');
  // The side request: non-streaming, the small model's name, a short budget.
  const side = await request(s, { method: 'POST', path: '/v1/messages?beta=true', headers: CLAUDE_CODE_HEADERS, body: {
    model: 'claude-haiku-4-5-20251001', max_tokens: 512, temperature: 0,
    system: [{ type: 'text', text: 'Summarize this coding conversation in under 50 characters.' }],
    messages: [{ role: 'user', content: 'List the files here.' }],
    metadata: { user_id: body.metadata.user_id } } });
  eq([side.status, side.json?.type, side.json?.model], [200, 'message', MODEL_ID], `side request (${show(side.text)})`);
  const count = await request(s, { method: 'POST', path: '/v1/messages/count_tokens?beta=true', headers: CLAUDE_CODE_HEADERS,
                                   body: { model: body.model, system: body.system, messages: body.messages, tools } });
  assert(count.status === 200 && count.json.input_tokens > 50, `count_tokens?beta=true: ${show(count.text)}`);
  await s.waitForStderr(new RegExp(`^\\[http\\] ${side.headers['x-request-id']} POST /v1/messages 200 prompt=\\d+`, 'm'));
});

// A prompt over the context: the SDK's BadRequestError in Anthropic's envelope, the message naming
// the prompt's whole count (the one count_tokens gives), the context and the setting.
await check('errors.context_overflow_numbers', async () => {
  const s = await start('ctx-256', ['--ctx', '256']);
  const long = { model: 'claude-sonnet-4-5-20250929', system: 'Be brief.', messages: [{ role: 'user', content: 'lorem ipsum dolor sit amet '.repeat(80) }], ...OFF };
  const n = (await client(s).messages.countTokens(long)).input_tokens;
  assert(n > 256, `the prompt (${n} tokens) is over the context`);
  const e = await client(s).messages.create({ ...long, max_tokens: 8 }).catch((x) => x);
  assert(e instanceof Anthropic.BadRequestError, () => `over the context: ${e}`);
  eq([e.type, e.errorCode, e.details?.param], ['invalid_request_error', 'context_length_exceeded', 'messages'], 'type, code, param');
  eq(e.apiMessage, `the prompt has ${n} tokens and the reply needs at least 1 more, ${n + 1} in all, but the context holds 256 ` +
     `(--ctx / COLI_CTX): raise --ctx to ${n + 1} or more, or shorten the prompt`, 'message');
  const streamed = await request(s, { method: 'POST', path: '/v1/messages?beta=true', body: { ...long, max_tokens: 8, stream: true } });
  eq([streamed.status, streamed.json?.error?.details?.error_code], [400, 'context_length_exceeded'], 'streamed request: refused before the stream');
});

// ---- summary --------------------------------------------------------------------------------

for (const s of servers) await s.stop();
cancelTimeout();
killAll();
const ok = R.summary();
process.exit(ok ? 0 : 1);

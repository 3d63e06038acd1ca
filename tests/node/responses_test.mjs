// End-to-end tests of the OpenAI Responses API of `coli serve` (POST /v1/responses, stateless)
// with the official `openai` npm client's `responses.create` and `responses.stream`, raw HTTP for
// the stream's framing, and every response, event and error validated against OpenAI's published
// schemas (tests/data/openai/responses_schemas.json). Written from docs/serving.md §3.17.
//
//   node tests/node/responses_test.mjs <path-to-coli>
//   (ctest: Serve.OpenAIResponses; `make test` installs tests/node/node_modules)
//
// A random-weight demo model with the real K3 tokenizer: generated text is noise but greedy at
// temperature 0, so a Responses answer is compared with the chat completion of the same turns
// (same prompt tokens, same text). A server with --script-ids writes a real function call.
// Environment: RESPONSES_TEST_TIMEOUT_S (default 240), RESPONSES_TEST_ONLY (a regular
// expression; runs only the matching checks).
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  MODEL_ID, Runner, Server, assert, chat, demoModel, eq, expectError, globalTimeout, killAll,
  postJson, request, show, sse,
} from './serve_util.mjs';

const coliArg = process.argv[2];
if (!coliArg) {
  console.error('usage: node tests/node/responses_test.mjs <path-to-coli>');
  process.exit(2);
}
const coli = path.resolve(coliArg);
const here = path.dirname(fileURLToPath(import.meta.url));

// Each event is validated against its own schema (ResponseStreamEvent is an anyOf of them, whose
// failures list every branch): the event type → schema name map comes from that anyOf.
let OpenAI, v, eventSchema;
try {
  ({ default: OpenAI } = await import('openai'));
  const { schemaValidators } = await import('./openai_schemas.mjs');
  const file = path.join(here, '..', 'data', 'openai', 'responses_schemas.json');
  const all = JSON.parse(fs.readFileSync(file, 'utf8')).components.schemas;
  eventSchema = new Map(all.ResponseStreamEvent.anyOf.map(({ $ref }) => {
    const name = $ref.split('/').pop();
    return [all[name].properties.type.enum[0], name];
  }));
  v = schemaValidators(file, ['Response', 'ErrorResponse', ...eventSchema.values()]);
} catch (e) {
  console.error(`FAIL: the npm test oracles are not installed (${e.code ?? e.message}).\n` +
                'Run `make test`: it installs them (npm ci --prefix tests/node) before running ctest.');
  process.exit(1);
}

const cancelTimeout = globalTimeout(Number(process.env.RESPONSES_TEST_TIMEOUT_S ?? 240) * 1000, 'responses_test');
const ONLY = process.env.RESPONSES_TEST_ONLY ? new RegExp(process.env.RESPONSES_TEST_ONLY) : null;
const R = new Runner('responses_test');
const check = (name, fn) => (ONLY && !ONLY.test(name) ? Promise.resolve() : R.check(name, fn));

const modelDir = demoModel(coli);

const servers = [];
async function startServer(name, flags = []) {
  const s = new Server(coli, modelDir, name, flags);
  servers.push(s);
  return s.start();
}
let mainPromise = null;
const mainSrv = () => (mainPromise ??= startServer('main', ['--ctx', '2048']));
const client = (s) => new OpenAI({ apiKey: 'sk-local-dummy', baseURL: `${s.url}/v1`, maxRetries: 0, timeout: 120_000 });

// ---- helpers --------------------------------------------------------------------------------

const body = (input, extra = {}) => ({ model: MODEL_ID, input, temperature: 0, max_output_tokens: 12, ...extra });
const OFF = { reasoning: { effort: 'none' } };

// The text of an answer: reasoning and message texts, function calls.
function partsOf(resp) {
  const out = { reasoning: '', text: '', calls: [] };
  for (const item of resp.output) {
    if (item.type === 'reasoning') out.reasoning += (item.content ?? []).map((c) => c.text).join('');
    else if (item.type === 'message') out.text += item.content.map((c) => c.text ?? '').join('');
    else if (item.type === 'function_call') out.calls.push({ name: item.name, arguments: item.arguments, call_id: item.call_id });
  }
  return out;
}

// Checks a whole response object beyond the schema.
function checkResponse(r, { maxOutput, status } = {}) {
  const { output_text: sdkOnly, ...wire } = r;  // the SDK adds output_text; the schema allows it too
  v.Response(wire);
  eq(r.object, 'response', 'object');
  assert(/^resp_[0-9a-f]{32}$/.test(r.id), `id: ${r.id}`);
  eq(r.model, MODEL_ID, 'model');
  assert(Math.abs(r.created_at - Date.now() / 1000) < 600, `created_at is not the current time: ${r.created_at}`);
  assert(['completed', 'incomplete'].includes(r.status), `status ${r.status}`);
  if (status) eq(r.status, status, 'status');
  if (r.status === 'completed') {
    assert(Number.isInteger(r.completed_at) && r.completed_at >= r.created_at, `completed_at ${r.completed_at}`);
    eq(r.incomplete_details, null, 'incomplete_details');
  } else {
    eq(r.completed_at, null, 'completed_at of an incomplete response');
  }
  eq(r.error, null, 'error');
  eq(r.store, false, 'store (nothing is stored)');
  eq(r.previous_response_id, null, 'previous_response_id');
  assert(r.output.length >= 1, 'output is empty');
  const ids = r.output.map((i) => i.id);
  eq(new Set(ids).size, ids.length, 'output item ids are distinct');
  const u = r.usage;
  assert(Number.isInteger(u.input_tokens) && u.input_tokens > 0, `usage.input_tokens ${show(u)}`);
  assert(Number.isInteger(u.input_tokens_details.cached_tokens) && u.input_tokens_details.cached_tokens < u.input_tokens,
         `usage.input_tokens_details.cached_tokens ${show(u)}`);
  assert(u.output_tokens_details.reasoning_tokens <= u.output_tokens, `reasoning_tokens > output_tokens ${show(u)}`);
  eq(u.total_tokens, u.input_tokens + u.output_tokens, 'usage.total_tokens');
  if (maxOutput !== undefined) assert(u.output_tokens <= maxOutput, `output_tokens ${u.output_tokens} > ${maxOutput}`);
  return r;
}

// The SDK's output_text: the messages' text.
function checkOutputText(r) {
  eq(r.output_text, partsOf(r).text, 'SDK output_text = the message text');
}

// A raw SSE exchange on /v1/responses: named events whose name is the data's type, sequence
// numbers 0.., no [DONE], every event valid; the terminal response equals what the deltas built.
function checkEvents(st) {
  assert(st.status === 200, () => `stream: expected 200, got ${st.status} ${show(st.text ?? st.json, 500)}`);
  assert(String(st.headers['content-type']).startsWith('text/event-stream'), `content-type ${st.headers['content-type']}`);
  assert(st.badUtf8.length === 0, 'SSE events with invalid UTF-8');
  assert(!st.events.some((e) => e.kind === 'done'), 'a Responses stream has no [DONE]');
  const events = st.events.filter((e) => e.kind !== 'comment');
  events.forEach((e, i) => {
    assert(e.kind === 'data', () => `event ${i} is not JSON data: ${show(e.text)}`);
    const name = /^event: (.*)$/m.exec(e.text)?.[1];
    eq(name, e.json.type, `event ${i}: the SSE event name is the type`);
    eq(e.json.sequence_number, i, `event ${i}: sequence_number`);
    const schema = eventSchema.get(e.json.type);
    assert(schema, `event ${i}: ${e.json.type} is not an event type of the API`);
    try { v[schema](e.json); } catch (err) { throw new Error(`event ${i} (${e.json.type}): ${err.message}`); }
  });
  const data = events.map((e) => e.json);
  eq(data[0].type, 'response.created', 'first event');
  eq(data[1].type, 'response.in_progress', 'second event');
  eq(data[0].response.status, 'in_progress', 'response.created status');
  eq(data[0].response.output, [], 'response.created output');
  const last = data[data.length - 1];
  assert(['response.completed', 'response.incomplete'].includes(last.type), `last event ${last.type}`);
  eq(last.response.id, data[0].response.id, 'the same response id throughout');
  // Rebuild the output from the item events and compare with the terminal response.
  const built = [];
  const open = new Map();
  for (const e of data.slice(2, -1)) {
    switch (e.type) {
      case 'response.output_item.added':
        eq(e.output_index, built.length, 'output_item.added index');
        built.push(structuredClone(e.item));
        open.set(e.item.id, '');
        break;
      case 'response.content_part.added':
        eq(built[e.output_index].id, e.item_id, 'content_part.added item_id');
        break;
      case 'response.output_text.delta':
      case 'response.reasoning_text.delta':
      case 'response.function_call_arguments.delta':
        eq(built[e.output_index].id, e.item_id, `${e.type} item_id`);
        open.set(e.item_id, open.get(e.item_id) + e.delta);
        break;
      case 'response.output_text.done':
      case 'response.reasoning_text.done':
        eq(e.text, open.get(e.item_id), `${e.type}: text = the deltas`);
        break;
      case 'response.function_call_arguments.done':
        eq(e.arguments, open.get(e.item_id), 'function_call_arguments.done = the deltas');
        break;
      case 'response.content_part.done':
        break;
      case 'response.output_item.done':
        built[e.output_index] = e.item;
        open.delete(e.item.id);
        break;
      default:
        throw new Error(`unexpected event ${e.type}`);
    }
  }
  eq(open.size, 0, 'every opened item was closed');
  eq(built, last.response.output, 'the terminal response output = the items as streamed');
  return { data, final: last.response };
}

// The chat completion of the same turns (for comparing prompts and greedy text).
async function chatOf(s, messages, extra = {}) {
  const r = await chat(s, { model: MODEL_ID, messages, temperature: 0, ...extra });
  assert(r.status === 200, () => `chat: ${r.status} ${show(r.text)}`);
  return r.json;
}

// =============================================================================================

await check('create.string_input', async () => {
  const s = await mainSrv();
  const r = checkResponse(await client(s).responses.create(body('Say hello.', OFF)), { maxOutput: 12 });
  checkOutputText(r);
  eq(r.output.filter((i) => i.type === 'reasoning').length, 0, 'no reasoning item with effort none');
  eq(r.reasoning.effort, 'none', 'reasoning.effort echoed');
  eq(r.max_output_tokens, 12, 'max_output_tokens echoed');
  const c = await chatOf(s, [{ role: 'user', content: 'Say hello.' }], { max_tokens: 12, reasoning_effort: 'none' });
  eq(r.usage.input_tokens, c.usage.prompt_tokens, 'input_tokens = the chat prompt of the same turn');
  eq(r.output_text, c.choices[0].message.content, 'greedy text = the chat answer');
});

await check('create.items_with_instructions', async () => {
  const s = await mainSrv();
  const input = [
    { role: 'developer', content: 'Answer in French.' },
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Name a colour.' }] },
    { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Rouge.', annotations: [] }] },
    { role: 'user', content: 'Another one?' },
  ];
  const r = checkResponse(await client(s).responses.create(body(input, { instructions: 'Be brief.', max_output_tokens: 10 })));
  eq(r.instructions, 'Be brief.', 'instructions echoed');
  const p = partsOf(r);
  const c = await chatOf(s, [
    { role: 'system', content: 'Be brief.' }, { role: 'system', content: 'Answer in French.' },
    { role: 'user', content: 'Name a colour.' }, { role: 'assistant', content: 'Rouge.' },
    { role: 'user', content: 'Another one?' }], { max_tokens: 10 });
  eq(r.usage.input_tokens, c.usage.prompt_tokens, 'input_tokens = the chat prompt of the same turns');
  eq(p.reasoning, c.choices[0].message.reasoning_content ?? '', 'reasoning = the chat reasoning_content');
  eq(p.text, c.choices[0].message.content ?? '', 'text = the chat content');
  eq(r.usage.output_tokens_details.reasoning_tokens, c.usage.completion_tokens_details.reasoning_tokens, 'reasoning_tokens');
});

await check('stream.events_and_sdk_helper', async () => {
  const s = await mainSrv();
  const b = body('Tell me a story.', { max_output_tokens: 16 });
  const plain = checkResponse(await client(s).responses.create(b));
  const st = await sse(s, { ...b, stream: true }, { path: '/v1/responses' });
  const { data, final } = checkEvents(st);
  checkResponse(final);
  eq(partsOf(final), partsOf(plain), 'streamed output = the non-streamed one (greedy)');
  eq(final.usage.output_tokens, plain.usage.output_tokens, 'streamed usage.output_tokens');
  const types = data.map((e) => e.type);
  if (partsOf(plain).reasoning) assert(types.includes('response.reasoning_text.delta'), 'no reasoning_text.delta');
  if (partsOf(plain).text) assert(types.includes('response.output_text.delta'), 'no output_text.delta');
  // The SDK: the raw event iterator, then the accumulating helper.
  const events = [];
  for await (const e of await client(s).responses.create({ ...b, stream: true })) events.push(e);
  eq(events.map((e) => e.type), types, 'SDK iterator: the same events');
  eq(events.map((e) => e.sequence_number), types.map((_, i) => i), 'SDK iterator: sequence numbers');
  const stream = client(s).responses.stream(b);
  let deltas = '';
  stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const helper = await stream.finalResponse();
  eq(helper.status, plain.status, 'responses.stream finalResponse status');
  eq(partsOf(helper), partsOf(plain), 'responses.stream finalResponse = the non-streamed output');
  eq(helper.output_text, deltas, 'responses.stream: output_text = the text deltas');
});

await check('max_output_tokens.incomplete', async () => {
  const s = await mainSrv();
  const r = checkResponse(await client(s).responses.create(body('Count to one hundred.', { max_output_tokens: 4 })),
                          { status: 'incomplete' });
  eq(r.incomplete_details, { reason: 'max_output_tokens' }, 'incomplete_details');
  eq(r.usage.output_tokens, 4, 'output_tokens');
  eq(r.output[r.output.length - 1].status, 'incomplete', 'the cut item is incomplete');
  const st = await sse(s, { ...body('Count to one hundred.', { max_output_tokens: 4 }), stream: true }, { path: '/v1/responses' });
  const { final } = checkEvents(st);
  eq(st.events[st.events.length - 1].json.type, 'response.incomplete', 'terminal event');
  eq(final.incomplete_details, { reason: 'max_output_tokens' }, 'streamed incomplete_details');
  const helper = await client(s).responses.stream(body('Count to one hundred.', { max_output_tokens: 4 })).finalResponse();
  eq(helper.status, 'incomplete', 'responses.stream finalResponse of a cut reply');
});

await check('reasoning.effort', async () => {
  const s = await mainSrv();
  const msgs = [{ role: 'user', content: 'Why is the sky blue?' }];
  const seen = new Map();
  for (const [effort, chatEffort] of [['low', 'low'], ['high', 'high'], ['none', 'none']]) {
    const r = checkResponse(await client(s).responses.create(body(msgs, { reasoning: { effort }, max_output_tokens: 6 })));
    eq(r.reasoning.effort, effort, 'reasoning.effort echoed');
    const c = await chatOf(s, msgs, { max_tokens: 6, reasoning_effort: chatEffort });
    eq(r.usage.input_tokens, c.usage.prompt_tokens, `effort ${effort}: input_tokens = the chat prompt with reasoning_effort ${chatEffort}`);
    eq(partsOf(r).reasoning, c.choices[0].message.reasoning_content ?? '', `effort ${effort}: reasoning = chat's`);
    seen.set(effort, r);
  }
  // low and high differ in one token of the prompt (the template's effort message), which the
  // greedy answer shows; none drops the thinking prompt.
  assert(JSON.stringify(partsOf(seen.get('low'))) !== JSON.stringify(partsOf(seen.get('high'))),
         () => `effort low and high gave the same answer: ${show(partsOf(seen.get('low')))}`);
  assert(seen.get('none').usage.input_tokens !== seen.get('low').usage.input_tokens,
         'effort none renders the same prompt as low');
  eq(seen.get('none').output.filter((i) => i.type === 'reasoning').length, 0, 'effort none: no reasoning item');
  eq(seen.get('none').usage.output_tokens_details.reasoning_tokens, 0, 'effort none: reasoning_tokens');
});

// A function call written by the model (--script-ids: the first ids of every reply), sent back
// with its output; the follow-up turn is answered by the plain server and equals the chat answer
// of the same turns.
const TOOLS = [{
  type: 'function', name: 'get_weather', description: 'Current weather for a city.', strict: false,
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'number' } }, required: ['city'] },
}];
const CALL_TEXT = 'Weather needs a tool.<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>' +
  '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>' +
  '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>' +
  '<|open|>argument key="days" type="number"<|sep|>2<|close|>argument<|sep|>' +
  '<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>';

await check('function_call.round_trip', async () => {
  const main = await mainSrv();
  const tk = await postJson(main, '/tokenize', { content: CALL_TEXT, parse_special: true });
  eq(tk.status, 200, '/tokenize');
  const s = await startServer('script-tool', ['--script-ids', tk.json.tokens.join(',')]);
  const question = { role: 'user', content: 'Weather in Paris?' };
  const b = body([question], { tools: TOOLS, tool_choice: 'auto', max_output_tokens: 300 });
  const r = checkResponse(await client(s).responses.create(b), { status: 'completed' });
  eq(r.output.map((i) => i.type), ['reasoning', 'message', 'function_call'], 'output item types');
  const p = partsOf(r);
  eq(p.reasoning, 'Weather needs a tool.', 'reasoning');
  eq(p.text, 'Checking.', 'text');
  eq(p.calls.length, 1, 'one call');
  eq(p.calls[0].name, 'get_weather', 'call name');
  eq(JSON.parse(p.calls[0].arguments), { city: 'Paris', days: 2 }, 'call arguments');
  assert(/^call_/.test(p.calls[0].call_id), `call_id ${p.calls[0].call_id}`);
  eq(r.tools[0].name, 'get_weather', 'tools echoed');
  // Streamed: the call's arguments as delta and done events.
  const st = await sse(s, { ...b, stream: true }, { path: '/v1/responses' });
  const { data, final } = checkEvents(st);
  eq(partsOf(final).calls.map((c) => c.arguments), p.calls.map((c) => c.arguments), 'streamed call arguments');
  assert(data.some((e) => e.type === 'response.function_call_arguments.done' && e.name === 'get_weather'),
         'no function_call_arguments.done naming the function');
  const helper = await client(s).responses.stream(b).finalResponse();
  eq(partsOf(helper).calls[0]?.name, 'get_weather', 'responses.stream: the call');
  // Turn 2: the whole output sent back, with the call's output.
  const turn2 = [question, ...r.output, { type: 'function_call_output', call_id: p.calls[0].call_id, output: '18 C, sunny' }];
  const a = checkResponse(await client(main).responses.create(body(turn2, { tools: TOOLS, max_output_tokens: 8 })));
  assert(a.usage.input_tokens > r.usage.input_tokens, 'turn 2 holds turn 1 and the tool output');
  const c = await chatOf(main, [question,
    { role: 'assistant', content: 'Checking.', reasoning_content: 'Weather needs a tool.',
      tool_calls: [{ id: p.calls[0].call_id, type: 'function', function: { name: 'get_weather', arguments: p.calls[0].arguments } }] },
    { role: 'tool', tool_call_id: p.calls[0].call_id, content: '18 C, sunny' }],
  { max_tokens: 8, tools: TOOLS.map(({ type, name, description, parameters }) => ({ type, function: { name, description, parameters } })) });
  eq(a.usage.input_tokens, c.usage.prompt_tokens, 'turn 2 input_tokens = the chat prompt of the same turns');
  eq(partsOf(a).text, c.choices[0].message.content ?? '', 'turn 2 answer = the chat answer');
});

// Any model name (OpenAI apps send gpt-4o-mini) gets the served model; the response names it.
await check('model.any_name', async () => {
  const s = await mainSrv();
  const r = await client(s).responses.create(body('Hello', { ...OFF, model: 'gpt-4o-mini', max_output_tokens: 2 }));
  checkResponse(r);
  eq(r.model, MODEL_ID, 'model');
  const events = [];
  for await (const ev of await client(s).responses.create(body('Hello', { ...OFF, model: 'gpt-4.1', max_output_tokens: 2, stream: true })))
    events.push(ev);
  eq(events[0]?.response?.model, MODEL_ID, `streamed ${events[0]?.type} model`);
  eq(events[events.length - 1]?.response?.model, MODEL_ID, `streamed ${events[events.length - 1]?.type} model`);
});

await check('errors', async () => {
  const s = await mainSrv();
  const post = (b) => postJson(s, '/v1/responses', b);
  const err = async (b, status, code, param) => {
    const r = await post(b);
    expectError(r, status, code, { param });
    v.ErrorResponse(r.json);
  };
  await err(body('x', { previous_response_id: 'resp_0123' }), 400, 'unsupported_parameter', 'previous_response_id');
  await err(body('x', { conversation: 'conv_1' }), 400, 'unsupported_parameter', 'conversation');
  await err(body('x', { tools: [{ type: 'web_search' }] }), 400, 'unsupported_value', 'tools.0.type');
  await err(body([{ role: 'user', content: [{ type: 'input_image', image_url: 'https://x/y.png' }] }]), 400,
            'unsupported_content_type', 'input.0.content.0');
  await err(body([{ type: 'item_reference', id: 'msg_1' }]), 400, 'unsupported_parameter', 'input.0');
  await err({ model: MODEL_ID }, 400, 'missing_required_parameter', 'input');
  await err(body('x', { max_output_tokens: 0 }), 400, 'invalid_value', 'max_output_tokens');
  await err(body('x', { text: { format: { type: 'yaml' } } }), 400, 'unsupported_parameter', 'text.format');
  const long = await post(body('word '.repeat(5000)));
  const e = expectError(long, 400, 'context_length_exceeded', { param: 'input' });
  v.ErrorResponse(long.json);
  // The whole count, the same the chat endpoint gives for the same turn, the context and the setting.
  const viaChat = expectError(await chat(s, { model: MODEL_ID, messages: [{ role: 'user', content: 'word '.repeat(5000) }] }),
                              400, 'context_length_exceeded', { param: 'messages' });
  const n = Number(/^the prompt has (\d+) tokens/.exec(viaChat.message)?.[1]);
  assert(n > 2048, `chat counts the prompt: ${viaChat.message}`);
  eq(e.message, `the prompt has ${n} tokens and the reply needs at least 1 more, ${n + 1} in all, but the context holds 2048 ` +
     `(--ctx / COLI_CTX): raise --ctx to ${n + 1} or more, or shorten the prompt`, 'the Responses message');
  // store: true is accepted; nothing is stored, and stored responses cannot be fetched.
  const stored = checkResponse((await post(body('x', { store: true, max_output_tokens: 2 }))).json);
  eq(stored.store, false, 'store');
  const fetched = await request(s, { path: `/v1/responses/${stored.id}` });
  expectError(fetched, 404, 'not_found');
  expectError(await request(s, { path: '/v1/responses' }), 405, 'method_not_allowed');
  // The SDK raises the error with its status and parameter.
  let thrown = null;
  try { await client(s).responses.create(body('x', { previous_response_id: 'resp_0123' })); } catch (e) { thrown = e; }
  assert(thrown instanceof OpenAI.BadRequestError, `the SDK should throw BadRequestError, got ${thrown}`);
  eq(thrown.status, 400, 'SDK error status');
  eq(thrown.param, 'previous_response_id', 'SDK error param');
});

cancelTimeout();
for (const s of servers) await s.stop();
killAll();
process.exit(R.summary() ? 0 : 1);

// End-to-end tests of `coli serve` driven the way users drive it: the official `openai` npm
// client, raw HTTP for what the SDK cannot send, and OpenAI's published response schemas.
// Written from docs/serving.md (§3.5–3.10, 3.14 and §4), not from the server's code.
//
//   node tests/node/serve_test.mjs <path-to-coli>
//   (ctest: Serve.OpenAIClient; `make test` installs tests/node/node_modules)
//
// It runs on the build's random-weight demo model with the real K3 tokenizer
// (<build>/tests/demo-model, k3_synth --preset demo), starts several servers with different flags on ephemeral ports, and prints
// PASS/FAIL per named check plus a summary; exit status 1 on any failure. Generated text is noise
// but deterministic at temperature 0, so outputs are compared between requests and servers (a
// fresh `--ckpt 0` server gives the "cold" answer). Environment: SERVE_TEST_TIMEOUT_S (default
// 300), SERVE_TEST_ONLY (a regular expression; runs only the matching checks).
import { spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  MODEL_ID, Runner, Server, assert, chat, demoModel, eq, expectError, globalTimeout, killAll,
  makeTempDir, postJson, rawSocket, request, show, sleep, sse,
} from './serve_util.mjs';

const coliArg = process.argv[2];
if (!coliArg) {
  console.error('usage: node tests/node/serve_test.mjs <path-to-coli>');
  process.exit(2);
}
const coli = path.resolve(coliArg);

let OpenAI, validateResponse, validateChunk, validateCompletion;
try {
  ({ default: OpenAI } = await import('openai'));
  ({ validateResponse, validateChunk, validateCompletion } = await import('./openai_schemas.mjs'));
} catch (e) {
  console.error(`FAIL: the npm test oracles are not installed (${e.code ?? e.message}).\n` +
                'Run `make test`: it installs them (npm ci --prefix tests/node) before running ctest.');
  process.exit(1);
}

const cancelTimeout = globalTimeout(Number(process.env.SERVE_TEST_TIMEOUT_S ?? 300) * 1000, 'serve_test');
const ONLY = process.env.SERVE_TEST_ONLY ? new RegExp(process.env.SERVE_TEST_ONLY) : null;
const R = new Runner('serve_test');
const check = (name, fn) => (ONLY && !ONLY.test(name) ? Promise.resolve() : R.check(name, fn));

const tmp = makeTempDir('coli-serve-test-');
const modelDir = demoModel(coli);
const listing = (dir) => fs.readdirSync(dir).sort().map((f) => {
  const st = fs.statSync(path.join(dir, f));
  return `${f}:${st.size}:${st.mtimeMs}`;
});
const modelListingBefore = listing(modelDir);

// ---- servers (started on first use) ---------------------------------------------------------

const allServers = [];
function lazy(name, flags, opts = {}) {
  let p = null;
  return () => {
    if (!p) {
      const s = new Server(coli, modelDir, name, flags, opts);
      allServers.push(s);
      p = s.start(opts.start ?? {});
    }
    return p;
  };
}
const API_KEY = 'sk-test-' + crypto.randomBytes(12).toString('hex');
const WRONG_KEY = 'sk-wrong-' + crypto.randomBytes(20).toString('hex');
const ENV_KEY = 'sk-env-' + crypto.randomBytes(8).toString('hex');
const GOOD_ORIGIN = 'http://good.example:3000';
const CKDIR = path.join(tmp, 'ck');        // not created by the test: the server creates it (0700)
const CKDIR_KEEP = path.join(tmp, 'ck-keep');

const mainSrv = lazy('main', []);
const ckSrv = lazy('ckpt2', ['--ckpt', '2']);
const ck3Srv = lazy('ckpt3', ['--ckpt', '3']);
const coldSrv = lazy('cold', ['--ckpt', '0']);
// One session (--parallel 1) where the checks are about one generation at a time and its queue;
// tests/node/parallel_test.mjs covers several sessions.
// --chunk 32: a prompt is prefilled in pieces of 32 ids with the 30 ms test delay after each but
// the last, so a ~400-token prefill lasts over 0.36 s however fast the machine computes it (the
// chunk does not change the logits).
const slowSrv = lazy('slow', ['--parallel', '1', '--token-delay-ms', '30', '--ckpt', '2', '--chunk', '32']);
const queueSrv = lazy('queue1', ['--parallel', '1', '--max-queue', '1', '--token-delay-ms', '40']);
const qtimeoutSrv = lazy('qtimeout', ['--parallel', '1', '--queue-timeout', '1', '--token-delay-ms', '40']);
const connSrv = lazy('conn', ['--max-connections-per-ip', '8']);  // explicit: loopback is capped too
const pingSrv = lazy('ping', ['--token-delay-ms', '1500', '--sse-ping-interval', '1']);
const limitsSrv = lazy('limits', ['--api-key', API_KEY, '--max-body-mb', '1', '--ctx', '256', '--max-tokens', '64',
                                  '--allowed-host', 'good.example', '--cors-origin', GOOD_ORIGIN], { key: API_KEY });
const diskSrv = lazy('disk', ['--ckpt', '2', '--ckpt-dir', CKDIR], { env: { COLI_API_KEY: ENV_KEY }, key: ENV_KEY });
const keepSrv = lazy('disk-keep', ['--ckpt', '2', '--ckpt-dir', CKDIR_KEEP, '--ckpt-keep']);
const ALIASES = ['k3-alias', 'house-model'];
const strictSrv = lazy('strict', ['--strict-model', '--alias', ALIASES.join(',')]);
// Its own id, aliases, and --accept-any-model after --strict-model (the last one wins).
const SERVED_ID = 'house-k3';
const aliasSrv = lazy('alias', ['--model-id', SERVED_ID, '--alias', ALIASES.join(','), '--strict-model', '--accept-any-model']);

const client = (s) => new OpenAI({ apiKey: s.key ?? 'sk-local-dummy', baseURL: `${s.url}/v1`, maxRetries: 0, timeout: 120_000 });

// ---- request / response helpers -------------------------------------------------------------

const OFF = { chat_template_kwargs: { enable_thinking: false } };
const user = (content) => ({ role: 'user', content });
const sys = (content) => ({ role: 'system', content });
const req = (messages, extra = {}) => ({ model: MODEL_ID, messages, temperature: 0, ...extra });
const textOf = (resp) => {
  const m = resp.choices[0].message;
  return { reasoning: m.reasoning_content ?? '', content: m.content ?? '' };
};
const cachedOf = (resp) => resp.usage?.prompt_tokens_details?.cached_tokens;
// The assistant turn exactly as the server returned it (3.4 History).
const asAssistant = (resp) => {
  const m = resp.choices[0].message;
  const a = { role: 'assistant', content: m.content ?? null };
  if (m.reasoning_content !== undefined) a.reasoning_content = m.reasoning_content;
  return a;
};

function checkUsage(u, what = 'usage') {
  assert(u && typeof u === 'object', `${what} missing`);
  for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens']) {
    assert(Number.isInteger(u[k]) && u[k] >= 0, `${what}.${k} not a non-negative integer: ${show(u)}`);
  }
  assert(u.prompt_tokens > 0, `${what}.prompt_tokens is 0`);
  eq(u.total_tokens, u.prompt_tokens + u.completion_tokens, `${what}.total_tokens = prompt + completion`);
  const c = u.prompt_tokens_details?.cached_tokens;
  assert(Number.isInteger(c) && c >= 0 && c < u.prompt_tokens,
         `${what}.prompt_tokens_details.cached_tokens must be an integer in [0, prompt_tokens): ${show(u)}`);
  const rt = u.completion_tokens_details?.reasoning_tokens;
  if (rt !== undefined) assert(Number.isInteger(rt) && rt >= 0 && rt <= u.completion_tokens, `${what}.completion_tokens_details.reasoning_tokens out of range: ${show(u)}`);
}

// Checks a non-streaming chat answer (already parsed) beyond the schema.
function checkCompletion(j, { maxTokens } = {}) {
  validateResponse(j);
  eq(j.object, 'chat.completion', 'object');
  assert(/^chatcmpl-/.test(j.id), `id should start with chatcmpl-: ${j.id}`);
  eq(j.model, MODEL_ID, 'model');
  assert(Math.abs(j.created - Date.now() / 1000) < 600, `created is not the current time: ${j.created}`);
  eq(j.choices.length, 1, 'choices.length');
  eq(j.choices[0].index, 0, 'choices[0].index');
  eq(j.choices[0].message.role, 'assistant', 'message.role');
  const rc = j.choices[0].message.reasoning_content;
  if (rc !== undefined) assert(typeof rc === 'string' && rc.length > 0, `reasoning_content present but not a non-empty string: ${show(rc)}`);
  checkUsage(j.usage);
  if (maxTokens !== undefined) assert(j.usage.completion_tokens <= maxTokens, `completion_tokens ${j.usage.completion_tokens} > max ${maxTokens}`);
  if (j.x_k3?.reuse !== undefined) assert(['live', 'checkpoint', 'none'].includes(j.x_k3.reuse), `x_k3.reuse invalid: ${j.x_k3.reuse}`);
  if (j.timings) {
    const t = j.timings;
    eq(t.predicted_n, j.usage.completion_tokens, 'timings.predicted_n = usage.completion_tokens');
    eq(t.cache_n, cachedOf(j), 'timings.cache_n = cached_tokens');
    eq(t.prompt_n + t.cache_n, j.usage.prompt_tokens, 'timings.prompt_n + cache_n = prompt_tokens');
  }
  return j;
}

async function complete(s, body, opts = {}) {
  const r = await chat(s, body, opts);
  assert(r.status === 200, () => `expected 200, got ${r.status} ${show(r.text, 500)}`);
  assert(r.utf8ok, 'response body is not valid UTF-8');
  assert(String(r.headers['content-type']).startsWith('application/json'), `content-type ${r.headers['content-type']}`);
  assert(r.headers['x-request-id'], 'no x-request-id header');
  assert(/^\d+$/.test(String(r.headers['x-queue-wait-ms'] ?? '')), `x-queue-wait-ms header missing or not an integer: ${r.headers['x-queue-wait-ms']}`);
  checkCompletion(r.json, { maxTokens: body.max_tokens ?? body.max_completion_tokens });
  r.json._headers = r.headers;
  return r.json;
}

// Validates a whole SSE exchange (3.6.3) and returns the accumulated text.
// usageKeyRule: check that "usage" appears on every chunk iff include_usage (3.6.3); off in checks
// about something else, so that one defect fails one check.
function checkStream(st, { includeUsage, usageKeyRule = true }) {
  assert(st.status === 200, () => `stream: expected 200, got ${st.status} ${show(st.text ?? st.json, 500)}`);
  const h = st.headers;
  assert(String(h['content-type']).startsWith('text/event-stream'), `content-type ${h['content-type']}`);
  assert(/no-cache/.test(String(h['cache-control'])), `cache-control should be no-cache: ${h['cache-control']}`);
  assert(h['x-request-id'], 'no x-request-id header');
  assert(/^\d+$/.test(String(h['x-queue-wait-ms'] ?? '')), `x-queue-wait-ms header missing: ${h['x-queue-wait-ms']}`);
  assert(st.badUtf8.length === 0, `SSE events with invalid UTF-8: ${st.badUtf8[0]}`);
  const bad = st.events.filter((e) => e.kind === 'bad' || e.kind === 'other');
  assert(bad.length === 0, () => `SSE events that are not JSON data, [DONE] or comments: ${show(bad[0].text)}`);
  const data = st.events.filter((e) => e.kind === 'data').map((e) => e.json);
  const last = st.events[st.events.length - 1];
  assert(last && last.kind === 'done', () => `stream must end with data: [DONE]; last event ${show(last)}`);
  assert(st.events.filter((e) => e.kind === 'done').length === 1, 'more than one [DONE]');
  assert(!st.trailing.trim(), `bytes after the last event: ${show(st.trailing)}`);
  assert(data.length >= 2, `too few chunks: ${data.length}`);
  data.forEach((c, i) => {
    try { validateChunk(c); } catch (e) { throw new Error(`chunk ${i}: ${e.message}`); }
    eq(c.object, 'chat.completion.chunk', `chunk ${i} object`);
    eq(c.id, data[0].id, `chunk ${i} id (same for all chunks)`);
    eq(c.created, data[0].created, `chunk ${i} created (same for all chunks)`);
    eq(c.model, MODEL_ID, `chunk ${i} model`);
    if (usageKeyRule && includeUsage) assert('usage' in c, `chunk ${i} lacks the "usage" key (include_usage is on)`);
    else if (usageKeyRule) assert(!('usage' in c), `chunk ${i} has "usage" although include_usage is off: ${show(c)}`);
  });
  assert(/^chatcmpl-/.test(data[0].id), `id should start with chatcmpl-: ${data[0].id}`);
  const first = data[0].choices[0];
  assert(first && first.delta.role === 'assistant', `first chunk must carry delta.role "assistant": ${show(data[0])}`);
  let reasoning = '', content = '', finish = null, finishIdx = -1, usage = null, nReasoning = 0, nContent = 0;
  data.forEach((c, i) => {
    if (c.choices.length === 0) {
      assert(includeUsage && i === data.length - 1 && c.usage, `chunk ${i} has choices [] but is not the final usage chunk: ${show(c)}`);
      usage = c.usage;
      return;
    }
    eq(c.choices.length, 1, `chunk ${i} choices.length`);
    const ch = c.choices[0];
    eq(ch.index, 0, `chunk ${i} choice index`);
    if (ch.delta.reasoning_content) { reasoning += ch.delta.reasoning_content; nReasoning++; }
    if (ch.delta.content) { content += ch.delta.content; nContent++; }
    if (includeUsage && c.usage !== null) assert(false, `chunk ${i}: usage must be null before the final chunk: ${show(c)}`);
    if (ch.finish_reason !== null) {
      assert(finish === null, `more than one finish_reason chunk (chunk ${i})`);
      finish = ch.finish_reason;
      finishIdx = i;
    } else if (finish !== null) {
      assert(false, `chunk ${i} comes after the finish_reason chunk: ${show(c)}`);
    }
  });
  assert(finish !== null, 'no chunk carries a finish_reason');
  if (includeUsage) {
    assert(usage, 'include_usage: no final chunk with choices [] and usage');
    checkUsage(usage, 'final chunk usage');
    assert(finishIdx === data.length - 2, 'the usage chunk must directly follow the finish_reason chunk');
  } else {
    assert(finishIdx === data.length - 1, 'the finish_reason chunk must be the last chunk');
  }
  return { reasoning, content, finish, usage, nReasoning, nContent, data, last: data[data.length - 1] };
}

// Greedy answer of a fresh `--ckpt 0` server; asserts it really was cold.
async function coldAnswer(body) {
  const s = await coldSrv();
  const j = await complete(s, body);
  eq(cachedOf(j), 0, 'cold server reference answer must not reuse anything (cached_tokens)');
  return j;
}

async function healthJson(s, headers = {}) {
  const r = await request(s, { path: '/health', headers });
  return r.json ?? {};
}
// Polls `probe` (async) every 25 ms until `ok(value)`; fails naming `what` and the last value
// after `ms`. For states the server reaches on its own time (a waiter queued, a slot idle).
async function waitUntil(what, probe, ok, ms = 20_000) {
  const t0 = Date.now();
  for (;;) {
    const v = await probe();
    if (ok(v)) return v;
    assert(Date.now() - t0 < ms, () => `${what}: not reached within ${ms} ms (last ${show(v)})`);
    await sleep(25);
  }
}
const scheduler = async (s) => (await healthJson(s)).scheduler;
// Waits until the detailed /health reports `n` queued waiters.
const waitQueued = (s, n) => waitUntil(`${n} queued`, () => scheduler(s), (sc) => sc?.queued === n);

// The value of one sample of GET /metrics (Prometheus text), e.g. 'k3_cancelled_total{phase="prefill"}'.
async function metric(s, name) {
  const r = await request(s, { path: '/metrics' });
  eq(r.status, 200, 'GET /metrics');
  const line = r.text.split('\n').find((l) => l.startsWith(`${name} `));
  assert(line, () => `/metrics has no ${name}: ${show(r.text, 300)}`);
  return Number(line.slice(name.length + 1));
}

// A streaming request that stays active until `release()` (it then disconnects). `firstData`
// resolves when the first data chunk (the role chunk, sent at Accept) arrives.
function holdActive(s, body) {
  let release = false, settled = false, onFirst;
  const firstData = new Promise((r) => { onFirst = r; });
  const done = sse(s, body, {
    onEvent: (ev) => {
      if (ev.kind === 'data') onFirst(true);
      return release ? 'abort' : undefined;
    },
  });
  done.then(() => onFirst(false), () => onFirst(false)).finally(() => { settled = true; });
  return { firstData, done, release: () => { release = true; }, streaming: () => !settled };
}

// Generations the server counted as cancelled (any phase), from the detailed /health.
const cancelledCount = async (s) => (await healthJson(s)).scheduler?.cancelled;

const CANARY = 'CANARY-' + crypto.randomBytes(6).toString('hex');
const good = { model: MODEL_ID, messages: [user('hi')], max_tokens: 2, temperature: 0 };
const goodText = JSON.stringify(good);

// =============================================================================================
// Basic endpoints
// =============================================================================================

// One log line per request names its path (a probe of /favicon.ico, a model looked up by name),
// read from the server's stderr as it is written.
await check('logs.line_names_the_path', async () => {
  const s = await mainSrv();
  const probe = await request(s, { path: '/favicon.ico' });
  eq(probe.status, 404, 'GET /favicon.ico');
  const rid = probe.headers['x-request-id'];
  await s.waitForStderr(new RegExp(`^\\[http\\] ${rid} GET /favicon\\.ico 404$`, 'm'));
  const model = await request(s, { path: '/v1/models/gpt-4o-mini?x=1' });
  await s.waitForStderr(new RegExp(`^\\[http\\] ${model.headers['x-request-id']} GET /v1/models/gpt-4o-mini 200$`, 'm'));
  const odd = await request(s, { path: '/a%20b%0Aforged' });
  await s.waitForStderr(new RegExp(`^\\[http\\] ${odd.headers['x-request-id']} GET /a%20b%0Aforged 404$`, 'm'));
  assert(!/^forged/m.test(s.err), 'an encoded newline in a path started a log line');
});

await check('health.ok', async () => {
  const s = await mainSrv();
  const r = await request(s, { path: '/health' });
  eq(r.status, 200, '/health status');
  eq(r.json?.status, 'ok', '/health status field');
  assert(r.headers['x-request-id'], 'no x-request-id on /health');
  const r2 = await request(s, { path: '/v1/health' });
  eq(r2.status, 200, '/v1/health (alias) status');
});

// The listener starts before the model loads (3.7.1): while it loads, /health is 503
// {"status":"loading",...} with Retry-After, and generation is 503 model_loading. A load that
// never ends (--load-delay-ms 600000 after each layer) makes this hold whenever the requests
// arrive; SIGTERM then stops the load (3.9).
await check('health.loading_phase', async () => {
  const s = new Server(coli, modelDir, 'loading', ['--load-delay-ms', '600000']);
  allServers.push(s);
  s.spawnProcess();
  await s.waitListening();
  const [h, c, h2] = await Promise.all([request(s, { path: '/health' }), chat(s, good), request(s, { path: '/v1/health' })]);
  for (const [what, r] of [['/health', h], ['/v1/health', h2]]) {
    eq(r.status, 503, `${what} while loading: ${show(r.text)}`);
    eq(r.json?.status, 'loading', `${what} status while loading`);
    assert(r.headers['retry-after'], `${what} 503 lacks Retry-After`);
  }
  expectError(c, 503, 'model_loading');
  assert(c.headers['retry-after'], '503 model_loading lacks Retry-After');
  eq(await s.stop(), { code: 143, signal: null }, 'exit after SIGTERM during the load');
  assert(!/ loaded in /.test(s.err), `the load finished: ${show(s.err)}`);
});

await check('health.detailed_without_key', async () => {
  const s = await mainSrv();
  const h = await healthJson(s);
  eq(h.model, MODEL_ID, '/health model');
  assert(Number.isInteger(h.context_capacity) && h.context_capacity > 0, `/health context_capacity: ${show(h)}`);
  const sc = h.scheduler;
  assert(sc && typeof sc === 'object', `/health scheduler missing: ${show(h)}`);
  for (const k of ['active', 'capacity', 'queued', 'max_queue', 'admitted', 'completed', 'rejected', 'cancelled']) {
    assert(Number.isInteger(sc[k]), `/health scheduler.${k} missing: ${show(sc)}`);
  }
  eq(sc.max_queue, 8, 'default --max-queue');
  eq(sc.capacity, 4, 'scheduler capacity (--parallel: 4 sessions by default)');
  eq(sc.busy, 0, 'scheduler busy (sessions running a generation)');
});

// The sampling a request gets when it does not say: the model card's 0.6 / 0.95 by default, and
// --temp / --top-p in every spelling (`--temp=0.25` used to be ignored), a flag beating its
// variable. /health reports the effective values the request defaults are built from.
const tempSrv = lazy('temp', ['--temp=0.25', '--top-p', '0.5'], { env: { COLI_TEMP: '0.9', COLI_TOP_K: '7' } });
await check('options.effective_sampling_defaults', async () => {
  const d = (await healthJson(await mainSrv())).defaults;
  assert(d && typeof d === 'object', `/health defaults missing: ${show(d)}`);
  eq(d.temperature, 0.6, 'default temperature (model card)');
  eq(d.top_p, 0.95, 'default top_p (model card)');
  eq(d.top_k, 0, 'default top_k');
  const t = (await healthJson(await tempSrv())).defaults;
  eq(t.temperature, 0.25, '--temp=0.25 beats COLI_TEMP=0.9');
  eq(t.top_p, 0.5, '--top-p 0.5');
  eq(t.top_k, 7, 'COLI_TOP_K=7');
});

await check('privacy.canary_request', async () => {
  const s = await mainSrv();
  await complete(s, req([user(`Remember the code ${CANARY} please.`)], { max_tokens: 2 }));
});

await check('models.list', async () => {
  const s = await mainSrv();
  const r = await request(s, { path: '/v1/models' });
  eq(r.status, 200, 'GET /v1/models status');
  eq(r.json?.object, 'list', 'object');
  assert(Array.isArray(r.json.data) && r.json.data.length >= 1, `data: ${show(r.json)}`);
  const m = r.json.data.find((x) => x.id === MODEL_ID);
  assert(m, `no ${MODEL_ID} in ${show(r.json)}`);
  eq(m.object, 'model', 'data[].object');
  assert(Number.isInteger(m.created), `created: ${show(m)}`);
  assert(typeof m.owned_by === 'string', `owned_by: ${show(m)}`);
  const one = await request(s, { path: `/v1/models/${MODEL_ID}` });
  eq(one.status, 200, `GET /v1/models/${MODEL_ID}`);
  eq(one.json?.id, MODEL_ID, 'model id');
  eq(one.json?.object, 'model', 'model object');
  const c = client(s);
  const ids = [];
  for await (const x of c.models.list()) ids.push(x.id);
  assert(ids.includes(MODEL_ID), `SDK models.list(): ${show(ids)}`);
  eq((await c.models.retrieve(MODEL_ID)).id, MODEL_ID, 'SDK models.retrieve()');
});

// A one-model server answers whatever model name a client sends (OpenAI apps send gpt-4o-mini,
// Claude Code claude-sonnet-4-5-…), and responses name the served id.
await check('models.any_name_is_the_served_model', async () => {
  const s = await mainSrv();
  const one = await request(s, { path: '/v1/models/gpt-4o-mini' });
  eq(one.status, 200, `GET /v1/models/gpt-4o-mini (${show(one.text)})`);
  eq(one.json?.id, MODEL_ID, 'the served id');
  const c = client(s);
  eq((await c.models.retrieve('gpt-4o-mini')).id, MODEL_ID, 'SDK models.retrieve(gpt-4o-mini)');
  const j = await c.chat.completions.create({ model: 'gpt-4o-mini', messages: [user('Hello')], max_tokens: 3, temperature: 0 });
  checkCompletion(j);
  eq(j.model, MODEL_ID, 'chat.completion model');
  const chunks = [];
  for await (const ch of await c.chat.completions.create({ model: 'gpt-4o-mini', messages: [user('Hello')], max_tokens: 3, stream: true })) chunks.push(ch);
  assert(chunks.length > 1 && chunks.every((ch) => ch.model === MODEL_ID), `chunk models: ${show(chunks.map((ch) => ch.model))}`);
  const t = await c.completions.create({ model: 'gpt-4o-mini', prompt: 'The capital of France is', max_tokens: 3, temperature: 0 });
  validateCompletion(t);
  eq(t.model, MODEL_ID, 'text_completion model');
  const r = await c.responses.create({ model: 'gpt-4o-mini', input: 'Hello', max_output_tokens: 3 });
  eq(r.model, MODEL_ID, 'response model');
  const m = await postJson(s, '/v1/messages', { model: 'claude-haiku-4-5-20251001', max_tokens: 3, messages: [user('Hello')] });
  eq([m.status, m.json?.model], [200, MODEL_ID], `POST /v1/messages with a Claude model name (${show(m.text)})`);
});

// --model-id names the served model; /v1/models lists it and every --alias; a request naming an
// alias or any other name (--accept-any-model, given after --strict-model) is served, and every
// response names the served id.
await check('models.model_id_aliases_accept_any', async () => {
  const s = await aliasSrv();
  const c = client(s);
  const ids = [];
  for await (const x of c.models.list()) ids.push(x.id);
  eq(ids, [SERVED_ID, ...ALIASES], 'SDK models.list() ids');
  eq((await c.models.retrieve(ALIASES[1])).id, ALIASES[1], 'models.retrieve(alias)');
  eq((await healthJson(s)).model, SERVED_ID, '/health model');
  eq((await request(s, { path: '/props' })).json?.model_alias, SERVED_ID, '/props model_alias');
  for (const model of [ALIASES[0], 'gpt-4o-mini']) {
    const j = await c.chat.completions.create({ ...good, model });
    eq(j.model, SERVED_ID, `chat.completion model for a request naming ${model}`);
  }
  const chunks = [];
  for await (const ch of await c.chat.completions.create({ ...good, model: ALIASES[1], stream: true })) chunks.push(ch.model);
  assert(chunks.length > 1 && chunks.every((m) => m === SERVED_ID), `chunk models: ${show(chunks)}`);
});

// --strict-model: names other than the id and the aliases are a 404 on every API; the id and
// the aliases are served (and answered under the served id).
await check('models.strict_model', async () => {
  const s = await strictSrv();
  const c = client(s);
  expectError(await request(s, { path: '/v1/models/gpt-4o' }), 404, 'model_not_found', { param: 'model' });
  eq((await request(s, { path: `/v1/models/${ALIASES[0]}` })).status, 200, 'GET /v1/models/<alias>');
  const e = expectError(await chat(s, { ...good, model: 'gpt-4o-mini' }), 404, 'model_not_found', { param: 'model' });
  for (const name of ['gpt-4o-mini', MODEL_ID, ...ALIASES, '--strict-model'])
    assert(e.message.includes(name), `the 404 names ${name}: ${e.message}`);
  expectError(await postJson(s, '/v1/completions', { model: 'gpt-4o-mini', prompt: 'x', max_tokens: 1 }), 404, 'model_not_found', { param: 'model' });
  expectError(await postJson(s, '/v1/responses', { model: 'gpt-4o-mini', input: 'x', max_output_tokens: 1 }), 404, 'model_not_found', { param: 'model' });
  const a = await postJson(s, '/v1/messages?beta=true', { model: 'claude-sonnet-4-5-20250929', max_tokens: 1, messages: [user('hi')] });
  eq([a.status, a.json?.type, a.json?.error?.type], [404, 'error', 'not_found_error'], `Anthropic 404 (${show(a.text)})`);
  try {
    await c.chat.completions.create({ ...good, model: 'no-such-model' });
    assert(false, 'expected an error');
  } catch (err) {
    eq([err.status, err.code, err.param], [404, 'model_not_found', 'model'], 'SDK NotFoundError');
  }
  for (const model of [MODEL_ID, ...ALIASES]) {
    const j = await c.chat.completions.create({ ...good, model });
    eq(j.model, MODEL_ID, `served under ${model}`);
  }
});

// =============================================================================================
// Chat: non-streaming and streaming shapes
// =============================================================================================

await check('chat.nonstream_schema_usage', async () => {
  const s = await mainSrv();
  const c = client(s);
  const { data: j, response } = await c.chat.completions
    .create(req([sys('You are terse.'), user('Name three colours.')], { max_tokens: 8 })).withResponse();
  checkCompletion(j, { maxTokens: 8 });
  assert(response.headers.get('x-request-id'), 'no x-request-id');
  eq(j.choices[0].finish_reason, 'length', 'finish_reason with max_tokens 8');
  eq(j.usage.completion_tokens, 8, 'completion_tokens with finish_reason length');
  // The first generation on this server cannot reuse anything except the canary turn's state,
  // which diverges at the system message.
  eq(cachedOf(j), 0, 'cached_tokens on a prompt unrelated to earlier requests');
  assert(textOf(j).reasoning.length > 0, `thinking is on by default: reasoning_content should hold the text: ${show(j.choices[0].message)}`);
  assert(j.timings, 'timings missing (3.6.2)');
});

await check('chat.max_completion_tokens', async () => {
  const s = await mainSrv();
  const j = await complete(s, req([user('Say something.')], { ...OFF, max_completion_tokens: 5 }));
  eq(j.choices[0].finish_reason, 'length', 'finish_reason');
  eq(j.usage.completion_tokens, 5, 'completion_tokens');
  assert(textOf(j).content.length > 0, 'thinking off: content should hold the text');
  assert(j.choices[0].message.reasoning_content === undefined, 'thinking off: no reasoning_content expected');
});

let greedyOn = null;   // {body, json} for stream-vs-nonstream
await check('stream.include_usage_thinking_on', async () => {
  const s = await mainSrv();
  const body = req([user('Describe the sea in one line.')], { max_tokens: 12, stream: true, stream_options: { include_usage: true } });
  const st = await sse(s, body);
  const r = checkStream(st, { includeUsage: true });
  assert(r.nReasoning > 0, 'thinking on: expected reasoning_content deltas');
  eq(r.usage.completion_tokens, 12, 'usage.completion_tokens');
  eq(r.finish, 'length', 'finish_reason');
  eq(st.events.filter((e) => e.kind === 'data')[0].json.choices[0].delta.content, '', 'role chunk carries content ""');
  greedyOn = { body, stream: r };
});

let greedyOff = null;
await check('stream.thinking_off_content', async () => {
  const s = await mainSrv();
  const body = req([user('Describe the sky in one line.')], { ...OFF, max_tokens: 12, stream: true, stream_options: { include_usage: true } });
  const r = checkStream(await sse(s, body), { includeUsage: true });
  assert(r.nContent > 0, 'thinking off: expected content deltas');
  eq(r.nReasoning, 0, 'thinking off: reasoning_content deltas');
  greedyOff = { body, stream: r };
});

await check('stream.without_include_usage', async () => {
  const s = await mainSrv();
  const r = checkStream(await sse(s, req([user('Hello!')], { ...OFF, max_tokens: 4, stream: true })), { includeUsage: false });
  assert(r.usage === null, 'no usage chunk expected');
});

await check('stream.equals_nonstream', async () => {
  const s = await mainSrv();
  assert(greedyOn && greedyOff, 'prerequisite stream checks failed');
  for (const g of [greedyOn, greedyOff]) {
    const { stream: _s, stream_options: _o, ...b } = g.body;
    const j = await complete(s, b);
    eq({ reasoning: g.stream.reasoning, content: g.stream.content }, textOf(j), 'streamed text vs non-streamed text (greedy)');
    eq(g.stream.finish, j.choices[0].finish_reason, 'finish_reason');
    eq(g.stream.usage.completion_tokens, j.usage.completion_tokens, 'completion_tokens');
    eq(g.stream.usage.prompt_tokens, j.usage.prompt_tokens, 'prompt_tokens');
  }
});

await check('sdk.stream_iterate', async () => {
  const s = await mainSrv();
  const c = client(s);
  const stream = await c.chat.completions.create(req([user('Count to three.')], { ...OFF, max_tokens: 6, stream: true, stream_options: { include_usage: true } }));
  let n = 0, text = '', usage = null, finish = null;
  for await (const chunk of stream) {
    validateChunk(chunk);
    n++;
    text += chunk.choices[0]?.delta?.content ?? '';
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
    if (chunk.usage) usage = chunk.usage;
  }
  assert(n >= 3 && text.length > 0, `SDK iteration: ${n} chunks, text ${show(text)}`);
  eq(finish, 'length', 'finish_reason');
  eq(usage?.completion_tokens, 6, 'usage.completion_tokens');
});

await check('sdk.stream_helper_final', async () => {
  const s = await mainSrv();
  const c = client(s);
  const base = req([user('Write a short greeting.')], { ...OFF, max_tokens: 16 });
  const ref = await complete(s, base);
  const stream = c.chat.completions.stream({ ...base, stream: true, stream_options: { include_usage: true } });
  let deltas = '';
  stream.on('content', (d) => { deltas += d; });
  const fin = await stream.finalChatCompletion();
  eq(fin.choices[0].message.content, textOf(ref).content, 'finalChatCompletion() content vs non-streamed');
  eq(deltas, textOf(ref).content, "'content' events vs non-streamed");
  eq(fin.choices[0].finish_reason, ref.choices[0].finish_reason, 'finish_reason');
  eq(fin.usage?.completion_tokens, ref.usage.completion_tokens, 'usage from the final chunk');
  eq(fin.id.startsWith('chatcmpl-'), true, 'id');
});

await check('sampling.seed_reproducible', async () => {
  const s = await mainSrv();
  const b = (seed, extra = {}) => req([user('Invent a word.')], { ...OFF, max_tokens: 8, temperature: 1, seed, ...extra });
  const a1 = textOf(await complete(s, b(1234))).content;
  const a2 = textOf(await complete(s, b(1234))).content;
  const a3 = textOf(await complete(s, b(4321))).content;
  eq(a2, a1, 'same seed, same prompt → same text');
  assert(a3 !== a1, `different seeds gave the same 8-token sample: ${show(a1)}`);
  const k1 = textOf(await complete(s, b(77, { top_k: 40, top_p: 0.9, min_p: 0.01 }))).content;
  const k2 = textOf(await complete(s, b(77, { top_k: 40, top_p: 0.9, min_p: 0.01 }))).content;
  eq(k2, k1, 'same seed with top_k/top_p/min_p → same text');
});

await check('thinking.switches', async () => {
  const s = await mainSrv();
  const m = [user('Pick a number.')];
  const variants = [
    { chat_template_kwargs: { enable_thinking: false } },
    { enable_thinking: false },
    { reasoning_effort: 'none' },
  ];
  const outs = [];
  for (const v of variants) {
    const j = await complete(s, req(m, { max_tokens: 10, ...v }));
    assert(j.choices[0].message.reasoning_content === undefined, `${show(v)}: thinking should be off`);
    outs.push(textOf(j).content);
  }
  eq(outs[1], outs[0], 'enable_thinking:false vs chat_template_kwargs');
  eq(outs[2], outs[0], 'reasoning_effort:"none" vs chat_template_kwargs');
  for (const v of [{ reasoning_effort: 'high' }, { enable_thinking: true, reasoning_effort: 'none' }, {}]) {
    const j = await complete(s, req(m, { max_tokens: 10, ...v }));
    assert(textOf(j).reasoning.length > 0, `${show(v)}: thinking should be on (reasoning_content): ${show(j.choices[0].message)}`);
  }
});

await check('messages.parts_and_roles', async () => {
  const s = await mainSrv();
  const a = textOf(await complete(s, req([sys('Be brief.'), user('Hi there')], { ...OFF, max_tokens: 8 }))).content;
  const b = textOf(await complete(s, req([sys('Be brief.'), user([{ type: 'text', text: 'Hi there' }])], { ...OFF, max_tokens: 8 }))).content;
  const c = textOf(await complete(s, req([{ role: 'developer', content: 'Be brief.' }, user([{ type: 'input_text', text: 'Hi there' }])], { ...OFF, max_tokens: 8 }))).content;
  eq(b, a, 'text part vs string content');
  eq(c, a, 'developer role + input_text part vs system + string');
});

// =============================================================================================
// Stop sequences
// =============================================================================================

let stopCase = null;
await check('stop.nonstream', async () => {
  const s = await mainSrv();
  const base = req([user('List some fruits.')], { ...OFF, max_tokens: 40 });
  const T = textOf(await complete(s, base)).content;
  const cps = [...T];
  let stop = null, idx = -1;
  for (let k = Math.floor(cps.length / 3); k + 3 <= cps.length && stop === null; k++) {
    const cand = cps.slice(k, k + 3).join('');
    if (!/\S/.test(cand) || cand.includes('\uFFFD')) continue;
    const i = T.indexOf(cand);
    if (i > 0) { stop = cand; idx = i; }
  }
  assert(stop !== null, `no usable stop substring in the greedy text ${show(T)}`);
  const j = await complete(s, { ...base, stop });
  eq(textOf(j).content, T.slice(0, idx), `content with stop ${show(stop)} (must end right before it)`);
  eq(j.choices[0].finish_reason, 'stop', 'finish_reason');
  assert(j.usage.completion_tokens < 40, 'completion_tokens should be below max_tokens');
  stopCase = { base, stop, expected: T.slice(0, idx) };
  const j2 = await complete(s, { ...base, stop: ['§never-appears§', stop] });
  eq(textOf(j2).content, T.slice(0, idx), 'stop given as an array');
  eq(j2.choices[0].finish_reason, 'stop', 'finish_reason (array)');
});

await check('stop.stream', async () => {
  const s = await mainSrv();
  assert(stopCase, 'prerequisite stop.nonstream failed');
  const r = checkStream(await sse(s, { ...stopCase.base, stop: stopCase.stop, stream: true }), { includeUsage: false, usageKeyRule: false });
  eq(r.content, stopCase.expected, 'streamed content with stop');
  eq(r.finish, 'stop', 'finish_reason');
  for (const c of r.data) {
    const d = c.choices[0]?.delta?.content ?? '';
    assert(!d.includes(stopCase.stop), `a delta contains the stop string: ${show(d)}`);
  }
});

// =============================================================================================
// Tools
// =============================================================================================

const TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather for a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];
await check('tools.declared_accepted', async () => {
  const s = await mainSrv();
  const j = await complete(s, req([user('Weather in Paris?')], { ...OFF, max_tokens: 12, tools: TOOLS, tool_choice: 'auto' }));
  assert(['stop', 'length', 'tool_calls'].includes(j.choices[0].finish_reason), `finish_reason ${j.choices[0].finish_reason}`);
  const st = await sse(s, req([user('Weather in Rome?')], { ...OFF, max_tokens: 12, tools: TOOLS, stream: true, stream_options: { include_usage: true } }));
  checkStream(st, { includeUsage: true });
  const j2 = await complete(s, req([user('Hi')], { ...OFF, max_tokens: 2, tool_choice: 'none' }));
  assert(j2, 'tool_choice "none" without tools');
});

// Random weights never write a valid call, so a server with --script-ids (debug: the first
// generated ids of each reply are scripted) writes one: the XTML turn comes back as
// reasoning_content, content and OpenAI tool_calls (both shapes, the SDK's accumulating helper).
const CALL_TEXT = 'Weather needs a tool.<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>' +
  '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>' +
  '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>' +
  '<|open|>argument key="days" type="number"<|sep|>2<|close|>argument<|sep|>' +
  '<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>';
async function scriptedServer(name, ids) {
  const s = new Server(coli, modelDir, name, ['--script-ids', ids.join(',')], {});
  allServers.push(s);
  return s.start({});
}
await check('tools.scripted_call_both_shapes', async () => {
  const tk = await postJson(await mainSrv(), '/tokenize', { content: CALL_TEXT, parse_special: true });
  eq(tk.status, 200, '/tokenize status');
  const s = await scriptedServer('script-tool', tk.json.tokens);
  const body = req([user('Weather in Paris?')], { tools: TOOLS, max_tokens: 300 });
  const j = await complete(s, body);
  eq(j.choices[0].finish_reason, 'tool_calls', 'finish_reason');
  const m = j.choices[0].message;
  eq(m.reasoning_content, 'Weather needs a tool.', 'reasoning_content');
  eq(m.content, 'Checking.', 'content');
  eq(m.tool_calls?.length, 1, 'tool_calls.length');
  eq(m.tool_calls[0].type, 'function', 'tool_calls[0].type');
  eq(m.tool_calls[0].function.name, 'get_weather', 'tool name');
  eq(JSON.stringify(JSON.parse(m.tool_calls[0].function.arguments)), '{"city":"Paris","days":2}', 'arguments');
  assert(typeof m.tool_calls[0].id === 'string' && m.tool_calls[0].id.length > 0, 'tool call id');
  const st = await sse(s, { ...body, stream: true, stream_options: { include_usage: true } });
  const acc = checkStream(st, { includeUsage: true });
  eq(acc.finish, 'tool_calls', 'stream finish_reason');
  eq(acc.content, 'Checking.', 'stream content');
  const deltas = acc.data.flatMap((c) => c.choices[0]?.delta?.tool_calls ?? []);
  assert(deltas.length >= 1 && deltas[0].index === 0 && deltas[0].function?.name === 'get_weather' && deltas[0].id,
         () => `tool_call deltas: ${show(deltas)}`);
  eq(JSON.stringify(JSON.parse(deltas.map((d) => d.function?.arguments ?? '').join(''))), '{"city":"Paris","days":2}', 'streamed arguments');
  const final = await client(s).chat.completions.stream({ ...body, stream: true }).finalChatCompletion();
  eq(final.choices[0].message.tool_calls?.[0]?.function?.name, 'get_weather', 'SDK helper: tool name');
  eq(final.choices[0].finish_reason, 'tool_calls', 'SDK helper: finish_reason');
});

// An engine fault after the stream is committed: one error event in OpenAI's shape, then
// [DONE]; the server goes on serving. (A scripted id outside the vocabulary reaches the model.)
await check('stream.engine_fault_after_commit', async () => {
  const s = await scriptedServer('script-fault', [1000, 1001, 1002, 999999999]);
  const st = await sse(s, req([user('Go.')], { ...OFF, max_tokens: 10, stream: true }));
  eq(st.status, 200, 'status (committed before the fault)');
  const data = st.events.filter((e) => e.kind === 'data').map((e) => e.json);
  const err = data.find((c) => c.error);
  assert(err, () => `no error event: ${show(st.events.map((e) => e.text))}`);
  assert(err.error.type === 'server_error' && typeof err.error.message === 'string', `error shape: ${show(err)}`);
  assert(!data.some((c) => c.choices?.[0]?.finish_reason), 'a finish_reason chunk after an engine fault');
  eq(st.events[st.events.length - 1].kind, 'done', 'last event');
  const j = await complete(s, req([user('Go.')], { ...OFF, max_tokens: 3 }));
  eq(j.usage.completion_tokens, 3, 'the server still serves');
});

// POST /v1/completions: raw text (or token ids) in, raw text out, no chat template.
await check('completions.text_and_ids', async () => {
  const s = await mainSrv();
  const c = client(s);
  const a = await c.completions.create({ model: MODEL_ID, prompt: 'The capital of France is', max_tokens: 8, temperature: 0 });
  validateCompletion(a);
  eq(a.object, 'text_completion', 'object');
  eq(a.choices[0].finish_reason, 'length', 'finish_reason');
  eq(a.usage.completion_tokens, 8, 'completion_tokens');
  assert(typeof a.choices[0].text === 'string' && a.choices[0].text.length > 0, 'text');
  const b = await c.completions.create({ model: MODEL_ID, prompt: 'The capital of France is', max_tokens: 8, temperature: 0, stream: true,
                                         stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null;
  for await (const chunk of b) {
    if (chunk.choices.length) {
      text += chunk.choices[0].text;
      if (chunk.choices[0].finish_reason) {
        finish = chunk.choices[0].finish_reason;
        validateCompletion(chunk);
      }
    } else {
      usage = chunk.usage;
    }
  }
  eq(text, a.choices[0].text, 'streamed text = non-streamed text (greedy)');
  eq(finish, 'length', 'streamed finish_reason');
  eq(usage?.completion_tokens, 8, 'streamed usage');
  const tk = await postJson(s, '/tokenize', { content: 'The capital of France is' });
  const ids = await c.completions.create({ model: MODEL_ID, prompt: tk.json.tokens, max_tokens: 8, temperature: 0 });
  eq(ids.choices[0].text, a.choices[0].text, 'token-id prompt = text prompt');
  expectError(await postJson(s, '/v1/completions', { model: MODEL_ID, prompt: 'x', echo: true }), 400, 'unsupported_parameter', { param: 'echo' });
  expectError(await postJson(s, '/v1/completions', { model: MODEL_ID }), 400, 'missing_required_parameter', { param: 'prompt' });
  expectError(await postJson(s, '/v1/completions', { model: MODEL_ID, prompt: { a: 1 } }), 400, 'unsupported_value', { param: 'prompt' });
});

// =============================================================================================
// Log-probabilities, penalties, /props and /apply-template (3.15, 3.16)
// =============================================================================================

// One chat logprobs entry (3.15.2): OpenAI's fields, alternatives most likely first, and at
// temperature 0 without penalties the chosen token is the first alternative (its logits are the
// ones reported).
function checkLogprobEntry(e, top, what) {
  assert(typeof e.token === 'string' && typeof e.logprob === 'number' && e.logprob <= 0, `${what}: ${show(e)}`);
  assert(Array.isArray(e.bytes) && e.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256), `${what}.bytes: ${show(e)}`);
  eq(e.top_logprobs.length, top, `${what}.top_logprobs.length`);
  e.top_logprobs.forEach((a, i) => {
    if (i > 0) assert(e.top_logprobs[i - 1].logprob >= a.logprob, `${what}.top_logprobs not sorted: ${show(e.top_logprobs)}`);
  });
  if (top > 0) {
    eq(e.bytes, e.top_logprobs[0].bytes, `${what}: greedy token = most likely alternative`);
    eq(e.logprob, e.top_logprobs[0].logprob, `${what}: its logprob`);
  }
}

let chatLogprobs = null;
await check('logprobs.chat_nonstream_schema', async () => {
  const s = await mainSrv();
  const { data: j } = await client(s).chat.completions
    .create(req([user('Name four fruits.')], { ...OFF, max_tokens: 10, logprobs: true, top_logprobs: 3 })).withResponse();
  checkCompletion(j, { maxTokens: 10 });
  const lp = j.choices[0].logprobs;
  assert(lp && Array.isArray(lp.content), `choices[0].logprobs.content missing: ${show(j.choices[0])}`);
  eq(lp.refusal, null, 'logprobs.refusal');
  // Thinking off: every generated token but a stop id is a content token.
  eq(lp.content.length, j.usage.completion_tokens - (j.choices[0].finish_reason === 'stop' ? 1 : 0), 'one entry per content token');
  lp.content.forEach((e, i) => checkLogprobEntry(e, 3, `content[${i}]`));
  eq(Buffer.from(lp.content.flatMap((e) => e.bytes)).toString('utf8'), j.choices[0].message.content, 'the entries\' bytes spell the content');
  const plain = await complete(s, req([user('Name four fruits.')], { ...OFF, max_tokens: 10 }));
  eq(plain.choices[0].logprobs, null, 'logprobs null when not asked for');
  eq(plain.choices[0].message.content, j.choices[0].message.content, 'asking for logprobs changes no token');
  chatLogprobs = lp.content;
});

await check('logprobs.chat_stream_per_chunk', async () => {
  const s = await mainSrv();
  assert(chatLogprobs, 'prerequisite logprobs.chat_nonstream_schema failed');
  const body = req([user('Name four fruits.')], { ...OFF, max_tokens: 10, logprobs: true, top_logprobs: 3, stream: true });
  const r = checkStream(await sse(s, body), { includeUsage: false });   // every chunk against the schema
  const streamed = [];
  for (const c of r.data) {
    const ch = c.choices[0];
    if (ch.logprobs === null) continue;
    assert(typeof ch.delta.content === 'string', `a chunk with logprobs carries content: ${show(c)}`);
    streamed.push(...ch.logprobs.content);
  }
  eq(streamed, chatLogprobs, 'streamed entries = non-streamed entries (greedy)');
  // The SDK's stream iterator reads them too.
  const st = await client(s).chat.completions.create(body);
  const viaSdk = [];
  for await (const chunk of st) if (chunk.choices[0]?.logprobs) viaSdk.push(...chunk.choices[0].logprobs.content);
  eq(viaSdk, chatLogprobs, 'entries read through the openai client');
  // Thinking on: reasoning tokens have no entries (3.15.2).
  const on = checkStream(await sse(s, req([user('Name four fruits.')], { max_tokens: 6, logprobs: true, top_logprobs: 1, stream: true })), { includeUsage: false });
  for (const c of on.data) {
    const ch = c.choices[0];
    if (ch?.delta?.reasoning_content) eq(ch.logprobs, null, 'a reasoning chunk carries no logprobs');
  }
});

await check('logprobs.completions_legacy', async () => {
  const s = await mainSrv();
  const c = client(s);
  const body = { model: MODEL_ID, prompt: 'The capital of France is', max_tokens: 6, temperature: 0, logprobs: 2 };
  const a = await c.completions.create(body);
  validateCompletion(a);
  const lp = a.choices[0].logprobs;
  assert(lp, `choices[0].logprobs missing: ${show(a.choices[0])}`);
  const n = lp.tokens.length;
  assert(n > 0, 'no tokens');
  for (const k of ['token_logprobs', 'top_logprobs', 'text_offset']) eq(lp[k].length, n, `${k}.length`);
  let offset = 0;
  lp.tokens.forEach((t, i) => {
    eq(lp.text_offset[i], offset, `text_offset[${i}] (UTF-8 bytes)`);
    offset += Buffer.byteLength(t);
    const alts = Object.values(lp.top_logprobs[i]);
    assert(alts.length >= 1 && alts.length <= 2, `top_logprobs[${i}]: ${show(lp.top_logprobs[i])}`);
    eq(lp.token_logprobs[i], Math.max(...alts), `greedy: token_logprobs[${i}] is the best alternative`);
  });
  eq(lp.tokens.join(''), a.choices[0].text, 'tokens spell the text');
  const st = await c.completions.create({ ...body, stream: true });
  const tokens = [], offsets = [];
  for await (const chunk of st) {
    const l = chunk.choices[0]?.logprobs;
    if (l) { tokens.push(...l.tokens); offsets.push(...l.text_offset); }
  }
  eq(tokens, lp.tokens, 'streamed tokens');
  eq(offsets, lp.text_offset, 'streamed text_offset runs on across chunks');
});

await check('penalties.reach_the_sampler', async () => {
  const s = await mainSrv();
  // Each chosen token is the argmax of the penalised logits: c x frequency + presence off every
  // token generated c times so far; the reported logprobs are the raw ones (3.15.2). The demo
  // model's greedy reply never repeats, so negative penalties (rewards) make the effect visible.
  const base = { model: MODEL_ID, prompt: 'a b c', max_tokens: 32, temperature: 0, logprobs: 20 };
  const plain = (await postJson(s, '/v1/completions', base)).json;
  const [frequency, presence] = [-2, -2];
  const pen = (await postJson(s, '/v1/completions', { ...base, frequency_penalty: frequency, presence_penalty: presence })).json;
  assert(pen.choices, `penalties refused: ${show(pen)}`);
  const count = new Map();
  const score = (t, v) => (count.has(t) ? v - (count.get(t) * frequency + presence) : v);
  const lp = pen.choices[0].logprobs;
  lp.tokens.forEach((t, i) => {
    const mine = score(t, lp.token_logprobs[i]);
    for (const [alt, v] of Object.entries(lp.top_logprobs[i]))
      assert(mine + 1e-9 >= score(alt, v), `step ${i}: ${show(t)} chosen over ${show(alt)}`);
    count.set(t, (count.get(t) ?? 0) + 1);
  });
  assert(count.size < lp.tokens.length, `the rewarded reply should repeat a token: ${show(lp.tokens)}`);
  assert(pen.choices[0].text !== plain.choices[0].text, 'the penalties changed nothing');
  const rep = (await postJson(s, '/v1/completions', { ...base, repeat_penalty: 0.05, repeat_last_n: -1 })).json;
  assert(rep.choices && rep.choices[0].text !== plain.choices[0].text, `repeat_penalty changed nothing: ${show(rep)}`);
  const neutral = (await postJson(s, '/v1/completions', { ...base, frequency_penalty: 0, presence_penalty: 0, repeat_penalty: 1 })).json;
  eq(neutral.choices[0].text, plain.choices[0].text, 'neutral penalties = none');
  // The SDK's typed fields on chat.
  const j = await client(s).chat.completions.create(req([user('Say a a a a.')], { ...OFF, max_tokens: 6, frequency_penalty: 1, presence_penalty: 0.5 }));
  checkCompletion(j, { maxTokens: 6 });
  expectError(await chat(s, req([user('x')], { frequency_penalty: 2.5 })), 400, 'invalid_value', { param: 'frequency_penalty' });
});

await check('props.fields', async () => {
  const s = await mainSrv();
  const r = await request(s, { path: '/props' });
  eq(r.status, 200, `/props status: ${show(r.text)}`);
  const p = r.json;
  eq(p.model_alias, MODEL_ID, 'model_alias');
  eq(fs.realpathSync(p.model_path), fs.realpathSync(modelDir), 'model_path');
  eq(p.total_slots, 1, 'total_slots');
  const g = p.default_generation_settings;
  assert(g && Number.isInteger(g.n_ctx) && g.n_ctx > 0, `default_generation_settings.n_ctx: ${show(g)}`);
  const models = await request(s, { path: '/v1/models' });
  eq(g.n_ctx, models.json.data[0].meta.context_length, 'n_ctx = /v1/models context_length');
  for (const [k, v] of Object.entries({ temperature: 0.6, top_p: 0.95, frequency_penalty: 0, presence_penalty: 0, repeat_penalty: 1, repeat_last_n: 64 }))
    eq(g.params[k], v, `params.${k}`);
  assert(typeof p.chat_template === 'string' && p.chat_template.length > 0, 'chat_template');
  assert(typeof p.build_info === 'string' && p.build_info.includes('coli'), `build_info: ${show(p.build_info)}`);
  eq(p.modalities, { vision: false, audio: false }, 'modalities');
  eq(p.eos_token, '<|end_of_msg|>', 'eos_token');
});

await check('apply_template.equals_coli_render', async () => {
  const s = await mainSrv();
  const messages = [sys('Be brief.'), user('Hi'), { role: 'assistant', content: 'Hello.', reasoning_content: 'greet' }, user('Bye')];
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  for (const [what, body, options] of [
    ['thinking on (effort max)', { messages }, { thinking: true, thinking_effort: 'max' }],
    ['thinking off', { messages, reasoning_effort: 'none' }, { thinking: false }],
    ['tools', { messages, tools }, { thinking: true, thinking_effort: 'max' }],
  ]) {
    const r = await postJson(s, '/apply-template', body);
    eq(r.status, 200, `${what}: status ${show(r.json)}`);
    const out = spawnSync(coli, ['render', modelDir], { input: JSON.stringify({ messages, tools: body.tools, options }) + '\n', encoding: 'utf8', timeout: 60_000 });
    eq(out.status, 0, `coli render: ${out.stderr}`);
    const rendered = JSON.parse(out.stdout.trim().split('\n')[0]);
    assert(typeof rendered.text === 'string', `coli render: ${show(rendered)}`);
    eq(r.json.prompt, rendered.text, `${what}: /apply-template = coli render`);
  }
  expectError(await postJson(s, '/apply-template', { messages: [] }), 400, 'invalid_value', { param: 'messages' });
});

// =============================================================================================
// Prefix reuse and checkpoints (3.10): reused state must give the cold answer
// =============================================================================================

await check('reuse.follow_up_turn', async () => {
  const s = await ckSrv();
  const m1 = [sys('You are a geography bot.'), user('Tell me about rivers.')];
  const r1 = await complete(s, req(m1, { max_tokens: 24 }));
  const p1 = r1.usage.prompt_tokens;
  const m2 = [...m1, asAssistant(r1), user('And lakes?')];
  const b2 = req(m2, { max_tokens: 16 });
  const r2 = await complete(s, b2);
  const cached = cachedOf(r2);
  assert(cached >= p1, `follow-up turn: cached_tokens ${cached} should be >= the turn-1 prompt (${p1}); x_k3 ${show(r2.x_k3)}`);
  assert(r2.usage.prompt_tokens > p1 + 2, 'turn-2 prompt should be longer than turn 1');
  if (r2.x_k3) {
    assert(['live', 'checkpoint'].includes(r2.x_k3.reuse), `x_k3.reuse ${show(r2.x_k3)}`);
    if (r2.x_k3.reuse === 'checkpoint') eq(r2.x_k3.checkpoint_restored_at, cached, 'x_k3.checkpoint_restored_at = cached_tokens');
  }
  const cold = await coldAnswer(b2);
  eq(cold.usage.prompt_tokens, r2.usage.prompt_tokens, 'prompt_tokens (warm vs cold)');
  eq(textOf(r2), textOf(cold), 'greedy answer with reused prefix vs cold server');
});

// The follow-up turn as the clients people use send it (thinking on, two slots, a system message
// so the anchor checkpoint competes for a slot): the reply with its reasoning, without it (most
// OpenAI clients drop reasoning_content), a reply cut by max_tokens, and one ended by a stop
// string (the record then holds ids the history does not). Each must reuse at least the turn-1
// prompt minus its generation prompt (`<|open|>message role="assistant"<|sep|><|open|>think<|sep|>`,
// 10 ids: docs/chat_format.md §6.7), and answer as a cold server does.
const GEN_PROMPT_IDS = 10;
await check('reuse.follow_up_client_shapes', async () => {
  const s = await ckSrv();
  const ref = await complete(await mainSrv(), req([sys('You list colours.'), user('Name four colours.')], { max_tokens: 24 }));
  const refText = (ref.choices[0].message.reasoning_content ?? '') + (ref.choices[0].message.content ?? '');
  const stopAt = refText.slice(Math.floor(refText.length / 2), Math.floor(refText.length / 2) + 3);
  assert(stopAt.trim().length >= 1, `no stop string could be taken from the reference reply ${show(refText)}`);
  const cases = [
    ['with_reasoning', {}, (r) => asAssistant(r)],
    ['without_reasoning', {}, (r) => ({ role: 'assistant', content: r.choices[0].message.content ?? '' })],
    ['cut_by_max_tokens', { max_tokens: 5 }, (r) => asAssistant(r)],
    ['cut_by_max_tokens_no_reasoning', { max_tokens: 5 }, (r) => ({ role: 'assistant', content: r.choices[0].message.content ?? '' })],
    ['stop_string', { stop: [stopAt] }, (r) => asAssistant(r)],
  ];
  const failures = [];
  for (const [name, extra, history] of cases) {
    const m1 = [sys(`You list colours (${name}).`), user('Name four colours.')];
    const r1 = await complete(s, req(m1, { max_tokens: 24, ...extra }));
    const p1 = r1.usage.prompt_tokens;
    const b2 = req([...m1, history(r1), user('And two more?')], { max_tokens: 8 });
    const r2 = await complete(s, b2);
    const cached = cachedOf(r2);
    if (cached < p1 - GEN_PROMPT_IDS)
      failures.push(`${name}: cached_tokens ${cached} < turn-1 prompt ${p1} - ${GEN_PROMPT_IDS} (finish ${r1.choices[0].finish_reason}; x_k3 ${show(r2.x_k3)})`);
    const cold = await coldAnswer(b2);
    eq(textOf(r2), textOf(cold), `${name}: greedy answer with reused prefix vs cold server`);
  }
  assert(failures.length === 0, failures.join('\n'));
});

// Turn 1, then the same conversation with the assistant turn edited (as when a client re-renders
// history differently, 1.9.4) and a new last user message: live reuse is impossible (the record
// holds the generated reply), so the turn-1 prompt-boundary checkpoint (1.9.2 capture point (a), kept
// by 3.10) must serve: cached_tokens >= the turn-1 prompt. --ckpt 3 leaves room for a server that
// also saves the start of the last user message.
await check('ckpt.edited_assistant_turn_restores_prompt_boundary', async () => {
  const s = await ck3Srv();
  const m1 = [sys('You describe places.'), user('Describe a forest.')];
  const r1 = await complete(s, req(m1, { ...OFF, max_tokens: 12 }));
  const p1 = r1.usage.prompt_tokens;
  const b2 = req([...m1, { role: 'assistant', content: 'EDITED: a quiet green place with tall trees.' }, user('Now describe a desert.')],
                 { ...OFF, max_tokens: 12 });
  const r2 = await complete(s, b2);
  const cached = cachedOf(r2);
  assert(cached >= p1, `cached_tokens ${cached} should be >= turn-1 prompt ${p1} (restored checkpoint); x_k3 ${show(r2.x_k3)}`);
  assert(r2.x_k3, 'x_k3 missing');
  eq(r2.x_k3.reuse, 'checkpoint', 'x_k3.reuse (the live record diverges inside the edited reply)');
  eq(r2.x_k3.checkpoint_restored_at, cached, 'x_k3.checkpoint_restored_at');
  const cold = await coldAnswer(b2);
  eq(textOf(r2), textOf(cold), 'greedy answer after checkpoint restore vs cold server');
});

// Edit of the last user message (the request's brief: with --ckpt 2 a checkpoint must make
// cached_tokens > 0; note that the 1.9.2 capture points alone — prompt boundary and end of reply —
// cannot serve this case). The answer must be the cold one and the reported reuse consistent.
await check('ckpt.edited_user_message_restores', async () => {
  const s = await ckSrv();
  const m1 = [sys('You name animals.'), user('Name a bird.')];
  const r1 = await complete(s, req(m1, { ...OFF, max_tokens: 8 }));
  const b2 = req([sys('You name animals.'), user('Name a fish.')], { ...OFF, max_tokens: 8 });
  const r2 = await complete(s, b2);
  const cached = cachedOf(r2);
  assert(cached < r1.usage.prompt_tokens, `cached_tokens ${cached} cannot cover the edited message`);
  assert(cached > 0, `cached_tokens 0: no checkpoint restored for an edited last user message (x_k3 ${show(r2.x_k3)})`);
  assert(r2.x_k3 && ['checkpoint', 'live'].includes(r2.x_k3.reuse), `x_k3.reuse should be checkpoint or live: ${show(r2.x_k3)}`);
  if (r2.x_k3.reuse === 'checkpoint') eq(r2.x_k3.checkpoint_restored_at, cached, 'x_k3.checkpoint_restored_at');
  const cold = await coldAnswer(b2);
  eq(textOf(r2), textOf(cold), 'greedy answer after an edited user message vs cold server');
});

// GET /slots describes every session: its state, context, the tokens it holds and its
// checkpoints. POST /slots/0?action=erase forgets the conversations, the live states and every
// checkpoint (a privacy feature): a follow-up of the old conversation then reuses nothing.
await check('slots.contents_and_erase_forgets_the_conversation', async () => {
  const slotsOf = (s) => async () => {
    const r = await request(s, { path: '/slots' });
    eq(r.status, 200, 'GET /slots');
    assert(Array.isArray(r.json) && r.json.length >= 1, () => `GET /slots is not a list of sessions: ${show(r.text)}`);
    // The session of the latest request: the most recently used one.
    const used = r.json.filter((v) => typeof v.last_used_s_ago === 'number');
    return used.length ? used.reduce((a, b) => (b.last_used_s_ago < a.last_used_s_ago ? b : a)) : r.json[0];
  };
  const slow = await slowSrv();   // 30 ms a token: 300 tokens keep it busy
  const busy = holdActive(slow, req([user('Keep the slot busy.')], { ...OFF, max_tokens: 300, stream: true }));
  try {
    assert(await busy.firstData, 'the request did not start');
    await waitUntil('GET /slots state busy during a generation', slotsOf(slow), (v) => v.state === 'busy');
  } finally {
    busy.release();
    await busy.done;
  }
  // The cancelled generation has ended (the abort checks below count cancellations on this server).
  await waitUntil('the busy server idle again', () => scheduler(slow), (sc) => sc.active === 0 && sc.queued === 0);
  const s = await ckSrv();
  const slots = slotsOf(s);
  const m1 = [sys('You keep secrets.'), user('The password is swordfish. Repeat it.')];
  const r1 = await complete(s, req(m1, { ...OFF, max_tokens: 8 }));
  const slot = await waitUntil('GET /slots state idle after the reply', slots, (v) => v.state === 'idle');
  eq(Object.keys(slot).sort(), ['cached_tokens', 'checkpoints', 'fed_tokens', 'generated_tokens', 'id',
                                'last_used_s_ago', 'n_ctx', 'phase', 'prompt_tokens', 'requests', 'state'],
     'GET /slots fields');
  assert(Number.isInteger(slot.id) && slot.id >= 0 && slot.id < 4, `slot id ${slot.id}`);
  assert(Number.isInteger(slot.requests) && slot.requests >= 1, `requests of the session that ran the turn: ${slot.requests}`);
  eq(slot.n_ctx, (await healthJson(s)).context_capacity, 'n_ctx = /health context_capacity');
  const { prompt_tokens: p1, completion_tokens: g1 } = r1.usage;
  assert(slot.fed_tokens >= p1 && slot.fed_tokens <= p1 + g1, `fed_tokens ${slot.fed_tokens} should hold the prompt (${p1}) and at most the ${g1} generated tokens`);
  assert(slot.checkpoints.length >= 1 && slot.checkpoints.length <= 2, () => `--ckpt 2 after a turn: ${show(slot.checkpoints)}`);
  for (const ck of slot.checkpoints) {
    assert(Number.isInteger(ck.slot) && Number.isInteger(ck.pos) && ck.pos > 0 && ck.pos <= slot.fed_tokens &&
           ck.pinned === false && typeof ck.age_s === 'number' && ck.age_s >= 0, () => `checkpoint entry ${show(ck)} (fed_tokens ${slot.fed_tokens})`);
  }
  expectError(await postJson(s, '/slots/0?action=restore', {}), 400, 'invalid_value', { param: 'action' });
  const restores = await metric(s, 'k3_checkpoint_restores_total');
  const e = await postJson(s, '/slots/0?action=erase', {});
  eq([e.status, e.json], [200, { id_slot: 0, erased: true }], 'POST /slots/0?action=erase');
  const erased = await waitUntil('GET /slots empty after the erase', slots, (v) => v.fed_tokens === 0);
  eq(erased.checkpoints, [], 'checkpoints after the erase');
  const r2 = await complete(s, req([...m1, asAssistant(r1), user('Say it again.')], { ...OFF, max_tokens: 4 }));
  eq([cachedOf(r2), r2.x_k3?.reuse], [0, 'none'], 'a follow-up of the erased conversation: cached_tokens, x_k3.reuse');
  eq(await metric(s, 'k3_checkpoint_restores_total'), restores, 'checkpoints restored after the erase (/metrics)');
});

// =============================================================================================
// Cancellation (3.9)
// =============================================================================================

await check('abort.midstream_then_extend', async () => {
  const s = await slowSrv();
  const main = await mainSrv();
  const c = client(s);
  const m1 = [user('Write a very long story about a lighthouse keeper.')];
  const p1 = (await complete(main, req(m1, { ...OFF, max_tokens: 1 }))).usage.prompt_tokens;
  const cancelledBefore = await cancelledCount(s);
  const ac = new AbortController();
  let partial = '', n = 0;
  const stream = await c.chat.completions.create(req(m1, { ...OFF, max_tokens: 400, stream: true }), { signal: ac.signal });
  try {
    for await (const ch of stream) {
      const d = ch.choices[0]?.delta?.content;
      if (d) { partial += d; if (++n === 6) ac.abort(); }
    }
  } catch (e) {
    if (!/abort/i.test(`${e.name} ${e.message}`)) throw e;
  }
  assert(n >= 6, `only ${n} content deltas before the stream ended`);
  // 400 tokens at 30 ms would keep the slot for ~12 s; a cancelled request frees it at once.
  const b2 = req([...m1, { role: 'assistant', content: partial }, user('Go on.')], { ...OFF, max_tokens: 12 });
  const r2 = await complete(s, b2);
  // An event, not seconds: the aborted generation was cancelled (had it run its 400 tokens, it
  // would have completed instead).
  eq(await cancelledCount(s), cancelledBefore + 1, 'generations cancelled after the abort (/health scheduler.cancelled)');
  const cached = cachedOf(r2);
  assert(cached >= p1, `cached_tokens ${cached} should be >= the aborted turn's prompt ${p1} (prefix reuse); x_k3 ${show(r2.x_k3)}`);
  const cold = await coldAnswer(b2);
  eq(textOf(r2), textOf(cold), 'greedy answer after abort + extension vs cold server');
});

await check('abort.then_same_prompt_equals_cold', async () => {
  const s = await slowSrv();
  const m = [user('Tell a slow tale about a clockmaker.')];
  const cancelledBefore = await cancelledCount(s);
  const stream = await client(s).chat.completions.create(req(m, { ...OFF, max_tokens: 400, stream: true }));
  let n = 0;
  try {
    for await (const ch of stream) {
      if (ch.choices[0]?.delta?.content && ++n === 4) stream.controller.abort();   // the SDK's own handle
    }
  } catch (e) {
    if (!/abort/i.test(`${e.name} ${e.message}`)) throw e;
  }
  assert(n >= 4, `only ${n} content deltas before the stream ended`);
  const b = req(m, { ...OFF, max_tokens: 10 });
  const r = await complete(s, b);
  eq(await cancelledCount(s), cancelledBefore + 1, 'the aborted generation was cancelled (/health scheduler.cancelled)');
  const cold = await coldAnswer(b);
  eq(textOf(r), textOf(cold), 'same prompt after abort vs cold server');
});

// A disconnect during the prefill: the client leaves as soon as the role chunk arrives (it is
// sent when the request is admitted, before the prefill of this ~400-token prompt starts; the
// server looks for a gone client every 100 ms, and the slow server's prefill of it takes over
// 0.36 s: 13 pieces of 32 ids, 30 ms after each but the last; in one piece it once ended first). The
// server counts the cancellation in the prefill phase (/metrics k3_cancelled_total, not in
// decode, which would mean the prefill had ended first), and the same prompt afterwards gets the
// cold answer.
await check('abort.during_prefill_then_cold', async () => {
  const s = await slowSrv();
  const words = [];
  for (let i = 0; i < 200; i++) words.push(['alpha', 'river', 'stone', 'cloud', 'maple', 'quartz'][i % 6] + (i % 97));
  const long = words.join(' ');
  const m = [user(`Summarise: ${long}`)];
  const PREFILL = 'k3_cancelled_total{phase="prefill"}';
  const prefillBefore = await metric(s, PREFILL);
  const cancelledBefore = await cancelledCount(s);
  const st = await sse(s, req(m, { ...OFF, max_tokens: 50, stream: true }), {
    onEvent: (ev) => (ev.kind === 'data' ? 'abort' : undefined),
  });
  eq(st.status, 200, 'stream status');
  assert(st.aborted, () => `the stream ended before the client could leave: ${show(st.events.map((e) => e.text))}`);
  const text = st.events.filter((e) => e.kind === 'data').flatMap((e) => e.json.choices ?? [])
    .map((c) => (c.delta?.content ?? '') + (c.delta?.reasoning_content ?? '')).join('');
  eq(text, '', 'text that arrived before the disconnect');
  const b = req(m, { ...OFF, max_tokens: 8 });
  const r = await complete(s, b);   // runs once the cancelled generation has ended
  eq(await metric(s, PREFILL), prefillBefore + 1, `generations cancelled in the prefill (/metrics ${PREFILL})`);
  eq(await cancelledCount(s), cancelledBefore + 1, 'generations cancelled (/health scheduler.cancelled)');
  const cold = await coldAnswer(b);
  eq(textOf(r), textOf(cold), 'answer after a cancelled long prefill vs cold server');
  eq(r.usage.prompt_tokens, cold.usage.prompt_tokens, 'prompt_tokens');
});

// The Vulkan expert tier's figures (docs/vulkan.md §8): with COLI_VULKAN=1 (ctest Serve.VulkanTier,
// on lavapipe) /health, /metrics and the request's log line report the device and a non-zero share
// of routed pairs served there (a silent fallback to the CPU fails); without it none of them
// mentions a device.
await check('device.tier_figures_in_health_metrics_and_log', async () => {
  const s = await mainSrv();
  const r = await request(s, { method: 'POST', path: '/v1/chat/completions', body: req([user('Count to five.')], { ...OFF, max_tokens: 8 }) });
  eq(r.status, 200, 'chat');
  const id = r.headers['x-request-id'];
  assert(id, 'x-request-id header');
  const health = await healthJson(s);
  const page = (await request(s, { path: '/metrics' })).text;
  if (process.env.COLI_VULKAN === '1') {
    assert(health.device && typeof health.device.name === 'string', () => `/health.device: ${show(health)}`);
    assert(health.device.pairs_served > 0 && !health.device.off, () => `/health.device served nothing: ${show(health.device)}`);
    assert(health.device.residents > 0 && health.device.residents <= health.device.budget, () => `residents: ${show(health.device)}`);
    assert(await metric(s, 'k3_device_pairs_served_total') > 0, 'k3_device_pairs_served_total');
    assert(/^k3_device_info\{device="[^"]+",off="0"\} 1$/m.test(page), () => `k3_device_info: ${show(page, 400)}`);
    const line = new RegExp(`^\\[VK\\] ${id} \\| (\\d+) of (\\d+) routed pairs on the device`, 'm');
    const m = await waitUntil('the [VK] line of the request', async () => s.err.match(line), (v) => v);
    assert(Number(m[1]) > 0 && Number(m[1]) <= Number(m[2]), () => `[VK] line: ${m[0]}`);
    if (process.env.COLI_VK_DENSE === 'on') {
      // The prompt's dense matrices ran on the device too (docs/vulkan.md §6).
      assert(health.device.dense_matrices > 0, () => `/health.device.dense_matrices: ${show(health.device)}`);
      assert(await metric(s, 'k3_device_dense_matmuls_total') > 0, 'k3_device_dense_matmuls_total');
    }
  } else {
    eq(health.device, undefined, '/health.device without the tier');
    assert(!/^k3_device_/m.test(page), 'no k3_device_ metric without the tier');
    assert(!/^\[VK\]/m.test(s.err), 'no [VK] line without the tier');
  }
});

// =============================================================================================
// Scheduler: FIFO, queue limit (4.7)
// =============================================================================================

await check('queue.fifo_three_concurrent', async () => {
  const s = await slowSrv();
  const bodies = ['first', 'second', 'third'].map((w) => req([user(`Say the ${w} word.`)], { ...OFF, max_tokens: 25 }));
  const finished = [];
  const ps = [];
  // Each request is sent once the one before it is in (admitted or queued: admitted + queued
  // grew), so the order they entered in is known.
  const entered = async () => { const sc = await scheduler(s); return sc.admitted + sc.queued; };
  const base = await entered();
  for (let i = 0; i < 3; i++) {
    ps.push(chat(s, bodies[i]).then((r) => { finished.push(i); return r; }));
    await waitUntil(`request ${i} admitted or queued`, entered, (n) => n >= base + i + 1);
  }
  const rs = await Promise.all(ps);
  rs.forEach((r, i) => {
    assert(r.status === 200, `request ${i}: ${r.status} ${show(r.text)}`);
    checkCompletion(r.json);
  });
  eq(finished, [0, 1, 2], 'completion order (FIFO)');
  const waits = rs.map((r) => Number(r.headers['x-queue-wait-ms']));
  assert(waits.every(Number.isFinite), `x-queue-wait-ms: ${show(waits)}`);
  assert(waits[1] > 0 && waits[2] > waits[1], `x-queue-wait-ms should grow along the queue: ${show(waits)}`);
});

await check('queue.full_429', async () => {
  const s = await queueSrv();
  const a = holdActive(s, req([user('Active request.')], { ...OFF, max_tokens: 300, stream: true }));
  try {
    assert(await a.firstData, 'active request did not start');
    const pb = chat(s, req([user('Queued request.')], { ...OFF, max_tokens: 4 }));
    await waitQueued(s, 1);
    const rc = await chat(s, req([user('One too many.')], { ...OFF, max_tokens: 4 }));
    expectError(rc, 429, 'queue_full', { param: null });
    const ra = String(rc.headers['retry-after'] ?? '');
    assert(/^\d+$/.test(ra) && Number(ra) >= 1 && Number(ra) <= 60, `Retry-After should be 1..60 s: ${show(ra)}`);
    a.release();
    const rb = await pb;
    eq(rb.status, 200, 'the queued request is served once the active one is cancelled');
  } finally {
    a.release();
    await a.done;
  }
});

// Default limits, one local client (an SDK's connection pool): 12 concurrent requests give one
// running, eight queued and three 429s — never a refused connection.
await check('queue.default_overflow_from_one_client', async () => {
  const s = await slowSrv();
  const c = client(s);
  const controllers = [];
  const outcomes = [];
  let n429 = 0, accounted = null;
  await Promise.all(Array.from({ length: 12 }, (_, i) => {
    const ac = new AbortController();
    controllers.push(ac);
    return c.chat.completions.create(req([user(`Request ${i}.`)], { ...OFF, max_tokens: 200 }), { signal: ac.signal })
      .then(() => 'ok', (e) => (e.status === 429 ? '429' : `${e.constructor.name} ${e.status ?? ''}`.trim()))
      .then((o) => {
        outcomes.push(o);
        // Three refusals expected; every request is accounted for once one runs and eight wait
        // (with a fourth refusal that never happens): then the others are ended.
        if (o === '429' && ++n429 === 3) {
          accounted = waitUntil('one running and eight queued', () => scheduler(s), (sc) => sc.active + sc.queued === 9)
            .then(() => null, (e) => e)
            .finally(() => controllers.forEach((x) => x.abort()));
        }
      });
  }));
  const waitError = await accounted;
  if (waitError) throw waitError;
  const other = outcomes.filter((o) => o !== '429' && o !== 'ok' && o !== 'APIUserAbortError');
  eq(n429, 3, `429s among 12 concurrent requests (outcomes ${show(outcomes)})`);
  eq(other.length, 0, `requests that failed otherwise: ${show(other)}`);
});

await check('queue.disconnected_waiter_removed', async () => {
  const s = await queueSrv();
  const a = holdActive(s, req([user('Active again.')], { ...OFF, max_tokens: 300, stream: true }));
  try {
    assert(await a.firstData, 'active request did not start');
    const ac = new AbortController();
    const pb = chat(s, req([user('I will leave.')], { ...OFF, max_tokens: 4 }), { signal: ac.signal }).catch((e) => e);
    await waitQueued(s, 1);
    const cancelledQueue = await metric(s, 'k3_cancelled_total{phase="queue"}');
    ac.abort();
    await pb;
    // The server checks waiters for disconnects at least every 100 ms (3.9): the place frees.
    await waitUntil('the disconnected waiter leaves the queue', () => scheduler(s), (sc) => sc.queued === 0);
    eq(await metric(s, 'k3_cancelled_total{phase="queue"}'), cancelledQueue + 1, 'waiters cancelled in the queue (/metrics)');
    // --max-queue 1: the free place takes a new waiter (a place still held would give 429 at once).
    const pc = chat(s, req([user('I take the free place.')], { ...OFF, max_tokens: 4 }));
    let early = null;
    pc.then((r) => { early = r; }, () => {});
    await waitUntil('the new request queued (or answered)', async () => early ?? await scheduler(s), (v) => v.status !== undefined || v.queued === 1);
    assert(!early, () => `a disconnected waiter still holds the queue place: ${early.status} ${show(early.text)}`);
    a.release();
    const rc = await pc;
    eq(rc.status, 200, 'request admitted after the waiter left');
  } finally {
    a.release();
    await a.done;
  }
});

await check('queue.timeout_429', async () => {
  const s = await qtimeoutSrv();
  const a = holdActive(s, req([user('Hold the slot.')], { ...OFF, max_tokens: 300, stream: true }));
  try {
    assert(await a.firstData, 'active request did not start');
    const t0 = performance.now();
    const r = await chat(s, req([user('I will time out.')], { ...OFF, max_tokens: 4 }), { timeoutMs: 15_000 });
    const dt = performance.now() - t0;
    expectError(r, 429, 'queue_timeout', { param: null });
    assert(r.headers['retry-after'], '429 queue_timeout lacks Retry-After');
    assert(dt >= 900, `the waiter was answered after ${Math.round(dt)} ms, before --queue-timeout 1`);
    // The upper bound is an event: the 429 came while the active request (300 tokens at 40 ms)
    // still held the slot.
    assert(a.streaming(), 'the waiter was answered only after the active request had ended');
  } finally {
    a.release();
    await a.done;
  }
});

// 4.6 / 4.9 item 8: at most 8 live connections per source IP (a ninth is closed), and a flood of
// idle connections from one address must not stop the server answering others.
await check('limits.connections_per_ip', async () => {
  const s = await connSrv();
  const open = (localAddress) => new Promise((resolve, reject) => {
    const k = net.connect({ host: '127.0.0.1', port: s.port, localAddress });
    k.closedByPeer = false;
    k.on('end', () => { k.closedByPeer = true; });
    k.on('close', () => { k.closedByPeer = true; });
    k.on('error', (e) => { k.err = e; if (!k.connected) reject(e); });
    k.on('connect', () => { k.connected = true; resolve(k); });
  });
  const socks = [];
  try {
    // Linux routes all of 127.0.0.0/8 to loopback: a second client address is always there.
    (await open('127.0.0.2')).destroy();
    for (let i = 0; i < 64; i++) socks.push(await open('127.0.0.1'));
    // The server counts in its accept order, which under load need not be the order in which
    // the client's connects completed: exactly 8 of the 64 stay open, whichever they are. Wait
    // for the 56 closes, then for an answer on a later connection (the server has handled every
    // one of the 64 before it), and count again.
    const closed = () => socks.filter((k) => k.closedByPeer).length;
    await waitUntil('56 of 64 connections from one IP closed', async () => closed(), (n) => n >= 56).catch(() => {});
    const probe = (localAddress) => new Promise((resolve) => {
      const k = net.connect({ host: '127.0.0.1', port: s.port, localAddress });
      let d = '';
      const t = setTimeout(() => { k.destroy(); resolve(`no answer within 3 s${d ? ` (${d.slice(0, 40)})` : ''}`); }, 3000);
      k.on('connect', () => k.write(`GET /health HTTP/1.1\r\nHost: 127.0.0.1:${s.port}\r\nConnection: close\r\n\r\n`));
      k.on('data', (x) => { d += x; });
      k.on('close', () => { clearTimeout(t); resolve(d.slice(0, 12)); });
      k.on('error', (e) => { clearTimeout(t); resolve(`error ${e.code}`); });
    });
    const other = await probe('127.0.0.2');
    const stillOpen = 64 - closed();
    const problems = [];
    if (stillOpen !== 8) problems.push(`${stillOpen} of 64 connections from one IP stayed open (expected exactly 8)`);
    if (!/^HTTP\/1\.[01] 200/.test(other)) problems.push(`GET /health from another address while 64 idle connections are held: ${other}`);
    assert(problems.length === 0, problems.join('\n'));
  } finally {
    for (const k of socks) k.destroy();
  }
});

// The request-read deadline is cumulative (4.6): a client dripping its headers a byte at a time
// is closed at the deadline; a body dripped the same way gets 408; a response that takes longer
// than the deadline (a long generation) is never cut.
const deadlineSrv = lazy('deadline', ['--read-deadline', '2', '--token-delay-ms', '40']);
await check('limits.read_deadline_cumulative', async () => {
  const s = await deadlineSrv();
  const drip = (head, tail) => new Promise((resolve) => {
    const k = net.connect({ host: '127.0.0.1', port: s.port });
    const t0 = Date.now();
    let data = '', i = 0, timer = null;
    const finish = (why) => { clearInterval(timer); k.destroy(); resolve({ why, ms: Date.now() - t0, data, sent: i, total: tail.length }); };
    k.on('connect', () => {
      k.write(head);
      timer = setInterval(() => {
        if (i < tail.length) k.write(tail[i++]);
        else finish('still open after the whole request was sent');
      }, 150);
    });
    k.on('data', (x) => { data += x; });
    k.on('close', () => finish('closed'));
    k.on('error', () => finish('closed'));
  });
  const headers = await drip('GET /health HTTP/1.1\r\n', `Host: 127.0.0.1:${s.port}\r\nX-Slow: ${'a'.repeat(200)}\r\n\r\n`);
  eq(headers.why, 'closed', 'a client dripping its headers');
  assert(headers.ms >= 1500, `closed after ${headers.ms} ms, before the 2 s deadline`);
  // The upper bound is an event: closed while the headers were still being dripped.
  assert(headers.sent < headers.total, `closed only after ${headers.sent} of ${headers.total} header bytes were sent`);
  const body = await drip(`POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1:${s.port}\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n`, ' '.repeat(200));
  assert(/^HTTP\/1\.1 408/.test(body.data), `a dripped body: ${show(body.data.slice(0, 60))} after ${body.ms} ms`);
  const t0 = Date.now();
  const j = await complete(s, req([user('Take your time.')], { ...OFF, max_tokens: 80 }));
  assert(Date.now() - t0 > 2500, 'the generation was expected to outlast the deadline');
  eq(j.usage.completion_tokens, 80, 'a long response is not cut by the read deadline');
});

await check('sse.keepalive_comments', async () => {
  const s = await pingSrv();
  const st = await sse(s, req([user('Slowly.')], { ...OFF, max_tokens: 3, stream: true }));
  checkStream(st, { includeUsage: false, usageKeyRule: false });
  const comments = st.events.filter((e) => e.kind === 'comment');
  assert(comments.length >= 1, `no SSE comment (keepalive) in ${st.events.length} events over ~4.5 s with --sse-ping-interval 1`);
});

// =============================================================================================
// Bad input: status + OpenAI envelope, and the server keeps serving (3.6.1, 3.8, 4.5)
// =============================================================================================

const badCases = [
  ['invalid_json', '{"model": "kimi-k3", "messages": [', 400, 'invalid_json', null],
  ['trailing_garbage', goodText + ' x', 400, 'invalid_json', null],
  ['top_level_array', '[1,2,3]', 400, 'invalid_json', null],
  ['temperature_string', { ...good, temperature: 'hot' }, 400, 'invalid_value', 'temperature'],
  ['temperature_range', { ...good, temperature: 2.5 }, 400, 'invalid_value', 'temperature'],
  ['messages_object', { ...good, messages: {} }, 400, 'invalid_value', 'messages'],
  ['stream_string', { ...good, stream: 'yes' }, 400, 'invalid_value', 'stream'],
  ['max_tokens_zero', { ...good, max_tokens: 0 }, 400, 'invalid_value', 'max_tokens'],
  ['max_tokens_fraction', { ...good, max_tokens: 2.5 }, 400, 'invalid_value', 'max_tokens'],
  ['top_p_zero', { ...good, top_p: 0 }, 400, 'invalid_value', 'top_p'],
  ['top_k_negative', { ...good, top_k: -1 }, 400, 'invalid_value', 'top_k'],
  ['min_p_range', { ...good, min_p: 1.5 }, 400, 'invalid_value', 'min_p'],
  ['seed_string', { ...good, seed: 'abc' }, 400, 'invalid_value', 'seed'],
  ['stop_17_strings', { ...good, stop: Array.from({ length: 17 }, (_, i) => `s${i}`) }, 400, 'invalid_value', 'stop'],
  ['stop_empty_string', { ...good, stop: [''] }, 400, 'invalid_value', ['stop', 'stop.0']],
  ['stop_too_long', { ...good, stop: 'x'.repeat(300) }, 400, 'invalid_value', ['stop', 'stop.0']],
  ['include_usage_string', { ...good, stream: true, stream_options: { include_usage: 'yes' } }, 400, 'invalid_value', 'stream_options.include_usage'],
  ['enable_thinking_string', { ...good, chat_template_kwargs: { enable_thinking: 'yes' } }, 400, 'invalid_value', 'chat_template_kwargs.enable_thinking'],
  ['missing_messages', { model: MODEL_ID }, 400, 'missing_required_parameter', 'messages'],
  ['missing_model', { messages: [user('hi')] }, 400, 'missing_required_parameter', 'model'],
  ['empty_messages', { ...good, messages: [] }, 400, 'invalid_value', 'messages'],
  ['bad_role', { ...good, messages: [{ role: 'wizard', content: 'hi' }] }, 400, 'invalid_value', 'messages.0.role'],
  ['content_number', { ...good, messages: [{ role: 'user', content: 42 }] }, 400, 'invalid_value', 'messages.0.content'],
  ['image_part', { ...good, messages: [user([{ type: 'text', text: 'what is this?' }, { type: 'image_url', image_url: { url: 'http://example.invalid/x.png' } }])] },
   400, 'unsupported_content_type', 'messages.0.content.1'],
  ['audio_part', { ...good, messages: [user([{ type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } }])] },
   400, 'unsupported_content_type', 'messages.0.content.0'],
  ['n_2', { ...good, n: 2 }, 400, 'unsupported_value', 'n'],
  ['frequency_penalty', { ...good, frequency_penalty: 2.5 }, 400, 'invalid_value', 'frequency_penalty'],
  ['repetition_penalty', { ...good, repetition_penalty: 1.2 }, 400, 'unsupported_parameter', 'repetition_penalty'],
  ['logprobs', { ...good, logprobs: 'yes' }, 400, 'invalid_value', 'logprobs'],
  ['top_logprobs_21', { ...good, logprobs: true, top_logprobs: 21 }, 400, 'invalid_value', 'top_logprobs'],
  ['response_format_unknown_type', { ...good, response_format: { type: 'yaml' } }, 400, 'unsupported_value', 'response_format.type'],
  ['response_format_unenforceable_schema', { ...good, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array', uniqueItems: true } } } },
   400, 'unsupported_schema', 'response_format.json_schema.schema'],
  ['reasoning_effort_unknown', { ...good, reasoning_effort: 'extreme' }, 400, 'unsupported_value', 'reasoning_effort'],
  ['lone_surrogate', '{"model":"kimi-k3","messages":[{"role":"user","content":"a\\ud800b"}]}', 400, ['invalid_json', 'invalid_value'], undefined],
  ['invalid_utf8', Buffer.concat([Buffer.from('{"model":"kimi-k3","messages":[{"role":"user","content":"a'), Buffer.from([0xff, 0xfe]), Buffer.from('b"}]}')]),
   400, ['invalid_json', 'invalid_value'], undefined],
  ['nul_in_content', '{"model":"kimi-k3","messages":[{"role":"user","content":"a\\u0000b"}]}', 400, ['invalid_json', 'invalid_value'], undefined],
  ['nesting_depth_100', `{"model":"kimi-k3","messages":[{"role":"user","content":"hi"}],"x":${'['.repeat(100)}${']'.repeat(100)}}`, 400, 'invalid_json', null],
];
for (const [name, body, status, code, param] of badCases) {
  await check(`errors.${name}`, async () => {
    const s = await mainSrv();
    const r = await chat(s, body);
    const e = expectError(r, status, Array.isArray(code) ? undefined : code, { codes: Array.isArray(code) ? code : undefined });
    if (Array.isArray(param)) assert(param.includes(e.param), `error.param should be one of ${show(param)}: ${show(r.json)}`);
    else if (param !== undefined) eq(e.param, param, `error.param (${show(r.json)})`);
  });
}

await check('errors.content_type_text_plain_415', async () => {
  const s = await mainSrv();
  expectError(await chat(s, goodText, { headers: { 'content-type': 'text/plain' } }), 415, 'unsupported_media_type');
  expectError(await chat(s, goodText, { headers: { 'content-type': 'application/x-www-form-urlencoded' } }), 415, 'unsupported_media_type');
  expectError(await chat(s, goodText, { headers: { 'content-type': null } }), 415, 'unsupported_media_type');
});

await check('errors.unknown_path_404_and_method_405', async () => {
  const s = await mainSrv();
  expectError(await request(s, { path: '/v1/nope' }), 404, 'not_found', { param: null });
  const r = await request(s, { path: '/v1/chat/completions' });
  expectError(r, 405, 'method_not_allowed');
  assert(/POST/.test(String(r.headers.allow ?? '')), `405 needs an Allow header naming POST: ${show(r.headers.allow)}`);
});

await check('errors.sdk_maps_errors', async () => {
  const s = await mainSrv();
  const c = client(s);
  try {
    await c.chat.completions.create({ ...good, temperature: 2.5 });
    assert(false, 'expected an error');
  } catch (e) {
    eq(e.status, 400, 'SDK error status');
    eq(e.code, 'invalid_value', 'SDK error code');
    eq(e.param, 'temperature', 'SDK error param');
    assert(/2\.5/.test(e.message) && /\[0, 2\]/.test(e.message), `the message names the value and the range: ${e.message}`);
  }
  try {
    await c.chat.completions.create({ ...good, n: 2 });
    assert(false, 'expected an error');
  } catch (e) {
    eq(e.status, 400, 'SDK error status (n=2)');
    eq(e.constructor.name, 'BadRequestError', 'SDK error class');
  }
});

await check('accept.tolerated_inputs', async () => {
  const s = await mainSrv();
  const ok = async (what, body, headers = {}) => {
    const r = await chat(s, body, { headers });
    assert(r.status === 200, () => `${what}: expected 200, got ${r.status} ${show(r.text)}`);
    checkCompletion(r.json);
    return r.json;
  };
  const dup = '{"max_tokens":7,"messages":[{"role":"user","content":"hi"}],"model":"kimi-k3","max_tokens":2}';
  eq((await ok('duplicate keys: the last one wins', dup)).usage.completion_tokens <= 2, true, 'the last max_tokens (2) wins');
  expectError(await chat(await strictSrv(), '{"model":"kimi-k3","model":"nope","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'),
              404, 'model_not_found', { param: 'model' });
  const j = await ok('integer written as 3.0', '{"model":"kimi-k3","messages":[{"role":"user","content":"hi"}],"max_tokens":3.0,"temperature":0}');
  assert(j.usage.completion_tokens <= 3, 'max_tokens 3.0 honoured');
  await ok('unknown and informational keys ignored', { ...good, foo_bar: 1, user: 'u1', metadata: { a: 'b' }, store: false, service_tier: 'auto' });
  await ok('charset parameter', goodText, { 'content-type': 'application/json; charset=utf-8' });
  await ok('n: 1', { ...good, n: 1 });
  await ok('assistant content null and reasoning alias',
           { ...good, messages: [user('a'), { role: 'assistant', content: null, reasoning: 'thought' }, user('b')] });
  await ok('frequency_penalty 0', { ...good, frequency_penalty: 0, presence_penalty: 0 });
  await ok('response_format text', { ...good, response_format: { type: 'text' } });
});

await check('errors.server_still_serves', async () => {
  const s = await mainSrv();
  eq((await request(s, { path: '/health' })).status, 200, '/health after the bad inputs');
  await complete(s, req([user('Still there?')], { max_tokens: 3 }));
});

await check('host.foreign_host_403_main', async () => {
  const s = await mainSrv();
  expectError(await request(s, { path: '/v1/models', headers: { host: 'evil.example' } }), 403, 'host_not_allowed');
  expectError(await chat(s, good, { headers: { host: `evil.example:${s.port}` } }), 403, 'host_not_allowed');
  const o = await request(s, { method: 'OPTIONS', path: '/v1/chat/completions',
                               headers: { host: 'evil.example', origin: 'http://evil.example', 'access-control-request-method': 'POST' } });
  eq(o.status, 403, 'OPTIONS with a foreign Host');
  for (const h of [`localhost:${s.port}`, `127.0.0.1:${s.port}`, `[::1]:${s.port}`, 'localhost']) {
    eq((await request(s, { path: '/v1/models', headers: { host: h } })).status, 200, `Host ${h}`);
  }
});

await check('tokenize.roundtrip', async () => {
  const s = await mainSrv();
  const oracle = (text) => {
    const r = spawnSync(coli, ['tokenize', modelDir], { input: JSON.stringify({ text }) + '\n', encoding: 'utf8' });
    assert(r.status === 0, `coli tokenize failed: ${r.stderr}`);
    return JSON.parse(r.stdout.trim()).ids;
  };
  for (const text of ['hello', 'Grüße, 世界! 🙂\nnew line\ttab']) {
    const t = await postJson(s, '/tokenize', { content: text });
    eq(t.status, 200, `/tokenize status (${show(t.text)})`);
    assert(Array.isArray(t.json?.tokens) && t.json.tokens.every(Number.isInteger), `/tokenize body ${show(t.json)}`);
    eq(t.json.tokens, oracle(text), `/tokenize ids vs coli tokenize for ${show(text)}`);
    const d = await postJson(s, '/detokenize', { tokens: t.json.tokens });
    eq(d.status, 200, `/detokenize status (${show(d.text)})`);
    eq(d.json?.content, text, '/detokenize round trip');
  }
  expectError(await postJson(s, '/tokenize', { content: 5 }), 400, 'invalid_value', { param: 'content' });
  expectError(await postJson(s, '/detokenize', { tokens: [1, 'x'] }), 400, 'invalid_value');
  expectError(await postJson(s, '/detokenize', { tokens: [999999999] }), 400, 'invalid_value');
});

// =============================================================================================
// Auth, Host, CORS, size limits, context (Part 4) on one locked-down server
// =============================================================================================

await check('auth.required_on_protected_routes', async () => {
  const s = await limitsSrv();
  const routes = [['GET', '/v1/models', null], ['GET', `/v1/models/${MODEL_ID}`, null],
                  ['POST', '/v1/chat/completions', good], ['POST', '/tokenize', { content: 'hi' }],
                  ['POST', '/detokenize', { tokens: [1] }]];
  for (const [method, p, body] of routes) {
    const r = await request(s, { method, path: p, body, auth: false });
    expectError(r, 401, 'invalid_api_key', { param: null });
    assert(/^Bearer/i.test(String(r.headers['www-authenticate'] ?? '')), `${method} ${p}: 401 without WWW-Authenticate: Bearer`);
  }
});

await check('auth.same_answer_missing_or_wrong', async () => {
  const s = await limitsSrv();
  const missing = await request(s, { path: '/v1/models', auth: false });
  const wrong = await request(s, { path: '/v1/models', auth: false, headers: { authorization: `Bearer ${WRONG_KEY}` } });
  const wrongShort = await request(s, { path: '/v1/models', auth: false, headers: { 'x-api-key': 'k' } });
  const basic = await request(s, { path: '/v1/models', auth: false, headers: { authorization: `Basic ${API_KEY}` } });
  for (const r of [missing, wrong, wrongShort, basic]) expectError(r, 401, 'invalid_api_key');
  eq(wrong.json, missing.json, 'wrong key vs missing key body');
  eq(basic.json, missing.json, 'non-Bearer scheme counts as missing');
});

await check('auth.bearer_and_x_api_key', async () => {
  const s = await limitsSrv();
  eq((await request(s, { path: '/v1/models', auth: false, headers: { authorization: `Bearer ${API_KEY}` } })).status, 200, 'Bearer');
  eq((await request(s, { path: '/v1/models', auth: false, headers: { 'x-api-key': API_KEY } })).status, 200, 'x-api-key');
  const r = await chat(s, { ...good, ...OFF }, { auth: false, headers: { 'x-api-key': API_KEY } });
  eq(r.status, 200, `chat with x-api-key (${show(r.text)})`);
  const ids = [];
  for await (const m of client(s).models.list()) ids.push(m.id);
  assert(ids.includes(MODEL_ID), 'SDK with apiKey');
  const bad = new OpenAI({ apiKey: WRONG_KEY, baseURL: `${s.url}/v1`, maxRetries: 0 });
  try { await bad.models.list(); assert(false, 'wrong key accepted'); } catch (e) { eq(e.status, 401, 'SDK with a wrong key'); }
});

// 4.2: 20 wrong keys from one client within 60 s → 429 to its wrong keys for 60 s; the right key
// still passes.
await check('auth.brute_force_brake', async () => {
  const s = await lazy('brake', ['--api-key', API_KEY], { key: API_KEY })();
  const codes = [];
  for (let i = 0; i < 21; i++) codes.push((await request(s, { path: '/v1/models', headers: { authorization: `Bearer ${WRONG_KEY}` }, auth: false })).status);
  eq(codes.slice(0, 20).every((c) => c === 401), true, `the first 20 wrong keys get 401: ${codes}`);
  const r = await request(s, { path: '/v1/models', headers: { authorization: `Bearer ${WRONG_KEY}` }, auth: false });
  expectError(r, 429, 'too_many_auth_failures', { param: null });
  assert(Number(r.headers['retry-after']) > 0, 'Retry-After');
  eq((await request(s, { path: '/v1/models' })).status, 200, 'the right key while blocked');
});

await check('auth.health_public_minimal', async () => {
  const s = await limitsSrv();
  const pub = await request(s, { path: '/health', auth: false });
  eq(pub.status, 200, '/health without a key');
  eq(pub.json?.status, 'ok', '/health status');
  for (const k of ['scheduler', 'model', 'memory', 'state', 'context_capacity']) {
    assert(!(k in (pub.json ?? {})), `/health without a key must be minimal; it has "${k}": ${show(pub.json)}`);
  }
  const priv = await request(s, { path: '/health' });
  eq(priv.json?.context_capacity, 256, 'authenticated /health context_capacity = --ctx');
  assert(priv.json?.scheduler, 'authenticated /health has scheduler');
  const o = await request(s, { method: 'OPTIONS', path: '/v1/chat/completions', auth: false,
                               headers: { origin: GOOD_ORIGIN, 'access-control-request-method': 'POST' } });
  eq(o.status, 204, 'OPTIONS preflight needs no key');
});

await check('host.allowlist', async () => {
  const s = await limitsSrv();
  for (const [method, p, body] of [['GET', '/v1/models', null], ['POST', '/v1/chat/completions', good], ['GET', '/health', null]]) {
    expectError(await request(s, { method, path: p, body, headers: { host: 'evil.example' } }), 403, 'host_not_allowed', { param: null });
  }
  eq((await request(s, { path: '/v1/models', headers: { host: 'good.example' } })).status, 200, '--allowed-host good.example');
  eq((await request(s, { path: '/v1/models', headers: { host: 'good.example:8443' } })).status, 200, '--allowed-host, port ignored');
});

await check('cors.preflight_and_origin', async () => {
  const s = await limitsSrv();
  const pre = (origin) => request(s, { method: 'OPTIONS', path: '/v1/chat/completions', auth: false,
    headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization,content-type' } });
  const ok = await pre(GOOD_ORIGIN);
  eq(ok.status, 204, 'preflight status');
  eq(ok.headers['access-control-allow-origin'], GOOD_ORIGIN, 'Access-Control-Allow-Origin echoes the allowlisted origin');
  assert(/(^|,\s*)origin(\s*,|$)/i.test(String(ok.headers.vary ?? '')), `Vary: Origin missing: ${show(ok.headers.vary)}`);
  const ah = String(ok.headers['access-control-allow-headers'] ?? '').toLowerCase();
  for (const h of ['authorization', 'content-type', 'x-api-key']) assert(ah.includes(h), `Access-Control-Allow-Headers lacks ${h}: ${ah}`);
  assert(/POST/.test(String(ok.headers['access-control-allow-methods'] ?? '')), 'Access-Control-Allow-Methods lacks POST');
  assert(!('access-control-allow-credentials' in ok.headers), 'no Access-Control-Allow-Credentials expected');
  const no = await pre('http://evil.example');
  assert(!('access-control-allow-origin' in no.headers), `unlisted origin got Access-Control-Allow-Origin: ${no.headers['access-control-allow-origin']}`);
  expectError(await chat(s, good, { headers: { origin: 'http://evil.example' } }), 403, 'origin_not_allowed');
  const r = await chat(s, { ...good, ...OFF }, { headers: { origin: GOOD_ORIGIN } });
  eq(r.status, 200, `POST from the allowlisted origin (${show(r.text)})`);
  eq(r.headers['access-control-allow-origin'], GOOD_ORIGIN, 'ACAO on the POST answer');
});

const parseRawJson = (text) => { try { return JSON.parse(text.slice(text.indexOf('\r\n\r\n') + 4)); } catch { return undefined; } };
const head = (s, lines) => `${lines.join('\r\n')}\r\nHost: 127.0.0.1:${s.port}\r\nAuthorization: Bearer ${s.key}\r\n\r\n`;

// Prompts far over the context are refused with their whole token count (a 6 MB body, bounded by
// --max-body-mb, is counted in full: the count /tokenize gives for the same text), and the memory
// of large requests goes back to the system: the server's RSS after eight such bodies stays within
// 64 MB of its level before them (it grew by ~1 GB).
const rssMb = (pid) => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) / 1024;
await check('limits.large_prompt_counted_rss_returns', async () => {
  const s = await mainSrv();
  await complete(s, req([user('Warm up.')], { ...OFF, max_tokens: 2 }));
  const before = rssMb(s.proc.pid);
  const words = 'lorem ipsum dolor sit amet consectetur '.repeat(160_000);  // ~6.2 MB
  for (let i = 0; i < 8; ++i) {
    const r = await chat(s, req([user(words + i)], { max_tokens: 4 }));
    const e = expectError(r, 400, 'context_length_exceeded', { param: 'messages' });
    const n = Number(/the prompt has (\d+) tokens/.exec(e.message)?.[1]);
    assert(n > 1_000_000 && e.message.includes(`raise --ctx to ${n + 1} `) && e.message.includes('holds 8192 (--ctx / COLI_CTX)'),
           `the whole count, the context and the setting: ${e.message}`);
  }
  const after = rssMb(s.proc.pid);
  assert(after <= before + 64, `RSS ${before.toFixed(1)} MB before eight 6 MB prompts, ${after.toFixed(1)} MB after`);
  const c = await postJson(s, '/v1/completions', { model: MODEL_ID, prompt: words, max_tokens: 4 });
  const ce = expectError(c, 400, 'context_length_exceeded', { param: 'prompt' });
  const counted = (await postJson(s, '/tokenize', { content: words })).json.tokens.length;
  assert(ce.message.startsWith(`the prompt has ${counted} tokens and the reply needs at least 1 more, ${counted + 1} in all, but the context holds 8192`),
         `/v1/completions names the prompt's ${counted} tokens: ${ce.message}`);
});

await check('limits.body_413_without_reading', async () => {
  const s = await limitsSrv();
  const size = 2 * 1024 * 1024;
  const r = await rawSocket(s.port, [head(s, ['POST /v1/chat/completions HTTP/1.1', 'Content-Type: application/json', `Content-Length: ${size}`])],
                            { readTimeoutMs: 3000 });
  assert(r.status !== 0, 'no answer within 3 s to a 2 MiB Content-Length before the body was sent (must answer 413 without reading it)');
  eq(r.status, 413, `status (${show(r.text.slice(0, 300))})`);
  const j = parseRawJson(r.text);
  eq(j?.error?.code, 'request_too_large', 'error.code');
  for (const part of [`${size} bytes`, '1048576 bytes', '1 MiB', '--max-body-mb / COLI_MAX_BODY_MB'])
    assert(j.error.message.includes(part), `the 413 names ${part}: ${j.error.message}`);
});

await check('limits.body_413_sent', async () => {
  const s = await limitsSrv();
  const size = 2 * 1024 * 1024;
  const body = Buffer.alloc(size, 0x20);
  body.write('{"model":"kimi-k3","messages":[{"role":"user","content":"', 0);
  const parts = [head(s, ['POST /v1/chat/completions HTTP/1.1', 'Content-Type: application/json', `Content-Length: ${size}`])];
  for (let i = 0; i < size; i += 65536) parts.push(body.subarray(i, i + 65536));
  const r = await rawSocket(s.port, parts, { stopWritingOnResponse: true });
  eq(r.status, 413, `status (${show(r.text.slice(0, 300))})`);
  eq(parseRawJson(r.text)?.error?.code, 'request_too_large', 'error.code');
  const chunk = Buffer.alloc(256 * 1024, 0x20).toString();
  const cparts = [head(s, ['POST /v1/chat/completions HTTP/1.1', 'Content-Type: application/json', 'Transfer-Encoding: chunked'])];
  for (let i = 0; i < 8; i++) cparts.push(`${(chunk.length).toString(16)}\r\n${chunk}\r\n`);
  cparts.push('0\r\n\r\n');
  const rc = await rawSocket(s.port, cparts, { stopWritingOnResponse: true });
  assert(rc.status === 413 || rc.status === 411, `chunked body over the cap: expected 413 (or 411), got ${show(rc.text.slice(0, 300))}`);
});

await check('limits.http_framing', async () => {
  const s = await limitsSrv();
  const big = [];
  for (let i = 0; i < 17; i++) big.push(`X-Filler-${i}: ${'a'.repeat(1000)}`);
  const r431 = await rawSocket(s.port, [head(s, ['GET /v1/models HTTP/1.1', ...big])]);
  eq(r431.status, 431, `17 KiB of headers (${show(r431.text.slice(0, 200))})`);
  const r411 = await rawSocket(s.port, [head(s, ['POST /v1/chat/completions HTTP/1.1', 'Content-Type: application/json', 'Connection: close'])]);
  eq(r411.status, 411, `POST without Content-Length (${show(r411.text.slice(0, 200))})`);
  const both = await rawSocket(s.port, [head(s, ['POST /v1/chat/completions HTTP/1.1', 'Content-Type: application/json',
                                                 'Content-Length: 5', 'Transfer-Encoding: chunked']) + '0\r\n\r\n']);
  eq(both.status, 400, `Content-Length and Transfer-Encoding together (${show(both.text.slice(0, 200))})`);
  for (const cl of ['-5', 'abc']) {
    const r = await rawSocket(s.port, [head(s, ['POST /v1/chat/completions HTTP/1.1', 'Content-Type: application/json', `Content-Length: ${cl}`])]);
    eq(r.status, 400, `Content-Length: ${cl} (${show(r.text.slice(0, 200))})`);
  }
  eq((await request(s, { path: '/health' })).status, 200, 'server alive after framing errors');
});

// After an early rejection (4.5: 401, 403, 413, 415 answer without reading the body, then close),
// the unread body must never be parsed as further requests on the same connection: a body that
// carries an HTTP request would otherwise run it (a text/plain cross-site POST refused with 403
// or 415 could smuggle a JSON POST without Origin past the guards of 4.3).
const BODY_CANARY = 'BODYCANARY-' + crypto.randomBytes(6).toString('hex');
await check('limits.no_request_smuggling_after_early_rejection', async () => {
  const s = await limitsSrv();
  const smuggled = `GET /v1/models?${BODY_CANARY} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${s.key}\r\n\r\n`;
  const filler = `${BODY_CANARY}/`.repeat(Math.ceil(65536 / (BODY_CANARY.length + 1)));
  const pad = (n, prefix) => prefix + filler.slice(0, n - prefix.length);
  const H = (lines) => `${lines.join('\r\n')}\r\n\r\n`;
  const auth = `Authorization: Bearer ${s.key}`;
  const N = 65536;
  const problems = [];
  const cases = [
    ['413 (body over the cap, sent late)', [H(['POST /v1/chat/completions HTTP/1.1', 'Host: 127.0.0.1', auth, 'Content-Type: application/json', `Content-Length: ${2 * 1024 * 1024}`]), 500, pad(N, smuggled)], true],
    ['415 (text/plain, body sent late)', [H(['POST /v1/chat/completions HTTP/1.1', 'Host: 127.0.0.1', auth, 'Content-Type: text/plain', `Content-Length: ${N}`]), 500, pad(N, smuggled)], false],
    ['403 (foreign Origin, body sent late)', [H(['POST /v1/chat/completions HTTP/1.1', 'Host: 127.0.0.1', auth, 'Origin: http://evil.example', 'Content-Type: text/plain', `Content-Length: ${N}`]), 500, pad(N, smuggled)], false],
    ['401 (no key, body sent late)', [H(['POST /v1/chat/completions HTTP/1.1', 'Host: 127.0.0.1', 'Content-Type: application/json', `Content-Length: ${N}`]), 500, pad(N, smuggled)], false],
  ];
  // The browser case: one write, the embedded request at offset 4096 of the connection.
  const head403 = H(['POST /v1/chat/completions HTTP/1.1', 'Host: 127.0.0.1', 'Origin: http://evil.example', 'Content-Type: text/plain', `Content-Length: ${N}`]);
  const lead = 'x'.repeat(4096 - head403.length);
  cases.push(['403 (foreign Origin, one write, request at offset 4096)', [head403 + pad(N, lead + smuggled)], false]);
  for (const [what, parts, mustClose] of cases) {
    const r = await rawSocket(s.port, parts, { readTimeoutMs: 6000, lingerMs: 1500 });
    const statuses = [...r.text.matchAll(/HTTP\/1\.[01] (\d{3})/g)].map((m) => Number(m[1]));
    if (statuses.length !== 1) problems.push(`${what}: ${statuses.length} responses on one connection (${statuses.join(', ')}); the body was parsed as requests`);
    else if (mustClose && !r.closed) problems.push(`${what}: the connection stayed open after the early rejection (4.5: close instead of draining)`);
  }
  assert(problems.length === 0, problems.join('\n'));
});

await check('privacy.rejected_body_not_logged', async () => {
  const s = await limitsSrv();
  await s.logSettled();
  assert(!s.log.includes(BODY_CANARY), 'bytes of a rejected request body appear in the server log');
  assert(!s.log.includes('xxxxxxxxxxxxxxxx'), 'bytes of a rejected request body appear in the server log');
});

await check('context.prompt_too_long_400', async () => {
  const s = await limitsSrv();
  const long = 'lorem ipsum dolor sit amet consectetur '.repeat(60);
  for (const stream of [false, true]) {
    const r = await chat(s, req([user(long)], { ...OFF, max_tokens: 4, stream }));
    const e = expectError(r, 400, 'context_length_exceeded', { param: 'messages' });
    const m = /^the prompt has (\d+) tokens and the reply needs at least 1 more, (\d+) in all, but the context holds 256 \(--ctx \/ COLI_CTX\): raise --ctx to (\d+) or more/.exec(e.message);
    assert(m && Number(m[1]) > 256 && Number(m[2]) === Number(m[1]) + 1 && m[3] === m[2],
           `the prompt's count, the context 256 and the setting: ${e.message}`);
  }
  // The same count as /v1/messages/count_tokens gives for the conversation (thinking off both).
  const a = await postJson(s, '/v1/messages', { model: MODEL_ID, max_tokens: 4, thinking: { type: 'disabled' }, messages: [user(long)] });
  eq([a.status, a.json?.type, a.json?.error?.type, a.json?.error?.details?.error_code], [400, 'error', 'invalid_request_error', 'context_length_exceeded'],
     `Anthropic envelope (${show(a.text)})`);
  const n = (await postJson(s, '/v1/messages/count_tokens', { model: MODEL_ID, thinking: { type: 'disabled' }, messages: [user(long)] })).json.input_tokens;
  assert(a.json.error.message.startsWith(`the prompt has ${n} tokens`) && a.json.error.message.includes('--ctx'),
         `count_tokens says ${n}: ${a.json.error.message}`);
  eq((await request(s, { path: '/health' })).status, 200, 'server alive after context_length_exceeded');
});

await check('context.max_tokens_clamped', async () => {
  const s = await limitsSrv();
  const j = await complete(s, req([user('Go.')], { ...OFF, max_tokens: 1000 }));
  assert(j.usage.completion_tokens <= 64, `max_tokens 1000 must be clamped to --max-tokens 64: ${j.usage.completion_tokens}`);
  const j2 = await complete(s, req([user('Again.')], { ...OFF }));
  assert(j2.usage.completion_tokens <= 64, `default max_tokens must be the ceiling 64: ${j2.usage.completion_tokens}`);
  // Prompt close to --ctx 256: generation is clamped to the room left.
  const unit = 'river stone cloud ';
  const p = async (k) => (await complete(s, req([user(unit.repeat(k))], { ...OFF, max_tokens: 1 }))).usage.prompt_tokens;
  const p10 = await p(10), p20 = await p(20);
  const per = (p20 - p10) / 10;
  assert(per > 0, 'prompt tokens do not grow with the prompt');
  const k = Math.floor(10 + (230 - p10) / per);
  const j3 = await complete(s, req([user(unit.repeat(k))], { ...OFF, max_tokens: 64 }));
  const room = 256 - j3.usage.prompt_tokens;
  assert(room > 0 && room < 64, `calibration: prompt ${j3.usage.prompt_tokens} tokens should leave 1..63 of 256`);
  assert(j3.usage.completion_tokens <= room, `completion_tokens ${j3.usage.completion_tokens} exceeds the room ${room} left by --ctx 256`);
});

await check('models.meta_context_length', async () => {
  const s = await limitsSrv();
  const r = await request(s, { path: '/v1/models' });
  const m = r.json?.data?.find((x) => x.id === MODEL_ID);
  eq(m?.meta?.context_length, 256, '/v1/models meta.context_length = --ctx');
  eq(m?.meta?.max_output_tokens, 64, '/v1/models meta.max_output_tokens = --max-tokens');
});

await check('privacy.no_key_in_logs', async () => {
  const s = await limitsSrv();
  await s.logSettled();
  assert(!s.log.includes(API_KEY), 'the API key appears in the server log');
  assert(!s.log.includes(WRONG_KEY), 'a presented (wrong) key appears in the server log');
});

// =============================================================================================
// Checkpoint files (4.8)
// =============================================================================================

const modeOf = (p) => fs.statSync(p).mode & 0o777;
await check('auth.env_key', async () => {
  const s = await diskSrv();
  expectError(await request(s, { path: '/v1/models', auth: false }), 401, 'invalid_api_key');
  eq((await request(s, { path: '/v1/models' })).status, 200, 'COLI_API_KEY from the environment');
});

// The checkpoint files live in a private subdirectory the server makes inside --ckpt-dir
// (docs/serving.md §3.10.4): the directory itself is never chmod-ed.
const ckptFiles = (dir) => {
  if (!fs.existsSync(dir)) return { subs: [], files: [] };
  const subs = fs.readdirSync(dir).filter((n) => n.startsWith('k3-ckpt-'));
  const files = subs.flatMap((d) => fs.readdirSync(path.join(dir, d)).map((f) => path.join(dir, d, f)));
  return { subs, files };
};

await check('ckpt.disk_files_private', async () => {
  const s = await diskSrv();
  const m1 = [user('Photos on disk, please.')];
  const r1 = await complete(s, req(m1, { ...OFF, max_tokens: 6 }));
  await complete(s, req([...m1, asAssistant(r1), user('More.')], { ...OFF, max_tokens: 6 }));
  const found = await waitUntil(`checkpoint files under ${CKDIR}`, async () => ckptFiles(CKDIR), (f) => f.files.length > 0);
  eq(found.subs.length, 4, 'one private subdirectory per session (--parallel 4)');
  eq(modeOf(CKDIR).toString(8), '700', 'a --ckpt-dir the server created is 0700');
  eq(modeOf(path.join(CKDIR, found.subs[0])).toString(8), '700', 'private subdirectory mode');
  for (const f of found.files) eq(modeOf(f).toString(8), '600', `mode of ${f}`);
});

await check('ckpt.disk_files_removed_on_exit', async () => {
  const s = await diskSrv();
  const e = await s.stop();
  eq(e, { code: 143, signal: null }, 'exit after SIGTERM');
  const left = fs.existsSync(CKDIR) ? fs.readdirSync(CKDIR) : [];
  eq(left, [], `files left in ${CKDIR} after a clean exit`);
});

await check('ckpt.keep', async () => {
  const s = await keepSrv();
  await complete(s, req([user('Keep my checkpoints.')], { ...OFF, max_tokens: 6 }));
  await waitUntil(`checkpoint files under ${CKDIR_KEEP}`, async () => ckptFiles(CKDIR_KEEP).files.length, (n) => n > 0);
  const e = await s.stop();
  eq(e, { code: 143, signal: null }, 'exit after SIGTERM');
  const { files } = ckptFiles(CKDIR_KEEP);
  assert(files.length > 0, '--ckpt-keep: checkpoints should survive the exit');
  for (const f of files) eq(modeOf(f).toString(8), '600', `mode of ${f}`);
});

// =============================================================================================
// Bind address (4.1) and shutdown (3.9)
// =============================================================================================

await check('bind.nonloopback_refused_without_key', async () => {
  const s = new Server(coli, modelDir, 'bind-refused', ['--host', '0.0.0.0']);
  allServers.push(s);
  s.spawnProcess();
  const e = await Promise.race([s.exited, sleep(20_000).then(() => null)]);
  if (!e) { await s.stop({ signal: 'SIGKILL' }); assert(false, '--host 0.0.0.0 without a key kept running'); }
  eq(e.code, 2, `exit code (stderr: ${s.err.trim().slice(0, 200)})`);
});

await check('bind.insecure_override', async () => {
  const s = new Server(coli, modelDir, 'bind-insecure', ['--host', '0.0.0.0', '--insecure-bind']);
  allServers.push(s);
  await s.start({ urlPattern: /(http:\/\/[^\s/]+:(\d+))/ });
  eq((await request(s, { path: '/health' })).status, 200, '/health');
  eq(await s.stop(), { code: 143, signal: null }, 'exit after SIGTERM');
});

await check('shutdown.sigterm_drains', async () => {
  const s = await queueSrv();
  const events = [];
  let onFirst;
  const first = new Promise((r) => { onFirst = r; });
  const pa = sse(s, req([user('Finish me during the drain.')], { ...OFF, max_tokens: 30, stream: true }),
                 { onEvent: (ev) => { events.push(ev); if (ev.kind === 'data') onFirst(); } });
  assert(await Promise.race([first.then(() => true), sleep(60_000).then(() => false)]), 'no data chunk within 60 s');
  const pb = chat(s, req([user('Queued at shutdown.')], { ...OFF, max_tokens: 4 })).catch((e) => ({ status: 0, error: e }));
  await waitQueued(s, 1);
  s.kill('SIGTERM');
  const rb = await pb;
  const st = await pa;
  const e = await s.exited;
  expectError(rb, 503, 'shutting_down');
  assert(rb.headers['retry-after'], '503 shutting_down lacks Retry-After (3.8)');
  const r = checkStream(st, { includeUsage: false, usageKeyRule: false });
  eq(r.finish, 'length', 'the active request runs to its end during the drain');
  eq(e, { code: 143, signal: null }, 'exit after SIGTERM');
});

// =============================================================================================
// End: logs, clean exits, model directory
// =============================================================================================

await check('privacy.no_prompt_in_logs', async () => {
  const s = await mainSrv();
  await s.logSettled();
  assert(!s.log.includes(CANARY), 'a prompt canary appears in the server log without --log-prompts');
});

// No --model and no COLI_MODEL: the built-in trained tiny K3 (assets/k3-mini of the source tree
// this coli was built from, this file's tree), named in the start-up line; it loads, answers a
// chat turn with its reasoning and reply, and nothing is written into it (it is committed).
await check('builtin.default_model', async () => {
  const builtin = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../assets/k3-mini');
  assert(fs.existsSync(path.join(builtin, 'config.json')), `the built-in model is missing: ${builtin}/config.json`);
  const before = listing(builtin);
  const s = new Server(coli, null, 'builtin', []);
  allServers.push(s);
  await s.start();
  // Each line is waited for: /health 200 does not mean the load line is written yet.
  const m = await s.waitForLine('out', /^coli serve: model: (.+) \(built-in trained tiny K3, no --model given\)$/m);
  eq(fs.realpathSync(m[1]), fs.realpathSync(builtin), 'the built-in model directory');
  const escaped = m[1].replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  await s.waitForLine('err', new RegExp(`${escaped} loaded in`));
  const j = await complete(s, req([user('Write a sentence about the river.')], { max_tokens: 64 }));
  const t = textOf(j);
  assert(t.reasoning.length > 0 || t.content.length > 0, `empty answer: ${show(j.choices[0])}`);
  await s.stop();
  eq(listing(builtin), before, 'built-in model directory listing before/after');
});

// Positive control for privacy.no_prompt_in_logs (which would pass on a server that logs nothing):
// with --log-prompts the request text does reach the log.
await check('privacy.log_prompts_flag', async () => {
  const s = new Server(coli, modelDir, 'log-prompts', ['--log-prompts']);
  allServers.push(s);
  await s.start();
  const canary = 'LOGGED-' + crypto.randomBytes(6).toString('hex');
  await complete(s, req([user(`Please log ${canary}.`)], { ...OFF, max_tokens: 2 }));
  await s.waitForLine('err', new RegExp(`^\\[prompt\\] \\S+ .*${canary}`, 'm'));   // fails (timeout) when it never comes
  await s.stop();
});

await check('shutdown.all_exit_143', async () => {
  const bad = [];
  await Promise.all(allServers.map(async (s) => {
    if (!s.proc || s.name === 'bind-refused') return;
    const e = await s.stop();
    if (!(e && e.code === 143 && e.signal === null)) bad.push(`${s.name}: ${show(e)}`);
  }));
  assert(bad.length === 0, `servers that did not exit 143 on SIGTERM: ${bad.join('; ')}`);
});

await check('model_dir.untouched', async () => {
  eq(listing(modelDir), modelListingBefore, 'model directory listing before/after (the server must not write there)');
});

cancelTimeout();
killAll();
const ok = R.summary();
// serve_util removes tmp at exit when the run passed, and only its model when it failed.
if (!ok) {
  for (const s of allServers) fs.writeFileSync(path.join(tmp, `${s.name}.log`), `${s.out}\n--- stderr ---\n${s.err}`);
  console.log(`(server logs kept in ${tmp})`);
}
process.exit(ok ? 0 : 1);

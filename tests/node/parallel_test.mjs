// `coli serve --parallel N` driven by the official `openai` npm client (issue 31): four concurrent
// streams on four sessions, each text equal to the same request run alone on a one-session server
// (greedy, and seeded sampling with a penalty); the decode steps batched them (/metrics);
// /slots lists every session; /health says how many are busy; the request log line names the
// session and the batch; 429 with Retry-After only once every session and the queue are taken.
//
//   node tests/node/parallel_test.mjs <path-to-coli>      (ctest: Serve.Parallel)
//
// Written from docs/serving.md §3.11 (sessions), not from the server's code. The overlap of the
// four streams is made certain by --token-delay-ms (a debug pause after every decode step): the
// checks wait on events and counters, never on elapsed time.
import path from 'node:path';
import {
  MODEL_ID, Runner, Server, assert, demoModel, eq, globalTimeout, killAll, request, show,
} from './serve_util.mjs';

const coliArg = process.argv[2];
if (!coliArg) {
  console.error('usage: node tests/node/parallel_test.mjs <path-to-coli>');
  process.exit(2);
}
const coli = path.resolve(coliArg);
let OpenAI;
try {
  ({ default: OpenAI } = await import('openai'));
} catch (e) {
  console.error(`FAIL: the npm test oracles are not installed (${e.code ?? e.message}).\n` +
                'Run `make test`: it installs them (npm ci --prefix tests/node) before running ctest.');
  process.exit(1);
}

const cancelTimeout = globalTimeout(Number(process.env.SERVE_TEST_TIMEOUT_S ?? 240) * 1000, 'parallel_test');
const R = new Runner('parallel_test');
const modelDir = demoModel(coli);

const client = (s) => new OpenAI({ apiKey: 'sk-local-dummy', baseURL: `${s.url}/v1`, maxRetries: 0, timeout: 120_000 });
const OFF = { chat_template_kwargs: { enable_thinking: false } };
const bodies = [
  { messages: [{ role: 'user', content: 'Name three rivers.' }], max_tokens: 24, temperature: 0 },
  { messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'A long story about the sea, the ships and the old harbour town, please.' }], max_tokens: 20, temperature: 0 },
  { messages: [{ role: 'user', content: 'Colours?' }], max_tokens: 16, temperature: 0.9, seed: 7, frequency_penalty: 0.4 },
  { messages: [{ role: 'user', content: 'Count from one to ten.' }], max_tokens: 28, temperature: 0.7, top_p: 0.9, seed: 99 },
].map((b) => ({ model: MODEL_ID, ...OFF, ...b }));

// One streamed answer through the SDK: its text and the chunks' count.
async function streamed(s, body) {
  const stream = await client(s).chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = '', reasoning = '', usage = null, finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    text += c.delta?.content ?? '';
    reasoning += c.delta?.reasoning_content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { text, reasoning, usage, finish };
}

const metric = (text, name) => {
  const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
};

const servers = [];
const start = async (name, flags) => {
  const s = new Server(coli, modelDir, name, flags);
  servers.push(s);
  return s.start();
};

try {
  const [par, solo] = await Promise.all([
    start('parallel4', ['--parallel', '4', '--token-delay-ms', '5']),
    start('solo', ['--parallel', '1']),
  ]);

  await R.check('four concurrent streams equal their solo runs', async () => {
    const alone = [];
    for (const b of bodies) alone.push(await streamed(solo, b));
    const together = await Promise.all(bodies.map((b) => streamed(par, b)));
    together.forEach((t, i) => {
      eq(t.text, alone[i].text, `stream ${i} content (batched vs alone)`);
      eq(t.reasoning, alone[i].reasoning, `stream ${i} reasoning (batched vs alone)`);
      eq(t.finish, alone[i].finish, `stream ${i} finish_reason`);
      eq(t.usage?.completion_tokens, alone[i].usage?.completion_tokens, `stream ${i} completion_tokens`);
    });
    assert(alone.some((a) => a.text.length > 0), 'the solo answers are all empty');
    const m = (await request(par, { path: '/metrics' })).text;
    eq(metric(m, 'k3_sessions'), 4, 'k3_sessions');
    assert(metric(m, 'k3_decode_rows_total') > metric(m, 'k3_decode_steps_total'),
           () => `no decode step fed more than one session:\n${m.split('\n').filter((l) => /k3_decode/.test(l)).join('\n')}`);
  });

  await R.check('/slots lists every session, /health the busy count, the log line the session and batch', async () => {
    const slots = (await request(par, { path: '/slots' })).json;
    assert(Array.isArray(slots) && slots.length === 4, `/slots should list 4 sessions: ${show(slots)}`);
    eq(slots.map((s) => s.id).join(','), '0,1,2,3', '/slots ids');
    for (const s of slots) {
      eq(s.state, 'idle', `session ${s.id} state`);
      eq(s.requests, 1, `session ${s.id} requests (one stream each)`);
      assert(s.prompt_tokens > 0 && s.generated_tokens >= 0 && s.fed_tokens > 0, `session ${s.id} figures: ${show(s)}`);
      assert(typeof s.last_used_s_ago === 'number', `session ${s.id} last_used_s_ago: ${show(s)}`);
    }
    const h = (await request(par, { path: '/health' })).json;
    eq(h.scheduler?.capacity, 4, '/health scheduler.capacity');
    eq(h.scheduler?.busy, 0, '/health scheduler.busy');
    await par.logSettled();
    const lines = par.err.split('\n').filter((l) => /POST \/v1\/chat\/completions 200/.test(l));
    assert(lines.length >= 4, `expected 4 request log lines:\n${par.err.slice(-1500)}`);
    const sessions = new Set(lines.map((l) => (l.match(/ session=(\d+)/) ?? [])[1]));
    eq([...sessions].sort().join(','), '0,1,2,3', 'sessions named by the log lines');
    assert(lines.some((l) => /batch_max=[2-4]\b/.test(l)), `no log line shows a batch of more than one:\n${lines.join('\n')}`);
  });

  await R.check('429 with Retry-After only when every session and the queue are taken', async () => {
    const busy = await start('busy2', ['--parallel', '2', '--max-queue', '0', '--token-delay-ms', '40']);
    const long = { ...bodies[0], max_tokens: 200 };
    const controllers = [new AbortController(), new AbortController()];
    const first = [];
    // Two streams hold both sessions; each is known to run once its first chunk arrived.
    const streams = await Promise.all(controllers.map((c) => client(busy).chat.completions.create(
      { ...long, stream: true }, { signal: c.signal })));
    for (const s of streams) {
      const it = s[Symbol.asyncIterator]();
      first.push(it);
      await it.next();
    }
    const h = (await request(busy, { path: '/health' })).json;
    eq(h.scheduler?.busy, 2, '/health scheduler.busy while two stream');
    const third = await request(busy, { method: 'POST', path: '/v1/chat/completions', body: { ...bodies[0], max_tokens: 2 } });
    eq(third.status, 429, `third request with 2 sessions and --max-queue 0: ${third.text}`);
    assert(/^\d+$/.test(String(third.headers['retry-after'] ?? '')), `Retry-After missing: ${show(third.headers)}`);
    eq(third.json?.error?.code, 'queue_full', 'error.code');
    controllers.forEach((c) => c.abort());
  });
} finally {
  await Promise.all(servers.map((s) => s.stop()));
  cancelTimeout();
  killAll();
}
process.exit(R.summary() ? 0 : 1);

// How the programs end on SIGTERM (docs/serving.md §3.9, issue 28 item 11, issue 29): `coli serve`
// drains, and a drain that reaches --drain-timeout cancels the running request, whose stream ends
// with an OpenAI-valid finish_reason ("length") and `data: [DONE]`; during the drain a new
// connection gets 503 (generations, /health and /v1/health alike); a second SIGTERM ends the
// running stream with its terminator (Anthropic's message_stop) and the process at once; and every
// program exits 143: coli serve, coli chat, k3_synth, k3_repack (kimi_k3: stop_during_load_test).
//
//   node tests/node/serve_shutdown_test.mjs <path-to-coli>
//   (ctest: Serve.Shutdown; synchronised on events: a stream's first chunk, a stderr line, a
//   process's signal mask, never a fixed sleep)
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import {
  Runner, Server, assert, demoModel, eq, expectError, globalTimeout, killAll, makeTempDir, request,
  show, sse,
} from './serve_util.mjs';

const coliArg = process.argv[2];
if (!coliArg) {
  console.error('usage: node tests/node/serve_shutdown_test.mjs <path-to-coli>');
  process.exit(2);
}
const coli = path.resolve(coliArg);
const tools = path.resolve(path.dirname(coli), '..', 'tools');
const cancelTimeout = globalTimeout(Number(process.env.SERVE_TEST_TIMEOUT_S ?? 180) * 1000, 'serve_shutdown');

const R = new Runner('serve_shutdown');
const tmp = makeTempDir('coli-serve-shutdown-');
const modelDir = demoModel(coli);

// OpenAI's finish_reason enum (the chat completion chunk schema).
const FINISH_REASONS = ['stop', 'length', 'tool_calls', 'content_filter', 'function_call'];
// A generation far longer than any check waits for: 40 ms a token, 4000 tokens.
const SLOW = ['--token-delay-ms', '40'];
const LONG = 4000;

// Resolves `p`, or rejects naming `what` after `ms` (a bound on a hang, not a timing assertion).
function within(p, ms, what) {
  let t;
  return Promise.race([p, new Promise((_, reject) => { t = setTimeout(() => reject(new Error(`${what}: nothing within ${ms / 1000} s`)), ms); })])
    .finally(() => clearTimeout(t));
}

// A stream that resolves `started` on its first data event.
function openStream(srv, body, opts = {}) {
  let started;
  const first = new Promise((r) => { started = r; });
  const done = sse(srv, body, { ...opts, onEvent: (ev) => { if (ev.kind === 'data') started(); } });
  return { first, done };
}

// During the drain: generations (OpenAI and Anthropic) and a new connection's /health and
// /v1/health are 503s with Retry-After.
async function expectDrainRefusals(s) {
  const refused = await request(s, { method: 'POST', path: '/v1/chat/completions', body: { model: 'm', messages: [{ role: 'user', content: 'late' }], max_tokens: 2 } });
  expectError(refused, 503, 'shutting_down');
  assert(refused.headers['retry-after'], '503 shutting_down without Retry-After');
  const anthropic = await request(s, { method: 'POST', path: '/v1/messages', body: { model: 'm', max_tokens: 2, messages: [{ role: 'user', content: 'late' }] } });
  eq(anthropic.status, 503, `/v1/messages during the drain: ${show(anthropic.text)}`);
  eq(anthropic.json?.type, 'error', 'the Anthropic envelope');
  for (const p of ['/health', '/v1/health']) {
    const h = await request(s, { path: p, auth: false });
    eq(h.status, 503, `${p} during the drain`);
    eq(h.json?.status, 'stopping', `${p} status`);
    assert(h.headers['retry-after'], `${p}: 503 without Retry-After`);
  }
}

await R.check('drain_timeout.cancels_the_stream_with_a_valid_finish_reason', async () => {
  const s = await new Server(coli, modelDir, 'drain-timeout', [...SLOW, '--drain-timeout', '1']).start();
  const st = openStream(s, { model: 'm', messages: [{ role: 'user', content: 'Talk for a long time.' }], max_tokens: LONG, stream: true, stream_options: { include_usage: true } });
  await within(st.first, 30_000, 'the first chunk');
  s.kill('SIGTERM');
  await s.waitForStderr(/draining/);
  await s.waitForStderr(/drain timeout: cancelling the active request/, 20_000);
  const r = await within(st.done, 20_000, 'the stream after the drain timeout');
  const exit = await within(s.exited, 20_000, 'the exit after the drain timeout');
  assert(r.endedCleanly, `the stream was cut: ${show(r.events.slice(-2))}`);
  const data = r.events.filter((e) => e.kind === 'data').map((e) => e.json);
  const finishes = data.flatMap((c) => c.choices ?? []).map((c) => c.finish_reason).filter((f) => f !== null);
  eq(finishes, ['length'], 'the finish_reason of the cancelled stream');
  assert(FINISH_REASONS.includes(finishes[0]), `not an OpenAI finish_reason: ${finishes[0]}`);
  const usage = data.at(-1);
  assert(usage?.usage && usage.usage.completion_tokens < LONG, `the request ran to its end: ${show(usage)}`);
  eq(usage.x_k3?.finish, 'cancelled', 'x_k3.finish');
  eq(r.events.at(-1).kind, 'done', 'the stream ends with data: [DONE]');
  eq(exit, { code: 143, signal: null }, 'exit after SIGTERM');
});

await R.check('second_sigterm.ends_the_stream_with_its_terminator_at_once', async () => {
  const s = await new Server(coli, modelDir, 'second-sigterm', [...SLOW, '--drain-timeout', '600']).start();
  const st = openStream(s, { model: 'm', max_tokens: LONG, stream: true, messages: [{ role: 'user', content: 'Talk for a long time.' }] },
    { path: '/v1/messages', headers: { 'anthropic-version': '2023-06-01' } });
  await within(st.first, 30_000, 'the first event');
  s.kill('SIGTERM');
  await s.waitForStderr(/draining/);
  await expectDrainRefusals(s);
  assert(!s.exit, 'the server left before the drain ended');
  s.proc.kill('SIGTERM');  // the second one
  const r = await within(st.done, 20_000, 'the stream after a second SIGTERM (the drain timeout is 600 s)');
  const exit = await within(s.exited, 20_000, 'the exit after a second SIGTERM');
  assert(/SIGTERM again/.test(s.err), `no second-signal line: ${show(s.err)}`);
  assert(r.endedCleanly, `the stream was cut: ${show(r.events.slice(-2))}`);
  const types = r.events.filter((e) => e.kind === 'data').map((e) => e.json.type);
  eq(types.slice(-2), ['message_delta', 'message_stop'], 'the last events');
  const delta = r.events.filter((e) => e.kind === 'data').at(-2).json;
  eq(delta.delta.stop_reason, 'max_tokens', 'stop_reason of the cancelled reply');
  assert(delta.usage.output_tokens < LONG, `the request ran to its end: ${show(delta)}`);
  eq(exit, { code: 143, signal: null }, 'exit after a second SIGTERM');
});

// Starts `argv`, waits for `ready` (a predicate over the process, checked on every chunk of output
// and every 5 ms), sends SIGTERM and resolves {code, signal}.
function termWhen(argv, ready, { input = false } = {}) {
  return new Promise((resolve, reject) => {
    const p = spawn(argv[0], argv.slice(1), { stdio: [input ? 'pipe' : 'ignore', 'pipe', 'pipe'] });
    let out = '';
    let sent = false;
    p.stdout.setEncoding('utf8');
    p.stderr.setEncoding('utf8');
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { out += d; });
    const poll = setInterval(() => {
      if (sent || p.exitCode !== null) return;
      if (ready(p, out)) { sent = true; p.kill('SIGTERM'); }
    }, 5);
    p.on('error', reject);
    p.on('exit', (code, signal) => {
      clearInterval(poll);
      resolve({ code, signal, sent, out: out.slice(-600) });
    });
  });
}

// The handler is in place once the kernel says SIGTERM is caught (/proc/<pid>/status SigCgt).
function catchesSigterm(p) {
  try {
    const m = fs.readFileSync(`/proc/${p.pid}/status`, 'utf8').match(/^SigCgt:\s*([0-9a-f]+)$/m);
    return m !== null && (BigInt('0x' + m[1]) & (1n << 14n)) !== 0n;
  } catch { return false; }
}

await R.check('every_program.exits_143', async () => {
  const results = {};
  // coli chat: loaded, waiting for a line on its (piped) stdin.
  results.coli_chat = await termWhen([coli, 'chat', '--model', modelDir], (p, out) => /loaded/.test(out), { input: true });
  // k3_synth: the "writing" line comes first (flushed), then seconds of writing.
  results.k3_synth = await termWhen([path.join(tools, 'k3_synth'), '--preset', 'demo', '--out', path.join(tmp, 'synth')],
    (p, out) => /k3_synth: writing/.test(out));
  // k3_repack: signalled once its handler is installed, a second into a repack that takes longer.
  results.k3_repack = await termWhen([path.join(tools, 'k3_repack'), modelDir, path.join(tmp, 'repacked')], (p) => catchesSigterm(p));
  for (const [name, r] of Object.entries(results)) {
    assert(r.sent, `${name} ended before it could be signalled: ${show(r)}`);
    eq({ code: r.code, signal: r.signal }, { code: 143, signal: null }, `${name} on SIGTERM (${r.out})`);
  }
});

cancelTimeout();
killAll();
process.exit(R.summary() ? 0 : 1);

// Two `coli serve` replicas behind Debian's nginx with deploy/nginx/k3-replicas.conf
// (docs/scale-out.md §1): conversation affinity, spread, failover to the surviving replica, and
// /health as the readiness probe.
//
// The configuration runs unchanged except for its upstream's server lines (the replicas' loopback
// ports) and its listen port; nginx runs unprivileged in the foreground with its own prefix, pid
// file, logs and temp directories under a temp directory. Which replica answered a request is read
// from the replicas' own request logs (the x-request-id nginx passes back), not from nginx.
//
// usage: node tests/node/replicas_test.mjs <path-to-coli> [<path-to-nginx>]
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  MODEL_ID, Runner, Server, assert, chat, demoModel, eq, globalTimeout, killAll, makeTempDir,
  request, show,
} from './serve_util.mjs';

const coliArg = process.argv[2];
if (!coliArg) {
  console.error('usage: node tests/node/replicas_test.mjs <path-to-coli> [<path-to-nginx>]');
  process.exit(2);
}
const coli = path.resolve(coliArg);
const nginxBin = process.argv[3] ?? '/usr/sbin/nginx';
if (!fs.existsSync(nginxBin)) {
  console.error(`FAIL: nginx not found at ${nginxBin} (scripts/setup.sh --test installs Debian's nginx)`);
  process.exit(1);
}
const here = path.dirname(fileURLToPath(import.meta.url));
const template = path.resolve(here, '..', '..', 'deploy', 'nginx', 'k3-replicas.conf');

const cancelTimeout = globalTimeout(Number(process.env.REPLICAS_TEST_TIMEOUT_S ?? 150) * 1000, 'replicas_test');
const R = new Runner('replicas_test');
const tmp = makeTempDir('k3-replicas-test-');
const modelDir = demoModel(coli);

// ---- the replicas and nginx -----------------------------------------------------------------

const replicas = [new Server(coli, modelDir, 'replica-a'), new Server(coli, modelDir, 'replica-b')];
await Promise.all(replicas.map((s) => s.start()));

const freePort = () => new Promise((resolve, reject) => {
  const s = net.createServer();
  s.on('error', reject);
  s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
});

// The shipped file with the replicas' ports and a loopback listen port put in; everything else as is.
function instantiate(text, ports, listenPort) {
  let servers = 0;
  let i = 0;
  const lines = text.split('\n').map((line) => {
    const m = line.match(/^(\s*)server\s+\S+:\d+(\s.*)?;$/);
    if (!m) return line;
    servers++;
    return i < ports.length ? `${m[1]}server 127.0.0.1:${ports[i++]}${m[2] ?? ''};` : null;
  }).filter((l) => l !== null);
  eq(servers, 2, `upstream server lines in ${template}`);
  let listens = 0;
  const out = lines.join('\n').replace(/^(\s*)listen\s+\d+;$/m, (_, ws) => { listens++; return `${ws}listen 127.0.0.1:${listenPort};`; });
  eq(listens, 1, `listen lines in ${template}`);
  return out;
}

const nginxDir = path.join(tmp, 'nginx');
fs.mkdirSync(nginxDir);
const nginxPort = await freePort();
fs.writeFileSync(path.join(nginxDir, 'k3-replicas.conf'),
                 instantiate(fs.readFileSync(template, 'utf8'), replicas.map((s) => s.port), nginxPort));
const tempPaths = ['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']
  .map((k) => `  ${k}_temp_path ${path.join(nginxDir, k)};`).join('\n');
fs.writeFileSync(path.join(nginxDir, 'nginx.conf'), `daemon off;
master_process off;
pid ${path.join(nginxDir, 'nginx.pid')};
error_log ${path.join(nginxDir, 'error.log')} info;
events { worker_connections 128; }
http {
  access_log ${path.join(nginxDir, 'access.log')};
${tempPaths}
  include ${path.join(nginxDir, 'k3-replicas.conf')};
}
`);
const nginxProc = spawn(nginxBin, ['-p', nginxDir, '-c', path.join(nginxDir, 'nginx.conf'), '-e', path.join(nginxDir, 'error.log')],
                        { stdio: ['ignore', 'pipe', 'pipe'] });
let nginxOut = '';
nginxProc.stdout.on('data', (d) => { nginxOut += d; });
nginxProc.stderr.on('data', (d) => { nginxOut += d; });
let nginxExit = null;
nginxProc.on('exit', (code, signal) => { nginxExit = { code, signal }; });
const stopNginx = () => { if (nginxExit === null) nginxProc.kill('SIGKILL'); };
process.on('exit', stopNginx);
const nginxLog = () => {
  let e = '';
  try { e = fs.readFileSync(path.join(nginxDir, 'error.log'), 'utf8'); } catch { /* none yet */ }
  return `${nginxOut}${e}`.slice(-2000);
};

// nginx writes nothing when it is up: poll its port (bounded) until it accepts a connection.
const lb = { port: nginxPort, authHeaders: {} };
{
  const t0 = Date.now();
  for (;;) {
    const ok = await new Promise((resolve) => {
      const c = net.connect({ host: '127.0.0.1', port: nginxPort });
      c.on('connect', () => { c.destroy(); resolve(true); });
      c.on('error', () => resolve(false));
    });
    if (ok) break;
    if (nginxExit) { console.log(`FAIL  nginx exited (${show(nginxExit)}):\n${nginxLog()}`); process.exit(1); }
    if (Date.now() - t0 > 20_000) { console.log(`FAIL  nginx not listening within 20 s:\n${nginxLog()}`); killAll(); stopNginx(); process.exit(1); }
    await new Promise((r) => setTimeout(r, 20));
  }
}

// ---- helpers ----------------------------------------------------------------------------------

const user = (content) => ({ role: 'user', content });
const body = (messages) => ({ model: MODEL_ID, messages, temperature: 0, max_tokens: 8,
                              chat_template_kwargs: { enable_thinking: false } });
const conv = (id) => ({ 'x-conversation-id': id });

// Which replica answered: the one whose request log holds the x-request-id nginx passed back
// (checked on every chunk the replicas write, bounded).
function servedBy(r, what) {
  const rid = r.headers['x-request-id'];
  if (!rid) return Promise.reject(new Error(`${what}: no x-request-id (${r.status} ${show(r.text)})\n${nginxLog()}`));
  const re = new RegExp(`^\\[http\\] ${rid} `, 'm');
  const pipes = replicas.filter((s) => s.proc && !s.exit).map((s) => s.proc.stderr);
  return new Promise((resolve, reject) => {
    const done = () => { clearTimeout(timer); for (const p of pipes) p.off('data', look); };
    const look = () => {
      const s = replicas.find((x) => re.test(x.err));
      if (s) { done(); resolve(s); }
    };
    const timer = setTimeout(() => { done(); reject(new Error(`${what}: request ${rid} is in no replica's log after 10 s\n${nginxLog()}`)); }, 10_000);
    for (const p of pipes) p.on('data', look);
    look();
  });
}

async function turn(id, messages, what) {
  const r = await chat(lb, body(messages), { headers: conv(id) });
  assert(r.status === 200, `${what}: HTTP ${r.status} ${show(r.text)}\n${nginxLog()}`);
  return { r, j: r.json, by: await servedBy(r, what) };
}
const reply = (j) => j.choices[0].message.content ?? '';
const cached = (j) => j.usage?.prompt_tokens_details?.cached_tokens;

// ---- checks -----------------------------------------------------------------------------------

// Affinity keys → replica, with a cheap request (GET /v1/models is logged, generates nothing): the
// same key twice reaches the same replica, and 12 keys reach both.
async function mapKeys(headersOf, what) {
  const m = new Map();
  for (let i = 0; i < 12; i++) {
    const r = await request(lb, { path: '/v1/models', headers: headersOf(i) });
    eq(r.status, 200, `GET /v1/models, ${what} ${i}`);
    const s = await servedBy(r, `${what} ${i}`);
    const again = await request(lb, { path: '/v1/models', headers: headersOf(i) });
    const s2 = await servedBy(again, `${what} ${i} again`);
    assert(s2 === s, `${what} ${i} moved between two requests: ${s.name}, then ${s2.name}`);
    m.set(i, s);
  }
  for (const s of replicas) {
    assert([...m.values()].includes(s), `12 ${what}s all hashed to one replica: ${[...m.values()].map((v) => v.name).join(' ')}`);
  }
  return m;
}
const where = new Map();
await R.check('affinity.conversation_header', async () => {
  for (const [i, s] of await mapKeys((i) => conv(`conv-${i}`), 'conversation id')) where.set(`conv-${i}`, s);
});
// Without a conversation header, the API key (Authorization) is the key.
await R.check('affinity.api_key_fallback', async () => {
  await mapKeys((i) => ({ authorization: `Bearer sk-user-${i}` }), 'API key');
});

// One conversation on each replica; turn 2 lands where turn 1 did and reuses its prefix.
const convs = [];
await R.check('affinity.follow_up_turns_stay', async () => {
  for (const s of replicas) {
    const id = [...where.entries()].find(([, v]) => v === s)?.[0];
    assert(id, `no conversation id on ${s.name}`);
    const m1 = [user(`Tell me about rivers (${id}).`)];
    const t1 = await turn(id, m1, `${id} turn 1`);
    assert(t1.by === s, `${id} turn 1 on ${t1.by.name}, expected ${s.name}`);
    const m2 = [...m1, { role: 'assistant', content: reply(t1.j) }, user('And lakes?')];
    const t2 = await turn(id, m2, `${id} turn 2`);
    assert(t2.by === s, `${id} turn 2 on ${t2.by.name}, turn 1 on ${s.name}`);
    assert(cached(t2.j) > 0, `${id} turn 2: cached_tokens ${cached(t2.j)} (usage ${show(t2.j.usage)})`);
    convs.push({ id, s, m2, reply2: reply(t2.j) });
  }
  eq(convs.length, 2, 'conversations');
});

// Stopping a replica moves its conversations to the other one: cold there (cached_tokens 0), and
// the same greedy answer (reuse equals cold: docs/serving.md §3.10).
await R.check('failover.stopped_replica', async () => {
  assert(convs.length === 2, 'needs affinity.follow_up_turns_stay');
  const [gone, kept] = convs;
  const e = await gone.s.stop();
  eq(e.code, 143, `${gone.s.name} exit status after SIGTERM`);
  const t = await turn(gone.id, gone.m2, `${gone.id} turn 2 after ${gone.s.name} stopped`);
  assert(t.by === kept.s, `${gone.id} after the stop served by ${t.by.name}`);
  eq(cached(t.j), 0, `${gone.id} on ${kept.s.name}: cached_tokens`);
  eq(reply(t.j), gone.reply2, `${gone.id} turn 2: the answer on ${kept.s.name} vs on ${gone.s.name}`);
  // The surviving replica keeps its own conversation.
  const k = await turn(kept.id, kept.m2, `${kept.id} turn 2 again`);
  assert(k.by === kept.s, `${kept.id}: served by ${k.by.name}, expected ${kept.s.name}`);
  eq(reply(k.j), kept.reply2, `${kept.id} turn 2 answer again`);
});

// A replica coming back is not ready while it loads: /health answers 503 "loading" (the readiness
// probe), and its conversations are still answered by the other replica.
await R.check('readiness.loading_replica', async () => {
  const [gone, kept] = convs;
  const port = gone.s.port;
  const back = new Server(coli, modelDir, `${gone.s.name}-restarted`, [],
                          { env: { K3_LOAD_DELAY_MS: '2000' }, listenPort: port });
  replicas[replicas.indexOf(gone.s)] = back;
  back.spawnProcess();
  await back.waitListening();
  eq(back.port, port, 'restarted replica port');
  const h = await request(back, { path: '/health' });
  eq([h.status, h.json?.status], [503, 'loading'], `${back.name} /health while loading`);
  const t = await turn(gone.id, gone.m2, `${gone.id} while ${back.name} loads`);
  assert(t.by === kept.s, `${gone.id} while its replica loads: served by ${t.by.name}`);
  eq(reply(t.j), gone.reply2, `${gone.id} turn 2 answer`);
  await back.stop({ signal: 'SIGKILL' });
});

stopNginx();
killAll();
cancelTimeout();
process.exit(R.summary() ? 0 : 1);

// The transport of `coli serve` under abuse (docs/serving.md §4.6, §4.10), over raw sockets:
// client ports reused across many connections never get a 400, a second server cannot bind a
// port in use, a load that fails at once ends the process, /health answers while one client
// holds slow connections, the listen backlog, framing and header refusals (400 / 431 / 408), a
// declared body is read whatever the method or path (never parsed as the next request), the
// strict head and chunk framing of RFC 9112 (400 and close), a garbage request line closes the
// connection, a half-closed client still gets its answer, the API-key brake counts only wrong
// keys (any loopback address is one client, the right key always passes), memory after rounds of
// concurrent large bodies, and the --host / --api-key-file checks.
//
//   node tests/node/serve_transport_test.mjs <path-to-coli>
//   (ctest: Serve.Transport; SERVE_TRANSPORT_CONNECTIONS sets the connection count of the first
//   check, 20000 by default; docs/serving.md §4.10 gives the 100000 run)
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import {
  MODEL_ID, Runner, Server, assert, demoModel, eq, globalTimeout, killAll, makeTempDir, rawSocket,
  request, show, sleep,
} from './serve_util.mjs';

const coliArg = process.argv[2];
if (!coliArg) {
  console.error('usage: node tests/node/serve_transport_test.mjs <path-to-coli>');
  process.exit(2);
}
const coli = path.resolve(coliArg);
const cancelTimeout = globalTimeout(Number(process.env.SERVE_TEST_TIMEOUT_S ?? 300) * 1000, 'serve_transport');
const CONNECTIONS = Number(process.env.SERVE_TRANSPORT_CONNECTIONS ?? 20000);

const R = new Runner('serve_transport');
const tmp = makeTempDir('coli-serve-transport-');
const modelDir = demoModel(coli);

// One HTTP exchange on a socket from `localPort` (0: any). Resolves {status, ms, error}.
function exchange(port, text, { localPort = 0, timeoutMs = 10_000 } = {}) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const parts = Array.isArray(text) ? text : [text];
    let sent = 1;
    const sock = net.connect({ host: '127.0.0.1', port, ...(localPort ? { localPort } : {}) });
    let buf = '';
    let done = false;
    const finish = (error) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      const m = buf.match(/^HTTP\/1\.1 (\d{3})/);
      const statuses = [...buf.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((x) => Number(x[1]));
      resolve({ status: m ? Number(m[1]) : 0, statuses, ms: performance.now() - t0, error, text: buf });
    };
    const timer = setTimeout(() => finish('timeout'), timeoutMs);
    sock.setEncoding('latin1');
    sock.on('connect', () => sock.write(parts[0]));
    sock.on('data', (d) => {
      buf += d;
      // Every request on the socket answered: the last response is complete.
      const n = parts.length;
      const answers = buf.split(/HTTP\/1\.1 \d{3}/).length - 1;
      if (!/\r\n\r\n\{[^]*\}\s*$/.test(buf)) return;
      if (answers >= n) finish(null);
      else if (answers > sent - 1) sock.write(parts[sent++]);
    });
    sock.on('error', (e) => finish(e.code ?? e.message));
    sock.on('close', () => finish(null));
  });
}

const HEALTH = 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n';
const HEALTH_CLOSE = 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n';

const srv = await new Server(coli, modelDir, 'transport', ['--read-deadline', '3']).start();

await R.check(`transport.${CONNECTIONS}_connections_zero_400`, async () => {
  // Half close after one request (the server closes first), half keep-alive with three requests
  // (the client closes). The closing half reuses a small set of client ports, so many
  // connections share an address and port with an earlier one.
  const counts = {};
  let next = 0;
  const t0 = performance.now();
  let maxMs = 0, requests = 0;
  const worker = async (w) => {
    for (let i = next++; i < CONNECTIONS; i = next++) {
      const close = i % 2 === 0;
      const text = close ? HEALTH_CLOSE : [HEALTH, HEALTH, HEALTH];
      const localPort = close ? 40000 + w * 50 + ((i >> 1) % 50) : 0;
      let r = await exchange(srv.port, text, { localPort });
      if (r.error === 'EADDRINUSE' || r.error === 'EADDRNOTAVAIL') r = await exchange(srv.port, text);
      const expected = close ? 1 : 3;
      for (const st of r.statuses) counts[st] = (counts[st] ?? 0) + 1;
      if (r.statuses.length < expected) counts[`missing (${r.error})`] = (counts[`missing (${r.error})`] ?? 0) + expected - r.statuses.length;
      requests += expected;
      maxMs = Math.max(maxMs, r.ms);
    }
  };
  await Promise.all(Array.from({ length: 8 }, (_, w) => worker(w)));
  const s = (performance.now() - t0) / 1000;
  console.log(`      ${CONNECTIONS} connections, ${requests} requests in ${s.toFixed(1)} s (${Math.round(CONNECTIONS / s)} connections/s), slowest ${maxMs.toFixed(0)} ms: ${show(counts)}`);
  assert(!counts['400'], `400 answers: ${show(counts)}`);
  assert(counts['200'] === requests, `not every request got 200: ${show(counts)}`);
});

await R.check('transport.listen_backlog', async () => {
  const r = spawnSync('ss', ['-ltnH', `sport = :${srv.port}`], { encoding: 'utf8' });
  assert(r.status === 0, `ss failed: ${r.stderr}`);
  const backlog = Number(r.stdout.trim().split(/\s+/)[2]);
  assert(backlog >= 128, `listen backlog ${backlog} (ss: ${r.stdout.trim()})`);
});

await R.check('transport.second_server_on_the_port_refused', async () => {
  const r = spawnSync(coli, ['serve', '--model', modelDir, '--port', String(srv.port)], { encoding: 'utf8', timeout: 60_000 });
  assert(r.status !== 0 && r.status !== null, `second server exited ${r.status} ${r.signal}: ${r.stderr}`);
  assert(/in use/i.test(r.stderr) && r.stderr.includes(String(srv.port)), `message: ${r.stderr}`);
  const h = await request(srv, { path: '/health' });
  assert(h.status === 200, `first server: ${h.status}`);
});

await R.check('transport.fast_load_failure_exits', async () => {
  // The load fails at once, maybe before the listener runs: the process must still end. The
  // directory passes coli's first look (config.json and a shard are there; a path that does not
  // exist stops before the server starts, options.h check_model_dir) and fails to load.
  const broken = path.join(tmp, 'broken');
  fs.mkdirSync(broken, { recursive: true });
  fs.writeFileSync(path.join(broken, 'config.json'), '{');
  fs.writeFileSync(path.join(broken, 'model.safetensors'), 'not a shard');
  const runs = await Promise.all(Array.from({ length: 16 }, () => new Promise((resolve) => {
    const p = spawn(coli, ['serve', '--model', broken, '--port', '0'], { stdio: 'ignore' });
    const t = setTimeout(() => { p.kill('SIGKILL'); resolve('hung'); }, 20_000);
    p.on('exit', (code) => { clearTimeout(t); resolve(code); });
  })));
  assert(runs.every((c) => c === 3), `exit codes: ${show(runs)}`);
});

await R.check('transport.health_answers_while_one_client_holds_slow_connections', async () => {
  const slow = await new Server(coli, modelDir, 'slowloris', ['--read-deadline', '60']).start();
  const sockets = [];
  try {
    // 100 connections (the cap is 64) dripping a request head a byte at a time; the probes start
    // once every one of them is connected (or already refused).
    const settled = [];
    for (let i = 0; i < 100; ++i) {
      const s = net.connect({ host: '127.0.0.1', port: slow.port });
      s.on('error', () => {});
      settled.push(new Promise((resolve) => { s.once('connect', resolve); s.once('close', resolve); }));
      sockets.push(s);
    }
    const drip = setInterval(() => { for (const s of sockets) if (!s.destroyed) s.write('X'); }, 200);
    for (const s of sockets) s.write('GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ');
    await Promise.all(settled);
    const probes = [];
    for (let i = 0; i < 20; ++i) probes.push(await exchange(slow.port, HEALTH_CLOSE, { timeoutMs: 5000 }));
    clearInterval(drip);
    const ok = probes.filter((p) => p.status === 200).length;
    console.log(`      /health under 100 slow connections: ${ok}/20 answered, slowest ${Math.max(...probes.map((p) => p.ms)).toFixed(0)} ms`);
    assert(ok === 20, `probes: ${show(probes.map((p) => p.status || p.error))}`);
  } finally {
    for (const s of sockets) s.destroy();
    await slow.stop();
  }
});

await R.check('transport.framing_and_header_refusals', async () => {
  const post = (extra, body = '{}') =>
    `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n${extra}\r\n${body}`;
  const twoLengths = await rawSocket(srv.port, [post('Content-Length: 2\r\nContent-Length: 30\r\n')]);
  assert(twoLengths.status === 400 && /invalid_framing/.test(twoLengths.text), `two lengths: ${show(twoLengths.text)}`);
  const teCl = await rawSocket(srv.port, [post('Content-Length: 7\r\nTransfer-Encoding: chunked\r\n', '2\r\n{}\r\n0\r\n\r\n')]);
  assert(teCl.status === 400 && /invalid_framing/.test(teCl.text), `TE+CL: ${show(teCl.text)}`);
  const big = await rawSocket(srv.port, [`GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`]);
  assert(big.status === 431 && /headers_too_large/.test(big.text), `20 KB header: ${show(big.text)}`);
  const many = await rawSocket(srv.port, [`GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n${'X-A: b\r\n'.repeat(4000)}\r\n`]);
  assert(many.status === 431, `32 KB of headers: ${show(many.text)}`);
  // The body stops after 2 of 100 bytes: 408 once the read deadline (3 s here) passes. A request
  // head that never ends: 408, not a silent close. (Both connections wait out the deadline at once.)
  const [stalled, head] = await Promise.all([
    rawSocket(srv.port, [post('Content-Length: 100\r\n', '{"')], { readTimeoutMs: 10_000 }),
    rawSocket(srv.port, ['GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n'], { readTimeoutMs: 10_000 }),
  ]);
  assert(stalled.status === 408 && /request_timeout/.test(stalled.text), `stalled body: ${show(stalled.text)}`);
  assert(head.status === 408 && head.closed, `stalled head: ${show(head.text)}`);
});

// The statuses of the responses on one connection, in order.
const statusesOf = (text) => [...text.matchAll(/HTTP\/1\.[01] (\d{3})/g)].map((m) => Number(m[1]));
// A request that closes the connection once answered: nothing sent after it is read.
const LAST = 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n';
// What a proxy in front would take for a body, and the server for a second request.
const SMUGGLED = 'GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n';
const chunked = (data) => `${Buffer.byteLength(data).toString(16)}\r\n${data}\r\n0\r\n\r\n`;

await R.check('transport.declared_body_is_read_whatever_the_method_or_path', async () => {
  // Each request declares a body holding a request; then LAST. Exactly two answers: the body is
  // read and dropped (or handed to the route), never parsed as a request of its own.
  const heads = ['GET /health', 'HEAD /health', 'OPTIONS /v1/models', 'GET /v1/no-such-path', 'GET /no/such/page',
                 'PUT /v1/models', 'DELETE /health', 'PATCH /v1/models'];
  const problems = [];
  for (const h of heads) {
    for (const [how, framing, body] of [['length', `Content-Length: ${SMUGGLED.length}`, SMUGGLED],
                                        ['chunked', 'Transfer-Encoding: chunked', chunked(SMUGGLED)]]) {
      const r = await rawSocket(srv.port, [`${h} HTTP/1.1\r\nHost: 127.0.0.1\r\n${framing}\r\n\r\n${body}${LAST}`], { readTimeoutMs: 8000 });
      const st = statusesOf(r.text);
      if (st.length !== 2 || st[0] >= 500 || st[1] !== 200 || !r.closed) problems.push(`${h} (${how} body): answers ${show(st)}, closed ${r.closed}`);
    }
  }
  // A GET whose body is not a request: it is read, not waited on as the rest of a request line.
  const r = await rawSocket(srv.port, [`GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n0123456789${LAST}`], { readTimeoutMs: 8000 });
  if (show(statusesOf(r.text)) !== '[200,200]' || !r.closed) problems.push(`GET with a 10-byte body: answers ${show(statusesOf(r.text))}, closed ${r.closed}`);
  // A request the HTTP library refuses on its own once the head is in (a Range it cannot parse):
  // its body is unread, so the connection ends with the answer.
  const range = await rawSocket(srv.port, [`GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nRange: bytes=zz\r\nContent-Length: ${SMUGGLED.length}\r\n\r\n${SMUGGLED}${LAST}`], { readTimeoutMs: 8000 });
  if (show(statusesOf(range.text)) !== '[416]' || !range.closed) problems.push(`bad Range with a body: answers ${show(statusesOf(range.text))}, closed ${range.closed}`);
  assert(problems.length === 0, problems.join('\n      '));
});

await R.check('transport.strict_head_and_chunk_framing', async () => {
  const tb = '{"content":"hi"}';
  const post = (fields, body) => `POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n${fields}\r\n${body}`;
  const get = (fields) => `GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n${fields}\r\n`;
  const cases = [
    ['Content-Length: +N', post(`Content-Length: +${tb.length}\r\n`, tb)],
    ['Content-Length: N, N', post(`Content-Length: ${tb.length}, ${tb.length}\r\n`, tb)],
    ['space before the colon (POST)', post(`Content-Length : ${tb.length}\r\n`, tb)],
    ['space before the colon (GET)', get(`Content-Length : ${SMUGGLED.length}\r\n`) + SMUGGLED],
    ['a header line without a colon', get('X-No-Colon\r\n')],
    ['a NUL in a header value', get('X-A: a\0b\r\n')],
    ['a percent-encoded NUL in a header value', get('X-A: a%00b\r\n')],
    ['a header line ending in a bare LF', get('X-A: a\nContent-Length: 5\r\n') + 'xxxxx'],
    ['obsolete line folding', get('X-A: a\r\n b\r\n')],
    ['two Host headers', get('Host: evil.example\r\n')],
    ['HTTP/1.1 without Host', 'GET /health HTTP/1.1\r\nX-A: b\r\n\r\n'],
    ['chunk data not followed by CRLF', post('Transfer-Encoding: chunked\r\n', `${tb.length.toString(16)}\r\n${tb}XX${SMUGGLED}`)],
    ['a chunk size with a sign', post('Transfer-Encoding: chunked\r\n', `+${tb.length.toString(16)}\r\n${tb}\r\n0\r\n\r\n`)],
  ];
  const problems = [];
  for (const [what, text] of cases) {
    const r = await rawSocket(srv.port, [text + LAST], { readTimeoutMs: 8000 });
    const st = statusesOf(r.text);
    const code = /"code":"([a-z_]+)"/.exec(r.text)?.[1];
    if (show(st) !== '[400]' || !r.closed || !['bad_request', 'invalid_framing'].includes(code)) {
      problems.push(`${what}: answers ${show(st)}, code ${code}, closed ${r.closed}`);
    }
  }
  // Well-formed chunking (an extension, a trailer) is served, and the connection stays in step.
  const ok = await rawSocket(srv.port, [post('Transfer-Encoding: chunked\r\n',
    `${tb.length.toString(16)};ext=1\r\n${tb}\r\n0\r\nX-Trailer: 1\r\n\r\n`) + LAST], { readTimeoutMs: 8000 });
  if (show(statusesOf(ok.text)) !== '[200,200]' || !/"tokens":\[/.test(ok.text)) problems.push(`well-formed chunked body: ${show(ok.text)}`);
  assert(problems.length === 0, problems.join('\n      '));
});

await R.check('transport.garbage_request_line_closes_the_connection', async () => {
  // Answered and closed at once (the keep-alive wait is 15 s; the socket gives up at 8).
  const r = await rawSocket(srv.port, ['\x16\x03\x01 garbage here\r\n\r\n'], { readTimeoutMs: 8000 });
  assert(r.status === 400 && r.closed && /bad_request/.test(r.text), `garbage: closed=${r.closed} ${show(r.text)}`);
});

await R.check('transport.half_closed_client_gets_its_answer', async () => {
  const body = JSON.stringify({ model: MODEL_ID, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0 });
  const r = await new Promise((resolve) => {
    const sock = net.connect({ host: '127.0.0.1', port: srv.port });
    let buf = '';
    const t = setTimeout(() => { sock.destroy(); resolve({ buf, error: 'timeout' }); }, 60_000);
    sock.setEncoding('utf8');
    sock.on('connect', () => {
      sock.end(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    });
    sock.on('data', (d) => { buf += d; });
    sock.on('close', () => { clearTimeout(t); resolve({ buf }); });
    sock.on('error', (e) => { clearTimeout(t); resolve({ buf, error: e.code }); });
  });
  const final = r.buf.replace(/^HTTP\/1\.1 1\d\d [^\r]*\r\n\r\n/g, '');
  assert(/^HTTP\/1\.1 200/.test(final) && /chat\.completion/.test(final), `half-closed: ${show(r)}`);
});

// GET /v1/models on a fresh connection from `localAddress` (any 127.x.y.z), with `key` (none when
// null). Resolves the status.
function modelsFrom(port, localAddress, key) {
  return new Promise((resolve) => {
    const headers = key ? { authorization: `Bearer ${key}` } : {};
    const req = http.get({ host: '127.0.0.1', port, path: '/v1/models', localAddress, headers, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode));
    });
    req.on('error', (e) => resolve(e.code));
  });
}

await R.check('transport.auth_brake_counts_wrong_keys_from_any_loopback_address', async () => {
  const KEY = 'sk-transport-brake-key';
  const s = await new Server(coli, modelDir, 'brake', ['--api-key', KEY], { key: KEY }).start();
  try {
    // Requests without a key are 401s, not guesses: the key's holder is never locked out by them.
    const keyless = [];
    for (let i = 0; i < 25; ++i) keyless.push(await modelsFrom(s.port, '127.0.0.1', null));
    assert(keyless.every((c) => c === 401), `25 requests without a key: ${show(keyless)}`);
    eq(await modelsFrom(s.port, '127.0.0.1', KEY), 200, 'the right key after 25 requests without one');
    // Twenty wrong keys from twenty loopback addresses are twenty guesses of one client.
    const guesses = [];
    for (let i = 0; i < 20; ++i) guesses.push(await modelsFrom(s.port, `127.0.${i}.2`, 'sk-guess'));
    assert(guesses.every((c) => c === 401), `20 wrong keys: ${show(guesses)}`);
    eq(await modelsFrom(s.port, '127.0.99.3', 'sk-guess'), 429, 'a 21st wrong key from yet another loopback address');
    // The right key is never refused, from any of them.
    eq(await modelsFrom(s.port, '127.0.99.3', KEY), 200, 'the right key while wrong keys are blocked');
    eq(await modelsFrom(s.port, '127.0.0.1', KEY), 200, 'the right key from 127.0.0.1');
  } finally {
    await s.stop();
  }
});

await R.check('transport.memory_returns_after_concurrent_large_bodies', async () => {
  // Rounds of ten concurrent 7 MB prompts (each refused once its first tokenizer slice is past the
  // context), then RSS against the level after one such request. Before the tokenizer freed its
  // per-thread scratch, each connection thread kept ~4 MB: three rounds left over +100 MB.
  const ROUNDS = 3, CONCURRENT = 10, BOUND_MB = 48;
  const s = await new Server(coli, modelDir, 'memory').start();
  try {
    const rss = () => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${s.proc.pid}/status`, 'utf8'))[1]) / 1024;
    const words = ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta', 'eta', 'theta'];
    const parts = [];
    for (let i = 0, n = 0; n < 7_000_000; ++i) { const w = `${words[(i * 7) % 8]} ${i % 1000} `; parts.push(w); n += w.length; }
    const body = JSON.stringify({ model: MODEL_ID, messages: [{ role: 'user', content: parts.join('') }], max_tokens: 1 });
    const post = () => new Promise((resolve) => {
      const req = http.request({ host: '127.0.0.1', port: s.port, method: 'POST', path: '/v1/chat/completions', agent: false,
                                 headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode));
      });
      req.on('error', (e) => resolve(e.code));
      req.end(body);
    });
    eq(await post(), 400, 'a 7 MB prompt');
    const base = rss();
    const seen = [];
    for (let round = 0; round < ROUNDS; ++round) {
      const st = await Promise.all(Array.from({ length: CONCURRENT }, post));
      assert(st.every((c) => c === 400), `round ${round}: ${show(st)}`);
      seen.push(Math.round(rss()));
    }
    // Every response is in; the bound is on memory, so give the server up to 10 s to get there.
    let after = rss();
    for (const t0 = Date.now(); after > base + BOUND_MB && Date.now() - t0 < 10_000; after = rss()) await sleep(200);
    console.log(`      RSS ${base.toFixed(0)} MB after one 7 MB body; after each round of ${CONCURRENT}: ${seen.join(', ')} MB; at the end ${after.toFixed(0)} MB`);
    assert(after <= base + BOUND_MB, `RSS ${after.toFixed(0)} MB after ${ROUNDS} rounds, over ${base.toFixed(0)} + ${BOUND_MB} MB`);
  } finally {
    await s.stop();
  }
});

await R.check('transport.host_and_key_file_checks', async () => {
  const evil = spawnSync(coli, ['serve', '--model', modelDir, '--host', '127.evil', '--port', '0'], { encoding: 'utf8', timeout: 30_000 });
  assert(evil.status !== 0 && /refusing to listen on 127\.evil/.test(evil.stderr), `127.evil: ${evil.status} ${evil.stderr}`);
  const keyFile = path.join(tmp, 'keys');
  fs.writeFileSync(keyFile, '# no key yet\n\n', { mode: 0o600 });
  const empty = spawnSync(coli, ['serve', '--model', modelDir, '--api-key-file', keyFile, '--port', '0'], { encoding: 'utf8', timeout: 30_000 });
  assert(empty.status !== 0 && empty.stderr.includes(keyFile) && /no key/.test(empty.stderr), `empty key file: ${empty.status} ${empty.stderr}`);
  // --host [::1] (the URL spelling) listens on ::1 and answers there.
  const v6 = new Server(coli, modelDir, 'v6', ['--host', '[::1]']);
  v6.spawnProcess();
  await v6.waitListening({ urlPattern: /(http:\/\/\[::1\]:(\d+))/ });
  const h = await new Promise((resolve) => {
    const sock = net.connect({ host: '::1', port: v6.port });
    let buf = '';
    sock.on('connect', () => sock.write('GET /health HTTP/1.1\r\nHost: [::1]\r\nConnection: close\r\n\r\n'));
    sock.on('data', (d) => { buf += d; });
    sock.on('close', () => resolve(buf));
    sock.on('error', (e) => resolve(`error ${e.code}`));
  });
  assert(/^HTTP\/1\.1 (200|503)/.test(h), `/health on [::1]: ${show(h)}`);
  await v6.stop();
});

await R.check('transport.server_exits_cleanly', async () => {
  const e = await srv.stop();
  assert(e.code === 143 && e.signal === null, `exit ${show(e)}\n${srv.logTail()}`);
});

cancelTimeout();
killAll();
process.exit(R.summary() ? 0 : 1);

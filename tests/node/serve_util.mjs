// Shared harness for the `coli serve` integration tests (serve_test.mjs, serve_fuzz.mjs): a demo
// model, server processes, raw HTTP (node:http / node:net, for requests the SDK cannot make),
// an SSE reader that checks framing and UTF-8 byte by byte, and a small check runner.
//
// Nothing here knows the server's code: everything follows docs/serving.md §3 and §4.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

export const MODEL_ID = 'kimi-k3';
const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

// ---- processes ------------------------------------------------------------------------------

const children = new Set();
let cleanedUp = false;
export function killAll() {
  if (cleanedUp) return;
  cleanedUp = true;
  for (const c of children) {
    try { if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL'); } catch { /* gone */ }
  }
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => { killAll(); process.exit(1); });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Temp folders live until the process exits: then every one goes when the run passed; when it
// failed, each is kept, for a look at the logs and written files, and its path is printed.
const tempDirs = [];
export function makeTempDir(prefix) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  tempDirs.push(dir);
  return dir;
}
process.on('exit', (code) => {
  for (const dir of tempDirs) {
    try {
      if (code === 0) {
        fs.rmSync(dir, { recursive: true, force: true });
      } else if (fs.existsSync(dir)) {
        console.error(`kept ${dir} (this run failed)`);
      }
    } catch { /* a folder still in use: leave it */ }
  }
});

// The random-weight demo model (real K3 tokenizer) that the build writes once for every test
// (tests/CMakeLists.txt, k3_test_demo_model), found next to the coli binary's build tree
// (<build>/apps/coli → <build>/tests/demo-model). Shared: read it, never write into it.
export function demoModel(coli) {
  const dir = path.resolve(path.dirname(coli), '..', 'tests', 'demo-model');
  if (!fs.existsSync(path.join(dir, 'config.json')))
    throw new Error(`the demo model is missing at ${dir} (build the k3_test_demo_model target)`);
  return dir;
}

// One `coli serve` process. Flags are passed verbatim after `serve --model DIR --port 0` (no
// --model when modelDir is null: the server's built-in model; `listenPort` instead of 0: a fixed port).
export class Server {
  constructor(coli, modelDir, name, flags = [], { env = {}, key = null, listenPort = 0 } = {}) {
    this.coli = coli;
    this.modelDir = modelDir;
    this.name = name;
    this.flags = flags;
    this.env = env;
    this.key = key;                 // API key the tests present by default (null: none)
    this.listenPort = listenPort;
    this.out = '';                  // stdout
    this.err = '';                  // stderr
    this.proc = null;
    this.url = null;
    this.port = 0;
    this.exit = null;               // {code, signal} once exited
  }

  get log() { return this.out + this.err; }
  logTail(n = 1500) {
    const s = `--- ${this.name} stdout ---\n${this.out.slice(-n)}\n--- ${this.name} stderr ---\n${this.err.slice(-n)}`;
    return s;
  }
  get authHeaders() { return this.key ? { authorization: `Bearer ${this.key}` } : {}; }

  spawnProcess() {
    const args = ['serve', ...(this.modelDir === null ? [] : ['--model', this.modelDir]), '--port', String(this.listenPort), ...this.flags];
    const env = { ...process.env, ...this.env };
    // Never inherit variables that change exposure or auth from the caller's shell.
    for (const k of ['COLI_API_KEY', 'COLI_ALLOW_INSECURE_BIND', 'COLI_ALLOWED_HOSTS', 'COLI_MODEL']) {
      if (!(k in this.env)) delete env[k];
    }
    this.proc = spawn(this.coli, args, { stdio: ['ignore', 'pipe', 'pipe'], env });
    children.add(this.proc);
    this.proc.stdout.setEncoding('utf8');
    this.proc.stderr.setEncoding('utf8');
    this.proc.stdout.on('data', (d) => { this.out += d; });
    this.proc.stderr.on('data', (d) => { this.err += d; });
    // Resolves once the process ended and its stdout and stderr are read to the end ('close'),
    // so that a check after stop() sees every line the server wrote.
    this.exited = new Promise((resolve) => {
      this.proc.on('exit', (code, signal) => { this.exit = { code, signal }; });
      this.proc.on('close', (code, signal) => { this.exit = { code, signal }; resolve(this.exit); });
    });
  }

  // Starts, waits for the listening line (stdout, `http://127.0.0.1:PORT`) and then for
  // GET /health 200. Returns this.
  async start({ urlTimeoutMs = 30_000, readyTimeoutMs = 90_000, urlPattern = /(http:\/\/127\.0\.0\.1:(\d+))/ } = {}) {
    this.spawnProcess();
    const t0 = Date.now();
    await this.waitListening({ timeoutMs: urlTimeoutMs, urlPattern });
    for (;;) {
      let r;
      try {
        r = await request(this, { path: '/health', timeoutMs: 5_000 });
      } catch (e) {
        r = { status: 0, error: e.message };
      }
      if (r.status === 200) break;
      if (this.exit) throw new Error(`${this.name}: exited (${JSON.stringify(this.exit)}) while loading\n${this.logTail()}`);
      if (Date.now() - t0 > readyTimeoutMs) throw new Error(`${this.name}: /health not 200 within ${readyTimeoutMs} ms (last ${r.status} ${r.text ?? r.error})\n${this.logTail()}`);
      await sleep(50);
    }
    return this;
  }

  // Waits for the listening line on stdout and takes the URL and port from it (the listener is
  // up before the model loads: docs/serving.md §3.7).
  async waitListening({ timeoutMs = 30_000, urlPattern = /(http:\/\/127\.0\.0\.1:(\d+))/ } = {}) {
    const m = await this.waitForLine('out', urlPattern, timeoutMs);
    this.url = m[1];
    this.port = Number(m[2]);
    return this;
  }

  // Resolves with the first match of `pattern` in the server's stderr ('err') or stdout ('out')
  // once it is there (checked on every chunk the server writes); rejects after `timeoutMs`, or
  // when the server exits first. Every check that reads the server's output waits for the line
  // it needs this way: a line is written when the server gets to it, not when /health or a
  // response says something else is ready (under load the two come apart).
  waitForLine(stream, pattern, timeoutMs = 10_000) {
    const pipe = stream === 'out' ? this.proc.stdout : this.proc.stderr;
    const where = stream === 'out' ? 'stdout' : 'stderr';
    return new Promise((resolve, reject) => {
      const look = () => {
        const m = (stream === 'out' ? this.out : this.err).match(pattern);
        if (!m) return false;
        done();
        resolve(m);
        return true;
      };
      const onExit = () => {
        if (look()) return;
        done();
        reject(new Error(`${this.name}: exited before ${pattern} appeared on ${where}\n${this.logTail()}`));
      };
      const timer = setTimeout(() => { done(); reject(new Error(`${this.name}: no ${pattern} on ${where} within ${timeoutMs} ms\n${this.logTail()}`)); }, timeoutMs);
      const done = () => { clearTimeout(timer); pipe.off('data', look); pipe.off('end', onExit); };
      if (look()) return;
      if (pipe.readableEnded) { onExit(); return; }
      // Registered after the harness's own listener (constructor order): the text already holds the chunk.
      pipe.on('data', look);
      pipe.on('end', onExit);
    });
  }
  waitForStderr(pattern, timeoutMs = 10_000) { return this.waitForLine('err', pattern, timeoutMs); }

  // Resolves once every line the server wrote to stderr before this call is in this.err: sends a
  // probe request and waits for its own log line, which the server writes after those of the
  // requests answered before it. A check that a log does NOT hold something calls this first,
  // so that it judges the whole log, not a prefix of it.
  async logSettled(timeoutMs = 10_000) {
    const probe = await request(this, { path: '/favicon.ico' });
    const rid = probe.headers['x-request-id'];
    if (!rid) throw new Error(`${this.name}: the log probe got no x-request-id (${probe.status})`);
    await this.waitForLine('err', new RegExp(`^\\[http\\] ${rid} GET /favicon\\.ico \\d{3}`, 'm'), timeoutMs);
  }

  kill(signal = 'SIGTERM') {
    if (signal === 'SIGTERM') this.sigtermSent = true;
    this.proc.kill(signal);
  }

  // SIGTERM (or another signal); waits for the exit. Returns {code, signal}.
  async stop({ signal = 'SIGTERM', timeoutMs = 40_000 } = {}) {
    if (!this.proc) return null;
    if (this.exit) return this.exited;
    // A second SIGTERM means "quit at once" (no drain): never repeat one already sent.
    if (!(signal === 'SIGTERM' && this.sigtermSent)) this.kill(signal);
    const t = setTimeout(() => { try { this.proc.kill('SIGKILL'); } catch { /* gone */ } }, timeoutMs);
    const e = await this.exited;
    clearTimeout(t);
    return e;
  }
}

// ---- raw HTTP -------------------------------------------------------------------------------

function decodeBody(buf) {
  try { return { text: strictUtf8.decode(buf), utf8ok: true }; } catch { return { text: buf.toString('utf8'), utf8ok: false }; }
}

// One request on a fresh connection. `body`: object (sent as JSON), string or Buffer (sent as is).
// Headers: the server's auth headers unless `auth: false`; a header set to null is removed.
// Resolves {status, headers, body: Buffer, text, json, utf8ok, ms}.
export function request(srv, { method = 'GET', path: p = '/', headers = {}, body = null, auth = true,
                               timeoutMs = 60_000, signal } = {}) {
  return new Promise((resolve, reject) => {
    let payload = null;
    const h = { ...(auth ? srv.authHeaders : {}) };
    if (body !== null && body !== undefined) {
      payload = Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
      h['content-type'] = 'application/json';
      h['content-length'] = String(payload.length);
    }
    for (const [k, v] of Object.entries(headers)) {
      const lk = k.toLowerCase();
      if (v === null) delete h[lk]; else h[lk] = v;
    }
    const t0 = performance.now();
    const req = http.request({ host: '127.0.0.1', port: srv.port, method, path: p, headers: h, agent: false, signal });
    const timer = setTimeout(() => req.destroy(new Error(`timeout after ${timeoutMs} ms: ${method} ${p}`)), timeoutMs);
    req.on('error', (e) => { clearTimeout(timer); reject(e); });
    req.on('response', (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('error', (e) => { clearTimeout(timer); reject(e); });
      res.on('end', () => {
        clearTimeout(timer);
        const buf = Buffer.concat(chunks);
        const { text, utf8ok } = decodeBody(buf);
        let json;
        try { json = JSON.parse(text); } catch { json = undefined; }
        resolve({ status: res.statusCode, headers: res.headers, body: buf, text, json, utf8ok, ms: performance.now() - t0 });
      });
    });
    req.end(payload ?? undefined);
  });
}

export const postJson = (srv, p, body, opts = {}) => request(srv, { method: 'POST', path: p, body, ...opts });
export const chat = (srv, body, opts = {}) => postJson(srv, '/v1/chat/completions', body, opts);

// Streams POST /v1/chat/completions and parses SSE byte-exactly. Every event block is decoded as
// strict UTF-8; `data:` payloads are JSON-parsed (or `[DONE]`); comment lines (`:`) are counted.
// onEvent(ev, st) may return 'abort' to close the connection (client disconnect).
// Resolves {status, headers, events: [{kind:'data'|'done'|'comment'|'bad', json?, text, t}],
//           json (error body when not SSE), badUtf8: [...], aborted, endedCleanly, trailing}.
export function sse(srv, body, { headers = {}, auth = true, path: p = '/v1/chat/completions', onEvent,
                                 timeoutMs = 120_000 } = {}) {
  return new Promise((resolve, reject) => {
    const payload = Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    const h = { 'content-type': 'application/json', 'content-length': String(payload.length),
                ...(auth ? srv.authHeaders : {}), ...headers };
    const st = { status: 0, headers: {}, events: [], badUtf8: [], aborted: false, endedCleanly: false,
                 trailing: '', t0: performance.now() };
    let done = false;
    const finish = () => { if (!done) { done = true; clearTimeout(timer); resolve(st); } };
    const req = http.request({ host: '127.0.0.1', port: srv.port, method: 'POST', path: p, headers: h, agent: false });
    const timer = setTimeout(() => { st.timedOut = true; req.destroy(); finish(); }, timeoutMs);
    req.on('error', (e) => { if (st.aborted || done) finish(); else { done = true; clearTimeout(timer); reject(e); } });
    req.on('response', (res) => {
      st.status = res.statusCode;
      st.headers = res.headers;
      const isSse = String(res.headers['content-type'] ?? '').startsWith('text/event-stream');
      let buf = Buffer.alloc(0);
      const whole = [];
      res.on('data', (chunk) => {
        if (!isSse) { whole.push(chunk); return; }
        buf = Buffer.concat([buf, chunk]);
        for (;;) {
          const i = buf.indexOf('\n\n');
          const j = buf.indexOf('\r\n\r\n');
          let cut = -1, len = 0;
          if (i >= 0 && (j < 0 || i <= j)) { cut = i; len = 2; } else if (j >= 0) { cut = j; len = 4; }
          if (cut < 0) break;
          const block = buf.subarray(0, cut);
          buf = buf.subarray(cut + len);
          handle(block);
          if (st.aborted) return;
        }
      });
      res.on('end', () => {
        if (!isSse) {
          const b = Buffer.concat(whole);
          const { text } = decodeBody(b);
          st.text = text;
          try { st.json = JSON.parse(text); } catch { /* not JSON */ }
        } else {
          st.trailing = buf.toString('utf8');
        }
        st.endedCleanly = true;
        finish();
      });
      res.on('close', finish);
      res.on('error', () => finish());
    });
    req.end(payload);

    function handle(block) {
      let text;
      try { text = strictUtf8.decode(block); } catch {
        st.badUtf8.push(block.toString('hex').slice(0, 240));
        text = block.toString('utf8');
      }
      const lines = text.split(/\r?\n/);
      const data = [];
      let comment = false;
      for (const line of lines) {
        if (line.startsWith(':')) comment = true;
        else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
        // other fields (event:, id:, retry:) are legal SSE; kept only in `text`
      }
      const t = performance.now() - st.t0;
      let ev;
      if (data.length === 0) ev = { kind: comment ? 'comment' : 'other', text, t };
      else {
        const d = data.join('\n');
        if (d === '[DONE]') ev = { kind: 'done', text, t };
        else {
          try { ev = { kind: 'data', json: JSON.parse(d), text, t }; } catch { ev = { kind: 'bad', text, t }; }
        }
      }
      st.events.push(ev);
      if (onEvent && onEvent(ev, st) === 'abort') {
        st.aborted = true;
        req.destroy();
        finish();
      }
    }
  });
}

// Raw bytes over TCP. `parts` are written in order; a number is a pause in ms. With
// `stopWritingOnResponse`, it stops writing as soon as a response starts arriving; it listens
// `lingerMs` more after a complete Content-Length response (for a close, or a second answer). Resolves
// {status, text, closed, wroteAll, ms, writeError}.
export function rawSocket(port, parts, { readTimeoutMs = 10_000, stopWritingOnResponse = false, lingerMs = 300 } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect({ host: '127.0.0.1', port });
    const t0 = performance.now();
    const chunks = [];
    let closed = false, wroteAll = false, writeError = null, responded = false, settled = false;
    const finish = () => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      const text = Buffer.concat(chunks).toString('latin1');
      const m = text.match(/^HTTP\/1\.[01] (\d{3})/);
      sock.destroy();
      resolve({ status: m ? Number(m[1]) : 0, text, closed, wroteAll, writeError, ms: performance.now() - t0 });
    };
    let timer = setTimeout(finish, readTimeoutMs);
    sock.on('data', (d) => {
      chunks.push(d);
      responded = true;
      // A complete non-chunked response with a body: stop when Content-Length bytes arrived.
      const text = Buffer.concat(chunks).toString('latin1');
      const he = text.indexOf('\r\n\r\n');
      if (he >= 0) {
        const m = text.slice(0, he).match(/\r\ncontent-length:\s*(\d+)/i);
        if (m && Buffer.concat(chunks).length >= he + 4 + Number(m[1])) {
          clearTimeout(timer);
          timer = setTimeout(finish, lingerMs);  // give the server a moment to close (or say more)
        }
      }
    });
    sock.on('end', () => { closed = true; finish(); });
    sock.on('close', () => { closed = true; finish(); });
    sock.on('error', (e) => { writeError = writeError ?? e.code ?? e.message; });
    sock.on('connect', async () => {
      try {
        for (const part of parts) {
          if (settled) return;
          if (stopWritingOnResponse && responded) return;
          if (typeof part === 'number') { await sleep(part); continue; }
          await new Promise((res) => {
            if (!sock.write(part)) sock.once('drain', res); else res();
          });
        }
        wroteAll = true;
      } catch (e) {
        writeError = e.code ?? e.message;
      }
    });
  });
}

// ---- assertions -----------------------------------------------------------------------------

export class CheckError extends Error {}
export function assert(cond, msg) { if (!cond) throw new CheckError(typeof msg === 'function' ? msg() : msg); }
export const show = (v, n = 400) => {
  const s = typeof v === 'string' ? JSON.stringify(v) : JSON.stringify(v);
  return s === undefined ? 'undefined' : s.length > n ? s.slice(0, n) + '…' : s;
};
export function eq(actual, expected, what) {
  const a = JSON.stringify(actual), e = JSON.stringify(expected);
  if (a !== e) throw new CheckError(`${what}: expected ${show(expected)}, got ${show(actual)}`);
}

// OpenAI error envelope (docs/serving.md §3.8): {"error":{"message","type","param","code"}}.
const TYPE_FOR_STATUS = {
  400: 'invalid_request_error', 401: 'authentication_error', 403: 'permission_error',
  404: 'invalid_request_error', 405: 'invalid_request_error', 408: 'invalid_request_error',
  411: 'invalid_request_error', 413: 'invalid_request_error', 415: 'invalid_request_error',
  429: 'rate_limit_error', 431: 'invalid_request_error', 500: 'server_error', 503: 'server_error',
};
export function expectError(r, status, code, { param, codes } = {}) {
  const ctx = () => `${r.status} ${show(r.text ?? r.json, 300)}`;
  assert(r.status === status, () => `expected HTTP ${status} (${code}), got ${ctx()}`);
  const e = r.json?.error;
  assert(e && typeof e === 'object', () => `no OpenAI error envelope: ${ctx()}`);
  assert(typeof e.message === 'string' && e.message.length > 0, () => `error.message missing/empty: ${ctx()}`);
  assert(!/[\x00-\x1f]/.test(e.message), () => `error.message has control characters: ${ctx()}`);
  assert(typeof e.type === 'string', () => `error.type not a string: ${ctx()}`);
  assert('param' in e && (e.param === null || typeof e.param === 'string'), () => `error.param must be string|null and present: ${ctx()}`);
  assert('code' in e && (e.code === null || typeof e.code === 'string'), () => `error.code must be string|null and present: ${ctx()}`);
  if (TYPE_FOR_STATUS[status]) assert(e.type === TYPE_FOR_STATUS[status], () => `error.type should be ${TYPE_FOR_STATUS[status]}: ${ctx()}`);
  if (codes) assert(codes.includes(e.code), () => `error.code should be one of ${codes.join('|')}: ${ctx()}`);
  else if (code !== undefined) assert(e.code === code, () => `error.code should be ${code}: ${ctx()}`);
  if (param !== undefined) assert(e.param === param, () => `error.param should be ${show(param)}: ${ctx()}`);
  if (r.headers) assert(r.headers['x-request-id'], () => `no x-request-id header on ${status}`);
  return e;
}

// ---- check runner ---------------------------------------------------------------------------

export class Runner {
  constructor(title) {
    this.title = title;
    this.results = [];
    this.t0 = performance.now();
  }
  async check(name, fn) {
    const t = performance.now();
    try {
      await fn();
      this.results.push({ name, ok: true });
      console.log(`PASS  ${name}  (${Math.round(performance.now() - t)} ms)`);
    } catch (e) {
      const msg = e instanceof CheckError ? e.message : (e?.stack ?? String(e));
      this.results.push({ name, ok: false, msg });
      console.log(`FAIL  ${name}  (${Math.round(performance.now() - t)} ms)\n      ${msg.replace(/\n/g, '\n      ')}`);
    }
  }
  // True when at least one check ran and none failed: a run in which no check ran (a
  // *_TEST_ONLY filter that matches no name any more) is a failure, not a pass.
  summary() {
    const failed = this.results.filter((r) => !r.ok);
    const s = ((performance.now() - this.t0) / 1000).toFixed(1);
    console.log(`\n${this.title}: ${this.results.length - failed.length} passed, ${failed.length} failed (${s} s)`);
    if (failed.length) console.log('failed: ' + failed.map((r) => r.name).join(', '));
    if (this.results.length === 0) {
      console.log(`FAIL  ${this.title}: no check ran (does a *_TEST_ONLY filter match no check name?)`);
      return false;
    }
    return failed.length === 0;
  }
}

export function globalTimeout(ms, what) {
  const t = setTimeout(() => {
    console.log(`FAIL  ${what}: overall timeout of ${ms / 1000} s reached`);
    killAll();
    process.exit(1);
  }, ms);
  return () => clearTimeout(t);
}

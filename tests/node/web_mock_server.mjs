// A stand-in for `coli serve` for work on the web page (web/) without a model: serves web/ with
// the server's security headers and fakes the API the page uses (docs/serving.md §3.5–3.7):
//   GET /health             503 {"status":"loading",...} for --loading-s seconds, then 200
//   GET /v1/models          one model, "kimi-k3-mock" (with meta.description when --description
//                           is given, as coli serve says what its built-in model is)
//   GET /metrics            Prometheus text with the k3_* counters the page shows
//   POST /v1/chat/completions  SSE (or JSON without stream): prompt_progress chunks when
//       return_progress, reasoning_content deltas when thinking is on, then content deltas, one
//       token per --token-delay-ms, a `: ping` comment, finish_reason, a usage chunk, [DONE].
//       The last user message picks the reply: "/error" → 400, "/midstream" → an error event
//       after a few tokens, "/long" → a long reply, "/markdown" → Markdown with hostile HTML;
//       anything else is echoed back inside a short Markdown answer.
//   GET /mock/requests      the chat request bodies received so far (for tests)
//   POST /mock/loaded       ends the loading phase now (tests start with a long --loading-s
//                           and end it once they have seen the loading screen)
// Usage: node tests/node/web_mock_server.mjs [--port 0] [--token-delay-ms 30] [--loading-s 0]
//                                            [--api-key KEY] [--description TEXT]
// Prints "web mock: listening on http://127.0.0.1:PORT/" once ready.
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import { fileURLToPath } from 'node:url';

const WEB_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../web');
const CSP = "default-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; object-src 'none'; base-uri 'none'";
const MIME = { '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.css': 'text/css; charset=utf-8',
               '.svg': 'image/svg+xml', '.png': 'image/png', '.json': 'application/json' };
const MODEL = 'kimi-k3-mock';

function option(args, name, fallback) {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
}

const args = process.argv.slice(2);
const port = Number(option(args, '--port', '0'));
const tokenDelayMs = Number(option(args, '--token-delay-ms', '30'));
let loadingS = Number(option(args, '--loading-s', '0'));
const apiKey = option(args, '--api-key', '');
const description = option(args, '--description', '');
const started = Date.now();
const requests = [];
const counters = { prompt: 0, cached: 0, generated: 0, prefill: 0, decode: 0, http: new Map() };
let active = 0, cancelled = 0;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const loading = () => (Date.now() - started) / 1000 < loadingS;

function sendJson(res, status, body, extra = {}) {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text), ...extra });
  res.end(text);
}
function sendError(res, status, type, code, message, param = null, extra = {}) {
  sendJson(res, status, { error: { message, type, param, code } }, extra);
}

function serveStatic(req, res) {
  let name = decodeURIComponent(new URL(req.url, 'http://x').pathname).slice(1) || 'index.html';
  if (name.includes('..') || name.split('/').some((p) => p.startsWith('.')) || name === 'README.md') name = '';
  let file = name && path.join(WEB_DIR, name);
  if (!file || !fs.existsSync(file) || !fs.statSync(file).isFile()) {
    if (name && name.includes('.')) return sendError(res, 404, 'invalid_request_error', 'not_found', 'no such path');
    file = path.join(WEB_DIR, 'index.html');  // SPA fallback
  }
  const type = MIME[path.extname(file)];
  if (!type) return sendError(res, 404, 'invalid_request_error', 'not_found', 'no such path');
  const body = fs.readFileSync(file);
  res.writeHead(200, { 'Content-Type': type, 'Content-Length': body.length, 'Content-Security-Policy': CSP,
                       'X-Content-Type-Options': 'nosniff', 'Referrer-Policy': 'no-referrer', 'Cache-Control': 'no-cache' });
  res.end(body);
}

function health(req, res) {
  const elapsed = (Date.now() - started) / 1000;
  if (loading()) {
    return sendJson(res, 503, { status: 'loading', phase: 'weights', progress: Math.min(0.99, elapsed / loadingS), elapsed_s: elapsed },
                    { 'Retry-After': '5' });
  }
  const body = { status: 'ok' };
  if (authorised(req)) {
    Object.assign(body, {
      model: MODEL, uptime_s: Math.round(elapsed), context_capacity: 8192,
      scheduler: { active, capacity: 1, queued: 0, max_queue: 8, queue_timeout_seconds: 300, admitted: requests.length,
                   completed: requests.length - active - cancelled, rejected: 0, timed_out: 0, cancelled },
      state: { phase: active ? 'decode' : 'idle', fed_tokens: counters.prompt },
      memory: { rss_gb: process.memoryUsage().rss / 1e9 },
    });
  }
  sendJson(res, 200, body);
}

function metrics(res) {
  const lines = ['# HELP k3_requests_total HTTP requests by endpoint and status', '# TYPE k3_requests_total counter'];
  for (const [label, n] of counters.http) lines.push(`k3_requests_total{${label}} ${n}`);
  const metric = (name, type, value) => lines.push(`# TYPE ${name} ${type}`, `${name} ${value}`);
  metric('k3_requests_active', 'gauge', active);
  metric('k3_requests_queued', 'gauge', 0);
  metric('k3_prompt_tokens_total', 'counter', counters.prompt);
  metric('k3_prompt_tokens_cached_total', 'counter', counters.cached);
  metric('k3_generated_tokens_total', 'counter', counters.generated);
  metric('k3_prefill_seconds_total', 'counter', counters.prefill.toFixed(3));
  metric('k3_decode_seconds_total', 'counter', counters.decode.toFixed(3));
  metric('k3_rss_bytes', 'gauge', process.memoryUsage().rss);
  const text = lines.join('\n') + '\n';
  res.writeHead(200, { 'Content-Type': 'text/plain; version=0.0.4', 'Content-Length': Buffer.byteLength(text) });
  res.end(text);
}

function authorised(req) {
  return !apiKey || req.headers.authorization === `Bearer ${apiKey}`;
}

const MARKDOWN_REPLY = `## A short demo

Here is **bold**, *italic*, \`inline code\`, and a [safe link](https://example.com/docs).
These must stay inert: <img src=x onerror="window.__xss=1"> and [bad](javascript:window.__xss=2).

| Feature | Status |
|:--------|-------:|
| Tables  | yes |
| <b>HTML</b> | escaped |

\`\`\`html
<script>window.__xss = 3</script>
\`\`\`

1. First
2. Second
   - nested`;

function replyFor(userText) {
  if (userText.includes('/markdown')) return MARKDOWN_REPLY;
  if (userText.includes('/long')) {
    return Array.from({ length: 400 }, (_, i) => `Sentence ${i + 1} of a long answer that takes a while to stream.`).join(' ');
  }
  return `You said: ${userText}\n\nThis is the **mock** server. A list:\n\n- one\n- two\n\nAnd some \`code\`.`;
}

const tokens = (text) => text.match(/\s*\S+|\s+/g) ?? [];

async function chat(req, res) {
  const type = (req.headers['content-type'] ?? '').split(';')[0].trim().toLowerCase();
  if (type !== 'application/json') return sendError(res, 415, 'invalid_request_error', 'unsupported_media_type', 'POST bodies must be application/json');
  let raw = '';
  for await (const chunk of req) raw += chunk;
  let body;
  try { body = JSON.parse(raw); } catch { return sendError(res, 400, 'invalid_request_error', 'invalid_json', 'the body is not valid JSON'); }
  requests.push(body);
  if (loading()) return sendError(res, 503, 'server_error', 'model_loading', 'the model is still loading', null, { 'Retry-After': '5' });
  if (body.model !== MODEL) return sendError(res, 404, 'invalid_request_error', 'model_not_found', `the model '${body.model}' does not exist`, 'model');
  if (!Array.isArray(body.messages) || !body.messages.length) return sendError(res, 400, 'invalid_request_error', 'invalid_value', "'messages' must be a non-empty array", 'messages');
  const user = [...body.messages].reverse().find((m) => m.role === 'user');
  const userText = typeof user?.content === 'string' ? user.content : '';
  if (userText.includes('/error')) return sendError(res, 400, 'invalid_request_error', 'invalid_value', 'mock: you asked for an error', 'messages');

  const thinking = body.chat_template_kwargs?.enable_thinking ?? body.enable_thinking ?? true;
  const maxTokens = body.max_completion_tokens ?? body.max_tokens ?? 4096;
  const promptTokens = Math.max(1, Math.round(JSON.stringify(body.messages).length / 4));
  const cached = body.messages.length > 1 ? Math.floor(promptTokens * 0.8) : 0;
  const reasoning = thinking ? tokens(`The user wrote ${JSON.stringify(userText.slice(0, 80))}. I should answer briefly, in Markdown, and mention that this is a mock.`) : [];
  const content = tokens(replyFor(userText));
  const id = 'chatcmpl-' + crypto.randomBytes(16).toString('hex');
  const created = Math.floor(Date.now() / 1000);
  const requestId = crypto.randomBytes(8).toString('hex');

  active++;
  let closed = false;
  res.on('close', () => { closed = true; });
  try {
    if (!body.stream) {
      await sleep(tokenDelayMs * (reasoning.length + content.length));
      const message = { role: 'assistant', content: content.join('') };
      if (reasoning.length) message.reasoning_content = reasoning.join('');
      return sendJson(res, 200, {
        id, object: 'chat.completion', created, model: MODEL,
        choices: [{ index: 0, message, finish_reason: 'stop' }],
        usage: { prompt_tokens: promptTokens, completion_tokens: reasoning.length + content.length, total_tokens: promptTokens + reasoning.length + content.length },
      }, { 'x-queue-wait-ms': '0', 'x-request-id': requestId });
    }
    const includeUsage = !!body.stream_options?.include_usage;
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache', 'X-Accel-Buffering': 'no',
                         Connection: 'close', 'x-queue-wait-ms': '3', 'x-colibri-queue-wait-ms': '3', 'x-request-id': requestId });
    const chunk = (delta, finish = null) => ({ id, object: 'chat.completion.chunk', created, model: MODEL,
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }], ...(includeUsage ? { usage: null } : {}) });
    const send = (obj) => { if (!closed) res.write(`data: ${JSON.stringify(obj)}\n\n`); };
    send(chunk({ role: 'assistant', content: '' }));
    const t0 = Date.now();
    if (body.return_progress) {
      const todo = promptTokens - cached;
      for (let k = 1; k <= 3 && !closed; k++) {
        await sleep(120);
        send({ id, object: 'chat.completion.chunk', created, model: MODEL, choices: [], ...(includeUsage ? { usage: null } : {}),
               prompt_progress: { total: promptTokens, cache: cached, processed: cached + Math.round((todo * k) / 3), time_ms: Date.now() - t0 } });
      }
    }
    if (!closed) res.write(': ping\n\n');
    counters.prompt += promptTokens;
    counters.cached += cached;
    counters.prefill += (Date.now() - t0) / 1000;
    const t1 = Date.now();
    let generated = 0, finish = 'stop';
    const stream = [...reasoning.map((t) => ['reasoning_content', t]), ...content.map((t) => ['content', t])];
    for (const [field, text] of stream) {
      if (closed) break;
      if (generated >= maxTokens) { finish = 'length'; break; }
      if (userText.includes('/midstream') && generated === 5) {
        send({ error: { message: 'engine failure during decode (mock)', type: 'server_error', param: null, code: 'engine_error' } });
        res.end();
        return;
      }
      await sleep(tokenDelayMs);
      send(chunk({ [field]: text }));
      generated++;
      counters.generated++;
    }
    counters.decode += (Date.now() - t1) / 1000;
    if (closed) { cancelled++; return; }
    send(chunk({}, finish));
    if (includeUsage) {
      send({ id, object: 'chat.completion.chunk', created, model: MODEL, choices: [],
             usage: { prompt_tokens: promptTokens, completion_tokens: generated, total_tokens: promptTokens + generated,
                      prompt_tokens_details: { cached_tokens: cached }, completion_tokens_details: { reasoning_tokens: Math.min(generated, reasoning.length) } },
             timings: { cache_n: cached, prompt_n: promptTokens - cached, predicted_n: generated,
                        predicted_ms: Date.now() - t1, predicted_per_second: generated / Math.max(0.001, (Date.now() - t1) / 1000) },
             x_k3: { reuse: cached ? 'live' : 'none', queue_wait_ms: 3 } });
    }
    res.end('data: [DONE]\n\n');
  } finally {
    active--;
  }
}

const server = http.createServer(async (req, res) => {
  const pathname = new URL(req.url, 'http://x').pathname;
  res.setHeader('x-request-id', crypto.randomBytes(8).toString('hex'));
  res.on('finish', () => {
    const route = /^\/(v1\/|health$|metrics$)/.test(pathname) ? pathname : 'static';
    const label = `endpoint="${route}",status="${res.statusCode}"`;
    counters.http.set(label, (counters.http.get(label) ?? 0) + 1);
  });
  try {
    const api = pathname.startsWith('/v1/') || pathname === '/metrics';
    if (api && !authorised(req)) return sendError(res, 401, 'authentication_error', 'invalid_api_key', 'a valid API key is required');
    if (req.method === 'GET' && (pathname === '/health' || pathname === '/v1/health')) return health(req, res);
    if (req.method === 'GET' && pathname === '/v1/models') {
      return sendJson(res, 200, { object: 'list', data: [{ id: MODEL, object: 'model', created: Math.floor(started / 1000), owned_by: 'local',
        meta: { context_length: 8192, max_output_tokens: 16384, reasoning: true, tools: false, vision: false, aliases: [],
                ...(description ? { description } : {}) } }] });
    }
    if (req.method === 'GET' && pathname === '/metrics') return metrics(res);
    if (req.method === 'GET' && pathname === '/mock/requests') return sendJson(res, 200, requests);
    if (req.method === 'POST' && pathname === '/mock/loaded') { loadingS = 0; return sendJson(res, 200, { loaded: true }); }
    if (pathname === '/v1/chat/completions') {
      if (req.method !== 'POST') return sendError(res, 405, 'invalid_request_error', 'method_not_allowed', 'use POST', null, { Allow: 'POST, OPTIONS' });
      return await chat(req, res);
    }
    if (api) return sendError(res, 404, 'invalid_request_error', 'not_found', 'no such path');
    if (req.method !== 'GET' && req.method !== 'HEAD') return sendError(res, 405, 'invalid_request_error', 'method_not_allowed', 'use GET');
    return serveStatic(req, res);
  } catch (e) {
    if (!res.headersSent) sendError(res, 500, 'server_error', 'internal_error', String(e.message));
    else res.destroy();
  }
});

server.listen(port, '127.0.0.1', () => {
  console.log(`web mock: listening on http://127.0.0.1:${server.address().port}/`);
});
const quit = () => { server.close(); server.closeAllConnections?.(); process.exit(0); };
process.on('SIGTERM', quit);
process.on('SIGINT', quit);

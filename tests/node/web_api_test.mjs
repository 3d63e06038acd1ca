// Unit tests of web/api.js in Node: the web page's SSE parser (every way a stream can be cut
// into network chunks must give the same events), the chat request body and history, the error
// text of failed responses, and the /metrics parser.
// Usage: node tests/node/web_api_test.mjs        (exit status 1 on any failure)
import { SseParser, buildMessages, buildRequestBody, errorText, parsePrometheus } from '../../web/api.js';
import { mulberry32 } from './kimi_k3.mjs';

let passed = 0;
const failures = [];
function check(name, ok, detail = '') {
  if (ok) passed++;
  else failures.push(`${name}${detail ? `\n    ${detail}` : ''}`);
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
function checkEqual(name, got, want) {
  check(name, same(got, want), `want ${JSON.stringify(want)}\n    got  ${JSON.stringify(got)}`);
}

function parseAll(chunks) {
  const p = new SseParser();
  const events = [];
  for (const c of chunks) events.push(...p.push(c));
  events.push(...p.finish());
  return events;
}

// ---------------------------------------------------------------------------------------------
// SSE

const chunk = (delta) => JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }] });
const STREAM = [
  `data: ${chunk({ role: 'assistant', content: '' })}`, '',
  ': ping', '',
  `data: ${JSON.stringify({ choices: [], prompt_progress: { total: 412, cache: 380, processed: 396, time_ms: 30512 } })}`, '',
  `data: ${chunk({ reasoning_content: 'Think: a\nb' })}`, '',
  `data: ${chunk({ content: 'Rome — 東京 😀' })}`, '',
  'data: {"choices":[],"usage":{"prompt_tokens":3}}', '',
  'data: [DONE]', '', '',
];
const WANT = [
  { data: chunk({ role: 'assistant', content: '' }) },
  { comment: 'ping' },
  { data: JSON.stringify({ choices: [], prompt_progress: { total: 412, cache: 380, processed: 396, time_ms: 30512 } }) },
  { data: chunk({ reasoning_content: 'Think: a\nb' }) },
  { data: chunk({ content: 'Rome — 東京 😀' }) },
  { data: '{"choices":[],"usage":{"prompt_tokens":3}}' },
  { data: '[DONE]' },
];
for (const [eol, name] of [['\n', 'LF'], ['\r\n', 'CRLF'], ['\r', 'CR']]) {
  const text = STREAM.join(eol);
  checkEqual(`SSE in one chunk (${name})`, parseAll([text]), WANT);
  checkEqual(`SSE one character at a time (${name})`, parseAll([...text]), WANT);
  const rand = mulberry32(name.length * 7919);
  for (let t = 0; t < 200; t++) {
    const cuts = [];
    for (let i = 0; i < text.length;) {
      const n = 1 + Math.floor(rand() * 40);
      cuts.push(text.slice(i, i + n));
      i += n;
    }
    const got = parseAll(cuts);
    if (!same(got, WANT)) { check(`SSE random chunking ${t} (${name})`, false, `cuts ${JSON.stringify(cuts).slice(0, 300)}`); break; }
    if (t === 199) check(`SSE 200 random chunkings (${name})`, true);
  }
}
checkEqual('SSE multi-line data joins with LF', parseAll(['data: a\ndata: b\ndata:c\n\n']), [{ data: 'a\nb\nc' }]);
checkEqual('SSE other fields ignored, only one leading space stripped', parseAll(['event: x\nid: 3\nretry: 5\ndata:  two\n\n']), [{ data: ' two' }]);
checkEqual('SSE unterminated last event is flushed by finish()', parseAll(['data: {"error":{"message":"boom"}}']), [{ data: '{"error":{"message":"boom"}}' }]);
checkEqual('SSE blank lines alone make no events', parseAll(['\n\n\r\n\n']), []);
checkEqual('SSE a field named data-ish is not data', parseAll(['datum: x\ndata\n\n']), [{ data: '' }]);
checkEqual('SSE CR at a chunk end then LF is one line end', parseAll(['data: a\r', '\ndata: b\r\n\r\n']), [{ data: 'a\nb' }]);

// ---------------------------------------------------------------------------------------------
// Request body and history

const turns = [
  { role: 'user', content: 'Capital of France?' },
  { role: 'assistant', content: 'Paris.  ', reasoning: ' Easy.\n', state: 'done', stats: { ttftMs: 3 } },
  { role: 'user', content: 'And Italy?' },
  { role: 'assistant', content: '', reasoning: '', state: 'error', error: 'HTTP 500' },
  { role: 'user', content: 'Hello?' },
  { role: 'assistant', content: 'Partial', reasoning: '', state: 'interrupted' },
  { role: 'user', content: 'Again' },
];
checkEqual('history: system first, assistant turns verbatim with reasoning_content, empty turns dropped', buildMessages('Be concise.', turns), [
  { role: 'system', content: 'Be concise.' },
  { role: 'user', content: 'Capital of France?' },
  { role: 'assistant', content: 'Paris.  ', reasoning_content: ' Easy.\n' },
  { role: 'user', content: 'And Italy?' },
  { role: 'user', content: 'Hello?' },
  { role: 'assistant', content: 'Partial' },
  { role: 'user', content: 'Again' },
]);
checkEqual('history: blank system prompt is not sent', buildMessages('  \n', [{ role: 'user', content: 'x' }]), [{ role: 'user', content: 'x' }]);

const msgs = [{ role: 'user', content: 'x' }];
checkEqual('request body with thinking and effort', buildRequestBody({ temperature: 0.7, maxTokens: 512, thinking: true, effort: 'high' }, 'kimi-k3', msgs), {
  model: 'kimi-k3', messages: msgs, stream: true, stream_options: { include_usage: true }, return_progress: true,
  chat_template_kwargs: { enable_thinking: true }, temperature: 0.7, max_completion_tokens: 512, reasoning_effort: 'high',
});
const off = buildRequestBody({ temperature: 5, maxTokens: 0, thinking: false, effort: 'high' }, 'm', msgs);
check('request body without thinking: no effort, temperature clamped, bad max tokens left out',
      off.chat_template_kwargs.enable_thinking === false && !('reasoning_effort' in off) && off.temperature === 2 && !('max_completion_tokens' in off),
      JSON.stringify(off));
check('request body ignores an unknown effort', !('reasoning_effort' in buildRequestBody({ thinking: true, effort: 'ludicrous' }, 'm', msgs)));

// ---------------------------------------------------------------------------------------------
// Error text

checkEqual('error.message from the envelope', errorText(400, 'Bad Request', '{"error":{"message":"\'temperature\' must be in [0, 2]","type":"invalid_request_error","param":"temperature","code":"invalid_value"}}'),
           "'temperature' must be in [0, 2]");
checkEqual('plain error string', errorText(500, '', '{"error":"boom"}'), 'boom');
checkEqual('non-JSON body', errorText(502, 'Bad Gateway', '<html>proxy</html>'), 'HTTP 502 Bad Gateway: <html>proxy</html>');
checkEqual('empty body', errorText(503, '', ''), 'HTTP 503');

// ---------------------------------------------------------------------------------------------
// Prometheus

const { totals, samples } = parsePrometheus(`# HELP k3_requests_total HTTP requests
# TYPE k3_requests_total counter
k3_requests_total{endpoint="/health",status="200"} 12
k3_requests_total{endpoint="/v1/chat/completions",status="200"} 3
k3_generated_tokens_total 1.5e3
k3_expert_cache_hit_ratio 0.553
k3_weird{label="a \\"quoted\\" } brace"} 2
not a metric line
k3_nan NaN
k3_inf +Inf
`);
check('prometheus sums label sets', totals.get('k3_requests_total') === 15);
check('prometheus exponent values', totals.get('k3_generated_tokens_total') === 1500);
check('prometheus gauges', totals.get('k3_expert_cache_hit_ratio') === 0.553);
check('prometheus skips NaN and junk, keeps +Inf', !totals.has('k3_nan') && !totals.has('not') && totals.get('k3_inf') === Infinity);
check('prometheus labels', same(samples[0].labels, { endpoint: '/health', status: '200' }));
check('prometheus quoted label values may hold braces', totals.get('k3_weird') === 2 && samples.find((x) => x.name === 'k3_weird')?.labels.label === 'a \\"quoted\\" } brace');

// ---------------------------------------------------------------------------------------------

const total = passed + failures.length;
for (const f of failures) console.error(`FAIL ${f}`);
console.log(`web_api_test: ${passed}/${total} checks passed`);
process.exit(failures.length ? 1 : 0);

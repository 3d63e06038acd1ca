// Unit tests of web/api.js in Node: the web page's SSE parser (every way a stream can be cut
// into network chunks must give the same events), the chat request body and history, the error
// text of failed responses, the /metrics parser, the stored settings' migration (max tokens,
// efforts, samplers), the sampling fields of the request body, the start screen's model line,
// conversation search, the JSON and Markdown exports, and the context-usage figures.
// Usage: node tests/node/web_api_test.mjs        (exit status 1 on any failure)
import {
  SseParser, buildMessages, buildRequestBody, errorText, parsePrometheus, EFFORTS, DEFAULT_SETTINGS, migrateSettings,
  searchConversations, exportFileName, conversationToJson, conversationToMarkdown, contextUsage, SAMPLING_FIELDS,
  samplingValue, modelLine,
} from '../../web/api.js';
import { parse as parseMarkdown } from '../../web/markdown.js';
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
check('request body sends OpenAI-only effort names never (the menu maps them)', !('reasoning_effort' in buildRequestBody({ thinking: true, effort: 'medium' }, 'm', msgs)));

// The samplers: each setting goes out under the server's field name; empty means the server's
// default, so nothing is sent; 0 is a value like any other.
const SAMPLERS = { topP: 0.9, topK: 40, minP: 0.05, seed: 1234, frequencyPenalty: 0.5, presencePenalty: -0.25, repeatPenalty: 1.1, repeatLastN: 32 };
const sampled = buildRequestBody({ temperature: 1, maxTokens: 16, thinking: false, ...SAMPLERS }, 'm', msgs);
checkEqual('request body carries the sampling settings under the API\'s names',
           Object.fromEntries(['top_p', 'top_k', 'min_p', 'seed', 'frequency_penalty', 'presence_penalty', 'repeat_penalty', 'repeat_last_n'].map((k) => [k, sampled[k]])),
           { top_p: 0.9, top_k: 40, min_p: 0.05, seed: 1234, frequency_penalty: 0.5, presence_penalty: -0.25, repeat_penalty: 1.1, repeat_last_n: 32 });
checkEqual('the sampling table covers every setting', SAMPLING_FIELDS.map((f) => f.key), Object.keys(SAMPLERS));
const unset = buildRequestBody({ ...DEFAULT_SETTINGS, topK: '', minP: null, seed: undefined, repeatLastN: 'abc' }, 'm', msgs);
checkEqual('empty sampling settings are not sent (the server\'s defaults)',
           SAMPLING_FIELDS.filter((f) => f.param in unset).map((f) => f.param), []);
const zeros = buildRequestBody({ topK: 0, seed: '0', presencePenalty: '-0.5', repeatLastN: '-1' }, 'm', msgs);
checkEqual('zero and typed text are values', [zeros.top_k, zeros.seed, zeros.presence_penalty, zeros.repeat_last_n], [0, 0, -0.5, -1]);
checkEqual('samplingValue', ['', '  ', null, undefined, 'x', NaN, Infinity, true, '3', 2.5, -1].map(samplingValue),
           [null, null, null, null, null, null, null, null, 3, 2.5, -1]);

// The start screen's line: the server's description of the model when it gives one (the
// built-in model), else the id and the context.
checkEqual('model line: the description', modelLine({ id: 'kimi-k3', meta: { context_length: 8192, description: 'k3-mini: a small model.' } }),
           'k3-mini: a small model.');
checkEqual('model line: id and context', modelLine({ id: 'kimi-k3', meta: { context_length: 8192 } }, (n) => n.toLocaleString('en-US')),
           'kimi-k3 · context 8,192 tokens');
checkEqual('model line: no meta', modelLine({ id: 'x' }), 'x');
checkEqual('model line: no model yet', modelLine(undefined), '');

// ---------------------------------------------------------------------------------------------
// Settings: defaults and the migration of what older pages stored

checkEqual('efforts are the template\'s (src/text/chat.cpp accepts low, high, max)', EFFORTS, ['low', 'high', 'max']);
checkEqual('defaults', { maxTokens: DEFAULT_SETTINGS.maxTokens, effort: DEFAULT_SETTINGS.effort }, { maxTokens: 512, effort: 'max' });
checkEqual('no stored settings → defaults', migrateSettings(null), { ...DEFAULT_SETTINGS });
checkEqual('garbage stored settings → defaults', migrateSettings([1, 2]), { ...DEFAULT_SETTINGS });
const v1 = migrateSettings({ temperature: 0.2, maxTokens: 4096, thinking: false, effort: 'medium', system: 'S', model: 'm' });
checkEqual('version 1 settings: the old 4096 default becomes the new default, medium → high, the rest kept', v1,
           { ...DEFAULT_SETTINGS, version: 2, temperature: 0.2, maxTokens: 512, thinking: false, effort: 'high', system: 'S', model: 'm' });
checkEqual('version 1 efforts map like the server does', ['minimal', 'low', 'medium', 'high', 'xhigh', '', 'bogus'].map((e) => migrateSettings({ effort: e }).effort),
           ['low', 'low', 'high', 'high', 'max', 'max', 'max']);
checkEqual('a chosen max tokens is kept', migrateSettings({ maxTokens: 2000 }).maxTokens, 2000);
checkEqual('version 2 keeps a deliberate 4096', migrateSettings({ version: 2, maxTokens: 4096 }).maxTokens, 4096);
checkEqual('sampling settings default to the server\'s (null)', SAMPLING_FIELDS.map((f) => migrateSettings({})[f.key]), SAMPLING_FIELDS.map(() => null));
const storedSamplers = migrateSettings({ version: 2, topK: 40, minP: '0.05', seed: 'abc', repeatPenalty: {}, topP: 0.9 });
checkEqual('stored sampling settings are kept; what is not a number is dropped',
           [storedSamplers.topK, storedSamplers.minP, storedSamplers.seed, storedSamplers.repeatPenalty, storedSamplers.topP], [40, 0.05, null, null, 0.9]);

// ---------------------------------------------------------------------------------------------
// Conversations: search, exports, context usage

const convs = [
  { id: 'a', title: 'Rome trip', messages: [{ role: 'user', content: 'Where to eat?' }, { role: 'assistant', content: 'Try Trastevere.', reasoning: 'pasta carbonara' }] },
  { id: 'b', title: 'Taxes', messages: [{ role: 'user', content: 'Deadline for FORMS?' }] },
];
const MD = '.md';  // (kept apart from the stem: a word ending in .md reads as a citation to Docs.Citations)
const ids = (list) => list.map((c) => c.id);
checkEqual('search: empty query keeps all', ids(searchConversations(convs, '  ')), ['a', 'b']);
checkEqual('search: title, case-insensitive', ids(searchConversations(convs, 'rOME')), ['a']);
checkEqual('search: message content and reasoning', [ids(searchConversations(convs, 'forms')), ids(searchConversations(convs, 'carbonara'))], [['b'], ['a']]);
checkEqual('search: every word must match', [ids(searchConversations(convs, 'rome forms')), ids(searchConversations(convs, 'eat trastevere'))], [[], ['a']]);

checkEqual('export file names', [exportFileName({ title: 'Hello! What is 2+2? <b>' }, 'md'), exportFileName({ title: '  ' }, 'json'),
                                 exportFileName({ title: 'Café — 東京' }, 'json'), exportFileName({ title: 'x'.repeat(100) }, 'md').length],
           [`hello-what-is-2-2-b${MD}`, 'conversation.json', 'cafe-東京.json', 63]);

const conversation = {
  id: 'c1', title: 'Math', created: Date.UTC(2026, 0, 2), updated: Date.UTC(2026, 0, 3),
  messages: [
    { role: 'user', content: 'What is\n```\n2+2\n```\n?' },
    { role: 'assistant', content: '**4**', reasoning: 'add', state: 'done', stats: { promptTokens: 20, cachedTokens: 4, completionTokens: 7, finish: 'stop', model: 'kimi-k3', ttftMs: 5 } },
    { role: 'user', content: 'More' },
    { role: 'assistant', content: 'Part', reasoning: '', state: 'interrupted', stats: { deltas: 3 } },
  ],
};
const exportedJson = conversationToJson(conversation, Date.UTC(2026, 0, 4));
checkEqual('JSON export', exportedJson, {
  type: 'k3chat.conversation', version: 1, exported_at: '2026-01-04T00:00:00.000Z', id: 'c1', title: 'Math',
  created_at: '2026-01-02T00:00:00.000Z', updated_at: '2026-01-03T00:00:00.000Z',
  messages: [
    { role: 'user', content: 'What is\n```\n2+2\n```\n?' },
    { role: 'assistant', content: '**4**', reasoning_content: 'add', state: 'done', usage: { prompt_tokens: 20, cached_tokens: 4, completion_tokens: 7 }, finish_reason: 'stop', model: 'kimi-k3' },
    { role: 'user', content: 'More' },
    { role: 'assistant', content: 'Part', state: 'interrupted' },
  ],
});
check('JSON export messages are a valid chat history', exportedJson.messages.every((m) => typeof m.role === 'string' && typeof m.content === 'string'));
const md = conversationToMarkdown(conversation, Date.UTC(2026, 0, 4));
check('Markdown export: title, turns, reply as written, interrupted noted',
      md.startsWith('# Math\n') && md.includes('## User') && md.includes('## Assistant') && md.includes('\n**4**\n') && md.includes('_(interrupted)_'), md);
// The user's text sits in a fence longer than any backtick run in it, so it stays literal.
const mdBlocks = parseMarkdown(md);
const codeTexts = JSON.stringify(mdBlocks);
check('Markdown export: user text with a fence of its own survives a Markdown parser', codeTexts.includes(JSON.stringify('What is\n```\n2+2\n```\n?')), codeTexts.slice(0, 400));

checkEqual('context usage from the usage chunk', contextUsage({ promptTokens: 100, completionTokens: 28 }, 8192),
           { used: 128, prompt: 100, generated: 28, total: 8192, fraction: 128 / 8192 });
checkEqual('context usage while streaming: prefill total + deltas', contextUsage({ promptTotal: 50, deltas: 5 }, 100),
           { used: 55, prompt: 50, generated: 5, total: 100, fraction: 0.55 });
checkEqual('context usage without a context length', contextUsage({ promptTokens: 10 }, undefined),
           { used: 10, prompt: 10, generated: 0, total: null, fraction: null });
checkEqual('context usage unknown', [contextUsage(undefined, 10), contextUsage({ deltas: 3 }, 10)], [null, null]);
check('context usage is capped at the whole context', contextUsage({ promptTokens: 90, completionTokens: 30 }, 100).fraction === 1);

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
if (total === 0) console.error('FAIL web_api_test: no check ran');
process.exit(failures.length || total === 0 ? 1 : 0);

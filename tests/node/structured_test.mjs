// Structured output of `coli serve` (docs/structured_output.md): JSON Schema and GBNF grammars
// enforced while sampling, checked with the official clients and ajv (pinned in package.json).
//
//   node tests/node/structured_test.mjs <path-to-coli>
//   (ctest: Serve.StructuredOutput)
//
// The property check samples at temperature 1.0 on the random-weights demo model, the most
// adversarial sampler there is: for each of STRUCTURED_SCHEMAS (default 200) seeded schemas
// covering every supported keyword, plus hand-written ones, the answer must end with
// finish_reason "stop", parse, and validate. The generator keeps every instance finite (strings
// have a maxLength, a format, a pattern or an enum; numbers have at most 16 digits; recursion
// stops), so every answer ends whichever ISA computed the logits; one cut by max_tokens (1500,
// far above the longest instance) fails the check.
import path from 'node:path';
import {
  MODEL_ID, Runner, Server, assert, demoModel, eq, globalTimeout, killAll, postJson, request, show,
} from './serve_util.mjs';

const coliArg = process.argv[2];
if (!coliArg) {
  console.error('usage: node tests/node/structured_test.mjs <path-to-coli>');
  process.exit(2);
}
const coli = path.resolve(coliArg);

let OpenAI, Anthropic, Ajv, addFormats;
try {
  ({ default: OpenAI } = await import('openai'));
  ({ default: Anthropic } = await import('@anthropic-ai/sdk'));
  ({ default: Ajv } = await import('ajv/dist/2020.js'));
  ({ default: addFormats } = await import('ajv-formats'));
} catch (e) {
  console.error(`FAIL: the npm test oracles are not installed (${e.code ?? e.message}).\n` +
                'Run `make test`: it installs them (npm ci --prefix tests/node) before running ctest.');
  process.exit(1);
}

const cancelTimeout = globalTimeout(Number(process.env.SERVE_TEST_TIMEOUT_S ?? 400) * 1000, 'structured_test');
const ONLY = process.env.SERVE_TEST_ONLY ? new RegExp(process.env.SERVE_TEST_ONLY) : null;
const R = new Runner('structured_test');
const check = (name, fn) => (ONLY && !ONLY.test(name) ? Promise.resolve() : R.check(name, fn));

const modelDir = demoModel(coli);
const srv = new Server(coli, modelDir, 'main', []);
await srv.start({});
const openai = new OpenAI({ apiKey: 'sk-local', baseURL: `${srv.url}/v1`, maxRetries: 0, timeout: 120_000 });

const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);
function validates(schema, text, what) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new Error(`${what}: not JSON (${e.message}): ${show(text)}`);
  }
  const ok = ajv.validate(schema, value);
  assert(ok, () => `${what}: ${show(text)} does not validate against ${show(schema, 600)}: ${ajv.errorsText()}`);
  return value;
}
const OFF = { chat_template_kwargs: { enable_thinking: false } };
const user = (content) => ({ role: 'user', content });

// ---- the seeded schema generator ---------------------------------------------------------------

function rng(seed) {
  let s = BigInt(seed) * 6364136223846793005n + 1442695040888963407n;
  return () => {
    s = (s * 6364136223846793005n + 1442695040888963407n) & 0xFFFFFFFFFFFFFFFFn;
    return Number(s >> 33n) / 2 ** 31;
  };
}
function generateSchema(seed) {
  const r = rng(seed);
  const pick = (a) => a[Math.floor(r() * a.length)];
  const int = (lo, hi) => lo + Math.floor(r() * (hi - lo + 1));
  const defs = {};
  const name = () => pick(['id', 'name', 'kind', 'size', 'tags', 'when', 'a', 'b', 'x_y', 'é', 'q']) + int(0, 9);
  function str() {
    switch (int(0, 6)) {
      case 0: return { type: 'string', maxLength: int(0, 6) };
      case 1: { const lo = int(0, 3); return { type: 'string', minLength: lo, maxLength: lo + int(0, 4) }; }
      case 2: return { type: 'string', format: pick(['date', 'time', 'date-time', 'uuid', 'email']) };
      case 3: return { type: 'string', pattern: pick(['^[A-Z]{2}-\\d{3}$', '^(ab|cd)+x?$'.replace('+', '{1,3}'), '^\\w{1,4}\\.[a-z]{2,3}$', '^[^"\\\\]{0,3}"$']) };
      case 4: return { enum: ['red', 'green', 'blue', 'a "quoted" one', 'ünï'].slice(0, int(1, 5)) };
      case 5: return { const: pick(['fixed', 'x\\y', '']) };
      default: return { type: 'string', maxLength: 3 };
    }
  }
  function num() {
    switch (int(0, 5)) {
      case 0: return { type: 'integer' };
      case 1: return { type: 'integer', minimum: int(-50, 50), maximum: int(51, 5000) };
      case 2: return { type: 'integer', exclusiveMinimum: int(-5, 5) };
      case 3: return { type: 'number', minimum: 0, maximum: int(1, 100) };
      case 4: return { type: 'number', exclusiveMinimum: int(0, 3), exclusiveMaximum: int(4, 9) };
      default: return { type: 'number' };
    }
  }
  function value(depth) {
    const k = depth > 2 ? int(0, 3) : int(0, 9);
    switch (k) {
      case 0: return str();
      case 1: return num();
      case 2: return { type: pick(['boolean', 'null']) };
      case 3: return { type: pick([['string', 'null'], ['integer', 'boolean'], ['null', 'number']]), ...(r() < 0.5 ? {} : {}) , maxLength: 4 };
      case 4: return object(depth + 1);
      case 5: return array(depth + 1);
      case 6: return { anyOf: [str(), num(), { type: 'null' }].slice(0, int(1, 3)) };
      case 7: return { oneOf: [{ type: 'boolean' }, { type: 'integer', minimum: 0 }, { type: 'null' }] };
      case 8: {
        const d = 'd' + Object.keys(defs).length;
        defs[d] = {};  // reserved first: a nested $ref takes the next name, never this one
        defs[d] = object(depth + 1);
        return { $ref: `#/$defs/${d}` };
      }
      default: return { allOf: [object(depth + 1), { properties: { extra: str() } }] };
    }
  }
  function object(depth) {
    const props = {};
    const n = int(0, 4);
    for (let i = 0; i < n; i++) props[name()] = value(depth);
    const keys = Object.keys(props);
    const required = keys.filter(() => r() < 0.6);
    const o = { type: 'object', properties: props, required };
    const ap = int(0, 3);
    if (ap <= 1) o.additionalProperties = false;
    return o;
  }
  function array(depth) {
    const a = { type: 'array' };
    if (r() < 0.3) {
      a.prefixItems = [value(depth), value(depth)].slice(0, int(1, 2));
      if (r() < 0.5) a.items = false; else a.items = value(depth);
    } else {
      a.items = value(depth);
    }
    a.minItems = a.items === false ? int(0, a.prefixItems.length) : int(0, 2);
    a.maxItems = a.minItems + int(0, 3);
    return a;
  }
  const root = r() < 0.7 ? object(0) : value(1);
  if (Object.keys(defs).length) root.$defs = defs;
  return root;
}

// Hand-written schemas: recursion, nested refs, every format, strict-style objects.
const HAND = [
  { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['city', 'days'], additionalProperties: false },
  { $defs: { node: { type: 'object', properties: { v: { type: 'integer', minimum: 0, maximum: 9 }, kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 1 } }, required: ['v'], additionalProperties: false } }, $ref: '#/$defs/node' },
  { type: 'array', prefixItems: [{ const: 'head' }, { type: 'number', minimum: 0, maximum: 1 }], items: false, minItems: 2 },
  { type: 'object', properties: { when: { type: 'string', format: 'date-time' }, id: { type: 'string', format: 'uuid' }, mail: { type: 'string', format: 'email' } }, required: ['when', 'id', 'mail'], additionalProperties: false },
  { enum: [1, 'one', null, true, { a: [1] }] },
  { type: ['integer', 'null'], minimum: -3, maximum: 3 },
];

const N = Number(process.env.STRUCTURED_SCHEMAS ?? 200);
await check('property.schemas_at_temperature_1_validate', async () => {
  const schemas = [...HAND, ...Array.from({ length: N }, (_, i) => generateSchema(i + 1))];
  let tokens = 0;
  for (let i = 0; i < schemas.length; i++) {
    const schema = schemas[i];
    ajv.compile(schema);  // the generator writes valid schemas
    const r = await postJson(srv, '/v1/chat/completions', {
      model: MODEL_ID, messages: [user('Answer in JSON.')], temperature: 1.0, seed: i, max_tokens: 1500, ...OFF,
      response_format: { type: 'json_schema', json_schema: { name: 's', schema, strict: true } },
    });
    eq(r.status, 200, `schema ${i} ${show(schema, 300)}: ${r.text}`);
    const c = r.json.choices[0];
    eq(c.finish_reason, 'stop', `schema ${i} ${show(schema, 300)}: finish_reason (content ${show(c.message.content)})`);
    validates(schema, c.message.content, `schema ${i}`);
    tokens += r.json.usage.completion_tokens;
  }
  console.log(`      ${schemas.length} schemas, ${tokens} tokens sampled at temperature 1.0`);
});

await check('openai.json_schema_and_json_object', async () => {
  const schema = HAND[0];
  const a = await openai.chat.completions.create({
    model: MODEL_ID, messages: [user('Weather?')], temperature: 1.0, seed: 3, max_tokens: 200, ...OFF,
    response_format: { type: 'json_schema', json_schema: { name: 'weather', schema, strict: true } },
  });
  validates(schema, a.choices[0].message.content, 'json_schema');
  const b = await openai.chat.completions.create({
    model: MODEL_ID, messages: [user('Anything as JSON.')], temperature: 1.0, seed: 4, max_tokens: 300, ...OFF,
    response_format: { type: 'json_object' },
  });
  // Any object: its keys are unbounded strings, so a sampler that never picks the closing quote
  // may spend the budget (length); an answer that ends is an object.
  const text = b.choices[0].message.content;
  assert(text.startsWith('{'), `json_object: ${show(text)}`);
  if (b.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(text);
    assert(v !== null && typeof v === 'object' && !Array.isArray(v), `json_object: ${text}`);
  } else {
    eq(b.choices[0].finish_reason, 'length', 'json_object finish_reason');
  }
});

await check('openai.streamed_json_schema', async () => {
  const schema = HAND[3];
  const stream = await openai.chat.completions.create({
    model: MODEL_ID, messages: [user('An event.')], temperature: 1.0, seed: 5, max_tokens: 300, stream: true, ...OFF,
    response_format: { type: 'json_schema', json_schema: { name: 'event', schema } },
  });
  let text = '', finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  eq(finish, 'stop', 'finish_reason');
  validates(schema, text, 'streamed');
});

await check('openai.forced_tool_arguments_match', async () => {
  const tools = [
    { type: 'function', function: { name: 'get_weather', strict: true, parameters: HAND[0] } },
    { type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: { q: { type: 'string', maxLength: 5 } }, required: ['q'], additionalProperties: false } } },
  ];
  for (const [choice, seed] of [[{ type: 'function', function: { name: 'get_weather' } }, 1], ['required', 2], ['required', 3]]) {
    const r = await openai.chat.completions.create({
      model: MODEL_ID, messages: [user('Weather in Paris?')], temperature: 1.0, seed, max_tokens: 300, tools, tool_choice: choice, ...OFF,
    });
    const c = r.choices[0];
    eq(c.finish_reason, 'tool_calls', `finish_reason (${show(c.message)})`);
    const call = c.message.tool_calls[0].function;
    const tool = tools.find((t) => t.function.name === call.name);
    assert(tool, `unknown tool ${call.name}`);
    if (typeof choice === 'object') eq(call.name, 'get_weather', 'the named tool');
    validates(tool.function.parameters, call.arguments, `${call.name} arguments`);
  }
});

await check('anthropic.forced_tool_use_input_matches', async () => {
  const anthropic = new Anthropic({ apiKey: 'sk-local', baseURL: srv.url, maxRetries: 0, timeout: 120_000 });
  const input_schema = HAND[0];
  const m = await anthropic.messages.create({
    model: MODEL_ID, max_tokens: 300, temperature: 1.0, messages: [{ role: 'user', content: 'Weather?' }],
    tools: [{ name: 'get_weather', description: 'weather', input_schema }],
    tool_choice: { type: 'tool', name: 'get_weather' }, thinking: { type: 'disabled' },
  });
  eq(m.stop_reason, 'tool_use', `stop_reason (${show(m.content)})`);
  const use = m.content.find((b) => b.type === 'tool_use');
  assert(use && use.name === 'get_weather', `tool_use block: ${show(m.content)}`);
  assert(ajv.validate(input_schema, use.input), `input ${show(use.input)}: ${ajv.errorsText()}`);
});

await check('grammar.gbnf_field_and_max_tokens_is_length', async () => {
  const r = await postJson(srv, '/v1/chat/completions', {
    model: MODEL_ID, messages: [user('Count.')], temperature: 1.0, seed: 9, max_tokens: 60, ...OFF,
    grammar: 'root ::= "[" num ("," num)* "]"\nnum ::= [1-9] [0-9]{0,2}\n',
  });
  eq(r.status, 200, r.text);
  const c = r.json.choices[0];
  if (c.finish_reason === 'stop') assert(/^\[[1-9][0-9]{0,2}(,[1-9][0-9]{0,2})*\]$/.test(c.message.content), c.message.content);
  // An answer the budget cuts is reported as length, never as stop.
  const cut = await postJson(srv, '/v1/chat/completions', {
    model: MODEL_ID, messages: [user('Count.')], temperature: 1.0, seed: 9, max_tokens: 3, ...OFF,
    grammar: 'root ::= "[" [0-9]{20} "]"',
  });
  eq(cut.json.choices[0].finish_reason, 'length', 'a cut constrained answer');
});

await check('llama.completion_endpoint_json_schema_and_grammar', async () => {
  // llama-server's native POST /completion: prompt, n_predict, temperature, seed, json_schema,
  // grammar in; content, stop, stop_type out; streamed as {content, stop:false} pieces, then the
  // whole object with stop true (no [DONE]).
  const schema = HAND[0];
  const r = await postJson(srv, '/completion', { prompt: 'Weather as JSON:', n_predict: 200, temperature: 1.0, seed: 11, json_schema: schema });
  eq(r.status, 200, r.text);
  eq(r.json.stop, true, 'stop');
  eq(r.json.stop_type, 'eos', `stop_type (${show(r.json)})`);
  validates(schema, r.json.content, '/completion content');
  assert(r.json.tokens_predicted > 0 && r.json.tokens_evaluated > 0, show(r.json));
  const g = await postJson(srv, '/completion', { prompt: 'Yes or no?', n_predict: 20, temperature: 1.0, seed: 2, grammar: 'root ::= "yes" | "no"' });
  assert(['yes', 'no'].includes(g.json.content), `grammar answer ${show(g.json.content)}`);
  const s = await request(srv, { method: 'POST', path: '/completion', body: { prompt: 'Weather:', n_predict: 200, temperature: 1.0, seed: 12, stream: true, json_schema: schema } });
  eq(s.status, 200, 'stream status');
  const events = s.text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));
  assert(!events.includes('[DONE]'), 'no [DONE] on /completion');
  const objs = events.map((e) => JSON.parse(e));
  eq(objs.at(-1).stop, true, 'the last event has stop true');
  validates(schema, objs.filter((o) => !o.stop).map((o) => o.content).join(''), 'streamed /completion');
});

await check('errors.400_names_the_problem', async () => {
  const bad = async (extra, param, says) => {
    const r = await postJson(srv, '/v1/chat/completions', { model: MODEL_ID, messages: [user('x')], max_tokens: 4, ...extra });
    eq(r.status, 400, `${show(extra)}: ${r.text}`);
    eq(r.json.error.param, param, 'param');
    assert(r.json.error.message.includes(says), `message ${show(r.json.error.message)} should say ${says}`);
  };
  await bad({ response_format: { type: 'json_schema', json_schema: { name: 'a', schema: { type: 'array', uniqueItems: true } } } },
    'response_format.json_schema.schema', 'uniqueItems');
  await bad({ response_format: { type: 'json_schema', json_schema: { name: 'a', schema: { $ref: 'https://x.example/s.json' } } } },
    'response_format.json_schema.schema', 'remote');
  await bad({ grammar: 'root ::= "a"\nrest ::= (' }, 'grammar', 'line 2, column 10');
  await bad({ grammar: 'root ::= x' }, 'grammar', "undefined rule 'x'");
  await bad({ json_schema: { type: 'string', format: 'hostname' } }, 'json_schema', 'hostname');
  await bad({ response_format: { type: 'yaml' } }, 'response_format.type', 'json_schema');
});

await check('responses.text_format_json_schema', async () => {
  const schema = HAND[0];
  const r = await openai.responses.create({
    model: MODEL_ID, input: 'Weather?', temperature: 1.0, max_output_tokens: 300, reasoning: { effort: 'none' },
    text: { format: { type: 'json_schema', name: 'weather', schema, strict: true } },
  });
  validates(schema, r.output_text, 'responses output_text');
  eq(r.text.format.type, 'json_schema', 'echoed text.format');
});

await srv.stop();
cancelTimeout();
killAll();
const ok = R.summary();
process.exit(ok ? 0 : 1);

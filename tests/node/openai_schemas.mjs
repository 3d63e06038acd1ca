// Validators for `coli serve`'s chat-completion answers against OpenAI's own published schemas
// (tests/data/openai/chat_schemas.json, extracted by extract_openai_schemas.mjs).
//
//   import { validateResponse, validateChunk } from './openai_schemas.mjs';
//   validateResponse(body);   // CreateChatCompletionResponse; throws Error listing every violation
//   validateChunk(chunk);     // CreateChatCompletionStreamResponse (one parsed SSE `data:` object)
//
// The file is OpenAPI 3.1 with OpenAPI 3.0's `nullable: true` mixed in; JSON Schema 2020-12 has no
// such keyword, so before compiling every schema object carrying `nullable: true` becomes
// `anyOf: [<schema without nullable>, {type: "null"}]` (`nullable: false` is dropped). Extra
// properties (reasoning_content, timings, x_k3, ...) are allowed by these schemas.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const require = createRequire(import.meta.url);
const Ajv2020 = require('ajv/dist/2020.js').default ?? require('ajv/dist/2020.js');
const addFormatsMod = require('ajv-formats');
const addFormats = addFormatsMod.default ?? addFormatsMod;

const here = path.dirname(fileURLToPath(import.meta.url));
export const SCHEMA_FILE = path.join(here, '..', 'data', 'openai', 'chat_schemas.json');

// Rewrites nullable everywhere (returns a new tree). Only objects that are schemas carry a boolean
// `nullable`; a property *named* "nullable" inside `properties` maps to a schema object, never to
// `true`, so the check on the value's type keeps them apart.
export function rewriteNullable(node) {
  if (Array.isArray(node)) return node.map(rewriteNullable);
  if (node === null || typeof node !== 'object') return node;
  const out = {};
  for (const [k, v] of Object.entries(node)) {
    if (k === 'nullable' && typeof v === 'boolean') continue;
    out[k] = rewriteNullable(v);
  }
  if (node.nullable === true) {
    // Annotations may stay outside; everything that constrains goes into the first branch.
    const { description, title, deprecated, default: dflt, ...rest } = out;
    const wrapped = { anyOf: [rest, { type: 'null' }] };
    if (description !== undefined) wrapped.description = description;
    if (title !== undefined) wrapped.title = title;
    if (deprecated !== undefined) wrapped.deprecated = deprecated;
    if (dflt !== undefined) wrapped.default = dflt;
    return wrapped;
  }
  return out;
}

const raw = JSON.parse(fs.readFileSync(SCHEMA_FILE, 'utf8'));
const doc = rewriteNullable({ $id: 'openai-chat-schemas.json', components: raw.components });
export const SCHEMA_INFO = raw.info;

const ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: true });
addFormats(ajv);
ajv.addFormat('unixtime', { type: 'number', validate: (x) => Number.isInteger(x) && x >= 0 });
ajv.addSchema(doc);

const compile = (name) => {
  const v = ajv.getSchema(`openai-chat-schemas.json#/components/schemas/${name}`);
  if (!v) throw new Error(`schema ${name} missing from ${SCHEMA_FILE}`);
  return v;
};
const vResponse = compile('CreateChatCompletionResponse');
const vChunk = compile('CreateChatCompletionStreamResponse');
const vCompletion = compile('CreateCompletionResponse');

const clip = (s, n = 300) => (s.length > n ? s.slice(0, n) + '…' : s);
function describe(errors, obj) {
  return errors.map((e) => {
    let at = e.instancePath || '(root)';
    let val;
    try {
      val = e.instancePath.split('/').slice(1)
        .reduce((o, k) => (o == null ? o : o[k.replace(/~1/g, '/').replace(/~0/g, '~')]), obj);
    } catch { val = undefined; }
    const extra = e.params && Object.keys(e.params).length ? ' ' + JSON.stringify(e.params) : '';
    return `  ${at} ${e.message}${extra} (value: ${clip(JSON.stringify(val) ?? 'undefined', 120)}; schema ${e.schemaPath})`;
  }).join('\n');
}

function check(v, what, obj) {
  if (v(obj)) return obj;
  const err = new Error(`${what} does not match OpenAI's schema:\n${describe(v.errors ?? [], obj)}\n` +
                        `  object: ${clip(JSON.stringify(obj), 600)}`);
  err.schemaErrors = v.errors;
  throw err;
}

export const validateResponse = (obj) => check(vResponse, 'CreateChatCompletionResponse', obj);
export const validateChunk = (obj) => check(vChunk, 'CreateChatCompletionStreamResponse', obj);
export const validateCompletion = (obj) => check(vCompletion, 'CreateCompletionResponse', obj);

// Validators for the named roots of another file extracted by extract_openai_schemas.mjs (e.g.
// tests/data/openai/responses_schemas.json): {Name: (obj) => obj}, each throwing an Error that
// lists every violation. The same nullable rewrite and formats as above.
export function schemaValidators(file, names) {
  const extracted = JSON.parse(fs.readFileSync(file, 'utf8'));
  const id = path.basename(file);
  if (!ajv.getSchema(id)) ajv.addSchema(rewriteNullable({ $id: id, components: extracted.components }));
  return Object.fromEntries(names.map((name) => {
    const v = ajv.getSchema(`${id}#/components/schemas/${name}`);
    if (!v) throw new Error(`schema ${name} missing from ${file}`);
    return [name, (obj) => check(v, name, obj)];
  }));
}

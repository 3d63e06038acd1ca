// web/api.js — the page's protocol helpers, free of DOM so Node tests can run them:
// an incremental Server-Sent Events parser, the chat request body (sampling settings included),
// the start screen's model line, the error text of a failed response, a Prometheus text parser
// for /metrics, the stored settings' migration, conversation search, the JSON and Markdown
// exports, and the context-usage figures.

// Incremental SSE parser (the WHATWG event-stream rules that matter here). push(text) returns
// the events completed by that text, each {data} for a `data:` event or {comment} for a `:` line
// (keep-alives). Lines end in LF, CRLF or CR; a CR at the end of a chunk waits for the next one,
// so a CRLF split across chunks is one line end. finish() flushes an unterminated last event.
export class SseParser {
  constructor() {
    this.buffer = '';
    this.data = null;  // the data lines of the event being read, or null
  }

  push(text) {
    this.buffer += text;
    const events = [];
    let start = 0;
    for (let i = 0; i < this.buffer.length; i++) {
      const c = this.buffer[i];
      if (c !== '\n' && c !== '\r') continue;
      if (c === '\r' && i + 1 === this.buffer.length) break;  // maybe the first half of CRLF
      this.line(this.buffer.slice(start, i), events);
      if (c === '\r' && this.buffer[i + 1] === '\n') i++;
      start = i + 1;
    }
    this.buffer = this.buffer.slice(start);
    return events;
  }

  finish() {
    const events = [];
    if (this.buffer) this.line(this.buffer.replace(/\r$/, ''), events);
    this.buffer = '';
    if (this.data !== null) events.push({ data: this.data.join('\n') });
    this.data = null;
    return events;
  }

  line(line, events) {
    if (line === '') {
      if (this.data !== null) events.push({ data: this.data.join('\n') });
      this.data = null;
      return;
    }
    if (line[0] === ':') {
      events.push({ comment: line.slice(1).trim() });
      return;
    }
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value[0] === ' ') value = value.slice(1);
    if (field === 'data') (this.data ??= []).push(value);
  }
}

// The messages array for /v1/chat/completions: the system prompt, then every turn. An assistant
// turn goes back with its content and reasoning_content exactly as they streamed in, so the
// server renders the same tokens and can reuse its prefix; turns that produced nothing (failed,
// or stopped before any output) are left out.
export function buildMessages(systemPrompt, turns) {
  const messages = [];
  if (systemPrompt && systemPrompt.trim()) messages.push({ role: 'system', content: systemPrompt });
  for (const t of turns) {
    if (t.role === 'user') {
      messages.push({ role: 'user', content: t.content });
    } else if (t.role === 'assistant') {
      if (!t.content && !t.reasoning) continue;
      const m = { role: 'assistant', content: t.content ?? '' };
      if (t.reasoning) m.reasoning_content = t.reasoning;
      messages.push(m);
    }
  }
  return messages;
}

// The thinking efforts the K3 chat template accepts (src/text/chat.cpp: low, high, max; the
// server's default when none is sent is max). The server also takes OpenAI's names and maps them
// onto these three (docs/serving.md §3.12), so a menu of OpenAI's five would offer choices that
// change nothing.
export const EFFORTS = ['low', 'high', 'max'];
export const DEFAULT_EFFORT = 'max';
const EFFORT_ALIASES = { minimal: 'low', medium: 'high', xhigh: 'max' };

// A default that keeps a reply short on the built-in demo model (assets/k3-mini decodes at a few
// tokens per second on two busy cores: 512 tokens is about a minute at worst; its replies end
// by themselves after ~50). The user raises it in Settings for a real model.
export const DEFAULT_MAX_TOKENS = 512;
const OLD_DEFAULT_MAX_TOKENS = 4096;  // what pages before settings version 2 stored
export const SETTINGS_VERSION = 2;

// The samplers the page offers besides temperature: the setting, the request field it becomes,
// and the input that edits it (web/index.html, which holds the ranges the server accepts:
// docs/serving.md §3.6.1). null (an empty input) sends nothing, so the server's default applies.
export const SAMPLING_FIELDS = Object.freeze([
  { key: 'topP', param: 'top_p', input: 'top-p' },
  { key: 'topK', param: 'top_k', input: 'top-k' },
  { key: 'minP', param: 'min_p', input: 'min-p' },
  { key: 'seed', param: 'seed', input: 'seed' },
  { key: 'frequencyPenalty', param: 'frequency_penalty', input: 'frequency-penalty' },
  { key: 'presencePenalty', param: 'presence_penalty', input: 'presence-penalty' },
  { key: 'repeatPenalty', param: 'repeat_penalty', input: 'repeat-penalty' },
  { key: 'repeatLastN', param: 'repeat_last_n', input: 'repeat-last-n' },
].map(Object.freeze));

export const DEFAULT_SETTINGS = Object.freeze({
  version: SETTINGS_VERSION, temperature: 0.6, maxTokens: DEFAULT_MAX_TOKENS, thinking: true,
  effort: DEFAULT_EFFORT, system: '', model: '',
  ...Object.fromEntries(SAMPLING_FIELDS.map((f) => [f.key, null])),
});

// A sampling setting as typed or stored → a number, or null for "the server's default" (empty,
// missing, or not a finite number). Range checks are the server's: it answers a value out of
// range with an error that names the field, the value and the range, and the page shows it.
export function samplingValue(raw) {
  if (raw === null || raw === undefined || (typeof raw === 'string' && !raw.trim()) || typeof raw === 'boolean') return null;
  const n = Number(raw);
  return Number.isFinite(n) ? n : null;
}

// Settings as stored by any version of the page → the current shape. Version 1 stored every
// field, defaults included, so its 4096-token default is taken for the default it was, and its
// efforts are mapped onto the template's (an empty effort meant "not sent", i.e. max). Sampling
// settings stored by no version (older pages) are null: the server's defaults.
export function migrateSettings(stored) {
  const s = { ...DEFAULT_SETTINGS, ...(stored && typeof stored === 'object' && !Array.isArray(stored) ? stored : {}) };
  if (!(Number(stored?.version) >= 2) && Number(s.maxTokens) === OLD_DEFAULT_MAX_TOKENS) s.maxTokens = DEFAULT_MAX_TOKENS;
  s.effort = EFFORTS.includes(s.effort) ? s.effort : EFFORT_ALIASES[s.effort] ?? DEFAULT_EFFORT;
  for (const f of SAMPLING_FIELDS) s[f.key] = samplingValue(s[f.key]);
  s.version = SETTINGS_VERSION;
  return s;
}

export function buildRequestBody(settings, model, messages) {
  const body = {
    model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    return_progress: true,
    chat_template_kwargs: { enable_thinking: !!settings.thinking },
  };
  const temperature = Number(settings.temperature);
  if (Number.isFinite(temperature)) body.temperature = Math.min(2, Math.max(0, temperature));
  const maxTokens = Math.floor(Number(settings.maxTokens));
  if (Number.isFinite(maxTokens) && maxTokens >= 1) body.max_completion_tokens = maxTokens;
  if (settings.thinking && EFFORTS.includes(settings.effort)) body.reasoning_effort = settings.effort;
  for (const f of SAMPLING_FIELDS) {
    const v = samplingValue(settings[f.key]);
    if (v !== null) body[f.param] = v;
  }
  return body;
}

// The start screen's line about the model: what the server says it is (meta.description, given
// for the built-in model), else its id and context length. '' before the model list arrives.
export function modelLine(model, format = (n) => String(n)) {
  if (!model || typeof model.id !== 'string') return '';
  const description = model.meta?.description;
  if (typeof description === 'string' && description.trim()) return description.trim();
  const context = model.meta?.context_length;
  return Number.isFinite(context) && context > 0 ? `${model.id} · context ${format(context)} tokens` : model.id;
}

// The text to show for a failed response: error.message of an OpenAI error envelope, else the
// status line and the start of the body.
export function errorText(status, statusText, bodyText) {
  try {
    const body = JSON.parse(bodyText);
    const message = body?.error?.message ?? (typeof body?.error === 'string' ? body.error : null) ?? body?.message;
    if (typeof message === 'string' && message) return message;
  } catch { /* not JSON */ }
  const snippet = String(bodyText ?? '').trim().slice(0, 200);
  return `HTTP ${status}${statusText ? ' ' + statusText : ''}${snippet ? ': ' + snippet : ''}`;
}

// Prometheus text format → Map of metric name → sum over its label sets (and `byLabels`, the
// individual samples). Comments, malformed lines and non-numeric values are skipped.
export function parsePrometheus(text) {
  const totals = new Map();
  const samples = [];
  for (const raw of String(text).split('\n')) {
    const line = raw.trim();
    if (!line || line[0] === '#') continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const value = m[3] === '+Inf' ? Infinity : m[3] === '-Inf' ? -Infinity : Number(m[3]);
    if (Number.isNaN(value)) continue;
    const labels = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    samples.push({ name: m[1], labels, value });
    totals.set(m[1], (totals.get(m[1]) ?? 0) + value);
  }
  return { totals, samples };
}

// ---------------------------------------------------------------------------------------------
// Conversations

// The conversations whose title or any message (content or reasoning) contains every word of
// the query, case-insensitively; an empty query keeps them all.
export function searchConversations(conversations, query) {
  const words = String(query ?? '').toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return conversations;
  return conversations.filter((c) => {
    const text = [c.title ?? '', ...(c.messages ?? []).map((m) => `${m.content ?? ''}\n${m.reasoning ?? ''}`)].join('\n').toLowerCase();
    return words.every((w) => text.includes(w));
  });
}

// A file name for an export: the title's letters and digits, dashes between, at most 60 chars.
export function exportFileName(conversation, extension) {
  const stem = String(conversation.title ?? '').normalize('NFKD').replace(/[^\p{L}\p{N}]+/gu, '-')
    .replace(/^-+|-+$/g, '').slice(0, 60).replace(/-+$/, '').toLowerCase();
  return `${stem || 'conversation'}.${extension}`;
}

const iso = (ms) => (Number.isFinite(ms) ? new Date(ms).toISOString() : null);

// The JSON export of one conversation: the messages in the chat API's shape (role, content,
// reasoning_content), each reply with its end state and its usage figures, so a file can be
// read back or fed to another client as it is.
export function conversationToJson(conversation, exportedAt = Date.now()) {
  const messages = (conversation.messages ?? []).map((m) => {
    const out = { role: m.role, content: m.content ?? '' };
    if (m.role !== 'assistant') return out;
    if (m.reasoning) out.reasoning_content = m.reasoning;
    out.state = m.state ?? 'done';
    if (m.error) out.error = m.error;
    const s = m.stats ?? {};
    const usage = {};
    if (Number.isFinite(s.promptTokens)) usage.prompt_tokens = s.promptTokens;
    if (Number.isFinite(s.cachedTokens)) usage.cached_tokens = s.cachedTokens;
    if (Number.isFinite(s.completionTokens)) usage.completion_tokens = s.completionTokens;
    if (Object.keys(usage).length) out.usage = usage;
    if (s.finish) out.finish_reason = s.finish;
    if (s.model) out.model = s.model;
    return out;
  });
  return {
    type: 'k3chat.conversation', version: 1, exported_at: iso(exportedAt), id: conversation.id,
    title: conversation.title ?? '', created_at: iso(conversation.created), updated_at: iso(conversation.updated), messages,
  };
}

// A fence longer than any run of backticks in the text, so the text cannot close it.
function fence(text) {
  let longest = 0;
  for (const m of String(text).matchAll(/`+/g)) longest = Math.max(longest, m[0].length);
  return '`'.repeat(Math.max(3, longest + 1));
}

// The Markdown export: a heading per turn; replies are written as the model wrote them (they
// are Markdown already), user messages and reasoning as quoted or fenced text so that their
// characters stay literal.
export function conversationToMarkdown(conversation, exportedAt = Date.now()) {
  const out = [`# ${String(conversation.title || 'Untitled').replace(/\n/g, ' ')}`, ''];
  out.push(`_Exported from the Kimi K3 web page on ${iso(exportedAt)}._`, '');
  for (const m of conversation.messages ?? []) {
    if (m.role === 'user') {
      const f = fence(m.content ?? '');
      out.push('## User', '', f + 'text', m.content ?? '', f, '');
    } else if (m.role === 'assistant') {
      out.push('## Assistant', '');
      if (m.reasoning) {
        out.push('<details><summary>Reasoning</summary>', '');
        const f = fence(m.reasoning);
        out.push(f + 'text', m.reasoning, f, '', '</details>', '');
      }
      if (m.content) out.push(m.content, '');
      const notes = [];
      if (m.state === 'interrupted') notes.push('interrupted');
      if (m.state === 'error') notes.push(`failed: ${m.error ?? 'error'}`);
      if (m.stats?.finish === 'length') notes.push('stopped at the token limit');
      if (notes.length) out.push(`_(${notes.join('; ')})_`, '');
    }
  }
  return out.join('\n');
}

// How much of the model's context a conversation fills: the last reply's prompt plus generated
// tokens (from its usage chunk, or while it streams from the prefill progress and the deltas
// seen) against the model's context length. null when nothing is known yet.
export function contextUsage(stats, contextLength) {
  if (!stats) return null;
  const prompt = Number.isFinite(stats.promptTokens) ? stats.promptTokens : Number.isFinite(stats.promptTotal) ? stats.promptTotal : null;
  if (prompt === null) return null;
  const generated = Number.isFinite(stats.completionTokens) ? stats.completionTokens : stats.deltas ?? 0;
  const used = prompt + generated;
  const total = Number.isFinite(contextLength) && contextLength > 0 ? contextLength : null;
  return { used, prompt, generated, total, fraction: total ? Math.min(1, used / total) : null };
}

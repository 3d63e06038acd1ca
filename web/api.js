// web/api.js — the page's protocol helpers, free of DOM so Node tests can run them:
// an incremental Server-Sent Events parser, the chat request body, the error text of a failed
// response, and a Prometheus text parser for /metrics.

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

export const EFFORTS = ['minimal', 'low', 'medium', 'high', 'xhigh'];

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
  return body;
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

// web/app.js — the chat page served by `coli serve` / `coli web` (docs/serving.md §3.12).
//
// Talks to its own origin only: GET /health (loading screen, status panel), GET /v1/models,
// GET /metrics (shown when it answers 200), POST /v1/chat/completions streamed as SSE. Model
// output goes through markdown.js, which builds DOM nodes and never parses HTML. Conversations
// and settings live in localStorage; the API key lives in sessionStorage only.
import { parse as parseMarkdown, toDom } from './markdown.js';
import { SseParser, buildMessages, buildRequestBody, errorText, parsePrometheus, EFFORTS } from './api.js';

const $ = (id) => document.getElementById(id);
const el = (tag, className, text) => {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
};

const KEYS = { conversations: 'k3chat.conversations', current: 'k3chat.current', settings: 'k3chat.settings', apiKey: 'k3chat.apiKey' };
const DEFAULT_SETTINGS = { temperature: 0.6, maxTokens: 4096, thinking: true, effort: '', system: '', model: '' };

const state = {
  settings: { ...DEFAULT_SETTINGS },
  conversations: [],  // [{id, title, created, updated, messages: [{role, content, reasoning, state, error, stats}]}]
  currentId: null,    // null: a fresh, unsaved thread
  models: [],
  active: null,       // the reply being streamed: {conversation, message, controller}
  views: new Map(),   // message → its DOM view, for the messages of the thread on screen
  healthy: false,
};

// ---------------------------------------------------------------------------------------------
// Storage

function readJson(storage, key, fallback) {
  try {
    const text = storage.getItem(key);
    return text === null ? fallback : JSON.parse(text);
  } catch {
    return fallback;
  }
}

function saveConversations() {
  try {
    localStorage.setItem(KEYS.conversations, JSON.stringify(state.conversations));
    if (state.currentId) localStorage.setItem(KEYS.current, state.currentId);
    else localStorage.removeItem(KEYS.current);
  } catch (e) {
    notice(`Could not save the conversation (${e.name}); it is kept until the page closes.`);
  }
}

function saveSettings() {
  try { localStorage.setItem(KEYS.settings, JSON.stringify(state.settings)); } catch { /* private mode */ }
}

function apiKey() {
  try { return sessionStorage.getItem(KEYS.apiKey) ?? ''; } catch { return ''; }
}

function loadState() {
  const settings = readJson(localStorage, KEYS.settings, {});
  state.settings = { ...DEFAULT_SETTINGS, ...(settings && typeof settings === 'object' ? settings : {}) };
  const list = readJson(localStorage, KEYS.conversations, []);
  state.conversations = Array.isArray(list)
    ? list.filter((c) => c && typeof c.id === 'string' && Array.isArray(c.messages))
    : [];
  // A reply that was streaming when the page went away is what it is now: interrupted.
  for (const c of state.conversations)
    for (const m of c.messages) if (m.role === 'assistant' && m.state === 'streaming') m.state = 'interrupted';
  const current = localStorage.getItem(KEYS.current);
  state.currentId = state.conversations.some((c) => c.id === current) ? current : null;
}

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// ---------------------------------------------------------------------------------------------
// Conversations

const currentConversation = () => state.conversations.find((c) => c.id === state.currentId) ?? null;

function titleOf(text) {
  const line = text.trim().split('\n')[0].trim();
  return line.length > 60 ? line.slice(0, 57) + '…' : line || 'Untitled';
}

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

function startNewChat() {
  state.currentId = null;
  saveConversations();
  renderConversationList();
  renderThread();
  closeSidebarOnNarrow();
  $('prompt').focus();
}

function openConversation(id) {
  state.currentId = id;
  saveConversations();
  renderConversationList();
  renderThread();
  closeSidebarOnNarrow();
}

function deleteConversation(id) {
  if (state.active?.conversation.id === id) state.active.controller.abort();
  state.conversations = state.conversations.filter((c) => c.id !== id);
  if (state.currentId === id) state.currentId = null;
  saveConversations();
  renderConversationList();
  renderThread();
}

function renderConversationList() {
  const list = $('conversations');
  list.replaceChildren();
  const sorted = [...state.conversations].sort((a, b) => (b.updated ?? 0) - (a.updated ?? 0));
  for (const c of sorted) {
    const item = el('li', 'conv' + (c.id === state.currentId ? ' active' : ''));
    item.dataset.id = c.id;
    const open = el('button', 'conv-open', c.title);
    open.type = 'button';
    open.title = c.title;
    if (c.id === state.currentId) open.setAttribute('aria-current', 'true');
    open.addEventListener('click', () => openConversation(c.id));
    const del = el('button', 'conv-delete', '×');
    del.type = 'button';
    del.setAttribute('aria-label', `Delete conversation: ${c.title}`);
    del.title = 'Delete';
    del.addEventListener('click', () => deleteConversation(c.id));
    item.append(open, del);
    list.append(item);
  }
  $('conversations-empty').hidden = sorted.length > 0;
}

// ---------------------------------------------------------------------------------------------
// Thread

function renderThread() {
  const thread = $('thread');
  state.views.clear();
  thread.replaceChildren();
  const conversation = currentConversation();
  $('empty-thread').hidden = !!conversation && conversation.messages.length > 0;
  if (conversation) for (const m of conversation.messages) thread.append(messageView(m).root);
  thread.scrollTop = thread.scrollHeight;
}

function messageView(message) {
  const root = el('article', `msg ${message.role === 'user' ? 'user' : 'assistant'}`);
  const view = { root, userToggled: false };
  if (message.role === 'user') {
    root.append(el('div', 'content', message.content));
  } else {
    const details = el('details', 'reasoning');
    const summary = el('summary', 'reasoning-summary');
    summary.addEventListener('click', () => { view.userToggled = true; });
    const body = el('div', 'reasoning-text');
    details.append(summary, body);
    details.open = message.state === 'streaming' && !message.content;
    view.details = details;
    view.summary = summary;
    view.reasoning = body;
    view.content = el('div', 'content markdown');
    view.note = el('div', 'note');
    view.stats = el('div', 'stats');
    root.append(details, view.content, view.note, view.stats);
    updateMessageView(message, view);
  }
  state.views.set(message, view);
  return view;
}

function isNearBottom(thread) {
  return thread.scrollHeight - thread.scrollTop - thread.clientHeight < 80;
}

function updateMessageView(message, view = state.views.get(message)) {
  if (!view || !view.content) return;
  const thread = $('thread');
  const stick = isNearBottom(thread);
  const streaming = message.state === 'streaming';
  view.root.dataset.state = message.state ?? 'done';
  view.root.classList.toggle('has-output', !!(message.content || message.reasoning));

  const reasoning = message.reasoning ?? '';
  view.details.hidden = !reasoning;
  if (view.reasoning.textContent !== reasoning) view.reasoning.textContent = reasoning;
  const thinking = streaming && !message.content;
  const seconds = message.stats?.thinkMs ? ` · ${(message.stats.thinkMs / 1000).toFixed(1)} s` : '';
  view.summary.textContent = thinking ? 'Thinking…' : `Reasoning${seconds}`;
  if (streaming && message.content && view.details.open && !view.userToggled) view.details.open = false;

  const key = (streaming ? 's' : 'f') + (message.content ?? '');
  if (view.renderedKey !== key) {
    view.content.replaceChildren(toDom(parseMarkdown(message.content ?? ''), document));
    if (!streaming) addCopyButtons(view.content);
    view.renderedKey = key;
  }

  const notes = [];
  if (message.state === 'interrupted') notes.push(message.content || reasoning ? 'Interrupted.' : 'Stopped before any output.');
  if (message.state === 'error') notes.push(message.error || 'The request failed.');
  if (message.stats?.finish === 'length') notes.push('Stopped at the token limit.');
  view.note.textContent = notes.join(' ');
  view.note.className = 'note' + (message.state === 'error' ? ' error' : message.state === 'interrupted' ? ' interrupted' : '');
  view.note.hidden = notes.length === 0;
  if (message.state === 'error') view.note.setAttribute('role', 'alert');

  view.stats.textContent = statsText(message);
  view.stats.hidden = !view.stats.textContent;
  if (message.stats?.requestId) view.stats.title = `request ${message.stats.requestId}`;
  if (stick) thread.scrollTop = thread.scrollHeight;
}

function addCopyButtons(container) {
  if (!navigator.clipboard) return;
  for (const pre of container.querySelectorAll('pre')) {
    if (pre.querySelector('.copy')) continue;
    const button = el('button', 'copy', 'Copy');
    button.type = 'button';
    button.addEventListener('click', () => {
      navigator.clipboard.writeText(pre.querySelector('code')?.textContent ?? '').then(
        () => { button.textContent = 'Copied'; setTimeout(() => { button.textContent = 'Copy'; }, 1500); },
        () => { button.textContent = 'Copy failed'; });
    });
    pre.append(button);
  }
}

const fmt = (n, digits = 0) => Number(n).toLocaleString(undefined, { maximumFractionDigits: digits, minimumFractionDigits: digits });

function statsText(message) {
  const s = message.stats;
  if (!s) return '';
  const parts = [];
  if (s.ttftMs !== undefined) parts.push(`TTFT ${fmt(s.ttftMs / 1000, 2)} s`);
  if (s.tokensPerSecond) parts.push(`${fmt(s.tokensPerSecond, 1)} tok/s`);
  if (s.completionTokens === undefined && s.deltas) parts.push(`${fmt(s.deltas)} tokens`);
  if (s.promptTokens !== undefined) parts.push(`prompt ${fmt(s.promptTokens)}${s.cachedTokens ? ` (${fmt(s.cachedTokens)} cached)` : ''}`);
  if (s.completionTokens !== undefined) parts.push(`completion ${fmt(s.completionTokens)}`);
  if (s.queueMs !== undefined && s.queueMs !== null) parts.push(`queue ${fmt(s.queueMs)} ms`);
  if (s.reuse) parts.push(`reuse ${s.reuse}`);
  return parts.join(' · ');
}

// Re-rendering Markdown on every delta is quadratic in the reply; renders are coalesced into
// animation frames, and spaced out further when one render takes long.
const pending = new Set();
let renderScheduled = false;
let lastRenderCost = 0;
function scheduleRender(message) {
  pending.add(message);
  if (renderScheduled) return;
  renderScheduled = true;
  const run = () => {
    renderScheduled = false;
    const t0 = performance.now();
    for (const m of pending) updateMessageView(m);
    pending.clear();
    lastRenderCost = performance.now() - t0;
  };
  const delay = lastRenderCost > 12 ? Math.min(1000, lastRenderCost * 4) : 0;
  if (delay) setTimeout(() => requestAnimationFrame(run), delay);
  else requestAnimationFrame(run);
}

function flushRender(message) {
  pending.delete(message);
  updateMessageView(message);
}

// ---------------------------------------------------------------------------------------------
// Sending and streaming

class StreamError extends Error {}

async function send() {
  if (state.active) return;
  const text = $('prompt').value;
  if (!text.trim()) return;
  const model = $('model').value || state.models[0] || '';
  if (!model) {
    notice('No model yet: the server has not answered /v1/models.');
    loadModels();
    return;
  }

  let conversation = currentConversation();
  if (!conversation) {
    conversation = { id: newId(), title: titleOf(text), created: Date.now(), updated: Date.now(), messages: [] };
    state.conversations.push(conversation);
    state.currentId = conversation.id;
    renderThread();
  }
  const history = [...conversation.messages, { role: 'user', content: text }];
  const message = { role: 'assistant', content: '', reasoning: '', state: 'streaming', stats: {} };
  conversation.messages.push(history[history.length - 1], message);
  conversation.updated = Date.now();
  $('prompt').value = '';
  $('empty-thread').hidden = true;
  const thread = $('thread');
  thread.append(messageView(history[history.length - 1]).root, messageView(message).root);
  thread.scrollTop = thread.scrollHeight;
  saveConversations();
  renderConversationList();

  const controller = new AbortController();
  state.active = { conversation, message, controller };
  updateComposer();
  const body = buildRequestBody(state.settings, model, buildMessages(state.settings.system, history));
  const t0 = performance.now();
  const timing = { t0, first: 0, last: 0 };
  let lastSave = t0;
  try {
    const response = await fetch('v1/chat/completions', {
      method: 'POST', headers: headers(true), body: JSON.stringify(body), signal: controller.signal, cache: 'no-store',
    });
    const queue = response.headers.get('x-queue-wait-ms') ?? response.headers.get('x-colibri-queue-wait-ms');
    if (queue !== null && queue !== '' && Number.isFinite(Number(queue))) message.stats.queueMs = Number(queue);
    message.stats.requestId = response.headers.get('x-request-id') ?? undefined;
    if (!response.ok) {
      message.state = 'error';
      message.error = errorText(response.status, response.statusText, await response.text());
      if (response.status === 503 || response.status === 401) pollHealth(0);
      return;
    }
    if (!(response.headers.get('content-type') ?? '').includes('text/event-stream')) {
      applyCompletion(message, await response.json());  // a server that ignored stream: true
      message.state = 'done';
      return;
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    const parser = new SseParser();
    let finished = false;
    for (;;) {
      const { value, done } = await reader.read();
      const events = done ? [...parser.push(decoder.decode()), ...parser.finish()]
                          : parser.push(decoder.decode(value, { stream: true }));
      for (const event of events) {
        if (event.comment !== undefined) continue;  // keep-alive
        if (event.data === '[DONE]') { finished = true; break; }
        applyChunk(message, event.data, timing);
      }
      if (finished || done) break;
      scheduleRender(message);
      if (performance.now() - lastSave > 2000) { saveConversations(); lastSave = performance.now(); }
    }
    if (finished) reader.cancel().catch(() => {});
    if (message.state === 'streaming') {
      message.state = finished ? 'done' : 'error';
      if (!finished) message.error = 'The connection closed before the reply was complete.';
    }
  } catch (e) {
    if (e.name === 'AbortError') {
      message.state = 'interrupted';
    } else {
      message.state = 'error';
      message.error = e instanceof StreamError ? e.message : `Network error: ${e.message}`;
    }
  } finally {
    finishStats(message, timing);
    state.active = null;
    conversation.updated = Date.now();
    hidePrefill();
    saveConversations();
    flushRender(message);
    updateComposer();
    setTimeout(pollMetrics, 300);
  }
}

function applyChunk(message, data, timing) {
  let chunk;
  try { chunk = JSON.parse(data); } catch { return; }
  if (!chunk || typeof chunk !== 'object') return;
  if (chunk.error) {
    const text = typeof chunk.error === 'string' ? chunk.error : chunk.error.message;
    throw new StreamError(text || 'The server reported an error during generation.');
  }
  const s = message.stats;
  if (chunk.prompt_progress) showPrefill(chunk.prompt_progress);
  const choice = Array.isArray(chunk.choices) ? chunk.choices[0] : null;
  if (choice) {
    const delta = choice.delta ?? {};
    const reasoning = typeof delta.reasoning_content === 'string' ? delta.reasoning_content
                    : typeof delta.reasoning === 'string' ? delta.reasoning : '';
    const content = typeof delta.content === 'string' ? delta.content : '';
    if (reasoning || content) {
      const now = performance.now();
      if (!timing.first) {
        timing.first = now;
        s.ttftMs = now - timing.t0;
        hidePrefill();
      }
      timing.last = now;
      s.deltas = (s.deltas ?? 0) + 1;
      if (reasoning) message.reasoning += reasoning;
      if (content) {
        if (!message.content && message.reasoning && !s.thinkMs) s.thinkMs = now - timing.first;
        message.content += content;
      }
    }
    if (choice.finish_reason) s.finish = choice.finish_reason;
  }
  if (chunk.usage) applyUsage(s, chunk.usage);
  if (chunk.timings?.predicted_per_second) s.serverTokensPerSecond = chunk.timings.predicted_per_second;
  if (typeof chunk.x_k3?.reuse === 'string') s.reuse = chunk.x_k3.reuse;
}

function applyUsage(s, usage) {
  if (Number.isFinite(usage.prompt_tokens)) s.promptTokens = usage.prompt_tokens;
  if (Number.isFinite(usage.completion_tokens)) s.completionTokens = usage.completion_tokens;
  const cached = usage.prompt_tokens_details?.cached_tokens;
  if (Number.isFinite(cached)) s.cachedTokens = cached;
}

function applyCompletion(message, body) {
  const m = body?.choices?.[0]?.message ?? {};
  message.content = typeof m.content === 'string' ? m.content : '';
  message.reasoning = typeof m.reasoning_content === 'string' ? m.reasoning_content : typeof m.reasoning === 'string' ? m.reasoning : '';
  if (body?.usage) applyUsage(message.stats, body.usage);
  message.stats.finish = body?.choices?.[0]?.finish_reason;
}

function finishStats(message, timing) {
  const s = message.stats;
  const tokens = s.completionTokens ?? s.deltas ?? 0;
  const seconds = timing.first ? (timing.last - timing.first) / 1000 : 0;
  if (s.serverTokensPerSecond) s.tokensPerSecond = s.serverTokensPerSecond;
  else if (tokens > 1 && seconds > 0) s.tokensPerSecond = (tokens - 1) / seconds;
  delete s.serverTokensPerSecond;
}

function stop() {
  state.active?.controller.abort();
}

function updateComposer() {
  const busy = !!state.active;
  $('send').hidden = busy;
  $('stop').hidden = !busy;
  $('send').disabled = busy;
  document.body.classList.toggle('busy', busy);
}

function showPrefill(p) {
  const total = Number(p.total) || 0;
  const processed = Math.min(total, Number(p.processed) || 0);
  const cached = Number(p.cache) || 0;
  $('prefill').hidden = false;
  const bar = $('prefill-progress');
  bar.max = Math.max(1, total);
  bar.value = processed;
  const seconds = p.time_ms ? ` · ${fmt(p.time_ms / 1000, 1)} s` : '';
  $('prefill-text').textContent = `Reading the prompt: ${fmt(processed)} / ${fmt(total)} tokens` +
    (cached ? ` (${fmt(cached)} reused)` : '') + seconds;
}

function hidePrefill() {
  $('prefill').hidden = true;
}

// ---------------------------------------------------------------------------------------------
// Server status: /health, /v1/models, /metrics

let healthTimer = 0;
async function pollHealth(delayMs = 0) {
  clearTimeout(healthTimer);
  if (delayMs) { healthTimer = setTimeout(() => pollHealth(0), delayMs); return; }
  let next = 5000;
  try {
    const response = await fetch('health', { headers: headers(false), cache: 'no-store' });
    const text = await response.text();
    let body = null;
    try { body = JSON.parse(text); } catch { /* not JSON */ }
    if (response.status === 503 && body?.status === 'loading') {
      showLoading(body);
      next = 1000;
    } else if (response.ok) {
      hideLoading();
      const wasHealthy = state.healthy;
      state.healthy = true;
      showHealth(body ?? {});
      if (!wasHealthy || !state.models.length) loadModels();
    } else if (body?.status === 'error') {
      showLoading({ status: 'error', message: body.message });
      setHealthDot('error', `Error: ${body.message ?? 'the model failed to load'}`);
      next = 10000;
    } else {
      state.healthy = false;
      setHealthDot('warn', body?.status ? `Server ${body.status}` : `Health check: HTTP ${response.status}`);
      next = 2000;
    }
  } catch {
    state.healthy = false;
    setHealthDot('error', 'Server unreachable');
    next = 2000;
  }
  if (document.visibilityState === 'hidden') next = Math.max(next, 30000);
  healthTimer = setTimeout(() => pollHealth(0), next);
}

function setHealthDot(kind, text) {
  const dot = $('health-dot');
  dot.className = `dot ${kind}`;
  dot.title = text;
  $('health-text').textContent = text;
}

function showLoading(body) {
  state.healthy = false;
  const overlay = $('loading');
  overlay.hidden = false;
  const bar = $('loading-progress');
  if (body.status === 'error') {
    $('loading-title').textContent = 'The model failed to load';
    $('loading-text').textContent = body.message ?? '';
    bar.hidden = true;
    return;
  }
  $('loading-title').textContent = 'Loading the model…';
  const progress = Number(body.progress);
  bar.hidden = false;
  if (Number.isFinite(progress)) { bar.max = 1; bar.value = Math.min(1, Math.max(0, progress)); }
  else bar.removeAttribute('value');
  const parts = [];
  if (body.phase) parts.push(`phase: ${body.phase}`);
  if (Number.isFinite(progress)) parts.push(`${fmt(progress * 100, 0)} %`);
  if (Number.isFinite(Number(body.elapsed_s))) parts.push(`${fmt(body.elapsed_s, 0)} s elapsed`);
  $('loading-text').textContent = parts.join(' · ');
  setHealthDot('warn', 'Loading the model');
}

function hideLoading() {
  $('loading').hidden = true;
}

function showHealth(body) {
  setHealthDot(body.status === 'ok' ? 'ok' : 'warn', body.status === 'ok' ? 'Ready' : `Server ${body.status ?? '?'}`);
  const rows = [];
  if (body.model) rows.push(['Model', body.model]);
  if (Number.isFinite(body.uptime_s)) rows.push(['Uptime', duration(body.uptime_s)]);
  if (Number.isFinite(body.context_capacity)) rows.push(['Context', `${fmt(body.context_capacity)} tokens`]);
  const q = body.scheduler;
  if (q) {
    rows.push(['Running', `${q.active ?? 0} / ${q.capacity ?? 1}`]);
    rows.push(['Queued', `${q.queued ?? 0}${q.max_queue !== undefined ? ` / ${q.max_queue}` : ''}`]);
    if (q.completed !== undefined) rows.push(['Completed', fmt(q.completed)]);
  }
  if (body.state?.phase) rows.push(['Engine', body.state.phase]);
  if (Number.isFinite(body.memory?.rss_gb)) rows.push(['Memory', `${fmt(body.memory.rss_gb, 1)} GB`]);
  fillList($('health-info'), rows);
}

function duration(seconds) {
  const s = Math.floor(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function fillList(dl, rows) {
  dl.replaceChildren();
  for (const [k, v] of rows) dl.append(el('dt', '', k), el('dd', '', String(v)));
}

let metricsTimer = 0;
async function pollMetrics() {
  clearTimeout(metricsTimer);
  let next = 10000;
  try {
    const response = await fetch('metrics', { headers: headers(false), cache: 'no-store' });
    if (response.status === 200) {
      showMetrics(parsePrometheus(await response.text()).totals);
    } else {
      $('metrics-section').hidden = true;
      next = 60000;
    }
  } catch {
    $('metrics-section').hidden = true;
  }
  if (document.visibilityState === 'hidden') next = Math.max(next, 60000);
  metricsTimer = setTimeout(pollMetrics, next);
}

const METRICS = [
  ['k3_generated_tokens_total', 'Generated tokens', 0],
  ['k3_prompt_tokens_total', 'Prompt tokens', 0],
  ['k3_prompt_tokens_cached_total', 'Prompt tokens reused', 0],
  ['k3_prefill_seconds_total', 'Prefill time (s)', 1],
  ['k3_decode_seconds_total', 'Decode time (s)', 1],
  ['k3_requests_total', 'HTTP requests', 0],
  ['k3_cancelled_total', 'Cancelled', 0],
  ['k3_checkpoint_restores_total', 'Checkpoint restores', 0],
  ['k3_expert_cache_hit_ratio', 'Expert cache hits', 'pct'],
  ['k3_rss_bytes', 'Resident memory', 'gb'],
];

function showMetrics(totals) {
  const rows = [];
  for (const [name, label, kind] of METRICS) {
    if (!totals.has(name)) continue;
    const v = totals.get(name);
    rows.push([label, kind === 'pct' ? `${fmt(v * 100, 1)} %` : kind === 'gb' ? `${fmt(v / 1e9, 1)} GB` : fmt(v, kind)]);
  }
  const decode = totals.get('k3_decode_seconds_total'), generated = totals.get('k3_generated_tokens_total');
  if (decode > 0 && generated > 0) rows.push(['Decode speed', `${fmt(generated / decode, 1)} tok/s`]);
  fillList($('metrics-info'), rows);
  $('metrics-section').hidden = rows.length === 0;
}

let modelsLoading = false;
async function loadModels() {
  if (modelsLoading) return;
  modelsLoading = true;
  try {
    const response = await fetch('v1/models', { headers: headers(false), cache: 'no-store' });
    const text = await response.text();
    if (!response.ok) {
      notice(response.status === 401 ? 'The server needs an API key: set it in Settings.'
                                      : `Model list: ${errorText(response.status, response.statusText, text)}`);
      return;
    }
    const data = JSON.parse(text)?.data;
    const models = Array.isArray(data) ? data.filter((m) => typeof m?.id === 'string') : [];
    state.models = models.map((m) => m.id);
    const select = $('model');
    select.replaceChildren(...models.map((m) => { const o = el('option', '', m.id); o.value = m.id; return o; }));
    select.value = state.models.includes(state.settings.model) ? state.settings.model : state.models[0] ?? '';
    const meta = models.find((m) => m.id === select.value)?.meta;
    if (Number.isFinite(meta?.max_output_tokens)) $('max-tokens').max = String(meta.max_output_tokens);
    notice('');
  } catch (e) {
    notice(`Model list: ${e.message}`);
  } finally {
    modelsLoading = false;
  }
}

function notice(text) {
  const n = $('notice');
  n.textContent = text;
  n.hidden = !text;
}

// ---------------------------------------------------------------------------------------------
// Settings and layout

function bindSettings() {
  const s = state.settings;
  const temperature = $('temperature'), temperatureValue = $('temperature-value');
  const maxTokens = $('max-tokens'), thinking = $('thinking'), effort = $('effort'), system = $('system');
  for (const e of EFFORTS) { const o = el('option', '', e); o.value = e; effort.append(o); }
  temperature.value = String(s.temperature);
  temperatureValue.textContent = Number(s.temperature).toFixed(2);
  maxTokens.value = String(s.maxTokens);
  thinking.checked = !!s.thinking;
  effort.value = EFFORTS.includes(s.effort) ? s.effort : '';
  effort.disabled = !s.thinking;
  system.value = s.system ?? '';
  $('api-key').value = apiKey();

  temperature.addEventListener('input', () => {
    s.temperature = Number(temperature.value);
    temperatureValue.textContent = s.temperature.toFixed(2);
    saveSettings();
  });
  maxTokens.addEventListener('input', () => {
    const v = Math.floor(Number(maxTokens.value));
    if (Number.isFinite(v) && v >= 1) { s.maxTokens = v; saveSettings(); }
  });
  thinking.addEventListener('change', () => {
    s.thinking = thinking.checked;
    effort.disabled = !s.thinking;
    saveSettings();
  });
  effort.addEventListener('change', () => { s.effort = effort.value; saveSettings(); });
  system.addEventListener('input', () => { s.system = system.value; saveSettings(); });
  $('model').addEventListener('change', () => { s.model = $('model').value; saveSettings(); });
  $('api-key').addEventListener('change', () => {
    try {
      if ($('api-key').value) sessionStorage.setItem(KEYS.apiKey, $('api-key').value);
      else sessionStorage.removeItem(KEYS.apiKey);
    } catch { /* storage disabled */ }
    loadModels();
    pollHealth(0);
  });
  $('delete-all').addEventListener('click', () => {
    if (!confirm('Delete every conversation stored in this browser?')) return;
    state.active?.controller.abort();
    state.conversations = [];
    state.currentId = null;
    saveConversations();
    renderConversationList();
    renderThread();
  });
}

function togglePanel(buttonId, panelId, open) {
  const panel = $(panelId), button = $(buttonId);
  const show = open ?? panel.hidden;
  panel.hidden = !show;
  button.setAttribute('aria-expanded', String(show));
  document.body.classList.toggle(`${panelId}-open`, show);
}

const narrow = () => window.matchMedia('(max-width: 820px)').matches;
function closeSidebarOnNarrow() {
  if (narrow()) togglePanel('toggle-sidebar', 'sidebar', false);
}

function bindLayout() {
  $('toggle-sidebar').addEventListener('click', () => togglePanel('toggle-sidebar', 'sidebar'));
  $('toggle-settings').addEventListener('click', () => togglePanel('toggle-settings', 'settings'));
  $('close-settings').addEventListener('click', () => togglePanel('toggle-settings', 'settings', false));
  $('scrim').addEventListener('click', () => {
    togglePanel('toggle-settings', 'settings', false);
    closeSidebarOnNarrow();
  });
  togglePanel('toggle-sidebar', 'sidebar', !narrow());
  window.matchMedia('(max-width: 820px)').addEventListener('change', () => togglePanel('toggle-sidebar', 'sidebar', !narrow()));

  $('composer').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $('stop').addEventListener('click', stop);
  $('new-chat').addEventListener('click', startNewChat);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') {
      if (state.active) stop();
      else if (!$('settings').hidden) togglePanel('toggle-settings', 'settings', false);
    }
  });
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible') { pollHealth(0); pollMetrics(); }
  });
  // Another tab changed the stored conversations: take them, unless this tab is streaming.
  window.addEventListener('storage', (e) => {
    if (e.key !== KEYS.conversations || state.active) return;
    const current = state.currentId;
    loadState();
    state.currentId = state.conversations.some((c) => c.id === current) ? current : null;
    renderConversationList();
    renderThread();
  });
}

function main() {
  loadState();
  bindSettings();
  bindLayout();
  renderConversationList();
  renderThread();
  updateComposer();
  pollHealth(0);
  pollMetrics();
  $('prompt').focus();
  document.body.dataset.ready = 'true';
}

main();

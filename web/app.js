// web/app.js — the chat page served by `coli serve` / `coli web` (docs/serving.md §3.12).
//
// Talks to its own origin only: GET /health (loading screen, liveness; not polled while a reply
// streams, since the stream itself drives the Generation panel), GET /v1/models (the model, its
// context length and, for the built-in model, what it is: the start screen says so), GET /metrics (only while the operator fold is open), and
// POST /v1/chat/completions streamed as SSE. Model output goes through markdown.js, which builds
// DOM nodes and never parses HTML. Conversations and settings live in localStorage; the API key
// lives in sessionStorage only. Exports are made in the page (Blob URLs), never sent anywhere.
import { parse as parseMarkdown, toDom } from './markdown.js';
import {
  SseParser, buildMessages, buildRequestBody, errorText, parsePrometheus, EFFORTS, migrateSettings,
  searchConversations, conversationToJson, conversationToMarkdown, exportFileName, contextUsage,
  SAMPLING_FIELDS, samplingValue, modelLine,
} from './api.js';

const $ = (id) => document.getElementById(id);
const el = (tag, className, text) => {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
};

const KEYS = { conversations: 'k3chat.conversations', current: 'k3chat.current', settings: 'k3chat.settings', apiKey: 'k3chat.apiKey' };

const state = {
  settings: migrateSettings({}),
  conversations: [],  // [{id, title, created, updated, messages: [{role, content, reasoning, state, error, stats}]}]
  currentId: null,    // null: a fresh, unsaved thread
  models: [],         // the ids of /v1/models
  modelEntries: [],   // its entries (meta: context_length, description)
  active: null,       // the reply being streamed: {conversation, message, controller}
  views: new Map(),   // message → its DOM view, for the messages of the thread on screen
  healthy: false,
  contextLength: null,  // meta.context_length of the selected model (or /health's context_capacity)
  search: '',
  renaming: null,     // id of the conversation whose title is being edited
  editing: null,      // the user message being edited in place
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
  state.settings = migrateSettings(readJson(localStorage, KEYS.settings, {}));
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
  const focused = document.activeElement?.closest?.('#conversations .conv');
  const refocus = focused && { id: focused.dataset.id, cls: document.activeElement.className };
  list.replaceChildren();
  const sorted = [...state.conversations].sort((a, b) => (b.updated ?? 0) - (a.updated ?? 0));
  const shown = searchConversations(sorted, state.search);
  for (const c of shown) {
    const item = el('li', 'conv' + (c.id === state.currentId ? ' active' : ''));
    item.dataset.id = c.id;
    if (state.renaming === c.id) {
      item.append(renameField(c));
      list.append(item);
      continue;
    }
    const open = el('button', 'conv-open', c.title);
    open.type = 'button';
    open.title = c.title;
    if (c.id === state.currentId) open.setAttribute('aria-current', 'true');
    open.addEventListener('click', () => openConversation(c.id));
    const rename = el('button', 'conv-rename', '✎');
    rename.type = 'button';
    rename.setAttribute('aria-label', `Rename conversation: ${c.title}`);
    rename.title = 'Rename';
    rename.addEventListener('click', () => { state.renaming = c.id; renderConversationList(); });
    const del = el('button', 'conv-delete', '×');
    del.type = 'button';
    del.setAttribute('aria-label', `Delete conversation: ${c.title}`);
    del.title = 'Delete';
    del.addEventListener('click', () => deleteConversation(c.id));
    item.append(open, rename, del);
    list.append(item);
  }
  $('conversations-empty').hidden = sorted.length > 0;
  $('conversations-none').hidden = !(sorted.length > 0 && shown.length === 0);
  if (refocus && !state.renaming) list.querySelector(`.conv[data-id="${CSS.escape(refocus.id)}"] .${refocus.cls.split(' ')[0]}`)?.focus();
  renderTitle();
}

// The title editor of a conversation: Enter or leaving the field saves, Escape cancels.
function renameField(c) {
  const input = el('input', 'conv-rename-input');
  input.type = 'text';
  input.value = c.title;
  input.maxLength = 200;
  input.setAttribute('aria-label', 'New title');
  let done = false;
  const finish = (save) => {
    if (done) return;
    done = true;
    const title = input.value.trim();
    if (save && title && title !== c.title) {
      c.title = title;
      c.renamed = true;
      saveConversations();
    }
    state.renaming = null;
    renderConversationList();
    document.querySelector(`#conversations .conv[data-id="${CSS.escape(c.id)}"] .conv-rename`)?.focus();
  };
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') { e.preventDefault(); finish(true); }
    else if (e.key === 'Escape') { e.preventDefault(); e.stopPropagation(); finish(false); }
  });
  input.addEventListener('blur', () => finish(true));
  queueMicrotask(() => { input.focus(); input.select(); });
  return input;
}

function renderTitle() {
  const c = currentConversation();
  $('thread-title').textContent = c?.title ?? '';
  $('export').hidden = !c || c.messages.length === 0;
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
  state.editing = null;
  renderTitle();
  updateActions();
  updateContext();
}

function messageView(message) {
  const root = el('article', `msg ${message.role === 'user' ? 'user' : 'assistant'}`);
  const view = { root, userToggled: false };
  const actions = el('div', 'actions');
  const copy = actionButton('Copy', 'copy-msg', `Copy this ${message.role === 'user' ? 'message' : 'reply'}`, () => copyText(message.content ?? '', copy));
  actions.append(copy);
  view.actions = actions;
  if (message.role === 'user') {
    view.content = null;
    view.text = el('div', 'content', message.content);
    view.edit = actionButton('Edit', 'edit-msg', 'Edit this message and send it again from here', () => startEdit(message));
    actions.append(view.edit);
    root.append(view.text, actions);
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
    view.regenerate = actionButton('Regenerate', 'regenerate', 'Write this reply again', () => regenerate(message));
    actions.append(view.regenerate);
    root.append(details, view.content, view.note, view.stats, actions);
    updateMessageView(message, view);
  }
  state.views.set(message, view);
  return view;
}

function actionButton(text, className, label, onClick) {
  const b = el('button', `action ${className}`, text);
  b.type = 'button';
  b.title = label;
  b.setAttribute('aria-label', label);
  b.addEventListener('click', onClick);
  return b;
}

// Which message actions apply now: Regenerate on the last reply only, nothing that starts a
// request while one streams, no Copy on an empty reply.
function updateActions() {
  const conversation = currentConversation();
  const messages = conversation?.messages ?? [];
  const lastAssistant = [...messages].reverse().find((m) => m.role === 'assistant');
  for (const m of messages) {
    const view = state.views.get(m);
    if (!view?.actions) continue;
    const busy = !!state.active;
    if (view.regenerate) view.regenerate.hidden = m !== lastAssistant || busy;
    if (view.edit) view.edit.hidden = busy;
    view.actions.querySelector('.copy-msg').hidden = !(m.content ?? '');
    view.actions.hidden = [...view.actions.children].every((b) => b.hidden);
  }
}

// Copies text; falls back to a selected textarea where the Clipboard API is missing (a page
// served over plain http to another machine is not a secure context).
function copyText(text, button) {
  const done = (ok) => {
    button.textContent = ok ? 'Copied' : 'Copy failed';
    setTimeout(() => { button.textContent = 'Copy'; }, 1500);
  };
  if (navigator.clipboard?.writeText) {
    navigator.clipboard.writeText(text).then(() => done(true), () => done(legacyCopy(text)));
  } else {
    done(legacyCopy(text));
  }
}

function legacyCopy(text) {
  const area = el('textarea', 'visually-hidden');
  area.value = text;
  document.body.append(area);
  area.select();
  let ok = false;
  try { ok = document.execCommand('copy'); } catch { ok = false; }
  area.remove();
  return ok;
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
  if (message.stats?.finish === 'length') notes.push('Stopped at the token limit (Max tokens, in Settings).');
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
  for (const pre of container.querySelectorAll('pre')) {
    if (pre.querySelector('.copy')) continue;
    const button = el('button', 'copy', 'Copy');
    button.type = 'button';
    button.setAttribute('aria-label', 'Copy this code');
    button.addEventListener('click', () => copyText(pre.querySelector('code')?.textContent ?? '', button));
    pre.append(button);
  }
}

// ---------------------------------------------------------------------------------------------
// Edit, regenerate, export

// Turns a user message into an editor: Enter (or Send) replaces it and everything after it and
// asks again from there; Escape (or Cancel) puts it back.
function startEdit(message) {
  if (state.active) return;
  const view = state.views.get(message);
  if (!view || state.editing === message) return;
  if (state.editing) cancelEdit();
  state.editing = message;
  const form = el('form', 'edit-form');
  const area = el('textarea', 'edit-text');
  area.value = message.content;
  area.rows = Math.min(12, Math.max(2, message.content.split('\n').length));
  area.setAttribute('aria-label', 'Edit the message');
  const save = el('button', 'primary edit-send', 'Send');
  save.type = 'submit';
  const cancel = el('button', 'edit-cancel', 'Cancel');
  cancel.type = 'button';
  const row = el('div', 'edit-row');
  row.append(cancel, save);
  form.append(area, row);
  form.addEventListener('submit', (e) => { e.preventDefault(); finishEdit(message, area.value); });
  cancel.addEventListener('click', cancelEdit);
  area.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); finishEdit(message, area.value); }
    else if (e.key === 'Escape') { e.preventDefault(); e.stopPropagation(); cancelEdit(); }
  });
  view.text.hidden = true;
  view.actions.hidden = true;
  view.root.insertBefore(form, view.actions);
  view.form = form;
  area.focus();
}

function cancelEdit() {
  const message = state.editing;
  state.editing = null;
  const view = message && state.views.get(message);
  if (!view?.form) return;
  view.form.remove();
  view.form = null;
  view.text.hidden = false;
  updateActions();
  view.edit.focus();
}

function finishEdit(message, text) {
  if (!text.trim()) return;
  const conversation = currentConversation();
  const i = conversation?.messages.indexOf(message) ?? -1;
  if (i < 0 || state.active) return;
  state.editing = null;
  conversation.messages.splice(i);
  if (i === 0 && !conversation.renamed) conversation.title = titleOf(text);
  renderThread();
  ask(conversation, text);
}

function regenerate(message) {
  const conversation = currentConversation();
  if (!conversation || state.active) return;
  const i = conversation.messages.indexOf(message);
  if (i < 1 || conversation.messages[i - 1].role !== 'user') return;
  conversation.messages.splice(i);
  renderThread();
  startReply(conversation);
}

function download(name, type, text) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = el('a');
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

function exportConversation(kind) {
  const c = currentConversation();
  if (!c) return;
  if (kind === 'json') download(exportFileName(c, 'json'), 'application/json', JSON.stringify(conversationToJson(c), null, 2) + '\n');
  else download(exportFileName(c, 'md'), 'text/markdown', conversationToMarkdown(c));
}

function exportAll() {
  const all = { type: 'k3chat.conversations', version: 1, exported_at: new Date().toISOString(),
                conversations: state.conversations.map((c) => conversationToJson(c)) };
  download('k3chat-conversations.json', 'application/json', JSON.stringify(all, null, 2) + '\n');
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

function selectedModel() {
  const model = $('model').value || state.models[0] || '';
  if (!model) {
    notice('No model yet: the server has not answered /v1/models.');
    loadModels();
  }
  return model;
}

function send() {
  if (state.active) return;
  const text = $('prompt').value;
  if (!text.trim() || !selectedModel()) return;
  let conversation = currentConversation();
  if (!conversation) {
    conversation = { id: newId(), title: titleOf(text), created: Date.now(), updated: Date.now(), messages: [] };
    state.conversations.push(conversation);
    state.currentId = conversation.id;
    renderThread();
  }
  $('prompt').value = '';
  ask(conversation, text);
}

// Appends a user message to the conversation on screen and streams the reply to it.
function ask(conversation, text) {
  const user = { role: 'user', content: text };
  conversation.messages.push(user);
  $('empty-thread').hidden = true;
  $('thread').append(messageView(user).root);
  startReply(conversation);
}

// Streams a reply to the conversation as it stands (it ends with a user message).
async function startReply(conversation) {
  const model = selectedModel();
  if (state.active || !model) return;
  const history = [...conversation.messages];
  const message = { role: 'assistant', content: '', reasoning: '', state: 'streaming', stats: { model } };
  conversation.messages.push(message);
  conversation.updated = Date.now();
  $('empty-thread').hidden = true;
  const thread = $('thread');
  thread.append(messageView(message).root);
  thread.scrollTop = thread.scrollHeight;
  saveConversations();
  renderConversationList();

  const controller = new AbortController();
  state.active = { conversation, message, controller };
  clearTimeout(healthTimer);  // the stream reports the server's state while it runs
  updateComposer();
  updateActions();
  const body = buildRequestBody(state.settings, model, buildMessages(state.settings.system, history));
  const t0 = performance.now();
  const timing = { t0, first: 0, last: 0 };
  let lastSave = t0;
  showGeneration(message, 'queued');
  try {
    const response = await fetch('v1/chat/completions', {
      method: 'POST', headers: headers(true), body: JSON.stringify(body), signal: controller.signal, cache: 'no-store',
    });
    showGeneration(message, 'started');
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
      showGeneration(message, 'stream', timing);
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
    showGeneration(message, 'end', timing);
    if (currentConversation() === conversation) { updateActions(); updateContext(); }
    renderConversationList();
    pollHealth(300);
    if ($('operator').open) setTimeout(pollMetrics, 300);
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
  if (chunk.prompt_progress) {
    s.promptTotal = Number(chunk.prompt_progress.total) || 0;
    s.prefill = chunk.prompt_progress;
    showPrefill(chunk.prompt_progress);
  }
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
  if (chunk.timings?.prompt_per_second) s.prefillPerSecond = chunk.timings.prompt_per_second;
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
  delete s.prefill;
}

// ---------------------------------------------------------------------------------------------
// The Generation panel and the context meter, driven by the reply's own stream: the request is
// queued until the response headers arrive (the server answers only once its worker accepts),
// then the prefill progress chunks, the first reasoning and content deltas, and the usage chunk
// move it on. No /health poll is involved.

const PHASES = {
  idle: 'Idle', queued: 'Waiting for the server', prefill: 'Reading the prompt', thinking: 'Thinking',
  answering: 'Answering', done: 'Done', stopped: 'Stopped', failed: 'Failed',
};
let genShownAt = 0;

function phaseOf(message, event) {
  if (event === 'queued') return 'queued';
  if (message.state === 'done') return 'done';
  if (message.state === 'interrupted') return 'stopped';
  if (message.state === 'error') return 'failed';
  if (message.content) return 'answering';
  if (message.reasoning) return 'thinking';
  return 'prefill';
}

function showGeneration(message, event, timing) {
  const gen = $('gen');
  const phase = phaseOf(message, event);
  const now = performance.now();
  if (event === 'stream' && gen.dataset.phase === phase && now - genShownAt < 150) return;
  genShownAt = now;
  gen.dataset.phase = phase;
  const s = message.stats ?? {};
  const p = s.prefill;
  let text = PHASES[phase];
  const bar = $('gen-progress');
  bar.hidden = !(phase === 'prefill' && p);
  if (phase === 'prefill' && p) {
    const total = Number(p.total) || 0, processed = Math.min(total, Number(p.processed) || 0);
    bar.max = Math.max(1, total);
    bar.value = processed;
    text += `: ${fmt(processed)} / ${fmt(total)} tokens`;
  }
  $('gen-phase').textContent = text;
  const rows = [];
  const prompt = s.promptTokens ?? s.promptTotal;
  if (prompt !== undefined) rows.push(['Prompt', `${fmt(prompt)} tokens${s.cachedTokens ?? p?.cache ? ` (${fmt(s.cachedTokens ?? p.cache)} reused)` : ''}`]);
  if (s.ttftMs !== undefined) rows.push(['First token', `${fmt(s.ttftMs / 1000, 2)} s`]);
  if (s.prefillPerSecond) rows.push(['Prefill', `${fmt(s.prefillPerSecond, 1)} tok/s`]);
  const generated = s.completionTokens ?? s.deltas;
  if (generated !== undefined) rows.push(['Generated', `${fmt(generated)} tokens`]);
  let rate = s.tokensPerSecond;
  if (!rate && timing?.first && s.deltas > 1 && now > timing.first) rate = (s.deltas - 1) / ((now - timing.first) / 1000);
  if (rate) rows.push(['Speed', `${fmt(rate, 1)} tok/s`]);
  if (s.queueMs !== undefined && s.queueMs !== null) rows.push(['Queue wait', `${fmt(s.queueMs)} ms`]);
  fillList($('gen-info'), rows);
  if (state.active?.message === message) updateContext(message);
}

// The context meter under the composer: the latest reply of the conversation on screen.
function updateContext(streaming) {
  const conversation = currentConversation();
  const last = streaming ?? [...(conversation?.messages ?? [])].reverse().find((m) => m.role === 'assistant' && m.stats);
  const u = contextUsage(last?.stats, state.contextLength);
  const box = $('context');
  box.hidden = !u;
  if (!u) return;
  const meter = $('context-meter');
  meter.max = u.total ?? Math.max(1, u.used);
  meter.low = meter.max * 0.7;
  meter.high = meter.max * 0.9;
  meter.value = Math.min(meter.max, u.used);
  box.dataset.used = String(u.used);
  box.dataset.total = String(u.total ?? '');
  box.classList.toggle('full', (u.fraction ?? 0) >= 0.9);
  $('context-text').textContent = u.total
    ? `Context: ${fmt(u.used)} / ${fmt(u.total)} tokens (${fmt(u.fraction * 100, 0)} %)`
    : `Context: ${fmt(u.used)} tokens`;
  box.title = `prompt ${fmt(u.prompt)} + generated ${fmt(u.generated)} tokens of the last reply`;
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
  if (state.active) return;  // the reply's stream drives the status; polled again when it ends
  let next = 30000;
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
  if (document.visibilityState === 'hidden') next = Math.max(next, 60000);
  if (!state.active) healthTimer = setTimeout(() => pollHealth(0), next);
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
  if (Number.isFinite(body.context_capacity)) {
    rows.push(['Context', `${fmt(body.context_capacity)} tokens`]);
    if (!state.contextLength) { state.contextLength = body.context_capacity; updateContext(); }
  }
  if (body.warning) rows.push(['Warning', body.warning]);
  fillList($('health-info'), rows);
  showSamplingDefaults(body.defaults);
  // The operator's counters, folded away by default.
  const ops = [];
  const q = body.scheduler;
  if (q) {
    ops.push(['Running', `${q.active ?? 0} / ${q.capacity ?? 1}`]);
    ops.push(['Queued', `${q.queued ?? 0}${q.max_queue !== undefined ? ` / ${q.max_queue}` : ''}`]);
    for (const [key, label] of [['admitted', 'Admitted'], ['completed', 'Completed'], ['rejected', 'Rejected'], ['cancelled', 'Cancelled']])
      if (q[key] !== undefined) ops.push([label, fmt(q[key])]);
  }
  if (body.state?.phase) ops.push(['Engine', body.state.phase]);
  if (Number.isFinite(body.state?.fed_tokens)) ops.push(['Fed tokens', fmt(body.state.fed_tokens)]);
  const ck = body.state?.checkpoints;
  if (ck) ops.push(['Checkpoints', `${ck.used ?? 0} / ${ck.slots ?? 0}${ck.policy ? ` (${ck.policy})` : ''}`]);
  if (Number.isFinite(body.memory?.rss_gb)) ops.push(['Memory', `${fmt(body.memory.rss_gb, 2)} GB`]);
  if (Number.isFinite(body.load_s)) ops.push(['Load time', `${fmt(body.load_s, 1)} s`]);
  fillList($('operator-info'), ops);
}

// The server's own defaults (authorised /health: the --top-p, --top-k, --min-p it runs with) as
// the placeholders of the empty sampling inputs.
function showSamplingDefaults(defaults) {
  if (!defaults) return;
  for (const [param, id] of [['top_p', 'top-p'], ['top_k', 'top-k'], ['min_p', 'min-p']]) {
    const v = defaults[param];
    if (!Number.isFinite(v)) continue;
    const off = (param === 'top_p' && v >= 1) || (param !== 'top_p' && v === 0);
    $(id).placeholder = `${v}${off ? ' (off)' : ''}`;
  }
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
  if (!$('operator').open) return;  // polled only while someone looks at the counters
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
    state.modelEntries = models;
    const meta = models.find((m) => m.id === select.value)?.meta;
    if (Number.isFinite(meta?.max_output_tokens)) $('max-tokens').max = String(meta.max_output_tokens);
    if (Number.isFinite(meta?.context_length)) state.contextLength = meta.context_length;
    showModelLine();
    updateContext();
    notice('');
  } catch (e) {
    notice(`Model list: ${e.message}`);
  } finally {
    modelsLoading = false;
  }
}

// The start screen's line on the selected model (api.js modelLine).
function showModelLine() {
  const line = modelLine(state.modelEntries.find((m) => m.id === $('model').value), (n) => fmt(n));
  $('model-line').textContent = line;
  $('model-line').hidden = !line;
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
  for (const e of EFFORTS) { const o = el('option', '', e === 'max' ? 'max (the default)' : e); o.value = e; effort.append(o); }
  temperature.value = String(s.temperature);
  temperatureValue.textContent = Number(s.temperature).toFixed(2);
  maxTokens.value = String(s.maxTokens);
  thinking.checked = !!s.thinking;
  effort.value = s.effort;
  effort.disabled = !s.thinking;
  system.value = s.system ?? '';
  $('api-key').value = apiKey();
  for (const f of SAMPLING_FIELDS) {
    const input = $(f.input);
    input.value = s[f.key] === null ? '' : String(s[f.key]);
    input.addEventListener('input', () => { s[f.key] = samplingValue(input.value); saveSettings(); });
  }
  $('sampling-reset').addEventListener('click', () => {
    for (const f of SAMPLING_FIELDS) { s[f.key] = null; $(f.input).value = ''; }
    saveSettings();
  });

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
  $('model').addEventListener('change', () => { s.model = $('model').value; saveSettings(); showModelLine(); });
  $('api-key').addEventListener('change', () => {
    try {
      if ($('api-key').value) sessionStorage.setItem(KEYS.apiKey, $('api-key').value);
      else sessionStorage.removeItem(KEYS.apiKey);
    } catch { /* storage disabled */ }
    loadModels();
    pollHealth(0);
  });
  $('export-all').addEventListener('click', exportAll);
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
  $('export-json').addEventListener('click', () => exportConversation('json'));
  $('export-md').addEventListener('click', () => exportConversation('md'));
  $('search').addEventListener('input', () => { state.search = $('search').value; renderConversationList(); });
  $('search').addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && $('search').value) { e.stopPropagation(); $('search').value = ''; state.search = ''; renderConversationList(); }
  });
  $('operator').addEventListener('toggle', () => { if ($('operator').open) { pollMetrics(); pollHealth(0); } });
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

// server/handlers.cpp — the endpoints of `coli serve` (see server/handlers.h): admission of a
// generation (context check, submission, the wait for the worker's acceptance, so the 200 is
// committed only once it accepts), the JSON and SSE answers, the small endpoints and the web page.
#include "handlers.h"

#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include "generation.h"
#include "options/options.h"
#include "request_fields.h"
#include "server/api.h"
#include "server/routes.h"
#include "server/security.h"
#include "util/sys.h"
#include "web_assets.h"

namespace k3::server {
namespace {

json model_entry(const HandlerContext& c, const std::string& id) {
  // `created`: when the model finished loading (the server's start while it still loads).
  const ServiceStats s = c.service.stats();
  const int64_t loaded = s.state == ServiceStats::State::loading
                             ? c.started_unix
                             : c.started_unix + static_cast<int64_t>(s.load_elapsed_s + 0.5);
  json meta = json{{"context_length", c.service.context_capacity()},
                   {"max_output_tokens", c.options.api.max_tokens_ceiling},
                   {"reasoning", true},
                   {"tools", true},
                   {"vision", false},
                   {"aliases", c.options.api.aliases}};
  if (!c.options.api.model_description.empty())
    meta["description"] = c.options.api.model_description;
  return json{{"id", id},
              {"object", "model"},
              {"created", loaded},
              {"owned_by", "local"},
              {"meta", std::move(meta)}};
}

void stream_chat(const HandlerContext& c, const HttpRequest& req, HttpResponse& res,
                 std::shared_ptr<ChatRequest> request, std::shared_ptr<RequestHandle> handle,
                 ResponseIds ids, ServiceEvent accepted, const text::Tokenizer* tokenizer) {
  struct StreamState {
    bool saw_think_close = false;
    int tool_index = 0;
  };
  auto state = std::make_shared<StreamState>();
  json role = json::object();
  role["role"] = "assistant";
  role["content"] = "";
  std::vector<json> first{chunk_json(ids, c.options.api, role, nullptr, request->include_usage)};
  const ApiConfig* api = &c.options.api;
  serve_sse(
      c, req, res, handle, std::move(first),
      [api, request, ids, accepted, state, tokenizer](const ServiceEvent& e) {
        const ApiConfig& config = *api;
        const bool usage = request->include_usage;
        json delta = json::object();
        json logprobs = nullptr;  // on the chunks of content tokens, when asked for
        switch (e.kind) {
          case ServiceEvent::Kind::progress:
            if (!request->return_progress) return std::vector<json>{};
            return std::vector<json>{progress_chunk_json(
                ids, config, e.total, accepted.stats.cached_tokens, e.processed, e.elapsed_ms)};
          case ServiceEvent::Kind::reasoning:
            if (request->reasoning_inline)
              delta["content"] = e.text;
            else
              put_reasoning(delta, e.text, config);
            break;
          case ServiceEvent::Kind::content:
            delta["content"] =
                request->reasoning_inline && !std::exchange(state->saw_think_close, true)
                    ? "</think>" + e.text
                    : e.text;
            if (request->top_logprobs >= 0) logprobs = chat_logprobs_json(e.logprobs, *tokenizer);
            break;
          case ServiceEvent::Kind::tool_call: {
            json call = tool_call_json(e.call, ids);
            call["index"] = state->tool_index++;
            delta["tool_calls"] = json::array({std::move(call)});
            break;
          }
          case ServiceEvent::Kind::done: {
            std::vector<json> out{chunk_json(ids, config, json::object(),
                                             openai_finish_reason(e.stats.finish), usage)};
            if (usage) out.push_back(usage_chunk_json(ids, config, e.stats));
            return out;
          }
          default:
            return std::vector<json>{};
        }
        return std::vector<json>{
            chunk_json(ids, config, std::move(delta), nullptr, usage, std::move(logprobs))};
      });
}

}  // namespace

bool authorised(const ServerOptions& options, const HttpRequest& req) {
  if (options.security.api_keys.empty()) return true;
  return key_matches(presented_key(req.header("Authorization"), req.header("x-api-key")),
                     options.security.api_keys);
}

void set_json(HttpResponse& res, int status, const json& body) {
  res.status = status;
  res.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  res.content_type = "application/json";
}

void drain_generations(const HandlerContext& c) {
  c.service.begin_shutdown();
  if (!c.service.wait_idle(c.options.drain_timeout_s)) {
    std::fprintf(stderr, "coli: drain timeout: cancelling the active request\n");
    c.service.cancel_active();
    c.service.wait_idle(5);
  }
}

HttpResponse health(const HandlerContext& c, const HttpRequest& req) {
  HttpResponse res;
  const ServiceStats s = c.service.stats();
  json body = json::object();
  if (s.state == ServiceStats::State::loading) {
    body["status"] = "loading";
    body["phase"] = "weights";
    body["progress"] = s.load_progress;
    body["elapsed_s"] = s.load_elapsed_s;
    res.set_header("Retry-After", "5");
    set_json(res, 503, body);
    return res;
  }
  if (s.state == ServiceStats::State::failed) {
    set_json(res, 500, json{{"status", "error"}, {"message", "model load failed"}});
    return res;
  }
  // Degraded: the model is loaded but the latest generations failed (none has ended normally
  // since); a probe sees 503 until one does.
  const bool degraded = s.state == ServiceStats::State::ready && s.failed_in_a_row > 0;
  body["status"] = s.state == ServiceStats::State::stopping ? "stopping"
                   : degraded                               ? "degraded"
                                                            : "ok";
  if (degraded) body["failed_in_a_row"] = s.failed_in_a_row;
  if (authorised(c.options, req)) {
    body["model"] = c.options.api.model_id;
    body["uptime_s"] = now_seconds() - c.started;
    body["load_s"] = s.load_elapsed_s;
    body["context_capacity"] = s.context_capacity;
    // What a request that does not say gets (the effective --temp / --top-p / ... of coli serve).
    body["defaults"] = json{{"temperature", c.options.api.default_temperature},
                            {"top_p", c.options.api.default_top_p},
                            {"top_k", c.options.api.default_top_k},
                            {"min_p", c.options.api.default_min_p},
                            {"max_tokens", c.options.api.max_tokens_ceiling},
                            {"thinking", c.options.api.default_thinking}};
    body["scheduler"] =
        json{{"active", s.active},
             {"busy", s.active},
             {"capacity", s.parallel},
             {"queued", s.queued},
             {"max_queue", s.max_queue},
             {"queue_timeout_seconds", c.options.queue_timeout_s},
             {"admitted", s.admitted},
             {"completed", s.completed},
             {"rejected", s.rejected},
             {"cancelled", s.cancelled_queue + s.cancelled_prefill + s.cancelled_decode}};
    body["state"] =
        json{{"phase", s.phase},
             {"fed_tokens", s.fed_tokens},
             {"checkpoints",
              json{{"policy", s.checkpoints}, {"slots", s.ckpt_slots}, {"used", s.ckpt_used}}},
             {"prefix_cache", s.prefix_cache}};
    body["memory"] = json{{"rss_gb", static_cast<double>(current_rss_bytes()) / 1e9}};
    if (s.device.on)
      body["device"] = json{{"name", s.device.device},
                            {"off", s.device.off},
                            {"pairs_served", s.device.pairs_served},
                            {"pairs_total", s.device.pairs_total},
                            {"served_share", s.device.served_share()},
                            {"residents", s.device.residents},
                            {"budget", s.device.budget},
                            {"uploads", s.device.uploads},
                            {"evictions", s.device.evictions},
                            {"join_wait_s", s.device.join_wait_seconds},
                            {"dense_matrices", s.device.dense_matrices},
                            {"dense_matmuls", s.device.dense_matmuls}};
    if (!is_loopback_host(c.options.security.bind_host) && c.options.security.api_keys.empty())
      body["warning"] = "bound beyond loopback without an API key (--insecure-bind)";
  }
  if (degraded && authorised(c.options, req)) body["last_error"] = s.last_failure;
  const bool stopping = s.state == ServiceStats::State::stopping;
  if (stopping || degraded) res.set_header("Retry-After", "5");  // every 503 carries one (§3.8)
  set_json(res, stopping || degraded ? 503 : 200, body);
  return res;
}

HttpResponse list_models(const HandlerContext& c, const HttpRequest&) {
  json data = json::array({model_entry(c, c.options.api.model_id)});
  for (const std::string& alias : c.options.api.aliases)
    if (alias != c.options.api.model_id) data.push_back(model_entry(c, alias));
  HttpResponse res;
  set_json(res, 200, json{{"object", "list"}, {"data", std::move(data)}});
  return res;
}

// The id or an alias: its own entry. Another name: the served model's entry (the name a
// generation request may use too), or 404 under --strict-model, as the generation routes.
HttpResponse get_model(const HandlerContext& c, const HttpRequest& req) {
  std::string id = req.path_param;
  if (!names_served_model(id, c.options.api))
    if (auto e = resolve_model(id, c.options.api)) return error_response(*e);
  HttpResponse res;
  set_json(res, 200, model_entry(c, id));
  return res;
}

HttpResponse chat_completions(const HandlerContext& c, const HttpRequest& req) {
  HttpResponse res;
  const ApiConfig& api = c.options.api;
  auto parsed = parse_chat_request(req.body, api);
  if (auto* e = std::get_if<ApiError>(&parsed)) return error_response(*e);
  auto request = std::make_shared<ChatRequest>(std::move(std::get<ChatRequest>(parsed)));
  ServiceEvent accepted;
  auto handle = admit_chat(c, *request, "messages", req, res, accepted);
  if (!handle) return res;
  const text::Tokenizer* tokenizer = c.service.engine()->tokenizer();  // admitted: loaded
  const ResponseIds ids = new_response_ids();
  if (request->stream) {
    stream_chat(c, req, res, request, handle, ids, accepted, tokenizer);
    return res;
  }
  ChatResult result;
  if (collect(c, handle, req, res, result))
    set_json(res, 200, chat_completion_json(result, *request, api, ids, tokenizer));
  return res;
}

namespace {

// A plain completion admitted: the drain check, the tokenizer, the prompt's ids (checked against
// the vocabulary), the generation settings and admit(). The handle, or nullptr with `res` set.
std::shared_ptr<RequestHandle> admit_completion(const HandlerContext& c,
                                                const CompletionRequest& request,
                                                const HttpRequest& req, HttpResponse& res,
                                                const text::Tokenizer*& tokenizer) {
  if (c.draining.load()) {
    res = error_response(shutting_down());
    return nullptr;
  }
  tokenizer = tokenizer_or_503(c, res);
  if (!tokenizer) return nullptr;
  ServiceRequest sr;
  if (request.ids_given) {
    const int64_t vocab = c.service.engine()->info().vocab_size;
    for (size_t i = 0; i < request.prompt_ids.size(); ++i)
      if (request.prompt_ids[i] >= vocab) {
        res = error_response(invalid_value(
            "prompt." + std::to_string(i),
            "'prompt." + std::to_string(i) + "' is " + std::to_string(request.prompt_ids[i]) +
                ", not a token id of this vocabulary (0.." + std::to_string(vocab - 1) + ")"));
        return nullptr;
      }
    sr.prompt = request.prompt_ids;
  } else {
    std::vector<int32_t> ids32;
    tokenizer->encode(request.prompt, false, ids32);  // counted whole: admit() names the count
    sr.prompt.assign(ids32.begin(), ids32.end());
  }
  sr.raw = true;
  sr.starts_in_think = false;
  apply_generation(request, sr);
  ServiceEvent accepted;
  return admit(c, std::move(sr), "prompt", req, res, accepted);
}

// llama-server's /completion answer fields for a finished generation.
json llama_completion_json(const std::string& content, const GenerationStats& s,
                           const std::string& model) {
  const char* stop_type = s.finish == FinishReason::length ? "limit"
                          : !s.stop_sequence.empty()       ? "word"
                          : s.finish == FinishReason::stop ? "eos"
                                                           : "none";
  return json{{"content", content},
              {"stop", true},
              {"model", model},
              {"tokens_predicted", s.completion_tokens},
              {"tokens_evaluated", s.prompt_tokens},
              {"tokens_cached", s.cached_tokens},
              {"stop_type", stop_type},
              {"stopping_word", s.stop_sequence},
              {"truncated", false},
              {"timings",
               {{"prompt_n", s.prompt_tokens - s.cached_tokens},
                {"prompt_ms", s.prefill_ms},
                {"predicted_n", s.completion_tokens},
                {"predicted_ms", s.decode_ms}}}};
}

}  // namespace

HttpResponse completions(const HandlerContext& c, const HttpRequest& req) {
  HttpResponse res;
  const ApiConfig& api = c.options.api;
  auto parsed = parse_completion_request(req.body, api);
  if (auto* e = std::get_if<ApiError>(&parsed)) return error_response(*e);
  auto request =
      std::make_shared<CompletionRequest>(std::move(std::get<CompletionRequest>(parsed)));
  const text::Tokenizer* tokenizer = nullptr;
  auto handle = admit_completion(c, *request, req, res, tokenizer);
  if (!handle) return res;
  const ResponseIds ids = new_response_ids("cmpl-");
  const bool with_logprobs = request->top_logprobs >= 0;
  if (!request->stream) {
    ChatResult result;
    int64_t offset = 0;
    if (collect(c, handle, req, res, result))
      set_json(res, 200,
               completion_json(result.content, result.stats, request->model, api, ids,
                               with_logprobs
                                   ? completion_logprobs_json(result.logprobs, *tokenizer, offset)
                                   : json(nullptr)));
    return res;
  }
  const ApiConfig* config = &api;
  auto offset = std::make_shared<int64_t>(0);  // text_offset runs on across the chunks
  serve_sse(
      c, req, res, handle, {}, [config, request, ids, tokenizer, offset](const ServiceEvent& e) {
        if (e.kind == ServiceEvent::Kind::content)
          return std::vector<json>{completion_chunk_json(
              ids, *config, e.text, nullptr,
              request->top_logprobs >= 0 ? completion_logprobs_json(e.logprobs, *tokenizer, *offset)
                                         : json(nullptr))};
        if (e.kind != ServiceEvent::Kind::done) return std::vector<json>{};
        std::vector<json> out{
            completion_chunk_json(ids, *config, "", openai_finish_reason(e.stats.finish))};
        if (request->include_usage)
          out.push_back(completion_usage_chunk_json(ids, *config, e.stats));
        return out;
      });
  return res;
}

// POST /completion, llama-server's native shape: `prompt`, `n_predict`, `temperature`, `seed`,
// `stream`, `stop`, `json_schema`, `grammar`, ... in; `content`, `stop`, `stop_type`,
// `tokens_predicted`, `timings` out (streamed: one `{"content", "stop": false}` per piece, then
// the full object with `stop` true). The body goes through the /v1/completions validation.
HttpResponse llama_completion(const HandlerContext& c, const HttpRequest& req) {
  HttpResponse res;
  const ApiConfig& api = c.options.api;
  auto object = parse_json_object(req.body);
  if (auto* e = std::get_if<ApiError>(&object)) return error_response(*e);
  json& body = std::get<json>(object);
  if (!given(body, "model")) body["model"] = api.model_id;
  auto parsed =
      parse_completion_request(body.dump(-1, ' ', false, json::error_handler_t::strict), api);
  if (auto* e = std::get_if<ApiError>(&parsed)) return error_response(*e);
  auto request =
      std::make_shared<CompletionRequest>(std::move(std::get<CompletionRequest>(parsed)));
  const text::Tokenizer* tokenizer = nullptr;
  auto handle = admit_completion(c, *request, req, res, tokenizer);
  if (!handle) return res;
  const std::string model = api.model_id;
  if (!request->stream) {
    ChatResult result;
    if (collect(c, handle, req, res, result))
      set_json(res, 200, llama_completion_json(result.content, result.stats, model));
    return res;
  }
  SseStyle style;
  style.done_marker = false;  // llama-server ends its stream with the `stop: true` object
  serve_sse(
      c, req, res, handle, {},
      [model](const ServiceEvent& e) {
        if (e.kind == ServiceEvent::Kind::content)
          return std::vector<SseFrame>{{"", json{{"content", e.text}, {"stop", false}}}};
        if (e.kind != ServiceEvent::Kind::done) return std::vector<SseFrame>{};
        return std::vector<SseFrame>{{"", llama_completion_json("", e.stats, model)}};
      },
      style);
  return res;
}

HttpResponse props(const HandlerContext& c, const HttpRequest&) {
  HttpResponse res;
  const text::Tokenizer* tokenizer = tokenizer_or_503(c, res);
  if (!tokenizer) return res;
  const ApiConfig& api = c.options.api;
  const Penalties neutral;  // the penalties a request that does not set them gets (off)
  json params = json::object();
  params["n_predict"] = api.max_tokens_ceiling;
  params["temperature"] = api.default_temperature;
  params["top_k"] = api.default_top_k;
  params["top_p"] = api.default_top_p;
  params["min_p"] = api.default_min_p;
  params["frequency_penalty"] = neutral.frequency_penalty;
  params["presence_penalty"] = neutral.presence_penalty;
  params["repeat_penalty"] = neutral.repeat_penalty;
  params["repeat_last_n"] = neutral.repeat_last_n;
  params["seed"] = -1;  // a fresh random seed per request
  params["stop"] = json::array();
  params["stream"] = false;
  params["cache_prompt"] = true;
  params["n_probs"] = 0;
  params["thinking"] = api.default_thinking;
  params["reasoning_format"] = "deepseek";
  json body = json::object();
  body["model_alias"] = api.model_id;
  body["model_path"] = c.service.model_dir();
  body["total_slots"] = 1;
  body["default_generation_settings"] =
      json{{"id", 0}, {"n_ctx", c.service.context_capacity()}, {"params", std::move(params)}};
  // The chat template is the built-in XTML renderer (docs/chat_format.md), not a Jinja text:
  // POST /apply-template shows what it makes of a conversation.
  body["chat_template"] = "kimi-k3 XTML (built in; POST /apply-template renders a conversation)";
  body["chat_template_caps"] = json{{"supports_system_role", true},
                                    {"supports_tools", true},
                                    {"supports_tool_calls", true},
                                    {"supports_parallel_tool_calls", true},
                                    {"supports_preserve_reasoning", true}};
  body["bos_token"] = "";  // the release never prepends one
  body["eos_token"] = "<|end_of_msg|>";
  body["modalities"] = json{{"vision", false}, {"audio", false}};
  body["build_info"] = version_text("coli");
  body["is_sleeping"] = false;
  set_json(res, 200, body);
  return res;
}

HttpResponse apply_template(const HandlerContext& c, const HttpRequest& req) {
  auto object = parse_json_object(req.body);
  if (auto* e = std::get_if<ApiError>(&object)) return error_response(*e);
  json& body = std::get<json>(object);
  // The chat request's validation, with the model optional (llama-server's body has none).
  if (!body.contains("model") || body["model"].is_null()) body["model"] = c.options.api.model_id;
  auto parsed =
      parse_chat_request(body.dump(-1, ' ', false, json::error_handler_t::strict), c.options.api);
  if (auto* e = std::get_if<ApiError>(&parsed)) return error_response(*e);
  auto prompt = render_chat_text(std::get<ChatRequest>(parsed));
  if (auto* e = std::get_if<ApiError>(&prompt)) return error_response(*e);
  HttpResponse res;
  set_json(res, 200, json{{"prompt", std::move(std::get<std::string>(prompt))}});
  return res;
}

namespace {

// A Prometheus label value: backslash, double quote and newline escaped.
std::string prom_label(std::string_view value) {
  std::string out;
  for (char ch : value) {
    if (ch == '\\' || ch == '"') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out;
}

}  // namespace

std::string metrics_text(const ServiceStats& s,
                         const std::vector<std::pair<std::string, int64_t>>& requests) {
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
      << name << ' ' << value << '\n';
  };
  o << "# HELP k3_requests_total HTTP requests by endpoint and status\n# TYPE k3_requests_total "
       "counter\n";
  for (const auto& [label, count] : requests)
    o << "k3_requests_total{" << label << "} " << count << '\n';
  metric("k3_requests_active", "gauge", "generations running", static_cast<double>(s.active));
  metric("k3_sessions", "gauge", "sessions (--parallel)", static_cast<double>(s.parallel));
  metric("k3_sessions_busy", "gauge", "sessions running a generation",
         static_cast<double>(s.active));
  metric("k3_decode_steps_total", "counter", "batched decode steps",
         static_cast<double>(s.decode_steps));
  metric("k3_decode_rows_total", "counter",
         "sessions fed by the decode steps (rows / steps = the mean batch)",
         static_cast<double>(s.decode_rows));
  metric("k3_decode_batch_size", "gauge", "sessions in the latest decode step",
         static_cast<double>(s.last_batch));
  o << "# HELP k3_session_fed_tokens positions each session's record holds\n"
       "# TYPE k3_session_fed_tokens gauge\n";
  for (const ServiceStats::SessionInfo& si : s.sessions)
    o << "k3_session_fed_tokens{session=\"" << si.id << "\"} " << si.fed_tokens << '\n';
  o << "# HELP k3_session_busy whether each session runs a generation\n"
       "# TYPE k3_session_busy gauge\n";
  for (const ServiceStats::SessionInfo& si : s.sessions)
    o << "k3_session_busy{session=\"" << si.id << "\"} " << (si.state == "idle" ? 0 : 1) << '\n';
  o << "# HELP k3_session_requests_total generations each session ran\n"
       "# TYPE k3_session_requests_total counter\n";
  for (const ServiceStats::SessionInfo& si : s.sessions)
    o << "k3_session_requests_total{session=\"" << si.id << "\"} " << si.requests << '\n';
  metric("k3_requests_queued", "gauge", "generations waiting", static_cast<double>(s.queued));
  metric("k3_prompt_tokens_total", "counter", "prompt tokens received",
         static_cast<double>(s.prompt_tokens));
  metric("k3_prompt_tokens_cached_total", "counter", "prompt tokens reused, not prefilled",
         static_cast<double>(s.cached_tokens));
  metric("k3_generated_tokens_total", "counter", "tokens generated",
         static_cast<double>(s.generated_tokens));
  metric("k3_prefill_seconds_total", "counter", "seconds spent in prefill", s.prefill_seconds);
  metric("k3_decode_seconds_total", "counter", "seconds spent in decode", s.decode_seconds);
  const double prefill_rate =
      s.prefill_seconds > 0
          ? static_cast<double>(s.prompt_tokens - s.cached_tokens) / s.prefill_seconds
          : 0;
  const double decode_rate =
      s.decode_seconds > 0 ? static_cast<double>(s.generated_tokens) / s.decode_seconds : 0;
  metric("k3_prefill_tokens_per_second", "gauge",
         "prefilled tokens per second over the server's life", prefill_rate);
  metric("k3_decode_tokens_per_second", "gauge",
         "generated tokens per second over the server's life", decode_rate);
  o << "# HELP k3_cancelled_total cancelled generations by phase\n# TYPE k3_cancelled_total "
       "counter\n"
    << "k3_cancelled_total{phase=\"queue\"} " << s.cancelled_queue
    << "\nk3_cancelled_total{phase=\"prefill\"} " << s.cancelled_prefill
    << "\nk3_cancelled_total{phase=\"decode\"} " << s.cancelled_decode << '\n';
  o << "# HELP k3_prefix_reuse_total reuse decisions\n# TYPE k3_prefix_reuse_total counter\n"
    << "k3_prefix_reuse_total{kind=\"live\"} " << s.reuse_live
    << "\nk3_prefix_reuse_total{kind=\"checkpoint\"} " << s.reuse_checkpoint
    << "\nk3_prefix_reuse_total{kind=\"disk\"} " << s.reuse_disk
    << "\nk3_prefix_reuse_total{kind=\"none\"} " << s.reuse_none << '\n';
  metric("k3_prefix_cache_saves_total", "counter", "prefixes written to the disk cache",
         static_cast<double>(s.prefix.saves));
  metric("k3_prefix_cache_restores_total", "counter", "prefixes restored from the disk cache",
         static_cast<double>(s.prefix.restores));
  metric("k3_prefix_cache_rejected_total", "counter",
         "disk cache files refused (damaged, truncated or foreign) and removed",
         static_cast<double>(s.prefix.rejected));
  metric("k3_prefix_cache_evicted_total", "counter", "disk cache files evicted by --cache-gb",
         static_cast<double>(s.prefix.evicted));
  metric("k3_checkpoint_saves_total", "counter", "recurrent-state checkpoints saved",
         static_cast<double>(s.ckpt.saves));
  metric("k3_checkpoint_restores_total", "counter", "recurrent-state checkpoints restored",
         static_cast<double>(s.ckpt.restores));
  metric("k3_checkpoint_restore_seconds_total", "counter", "seconds spent restoring checkpoints",
         s.ckpt.restore_seconds);
  metric("k3_checkpoint_rejected_total", "counter",
         "disk checkpoints that failed their header check", static_cast<double>(s.ckpt.rejected));
  metric("k3_requests_rejected_total", "counter", "generations refused with 429",
         static_cast<double>(s.rejected));
  metric("k3_expert_cache_hits_total", "counter", "routed experts found in the cache",
         static_cast<double>(s.experts.hits));
  metric("k3_expert_cache_misses_total", "counter", "routed experts read from disk",
         static_cast<double>(s.experts.misses));
  metric("k3_expert_bytes_read_total", "counter", "bytes of routed experts read from disk",
         static_cast<double>(s.experts.bytes_read));
  metric("k3_expert_cache_hit_ratio", "gauge", "hits / (hits + misses) over the server's life",
         s.experts.hit_ratio());
  metric("k3_expert_drive_bytes_total", "counter",
         "bytes of expert reads that reached the drive (cancelled read-ahead excluded)",
         static_cast<double>(s.experts.drive_bytes));
  metric("k3_expert_read_busy_seconds_total", "counter",
         "seconds with at least one expert read in flight (drive busy)", s.experts.busy_seconds);
  metric("k3_expert_read_wait_seconds_total", "counter",
         "seconds compute waited for expert reads (un-hidden I/O)", s.experts.wait_seconds);
  metric("k3_expert_transient_total", "counter", "expert reads not kept in a cache slot",
         static_cast<double>(s.experts.transient));
  metric("k3_expert_prefetch_reads_total", "counter",
         "experts read ahead on a prediction (K3_PREFETCH)",
         static_cast<double>(s.experts.prefetch_issued));
  metric("k3_expert_prefetch_used_total", "counter", "read-ahead experts the layer then used",
         static_cast<double>(s.experts.prefetch_used));
  metric("k3_expert_prefetch_recall", "gauge",
         "selections the read-ahead predicted / selections of predicted layers",
         s.experts.recall());
  if (s.expert_parallel.ranks > 1) {
    // --expert-parallel (docs/scale-out.md §2): the exchange, and each rank's expert counters as
    // its latest answer carried them.
    const ExpertParallelStats& ep = s.expert_parallel;
    metric("k3_ep_ranks", "gauge", "ranks of the expert-parallel job", ep.ranks);
    metric("k3_ep_exchange_seconds_total", "counter",
           "seconds rank 0 spent sending MoE rows and waiting for the ranks' answers",
           ep.exchange_seconds);
    metric("k3_ep_bytes_sent_total", "counter", "bytes of latent rows sent to the ranks",
           static_cast<double>(ep.bytes_sent));
    metric("k3_ep_bytes_received_total", "counter", "bytes of output rows received from the ranks",
           static_cast<double>(ep.bytes_received));
    const auto per_rank = [&](const char* name, const char* type, const char* help,
                              double ExpertParallelStats::Rank::*field) {
      o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
      for (const ExpertParallelStats::Rank& r : ep.per_rank)
        o << name << "{rank=\"" << r.rank << "\"} " << r.*field << '\n';
    };
    per_rank("k3_ep_rank_pairs_total", "counter", "routed pairs a rank computed for rank 0",
             &ExpertParallelStats::Rank::pairs);
    per_rank("k3_ep_rank_expert_hits_total", "counter", "a rank's experts found in its cache",
             &ExpertParallelStats::Rank::hits);
    per_rank("k3_ep_rank_expert_misses_total", "counter", "a rank's experts read from its disk",
             &ExpertParallelStats::Rank::misses);
    per_rank("k3_ep_rank_expert_bytes_read_total", "counter", "bytes of a rank's expert reads",
             &ExpertParallelStats::Rank::bytes_read);
    per_rank("k3_ep_rank_drive_bytes_total", "counter", "bytes of a rank's reads from its drive",
             &ExpertParallelStats::Rank::drive_bytes);
    per_rank("k3_ep_rank_read_busy_seconds_total", "counter",
             "seconds with one of a rank's reads in flight (drive bytes / this = its GB/s)",
             &ExpertParallelStats::Rank::busy_seconds);
  }
  if (s.device.on) {
    // The Vulkan expert tier (docs/vulkan.md §8); absent when it is not on.
    o << "# HELP k3_device_info the Vulkan device serving routed experts (off: it was lost)\n"
      << "# TYPE k3_device_info gauge\nk3_device_info{device=\"" << prom_label(s.device.device)
      << "\",off=\"" << (s.device.off ? 1 : 0) << "\"} 1\n";
    metric("k3_device_pairs_served_total", "counter",
           "routed (row, expert) pairs computed on the device",
           static_cast<double>(s.device.pairs_served));
    metric("k3_device_pairs_total", "counter", "routed (row, expert) pairs of every MoE step",
           static_cast<double>(s.device.pairs_total));
    metric("k3_device_served_share", "gauge", "pairs served on the device / routed pairs",
           s.device.served_share());
    metric("k3_device_residents", "gauge", "experts resident on the device",
           static_cast<double>(s.device.residents));
    metric("k3_device_budget_experts", "gauge", "experts the device budget holds",
           static_cast<double>(s.device.budget));
    metric("k3_device_uploads_total", "counter", "experts uploaded to the device",
           static_cast<double>(s.device.uploads));
    metric("k3_device_evictions_total", "counter", "residents evicted for a hotter expert",
           static_cast<double>(s.device.evictions));
    metric("k3_device_join_wait_seconds_total", "counter",
           "seconds the compute thread waited for the device's batches",
           s.device.join_wait_seconds);
    metric("k3_device_dense_matrices", "gauge",
           "dense matrices on the device for prompt chunks (COLI_VK_DENSE)",
           static_cast<double>(s.device.dense_matrices));
    metric("k3_device_dense_matmuls_total", "counter",
           "prompt-chunk dense matmuls computed on the device",
           static_cast<double>(s.device.dense_matmuls));
  }
  metric("k3_rss_bytes", "gauge", "resident memory", static_cast<double>(current_rss_bytes()));
  // Resident memory by use (engine.h: MemorySplit) and by backing.
  const MemorySplit& m = s.memory;
  o << "# HELP k3_memory_bytes resident memory by use (part) and by backing (anonymous, "
       "file_backed)\n# TYPE k3_memory_bytes gauge\n";
  for (const auto& [part, bytes] :
       std::initializer_list<std::pair<const char*, uint64_t>>{{"dense_weights", m.dense_weights},
                                                               {"mapped_weights", m.mapped_weights},
                                                               {"expert_cache", m.expert_cache},
                                                               {"kda_state", m.kda_state},
                                                               {"mla_cache", m.mla_cache},
                                                               {"activations", m.activations},
                                                               {"io_buffers", m.io_buffers},
                                                               {"anonymous", m.anonymous},
                                                               {"file_backed", m.file_backed}})
    o << "k3_memory_bytes{part=\"" << part << "\"} " << bytes << '\n';
  metric("k3_expert_slots_used", "gauge", "expert cache slots holding an expert (all MoE layers)",
         static_cast<double>(m.expert_slots_used));
  metric("k3_expert_slots_budget", "gauge", "expert cache slots of the budget (all MoE layers)",
         static_cast<double>(m.expert_slots_budget));
  metric("k3_peak_rss_bytes", "gauge", "peak resident memory since start",
         static_cast<double>(m.peak_rss));
  metric("k3_load_progress", "gauge", "model load progress [0, 1]", s.load_progress);
  return o.str();
}

HttpResponse metrics(const HandlerContext& c, const HttpRequest&) {
  std::vector<std::pair<std::string, int64_t>> requests;
  {
    std::lock_guard<std::mutex> lock(c.counters.mutex);
    for (const auto& [key, n] : c.counters.by_route_status)
      requests.push_back(
          {"endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"", n});
  }
  HttpResponse res;
  res.body = metrics_text(c.service.stats(), requests);
  res.content_type = "text/plain; version=0.0.4";
  return res;
}

HttpResponse slots(const HandlerContext& c, const HttpRequest&) {
  const ServiceStats s = c.service.stats();
  const double now = now_seconds();
  json out = json::array();
  for (const ServiceStats::SessionInfo& si : s.sessions) {
    json list = json::array();
    for (const auto& ck : si.ckpt_list)
      list.push_back(json{
          {"slot", ck.slot}, {"pos", ck.position}, {"pinned", false}, {"age_s", ck.age_seconds}});
    out.push_back(json{{"id", si.id},
                       {"state", si.state == "idle" ? "idle" : "busy"},
                       {"phase", si.state},
                       {"n_ctx", s.context_capacity},
                       {"fed_tokens", si.fed_tokens},
                       {"prompt_tokens", si.prompt_tokens},
                       {"cached_tokens", si.cached_tokens},
                       {"generated_tokens", si.generated_tokens},
                       {"requests", si.requests},
                       {"last_used_s_ago", si.last_used > 0 ? json(now - si.last_used) : json()},
                       {"checkpoints", list}});
  }
  HttpResponse res;
  set_json(res, 200, out);
  return res;
}

HttpResponse erase_slot(const HandlerContext& c, const HttpRequest& req) {
  if (req.query_value("action") != "erase")
    return error_response(invalid_value("action", "the only action is 'erase'"));
  c.service.erase_state();
  HttpResponse res;
  set_json(res, 200, json{{"id_slot", 0}, {"erased", true}});
  return res;
}

HttpResponse tokenize(const HandlerContext& c, const HttpRequest& req) {
  auto parsed = parse_json_object(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return error_response(*e);
  const json& b = std::get<json>(parsed);
  auto it = b.find("content");
  if (it == b.end() || !it->is_string())
    return error_response(invalid_value("content", "'content' must be a string"));
  bool special = false;
  if (auto s = b.find("parse_special"); s != b.end() && s->is_boolean()) special = s->get<bool>();
  HttpResponse res;
  const text::Tokenizer* tokenizer = tokenizer_or_503(c, res);
  if (!tokenizer) return res;
  std::vector<int32_t> ids;
  tokenizer->encode(it->get_ref<const std::string&>(), special, ids);
  set_json(res, 200, json{{"tokens", ids}});
  return res;
}

HttpResponse detokenize(const HandlerContext& c, const HttpRequest& req) {
  auto parsed = parse_json_object(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return error_response(*e);
  const json& b = std::get<json>(parsed);
  auto it = b.find("tokens");
  if (it == b.end() || !it->is_array())
    return error_response(invalid_value("tokens", "'tokens' must be an array of token ids"));
  HttpResponse res;
  const text::Tokenizer* tokenizer = tokenizer_or_503(c, res);
  if (!tokenizer) return res;
  std::vector<int32_t> ids;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= tokenizer->vocab_size())
      return error_response(invalid_value(
          "tokens." + std::to_string(i), "'tokens." + std::to_string(i) + "' is " + shown_value(t) +
                                             ", not a token id of this vocabulary (0.." +
                                             std::to_string(tokenizer->vocab_size() - 1) + ")"));
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  set_json(res, 200, json{{"content", tokenizer->decode(ids)}});
  return res;
}

HttpResponse web_page(const HandlerContext& c, const HttpRequest& req) {
  const WebAsset* asset = nullptr;
  if (c.options.web_ui) {
    const std::string path = req.path == "/" ? "/index.html" : req.path;
    const bool hidden =
        path.find("/.") != std::string::npos || path.find("..") != std::string::npos;
    asset = hidden ? nullptr : find_web_asset(path.substr(1));
  }
  if (!asset) return no_such_path(req);
  HttpResponse res;
  res.set_header(
      "Content-Security-Policy",
      "default-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
      "object-src 'none'; base-uri 'none'");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("Cache-Control", "no-cache");
  res.body = std::string(asset->bytes);
  res.content_type = std::string(asset->mime);
  return res;
}

HttpResponse no_such_path(const HttpRequest&) {
  return error_response(api_error(404, "invalid_request_error", "not_found", "no such path"));
}

HttpResponse not_found(const HttpRequest&) {
  return error_response(http_status_error(404));
}

HttpResponse post_only(const HttpRequest&) {
  HttpResponse res =
      error_response(api_error(405, "invalid_request_error", "method_not_allowed", "use POST"));
  res.set_header("Allow", "POST, OPTIONS");
  return res;
}

}  // namespace k3::server

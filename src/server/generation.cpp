// server/generation.cpp — the shared generation pipeline (see server/generation.h).
#include "generation.h"

#include <sys/random.h>

#include <algorithm>
#include <cstdio>

#include "util/sys.h"

namespace k3::server {

void set_error(HttpResponse& res, const ApiError& error) {
  res = error_response(error);
}

bool gone(const HttpRequest& req) {
  return req.client_gone && req.client_gone();
}

const text::Tokenizer* tokenizer_or_503(const HandlerContext& c, HttpResponse& res) {
  const Engine* engine = c.service.engine();
  if (engine) return engine->tokenizer();
  const ServiceStats s = c.service.stats();
  if (s.state == ServiceStats::State::failed)
    set_error(res, api_error(500, "server_error", "engine_error", "the model failed to load"));
  else
    set_error(res, api_error(503, "server_error", "model_loading",
                             "the model is still loading (" +
                                 std::to_string(static_cast<int>(s.load_progress * 100)) +
                                 "% read); GET /health reports the progress",
                             std::nullopt, 5));
  return nullptr;
}

int retry_after(const HandlerContext& c) {
  const ServiceStats s = c.service.stats();
  const double running = s.active ? now_seconds() - s.active_started : 0;
  return static_cast<int>(std::clamp(running > 0 ? running : 1.0, 1.0, 60.0));
}

ApiError shutting_down() {
  return api_error(503, "server_error", "shutting_down", "the server is shutting down",
                   std::nullopt, 5);
}

// The generation settings shared by both endpoints (a random seed unless one was given).
void apply_generation(const GenerationParams& g, ServiceRequest& sr) {
  sr.sampling.temperature = g.temperature;
  sr.sampling.top_p = g.top_p;
  sr.sampling.top_k = g.top_k;
  sr.sampling.min_p = g.min_p;
  sr.penalties.frequency_penalty = g.frequency_penalty;
  sr.penalties.presence_penalty = g.presence_penalty;
  sr.penalties.repeat_penalty = g.repeat_penalty;
  sr.penalties.repeat_last_n = g.repeat_last_n;
  sr.top_logprobs = g.top_logprobs;
  if (g.seed) {
    sr.sampling.seed = *g.seed;
  } else {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != sizeof seed)
      seed = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
    sr.sampling.seed = seed;
  }
  sr.max_tokens = g.max_tokens;
  sr.stop = g.stop;
  sr.cache_prompt = g.cache_prompt;
  if (!g.grammar.empty()) {
    ConstraintSpec spec;
    spec.gbnf = g.grammar;
    spec.tools = g.grammar_tools;
    spec.answer_open = !sr.starts_in_think;
    spec.raw = sr.raw;
    sr.constraint = std::move(spec);
  }
}

void drain_until_done(const std::shared_ptr<RequestHandle>& handle) {
  ServiceEvent e;
  for (int i = 0; i < 600; ++i)  // the worker acknowledges within one layer or one token
    if (handle->next(e, std::chrono::milliseconds(100)) &&
        (e.kind == ServiceEvent::Kind::done || e.kind == ServiceEvent::Kind::error))
      return;
}

namespace {

// The pace of the client-gone check while a generation runs: every 100 ms whether or not events
// arrive (prefill progress every 32 tokens would starve a check made only after an idle 100 ms
// wait), and never after the last event (drain_until_done would wait for a done already taken).
class GoneCheck {
 public:
  bool due(bool got, const ServiceEvent& e) {
    if (got && (e.kind == ServiceEvent::Kind::done || e.kind == ServiceEvent::Kind::error))
      return false;
    if (Clock::now() - last_ < std::chrono::milliseconds(100)) return false;
    last_ = Clock::now();
    return true;
  }

 private:
  Clock::time_point last_ = Clock::now();
};

// Waits for the worker's acceptance; a hung-up client, a queue timeout or an error ends it.
// Returns true with `accepted` filled, or false with `res` set (or the client gone).
bool await_acceptance(const HandlerContext& c, const std::shared_ptr<RequestHandle>& handle,
                      const HttpRequest& req, HttpResponse& res, ServiceEvent& accepted) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(c.options.queue_timeout_s);
  for (;;) {
    if (handle->next(accepted, std::chrono::milliseconds(100))) {
      if (accepted.kind == ServiceEvent::Kind::accepted) return true;
      if (accepted.kind == ServiceEvent::Kind::error) {
        if (accepted.error == ServiceError::shutting_down)
          set_error(res, shutting_down());
        else if (accepted.error != ServiceError::cancelled)
          set_error(res, api_error(500, "server_error", "engine_error",
                                   accepted.text.empty() ? "the engine failed" : accepted.text));
        return false;
      }
      continue;
    }
    if (gone(req)) {
      c.service.cancel(handle);
      res.status = 499;  // client closed (logged and counted; nothing is sent)
      return false;
    }
    if (Clock::now() > deadline) {
      c.service.cancel(handle);
      char waited[160];
      std::snprintf(waited, sizeof waited,
                    "waited %g s in the queue behind the running generation, the limit "
                    "(--queue-timeout / COLI_QUEUE_TIMEOUT)",
                    c.options.queue_timeout_s);
      set_error(res, api_error(429, "rate_limit_error", "queue_timeout", waited, std::nullopt,
                               retry_after(c)));
      return false;
    }
  }
}

}  // namespace

// Context check, submission, and the wait for the worker's acceptance (the 200 is committed
// only after it). Returns the handle, or nullptr with `res` set (or the client gone).
std::shared_ptr<RequestHandle> admit(const HandlerContext& c, ServiceRequest sr,
                                     const char* prompt_param, const HttpRequest& req,
                                     HttpResponse& res, ServiceEvent& accepted) {
  const int64_t capacity = c.service.context_capacity();
  if (static_cast<int64_t>(sr.prompt.size()) >= capacity) {
    set_error(res,
              context_exceeded(static_cast<int64_t>(sr.prompt.size()), capacity, prompt_param));
    return nullptr;
  }
  if (c.options.log_prompts)
    std::fprintf(stderr, "[prompt] %s %s\n", req.request_id.c_str(), req.body.c_str());
  auto submitted = c.service.submit(std::move(sr));
  if (!submitted.ok()) {
    const Status st = submitted.status();
    if (st.code() == Status::Code::resource_exhausted)
      set_error(res, api_error(429, "rate_limit_error", "queue_full", st.message(), std::nullopt,
                               retry_after(c)));
    else if (st.code() == Status::Code::unavailable)
      set_error(
          res, api_error(503, "server_error", c.draining.load() ? "shutting_down" : "model_loading",
                         st.message(), std::nullopt, 5));
    else
      set_error(res, invalid_value(prompt_param, st.message()));
    return nullptr;
  }
  std::shared_ptr<RequestHandle> handle = *submitted;
  if (!await_acceptance(c, handle, req, res, accepted)) return nullptr;
  const std::string wait_ms = std::to_string(static_cast<int64_t>(accepted.stats.queue_wait_ms));
  res.set_header("x-queue-wait-ms", wait_ms);
  res.set_header("x-colibri-queue-wait-ms", wait_ms);
  return handle;
}

std::shared_ptr<RequestHandle> admit_chat(const HandlerContext& c, const ChatRequest& request,
                                          const char* prompt_param, const HttpRequest& req,
                                          HttpResponse& res, ServiceEvent& accepted) {
  if (c.draining.load()) {
    set_error(res, shutting_down());
    return nullptr;
  }
  const text::Tokenizer* tokenizer = tokenizer_or_503(c, res);
  if (!tokenizer) return nullptr;
  auto prompt = render_chat_prompt(request, *tokenizer, c.service.context_capacity(), prompt_param);
  if (auto* e = std::get_if<ApiError>(&prompt)) {
    set_error(res, *e);
    return nullptr;
  }
  ServiceRequest sr;
  sr.prompt = std::move(std::get<RenderedPrompt>(prompt).ids);
  sr.anchor = std::get<RenderedPrompt>(prompt).anchor;
  sr.starts_in_think = request.thinking;
  apply_generation(request, sr);
  return admit(c, std::move(sr), prompt_param, req, res, accepted);
}

// Non-streaming: collects events until done. False (res set, or the client gone) otherwise.
bool collect(const HandlerContext& c, const std::shared_ptr<RequestHandle>& handle,
             const HttpRequest& req, HttpResponse& res, ChatResult& result) {
  ServiceEvent e;
  GoneCheck gone_check;
  for (;;) {
    const bool got = handle->next(e, std::chrono::milliseconds(100));
    if (gone_check.due(got, e) && gone(req)) {
      c.service.cancel(handle);
      drain_until_done(handle);
      res.status = 499;
      return false;
    }
    if (!got) continue;
    switch (e.kind) {
      case ServiceEvent::Kind::reasoning:
        result.reasoning += e.text;
        break;
      case ServiceEvent::Kind::content:
        result.content += e.text;
        result.logprobs.insert(result.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
        break;
      case ServiceEvent::Kind::tool_call:
        result.tool_calls.push_back(e.call);
        break;
      case ServiceEvent::Kind::done:
        result.stats = e.stats;
        c.counters.note(req.request_id, e.stats);
        return true;
      case ServiceEvent::Kind::error:
        set_error(res, api_error(500, "server_error", "engine_error",
                                 e.text.empty() ? "the engine failed" : e.text));
        return false;
      default:
        break;
    }
  }
}

namespace {

std::string frame_text(const SseFrame& f) {
  std::string out;
  if (!f.event.empty()) out += "event: " + f.event + "\n";
  out += "data: " + f.data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  return out;
}

}  // namespace

void serve_sse(const HandlerContext& c, const HttpRequest& req, HttpResponse& res,
               std::shared_ptr<RequestHandle> handle, std::vector<SseFrame> first, SseFrames frames,
               SseStyle style) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_header("Connection", "close");
  res.content_type = "text/event-stream";
  EngineService& service = c.service;
  const double ping_s = c.options.sse_ping_s;
  std::function<bool()> client_gone = req.client_gone;
  res.stream = [&service, &counters = c.counters, id = req.request_id, ping_s, client_gone, handle,
                first = std::move(first), frames = std::move(frames),
                style = std::move(style)](StreamSink& sink) {
    auto send = [&](const SseFrame& f) { return sink.write(frame_text(f)); };
    auto give_up = [&] {
      service.cancel(handle);
      drain_until_done(handle);
      return false;
    };
    for (const SseFrame& f : first)
      if (!send(f)) return give_up();
    auto last_write = Clock::now();
    GoneCheck gone_check;
    ServiceEvent e;
    for (;;) {
      const bool got = handle->next(e, std::chrono::milliseconds(100));
      if (client_gone && gone_check.due(got, e) && client_gone()) return give_up();
      if (!got) {
        if (ping_s > 0 && Clock::now() - last_write > std::chrono::duration<double>(ping_s)) {
          if (!sink.write(style.ping)) return give_up();
          last_write = Clock::now();
        }
        continue;
      }
      last_write = Clock::now();
      const bool failed = e.kind == ServiceEvent::Kind::error;
      std::vector<SseFrame> out;
      if (failed) {
        const ApiError error =
            api_error(500, "server_error", "engine_error",
                      e.text.empty() ? "engine failure during generation" : e.text);
        out = style.error_frames ? style.error_frames(error)
                                 : std::vector<SseFrame>{SseFrame{"", error_body(error)}};
      } else {
        out = frames(e);
      }
      for (const SseFrame& f : out)
        if (!send(f) && !failed) return give_up();
      if (failed || e.kind == ServiceEvent::Kind::done) {
        if (!failed) counters.note(id, e.stats);
        if (style.done_marker) sink.write("data: [DONE]\n\n");
        return true;
      }
    }
  };
  res.on_finish = [&service, handle](bool success) {
    if (!success) service.cancel(handle);
  };
}

void serve_sse(const HandlerContext& c, const HttpRequest& req, HttpResponse& res,
               std::shared_ptr<RequestHandle> handle, std::vector<json> first, SseChunks chunks) {
  std::vector<SseFrame> first_frames;
  for (json& j : first) first_frames.push_back(SseFrame{"", std::move(j)});
  serve_sse(
      c, req, res, std::move(handle), std::move(first_frames),
      [chunks = std::move(chunks)](const ServiceEvent& e) {
        std::vector<SseFrame> out;
        for (json& j : chunks(e)) out.push_back(SseFrame{"", std::move(j)});
        return out;
      },
      SseStyle{});
}

void RequestCounters::note(const std::string& id, const GenerationStats& stats) {
  if (id.empty()) return;
  std::lock_guard<std::mutex> lock(mutex);
  if (finished.size() >= 256) finished.erase(finished.begin());  // lines never asked for
  finished[id] = stats;
}

}  // namespace k3::server

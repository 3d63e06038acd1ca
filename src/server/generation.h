// server/generation.h — the generation pipeline every completion endpoint shares (OpenAI chat and
// completions in handlers.cpp, and any other API shape over the same service): the context check,
// submission and the wait for the worker's acceptance (the 200 is committed only after it), the
// non-streaming collection of events, and an SSE response fed by the worker's events. Private to
// server/ (not under include/): the endpoints own their JSON shapes, this file the flow.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "handlers.h"
#include "server/api.h"

namespace k3::server {

using Clock = std::chrono::steady_clock;

void set_error(HttpResponse& res, const ApiError& error);
// The client has hung up (HttpRequest::client_gone).
bool gone(const HttpRequest& req);
// The loaded model's tokenizer, or nullptr with `res` set to 503 (loading) / 500 (load failed).
const text::Tokenizer* tokenizer_or_503(const HandlerContext& c, HttpResponse& res);
// Retry-After seconds for a queue refusal: the active request's running time, clamped to 1..60.
int retry_after(const HandlerContext& c);
ApiError shutting_down();
// The sampling, budget and stop settings into the service request (a random seed unless one was
// given).
void apply_generation(const GenerationParams& g, ServiceRequest& sr);
// Waits (bounded) for the terminal event of a cancelled request.
void drain_until_done(const std::shared_ptr<RequestHandle>& handle);
// Context check, submission, and the wait for the worker's acceptance. Returns the handle, or
// nullptr with `res` set (or status 499: the client is gone). `prompt_param` names the request
// field a too-long prompt is blamed on.
std::shared_ptr<RequestHandle> admit(const HandlerContext& c, ServiceRequest sr,
                                     const char* prompt_param, const HttpRequest& req,
                                     HttpResponse& res, ServiceEvent& accepted);
// A chat-shaped request (chat completions, and the API shapes translated into one): the drain
// check, the tokenizer, the XTML render, the service request (prompt, anchor, sampling) and
// admit(). Returns the handle, or nullptr with `res` set.
std::shared_ptr<RequestHandle> admit_chat(const HandlerContext& c, const ChatRequest& request,
                                          const char* prompt_param, const HttpRequest& req,
                                          HttpResponse& res, ServiceEvent& accepted);
// Non-streaming: collects events until done. False (res set, or the client gone) otherwise.
bool collect(const HandlerContext& c, const std::shared_ptr<RequestHandle>& handle,
             const HttpRequest& req, HttpResponse& res, ChatResult& result);

// One server-sent event: `event: <name>` (when named) and `data: <json>`.
struct SseFrame {
  std::string event;  // "" = a data-only frame (OpenAI)
  json data;
};
using SseFrames = std::function<std::vector<SseFrame>(const ServiceEvent&)>;
struct SseStyle {
  bool done_marker = true;          // `data: [DONE]` after the terminal event (OpenAI)
  std::string ping = ": ping\n\n";  // written when the stream has been silent for sse_ping_s
  // The frames of an engine failure during generation (the stream then ends).
  std::function<std::vector<SseFrame>(const ApiError&)> error_frames;
};
// An SSE response fed by the worker's events: `first` is sent at the start, `frames` turns each
// event into frames; the terminal event (done, or an engine error) ends the stream. A failed
// write or a client that hung up cancels the request; silence is filled with `style.ping`.
void serve_sse(const HandlerContext& c, const HttpRequest& req, HttpResponse& res,
               std::shared_ptr<RequestHandle> handle, std::vector<SseFrame> first, SseFrames frames,
               SseStyle style);
// The OpenAI flavour: data-only frames, `data: [DONE]`, errors as one error body.
using SseChunks = std::function<std::vector<json>(const ServiceEvent&)>;
void serve_sse(const HandlerContext& c, const HttpRequest& req, HttpResponse& res,
               std::shared_ptr<RequestHandle> handle, std::vector<json> first, SseChunks chunks);

}  // namespace k3::server

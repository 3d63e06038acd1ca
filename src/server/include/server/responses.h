// server/responses.h — the OpenAI Responses API (`POST /v1/responses`) of `coli serve` as pure
// functions, stateless (docs/serving.md §3.17): a body → a validated ResponsesRequest whose
// `chat` part is an ordinary ChatRequest (the input items become chat messages, so the XTML
// renderer, the sampling checks and the generation pipeline are those of /v1/chat/completions),
// and the engine's events → the `response` object and its stream of typed events with sequence
// numbers. No sockets and no engine here: the handler (server/responses_handlers.cpp) feeds them.
// Nothing is stored: `previous_response_id`, `conversation` and `item_reference` are refused.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/api.h"

namespace k3::server {

struct ResponsesRequest {
  ChatRequest chat;  // messages, tools, sampling, budget, thinking, stream
  // The request's settings as the `response` object repeats them (instructions, tools,
  // tool_choice, reasoning, max_output_tokens, metadata, ...), merged into every response object.
  json echo = json::object();
};

// Parses and validates a /v1/responses body. Unknown keys are ignored; what we do not implement
// (stored state, built-in tools, structured output, logprobs, background runs, media) is refused
// with a 400 naming the field.
std::variant<ResponsesRequest, ApiError> parse_responses_request(std::string_view body,
                                                                 const ApiConfig& config);

// The `response` object. `status`: in_progress, completed, incomplete or failed. `stats` null: no
// usage (the opening events). `error`: the failed response's error, or null.
json response_object(const ResponsesRequest& request, const ResponseIds& ids, const char* status,
                     json output, const GenerationStats* stats, json error = nullptr);
// ResponseUsage from the generation's counters.
json responses_usage_json(const GenerationStats& stats);

// The non-streaming answer: output items (reasoning, message, function calls) and the final
// status from what the pipeline collected.
json responses_json(const ChatResult& result, const ResponsesRequest& request,
                    const ResponseIds& ids);

// The streamed answer as a state machine over the engine's events. Each call returns the events
// to send (each a JSON object whose "type" is also the SSE event name), sequence_number counting
// from 0 over the whole stream. Not thread-safe: one stream, one caller at a time.
class ResponsesStream {
 public:
  ResponsesStream(const ResponsesRequest& request, ResponseIds ids);
  // response.created and response.in_progress.
  std::vector<json> start();
  // Reasoning / content deltas and tool calls open, feed and close output items; `done` closes
  // what is open and ends with response.completed or response.incomplete. Other kinds: nothing.
  std::vector<json> on_event(const ServiceEvent& event);
  // An engine failure mid-stream: response.failed with the error (code server_error).
  std::vector<json> on_error(const ApiError& error);
  // The response as streamed so far (the terminal event carries it whole).
  const json& output() const { return output_; }

 private:
  enum class Open { none, reasoning, message };
  json event(const char* type, json fields);
  void close_open(std::vector<json>& out, const char* status);
  void open_item(std::vector<json>& out, Open kind);

  const ResponsesRequest& request_;
  ResponseIds ids_;
  int64_t sequence_ = 0;
  json output_ = json::array();  // the items closed so far, then the open one
  Open open_ = Open::none;
  std::string text_;  // the open item's text so far
};

}  // namespace k3::server

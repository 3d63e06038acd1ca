// server/api.h — the OpenAI-compatible request and response shapes of `coli serve`, as pure
// functions (no sockets, no engine): body → validated ChatRequest or ApiError (server/error.h),
// ChatRequest → prompt ids, engine events → response JSON and SSE chunks (docs/serving.md).
// The handlers (server/routes.h) call them; the socket adapter (server/http_server.h) only
// moves bytes.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/service.h"
#include "server/error.h"
#include "server/server_options.h"
#include "text/pyjson.h"
#include "text/tokenizer.h"

namespace k3::server {

// What both generation endpoints take (sampling, budget, stop, streaming).
struct GenerationParams {
  bool stream = false;
  bool include_usage = false;
  bool return_progress = false;
  bool cache_prompt = true;
  int64_t max_tokens = 0;  // after clamping to the ceiling (context room: the engine)
  double temperature = 0.6, top_p = 0.95, min_p = 0.0;
  int64_t top_k = 0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  // Penalties (docs/serving.md §3.15): OpenAI's over the generated tokens, -2..2 (0 = off), and
  // llama.cpp's repeat penalty over the last repeat_last_n tokens of prompt + reply (1 = off).
  double frequency_penalty = 0.0, presence_penalty = 0.0, repeat_penalty = 1.0;
  int64_t repeat_last_n = 64;
  // Log-probabilities of the content tokens: -1 = none; else the chosen token's and this many
  // alternatives' (chat: logprobs true + top_logprobs 0..20; completions: logprobs 0..20).
  int top_logprobs = -1;
  // Structured output (docs/structured_output.md): the answer's GBNF, start rule root ("" =
  // none), from response_format, json_schema or grammar; with grammar_tools, a forced tool call:
  // the grammar's rules tool-0, tool-1, ... are the arguments of these tools.
  std::string grammar;
  std::vector<std::string> grammar_tools;
};

struct ChatRequest : GenerationParams {
  std::string model;
  text::PyValue messages;     // normalised for the renderer (roles, text parts, reasoning)
  text::PyValue tools;        // null when none
  text::PyValue tool_choice;  // null when absent
  bool thinking = true;
  // The template's thinking-effort message (low, high, max; "" = none). reasoning_effort maps
  // minimal/low → low, medium/high → high, xhigh/max → max; absent → max, as apply_chat_template.
  std::string effort = "max";
  bool reasoning_inline = false;  // reasoning_format "none"
  // {"type": "json_object" | "json_schema", ...}: the template tells the model (null = none).
  text::PyValue response_format;
};

// Parses and validates a /v1/chat/completions body. Unknown keys are ignored; a feature we do
// not implement is refused with a 400 naming it.
std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body,
                                                       const ApiConfig& config);
// The same over a parsed body: other API shapes (server/responses.h) translate their bodies into
// a chat body and validate it here.
std::variant<ChatRequest, ApiError> chat_request_from_json(const json& body,
                                                           const ApiConfig& config);

// POST /v1/completions: raw text (or token ids) in, raw text out; no chat template.
struct CompletionRequest : GenerationParams {
  std::string model;
  std::string prompt;               // text, tokenized as plain text (specials stay text)
  std::vector<int64_t> prompt_ids;  // or token ids
  bool ids_given = false;
};
// max_tokens defaults to 16, as OpenAI's. `echo`, `suffix` and `best_of` > 1 are refused by name.
// `logprobs: N` (0..20) asks for the legacy log-probability lists.
std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body,
                                                                   const ApiConfig& config);

// Parses a JSON body for the small endpoints: an object, depth <= kMaxJsonDepth, valid UTF-8.
std::variant<json, ApiError> parse_json_object(std::string_view body);
// A body's field, or nullptr when it is absent or null (both mean "not given").
const json* given(const json& body, const char* key);
inline constexpr int kMaxJsonDepth = 64;

// The chat prompt ids (XTML render + tokenize) and the anchor: the length of the rendering of
// every message but the last (when it is a prefix of the prompt), where an edited last turn
// diverges. Or a 400 naming the problem. `context` (the engine's capacity): a prompt that leaves
// no position to generate is refused with its whole token count (the body is bounded by
// --max-body-mb, so the count is too).
struct RenderedPrompt {
  std::vector<int64_t> ids;
  int64_t anchor = 0;
};
std::variant<RenderedPrompt, ApiError> render_chat_prompt(const ChatRequest& request,
                                                          const text::Tokenizer& tokenizer,
                                                          int64_t context = INT64_MAX,
                                                          const char* prompt_param = "messages");
// The refusal of a prompt of `tokens` ids in a context of `context` positions, blamed on
// `param` (400 context_length_exceeded; the text is engine/service.h's
// context_overflow_message).
ApiError context_exceeded(int64_t tokens, int64_t context, const char* param);
// The text of the chat prompt render_chat_prompt tokenizes (POST /apply-template): the XTML
// segments joined, specials spelled out, as `coli render` prints them.
std::variant<std::string, ApiError> render_chat_text(const ChatRequest& request);

// Accumulates engine events into the final message (non-streaming) and builds the shapes.
struct ChatResult {
  std::string reasoning, content;
  std::vector<text::ToolCallOut> tool_calls;
  std::vector<TokenLogprobs> logprobs;  // content tokens, when asked for
  GenerationStats stats;
};

struct ResponseIds {
  std::string id;       // chatcmpl-<32 hex>
  int64_t created = 0;  // unix seconds
};

// `tokenizer` spells the logprobs' tokens (needed only when request.top_logprobs >= 0).
json chat_completion_json(const ChatResult& result, const ChatRequest& request,
                          const ApiConfig& config, const ResponseIds& ids,
                          const text::Tokenizer* tokenizer = nullptr);
// The OpenAI finish_reason of a generation: stop, length or tool_calls. A generation the server
// cancelled (a drain that timed out, a second SIGTERM) ends as "length": the reply was cut short,
// and OpenAI's schema has no other value for an incomplete reply (x_k3.finish says "cancelled").
const char* openai_finish_reason(FinishReason finish);
json usage_json(const GenerationStats& stats);
json timings_json(const GenerationStats& stats);
// Our extension block: reuse kind, restored checkpoint position, queue wait.
json x_k3_json(const GenerationStats& stats);
// One streamed chunk with `delta` (role, content, reasoning_content, tool_calls) or a finish.
// `"usage": null` is present only when the client asked for the usage chunk (as OpenAI does).
// `logprobs`: the choice's logprobs (chat_logprobs_json), null when not asked for.
json chunk_json(const ResponseIds& ids, const ApiConfig& config, json delta,
                const char* finish_reason, bool include_usage = true, json logprobs = nullptr);
// OpenAI's chat logprobs object {"content": [{token, logprob, bytes, top_logprobs}], "refusal":
// null} for content tokens (`token` is the token's text, invalid UTF-8 replaced; `bytes` its raw
// bytes).
json chat_logprobs_json(const std::vector<TokenLogprobs>& tokens, const text::Tokenizer& tokenizer);
// The legacy completions logprobs {tokens, token_logprobs, top_logprobs, text_offset}; offsets
// are UTF-8 byte offsets into the generated text, counted on from `offset` (updated).
json completion_logprobs_json(const std::vector<TokenLogprobs>& tokens,
                              const text::Tokenizer& tokenizer, int64_t& offset);
json usage_chunk_json(const ResponseIds& ids, const ApiConfig& config,
                      const GenerationStats& stats);
json progress_chunk_json(const ResponseIds& ids, const ApiConfig& config, int64_t total,
                         int64_t cached, int64_t processed, double time_ms);
// The OpenAI tool_calls entry for a parsed call (id "call_<index>_<request id tail>").
json tool_call_json(const text::ToolCallOut& call, const ResponseIds& ids);
// reasoning deltas under the configured field name(s).
void put_reasoning(json& delta, const std::string& text, const ApiConfig& config);

// A fresh response id (`prefix` + 32 hex from a random source) and the current time.
ResponseIds new_response_ids(const char* prefix = "chatcmpl-");

// /v1/completions shapes (object "text_completion").
json completion_json(const std::string& text, const GenerationStats& stats,
                     const std::string& model, const ApiConfig& config, const ResponseIds& ids,
                     json logprobs = nullptr);
// Completion chunks carry no "usage": null (the completion schema allows only an object there).
json completion_chunk_json(const ResponseIds& ids, const ApiConfig& config, const std::string& text,
                           const char* finish_reason, json logprobs = nullptr);
json completion_usage_chunk_json(const ResponseIds& ids, const ApiConfig& config,
                                 const GenerationStats& stats);

}  // namespace k3::server

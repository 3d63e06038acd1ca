// server/anthropic.h — the Anthropic Messages API of `coli serve` (POST /v1/messages and
// /v1/messages/count_tokens, docs/serving.md §3.18) as pure functions over the OpenAI layer of
// server/api.h: a Messages body → a validated ChatRequest in the XTML renderer's form (system,
// text / thinking / tool_use / tool_result blocks, tools, tool_choice, thinking), and the
// engine's events → the Message JSON and the named SSE events. No sockets, no engine; the
// handlers (anthropic_handlers.cpp) run them through the shared generation pipeline. Errors use
// Anthropic's envelope (server/error.h, ErrorStyle::anthropic).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "server/api.h"

namespace k3::server {

struct MessagesRequest {
  ChatRequest chat;            // the conversation for render_chat_prompt, the generation settings
  int64_t budget_tokens = 0;   // thinking.budget_tokens (0 = not given): picks the effort
  bool omit_thinking = false;  // thinking.display "omitted": thinking blocks carry no text
};

// Parses and validates a /v1/messages body (`count_only`: a /v1/messages/count_tokens body, which
// has no max_tokens and no generation fields). Unknown keys are ignored; what cannot be honoured
// (images, documents, server tools, a final assistant message to continue) is refused with a 400
// naming the field.
std::variant<MessagesRequest, ApiError> parse_messages_request(std::string_view body,
                                                               const ApiConfig& config,
                                                               bool count_only = false);

// "end_turn", "max_tokens", "stop_sequence" or "tool_use".
const char* anthropic_stop_reason(const GenerationStats& stats);
// {"input_tokens" (not read from the cache), "cache_creation_input_tokens": 0,
//  "cache_read_input_tokens", "output_tokens"}.
json anthropic_usage_json(const GenerationStats& stats);
// "toolu_<index>_<the message id's last 12 characters>".
std::string tool_use_id(const std::string& message_id, int index);
// The opaque signature of a thinking block: "k3-" + 16 hex of the text's FNV-1a. Never checked:
// thinking sent back is rendered as given.
std::string thinking_signature(const std::string& thinking);
// The tool_use block's `input`: the call's arguments as a JSON object (text that is not one is
// kept whole under "arguments").
json tool_input_json(const text::ToolCallOut& call);

// The non-streaming Message: {"id","type":"message","role":"assistant","model","content":[
// thinking?, text?, tool_use*],"stop_reason","stop_sequence","usage"}.
json messages_response_json(const ChatResult& result, const std::string& id,
                            const std::string& model, bool omit_thinking = false);

// One streamed Message as named SSE events: (event name, data).
using NamedEvents = std::vector<std::pair<std::string, json>>;
class MessagesStream {
 public:
  MessagesStream(std::string id, std::string model, bool omit_thinking = false)
      : id_(std::move(id)), model_(std::move(model)), omit_thinking_(omit_thinking) {}
  // message_start (usage from the acceptance) and a first ping.
  NamedEvents start(const GenerationStats& accepted) const;
  // content_block_start / _delta / _stop as the channel changes; on done the open block closes,
  // then message_delta (stop_reason, stop_sequence, usage) and message_stop.
  NamedEvents on_event(const ServiceEvent& e);

 private:
  enum class Block { none, thinking, text };
  void close_block(NamedEvents& out);
  void open_block(NamedEvents& out, Block kind);
  std::string id_, model_;
  bool omit_thinking_ = false;  // thinking blocks without thinking_delta (only the signature)
  Block open_ = Block::none;
  int index_ = -1;  // of the open (or last) block
  std::string thinking_;
};

// The SSE ping event and the one error event an engine fault ends a stream with.
inline constexpr std::string_view kAnthropicPing = "event: ping\ndata: {\"type\":\"ping\"}\n\n";

}  // namespace k3::server

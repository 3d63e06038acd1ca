// text/chat.h — the Kimi K3 XTML chat renderer, exact to Moonshot's
// `encoding_k3.build_chat_segments` (TOKENIZER_CHAT.md §6).
//
// A conversation becomes a list of segments that the tokenizer encodes one by one: the four
// control spellings (special = true, encoded with specials allowed) and ordinary text (special =
// false, where a typed `<|open|>` stays plain text). Encoding the joined string instead gives
// different ids; join_segments is for display only.
#pragma once

#include <string>
#include <vector>

#include "text/pyjson.h"
#include "util/status.h"

namespace k3::text {

struct Segment {
  std::string text;
  bool special = false;  // one of <|open|>, <|close|>, <|sep|>, <|end_of_msg|>
  friend bool operator==(const Segment&, const Segment&) = default;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool thinking = true;
  PyValue thinking_effort;  // null: no effort message; else must be "low", "high" or "max"
  PyValue tool_choice;      // "required" / "none" emit a message; anything else nothing
  PyValue response_format;  // {"type": "json_object" | "json_schema", ...} or the type string
  PyValue response_schema;  // null: taken from response_format.json_schema
};

// Renders `messages` (a list of message objects) with the declared `tools` (null when none).
// Errors (invalid_argument): an unsupported thinking effort (only checked when thinking),
// tool-call arguments that are neither null, an object nor a string, a JSON string that is not
// an object, a tool result without a resolvable tool name, image content (this engine is
// text-only), and malformed shapes the reference would raise on (a message without `role`,
// tool calls that are not objects, content parts without `type`/`text`).
Result<std::vector<Segment>> build_chat_segments(const PyValue& messages, const PyValue& tools,
                                                 const ChatOptions& options);

// The rendered string (the segment texts concatenated).
std::string join_segments(const std::vector<Segment>& segments);

// A fixture / `coli render` request:
//   {"messages": [...], "tools": [...] | null,
//    "options": {"entry": "build_chat_segments" | "apply_chat_template",
//                "add_generation_prompt", "thinking", "thinking_effort"?, "tool_choice"?,
//                "response_format"?, "response_schema"?}}
// Missing options take the Python defaults (add_generation_prompt and thinking true, entry
// build_chat_segments). With entry apply_chat_template an absent thinking_effort means "max"
// and an explicit null means none; build_chat_segments passes the keys as given.
Result<std::vector<Segment>> render_request(const PyValue& request);

}  // namespace k3::text

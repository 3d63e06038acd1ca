// text/chat.h — the Kimi K3 XTML chat renderer, exact to Moonshot's
// `encoding_k3.build_chat_segments` (docs/chat_format.md §6).
//
// A conversation becomes a list of segments that the tokenizer encodes one by one: the four
// control spellings and the image placeholder (special = true, encoded with specials allowed)
// and ordinary text (special = false, where a typed `<|open|>` stays plain text). Encoding the
// joined string instead gives different ids; join_segments is for display only.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "text/pyjson.h"
#include "util/status.h"

namespace k3::text {

struct Segment {
  std::string text;
  // One of <|open|>, <|close|>, <|sep|>, <|end_of_msg|>, or <|kimi_image_placeholder|> (one per
  // image part; not a vocabulary special, so with specials allowed it still encodes as the
  // ordinary-text ids the reference gets).
  bool special = false;
  friend bool operator==(const Segment&, const Segment&) = default;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool thinking = true;
  PyValue thinking_effort;  // null: no effort message; else must be "low", "high" or "max"
  PyValue tool_choice;      // "required" / "none" emit a message; anything else nothing
  PyValue response_format;  // {"type": "json_object" | "json_schema", ...} or the type string
  // Absent (nullopt): taken from response_format.json_schema (its `schema`, else its
  // `json_schema`, else itself). Present, even null: used as given (Python extracts only when
  // the keyword is absent).
  std::optional<PyValue> response_schema;
};

// Renders `messages` (a list of message objects) with the declared `tools` (null when none).
// Like the reference, `messages` is only iterated: a dict or a string renders no message, and a
// list whose first element is a list is a batch that is normalised but renders no message.
// Errors (invalid_argument): an unsupported thinking effort (only checked when thinking),
// tool-call arguments (on any message) that are neither null, an object nor a string, a JSON
// string that is not an object, a tool result without a resolvable tool name, and malformed
// shapes the reference would raise on (`messages`, a batch element or a truthy `tool_calls`
// that is not iterable, a message without `role`, assistant tool calls that are not objects,
// content parts without `type`/`text`); too_large for arguments JSON nested deeper than
// kMaxPyjsonDepth or with an over-long integer. Image parts are not rejected here: they render
// as the placeholder segment (a text-only server must refuse them itself).
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
// and an explicit null means none; build_chat_segments passes the keys as given (so an explicit
// "response_schema": null is a null schema, not "absent").
Result<std::vector<Segment>> render_request(const PyValue& request);

}  // namespace k3::text

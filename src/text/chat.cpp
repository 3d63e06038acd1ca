// text/chat.cpp — the Kimi K3 XTML renderer (docs/chat_format.md §6.3–6.6), segment for segment
// what Moonshot's `encoding_k3.build_chat_segments` emits.
//
// Element shape (C = control segment, T = ordinary text segment; empty texts are dropped):
//   open   C<|open|> T"tag" then per attribute T" key" T"=\"" T"escaped value" T"\"", C<|sep|>
//   close  C<|close|> T"tag" C<|sep|>        message end  C<|end_of_msg|>
//   attribute values are str(value) with & → &amp; then " → &quot;; bodies are never escaped.
//
// Emission order:
//   1. tool-declare system message when the deep-sorted `tools` is truthy;
//   2. thinking-effort system message when thinking and an effort (low | high | max) is given;
//   3. the messages in order (non-objects and unknown roles skipped; `messages` is only iterated,
//      so a dict or a string gives no message, and a list whose first element is a list is a
//      batch that is only normalised, never rendered):
//        user / system   message role(, name) · content
//        system + tools  dynamic tool-declare (content ignored)
//        assistant       message role(, name) · [think · reasoning] · response · content ·
//                        [tools · call tool index · (argument key type · value)* | json]
//        tool            message role tool index · content
//      after two pre-passes: tool results re-ordered by call id per run of tool messages, and
//      tool-call arguments of every message normalised to objects (or a raw json block);
//   4. tool-choice system message for "required" / "none";
//   5. response-format system message for json_object / json_schema;
//   6. the generation prompt: open message role="assistant", open think (or response).
#include "text/chat.h"

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string_view>
#include <utility>

namespace k3::text {
namespace {

constexpr std::string_view kOpenToken = "<|open|>";
constexpr std::string_view kCloseToken = "<|close|>";
constexpr std::string_view kSepToken = "<|sep|>";
constexpr std::string_view kEndOfMessageToken = "<|end_of_msg|>";
// Emitted (special) per image part; not a vocabulary special, so it encodes as ordinary text.
constexpr std::string_view kImagePlaceholder = "<|kimi_image_placeholder|>";

// ---- wire constants (§6.5, byte-exact) -------------------------------------------------------

constexpr std::string_view kToolDeclareStatic =
    "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
constexpr std::string_view kToolDeclareDynamic =
    "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
    "You have access to all existing and extended tools.\n"
    "Here are the specs for the extended tools.\n\n```json\n";
constexpr std::string_view kJsonBlockEnd = "\n```";
constexpr std::string_view kThinkingEffortPrefix =
    "`thinking_effort` guides on how much to think in your thinking channel "
    "(not including the response channel), supported values include `low`, "
    "`medium`, `high`, and `max`.\nNow the system is invoked with "
    "`thinking_effort=";
constexpr std::string_view kThinkingEffortSuffix = "`.";
constexpr std::string_view kToolChoiceRequired =
    "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.";
constexpr std::string_view kToolChoiceNone =
    "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next "
    "message.";
constexpr std::string_view kResponseFormatJsonObject =
    "The system is invoked with `response_format=json_object`.\n"
    "Your response must be raw JSON data without markdown code blocks (```json) "
    "or any additional formatting.";
constexpr std::string_view kResponseFormatJsonSchema =
    "The system is invoked with `response_format=json_schema`.\n"
    "Your response must be raw JSON data without markdown code blocks (```json) "
    "or any additional formatting.\n"
    "The JSON data must match the following schema:\n```json\n";

// The private key under which argument normalisation leaves an unparsable arguments string.
constexpr std::string_view kJsonBlockKey = "_xtml_json_block";

// ---- small Python-dict helpers ---------------------------------------------------------------

const PyValue kNone;

// dict.get(key): the value, or None when absent (or when `object` is no dict).
const PyValue& get(const PyValue& object, std::string_view key) {
  const PyValue* v = object.find(key);
  return v ? *v : kNone;
}

bool equals_string(const PyValue& value, std::string_view s) {
  return value.is_string() && value.as_string() == s;
}

std::string escape_attribute(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out.push_back(c);
  }
  return out;
}

// ---- segment writer --------------------------------------------------------------------------

struct Attribute {
  std::string_view key;
  std::string value;  // str(value), not yet escaped
};

class SegmentWriter {
 public:
  void control(std::string_view spelling) { segments_.push_back({std::string(spelling), true}); }
  void text(std::string_view s) {
    if (!s.empty()) segments_.push_back({std::string(s), false});
  }
  void open(std::string_view tag, std::initializer_list<Attribute> attributes = {}) {
    control(kOpenToken);
    text(tag);
    for (const Attribute& a : attributes) attribute(a);
    control(kSepToken);
  }
  void open(std::string_view tag, const std::vector<Attribute>& attributes) {
    control(kOpenToken);
    text(tag);
    for (const Attribute& a : attributes) attribute(a);
    control(kSepToken);
  }
  void close(std::string_view tag) {
    control(kCloseToken);
    text(tag);
    control(kSepToken);
  }
  void end_of_message() { control(kEndOfMessageToken); }

  // A message the renderer synthesises: role="system" type=KIND, one body segment.
  void internal_system_message(std::string_view kind, std::string_view body, bool strip_body) {
    open("message", {{"role", "system"}, {"type", std::string(kind)}});
    text(strip_body ? python_strip(body) : body);
    close("message");
    end_of_message();
  }

  std::vector<Segment> take() { return std::move(segments_); }

 private:
  void attribute(const Attribute& a) {
    text(std::string(" ") + std::string(a.key));
    text("=\"");
    text(escape_attribute(a.value));
    text("\"");
  }

  std::vector<Segment> segments_;
};

void write_tool_declare(SegmentWriter& w, const PyValue& sorted_tools, bool dynamic) {
  std::string body(dynamic ? kToolDeclareDynamic : kToolDeclareStatic);
  body += dumps(sorted_tools, DumpStyle::kCompact);
  body += kJsonBlockEnd;
  w.internal_system_message("tool-declare", body, /*strip_body=*/false);
}

// ---- pre-pass 1: tool results in call order --------------------------------------------------

struct CallTarget {
  std::string id;
  size_t position = 0;  // 1-based position in the assistant's tool_calls
  PyValue name;         // the function name, None when the call has none
};

// The name `_tool_call_id_index` records for a call: its dict `function`'s name, else (no
// `function`, or one that is not a dict) the call's own.
const PyValue& indexed_call_name(const PyValue& call) {
  const PyValue& function = get(call, "function");
  return get(function.is_object() ? function : call, "name");
}

// Never fails: calls that are not dicts (or a tool_calls that is no list) are just not indexed.
PyValue::Array order_tool_results(const PyValue::Array& messages) {
  PyValue::Array output;
  output.reserve(messages.size());
  std::vector<CallTarget> targets;
  auto find_target = [&](const std::string& id) -> const CallTarget* {
    for (const CallTarget& t : targets)
      if (t.id == id) return &t;
    return nullptr;
  };
  size_t i = 0;
  while (i < messages.size()) {
    const PyValue& message = messages[i];
    if (message.is_object() && equals_string(get(message, "role"), "assistant")) {
      targets.clear();
      const PyValue& calls = get(message, "tool_calls");
      if (calls.is_array()) {
        size_t position = 0;
        for (const PyValue& call : calls.as_array()) {
          ++position;  // every entry counts, dict or not
          const PyValue& id = get(call, "id");
          if (id.is_null()) continue;
          std::string key = python_str(id);
          if (find_target(key)) continue;  // the first occurrence of an id wins
          targets.push_back({std::move(key), position, indexed_call_name(call)});
        }
      }
      output.push_back(message);
      ++i;
      continue;
    }
    if (!message.is_object() || !equals_string(get(message, "role"), "tool")) {
      output.push_back(message);
      ++i;
      continue;
    }
    // A maximal run of tool messages: when every one matched a call id, stable-sorted by call
    // position with `tool` (and `name`, if present) set to the call's function name; otherwise
    // left exactly as it came.
    const size_t run_begin = i;
    std::vector<std::pair<size_t, PyValue>> resolved_run;
    bool unresolved = false;
    while (i < messages.size() && messages[i].is_object() &&
           equals_string(get(messages[i], "role"), "tool")) {
      const PyValue& tool_message = messages[i];
      ++i;
      if (unresolved) continue;
      const PyValue* call_id = tool_message.find("tool_call_id");
      if (!call_id) call_id = &get(tool_message, "id");
      const CallTarget* target = call_id->is_null() ? nullptr : find_target(python_str(*call_id));
      if (!target) {
        unresolved = true;
        continue;
      }
      PyValue resolved = tool_message;
      if (!target->name.is_null()) {
        resolved.set("tool", target->name);
        if (resolved.contains("name")) resolved.set("name", target->name);
      }
      resolved_run.emplace_back(target->position, std::move(resolved));
    }
    if (unresolved) {
      output.insert(output.end(), messages.begin() + static_cast<std::ptrdiff_t>(run_begin),
                    messages.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    std::stable_sort(resolved_run.begin(), resolved_run.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& entry : resolved_run) output.push_back(std::move(entry.second));
  }
  return output;
}

// ---- pre-pass 2: argument normalisation ------------------------------------------------------

struct NormalizedArguments {
  PyValue arguments;   // always an object
  PyValue json_block;  // the raw string when it was not valid JSON, else None
};

Result<NormalizedArguments> normalize_arguments(const PyValue& arguments) {
  if (arguments.is_null()) return NormalizedArguments{PyValue::object(), PyValue()};
  if (arguments.is_object()) return NormalizedArguments{arguments, PyValue()};
  if (arguments.is_string()) {
    const std::string& raw = arguments.as_string();
    if (python_strip(raw).empty()) return NormalizedArguments{PyValue::object(), PyValue()};
    Result<PyValue> parsed = parse_pyjson(raw);
    if (!parsed.ok()) {
      // Python's JSONDecodeError gives the raw block; its RecursionError / ValueError (nesting,
      // integer digits) propagate.
      if (parsed.status().code() != Status::Code::invalid_argument) return parsed.status();
      return NormalizedArguments{PyValue::object(), arguments};
    }
    if (!parsed->is_object())
      return Status::invalid("Kimi K3 tool call arguments must be a JSON object.");
    return NormalizedArguments{std::move(parsed).value(), PyValue()};
  }
  return Status::invalid("Kimi K3 tool call arguments must be a dict or a JSON object string.");
}

// Normalises the arguments of one call dict in place: `holder` is its dict `function`, or the
// call itself when `function` is absent or not a dict. A `_xtml_json_block` the caller put there
// is dropped unless the arguments are a raw block (`fn.pop("_xtml_json_block", None)`).
Status normalize_call_arguments(PyValue& holder) {
  Result<NormalizedArguments> arguments = normalize_arguments(get(holder, "arguments"));
  if (!arguments.ok()) return arguments.status();
  holder.set("arguments", std::move(arguments.value().arguments));
  if (!arguments->json_block.is_null()) {
    holder.set(std::string(kJsonBlockKey), std::move(arguments.value().json_block));
  } else {
    PyValue::Object& members = holder.as_object();
    std::erase_if(members, [](const PyMember& m) { return m.key == kJsonBlockKey; });
  }
  return {};
}

// `normalize_message`, applied to every message whatever its role: tools deep-sorted, and a
// truthy `tool_calls` iterated with every dict call's arguments normalised (entries that are not
// dicts are kept as they are). Only assistant messages render their calls.
Result<PyValue> normalize_message(const PyValue& message) {
  if (!message.is_object()) return message;
  PyValue normalized = message;
  if (const PyValue* tools = normalized.find("tools"); tools && !tools->is_null())
    normalized.set("tools", sort_keys_deep(*tools));
  PyValue* calls = normalized.find("tool_calls");
  if (!calls || !is_truthy(*calls)) return normalized;
  if (calls->is_object() || calls->is_string()) {
    // Python iterates the keys / characters: all strings, kept as they are (the list they would
    // become is never observable: an assistant fails on the first entry either way).
    return normalized;
  }
  if (!calls->is_array()) return Status::invalid("Kimi K3 `tool_calls` must be iterable");
  for (PyValue& call : calls->as_array()) {
    if (!call.is_object()) continue;
    PyValue* function = call.find("function");
    if (Status s = normalize_call_arguments(function && function->is_object() ? *function : call);
        !s.ok())
      return s;
  }
  return normalized;
}

// normalize_conversation + the message loop's iteration: the messages to render. A list whose
// first element is a list is a batch; every element is iterated as a list of messages and
// normalised, and nothing is rendered (the loop skips the lists). A dict or string `messages`
// iterates keys / characters, none of them a message; anything else is not iterable.
Result<PyValue::Array> messages_to_render(const PyValue& messages) {
  if (messages.is_object() || messages.is_string()) return PyValue::Array{};
  if (!messages.is_array())
    return Status::invalid("Kimi K3 `messages` must be iterable (a list of messages)");
  PyValue::Array ordered = order_tool_results(messages.as_array());
  const bool batch = !ordered.empty() && ordered.front().is_array();
  PyValue::Array out;
  if (!batch) out.reserve(ordered.size());
  for (const PyValue& message : ordered) {
    if (!batch) {
      Result<PyValue> normalized = normalize_message(message);
      if (!normalized.ok()) return normalized.status();
      out.push_back(std::move(normalized).value());
    } else if (message.is_array()) {
      for (const PyValue& inner : message.as_array())
        if (Result<PyValue> normalized = normalize_message(inner); !normalized.ok())
          return normalized.status();
    } else if (!message.is_object() && !message.is_string()) {
      return Status::invalid("Kimi K3 batched conversations must be lists of messages");
    }
  }
  return out;
}

// ---- bodies ----------------------------------------------------------------------------------

// `content`: a string, None, or a list of parts (each its own segment; an image part is the
// placeholder, a special segment).
Status write_content(SegmentWriter& w, const PyValue& content) {
  if (content.is_string()) {
    w.text(content.as_string());
    return {};
  }
  if (content.is_null()) return {};
  if (content.is_object() && content.as_object().empty()) return {};  // iterating {} yields nothing
  if (!content.is_array())
    return Status::invalid("Kimi K3 message content must be a string, a list of parts or None");
  for (const PyValue& part : content.as_array()) {
    const PyValue* type = part.find("type");
    if (!type) return Status::invalid("Kimi K3 content parts must be objects with a `type`");
    if (equals_string(*type, "image") || equals_string(*type, "image_url")) {
      w.control(kImagePlaceholder);
      continue;
    }
    const PyValue* text = part.find("text");
    if (!text) return Status::invalid("Kimi K3 text content parts need a `text`");
    w.text(python_str(*text));
  }
  return {};
}

const char* argument_type(const PyValue& value) {
  switch (value.kind()) {
    case PyValue::Kind::kBool:
      return "boolean";
    case PyValue::Kind::kNull:
      return "null";
    case PyValue::Kind::kInteger:
    case PyValue::Kind::kFloat:
      return "number";
    case PyValue::Kind::kString:
      return "string";
    case PyValue::Kind::kObject:
      return "object";
    case PyValue::Kind::kArray:
      return "array";
  }
  return "array";
}

std::vector<Attribute> with_name(std::string_view role, const PyValue& message) {
  std::vector<Attribute> attributes{{"role", std::string(role)}};
  const PyValue& name = get(message, "name");
  if (is_truthy(name)) attributes.push_back({"name", python_str(name)});
  return attributes;
}

// The assistant body (§6.4): think (thinking only), response, then tools when there are calls.
Status write_assistant_body(SegmentWriter& w, const PyValue& message, bool thinking) {
  if (thinking) {
    w.open("think");
    const PyValue& reasoning_content = get(message, "reasoning_content");
    const PyValue& reasoning =
        is_truthy(reasoning_content) ? reasoning_content : get(message, "reasoning");
    if (!reasoning.is_null()) {
      const std::string text = python_str(reasoning);
      if (!python_strip(text).empty()) w.text(text);  // tested stripped, emitted as is
    }
    w.close("think");
  }
  w.open("response");
  if (Status s = write_content(w, get(message, "content")); !s.ok()) return s;
  w.close("response");

  const PyValue& calls = get(message, "tool_calls");
  if (!is_truthy(calls)) return {};
  // Truthy and iterable (normalize_message checked); a dict or string iterates strings, which
  // have no `.get`.
  if (!calls.is_array())
    return Status::invalid("Kimi K3 assistant `tool_calls` must be a list of objects");
  w.open("tools");
  size_t index = 0;
  for (const PyValue& call : calls.as_array()) {
    ++index;
    // `fn = tool_call.get("function", tool_call)`, then `fn["name"]`.
    if (!call.is_object()) return Status::invalid("Kimi K3 tool calls must be objects");
    const PyValue* function = call.find("function");
    if (!function) function = &call;
    if (!function->is_object())
      return Status::invalid("Kimi K3 tool call `function` must be an object");
    const PyValue* name = function->find("name");
    if (!name) return Status::invalid("Kimi K3 tool calls need a function `name`");
    w.open("call", {{"tool", python_str(*name)}, {"index", std::to_string(index)}});
    const PyValue& json_block = get(*function, kJsonBlockKey);
    if (!json_block.is_null()) {
      w.open("json", {{"type", "object"}});
      w.text(python_str(json_block));
      w.close("json");
    } else {
      for (const PyMember& argument : get(*function, "arguments").as_object()) {  // normalised
        w.open("argument", {{"key", argument.key}, {"type", argument_type(argument.value)}});
        w.text(argument.value.is_string() ? argument.value.as_string()
                                          : dumps(argument.value, DumpStyle::kDefault));
        w.close("argument");
      }
    }
    w.close("call");
  }
  w.close("tools");
  return {};
}

// `response_format.json_schema` → its `schema`, else its `json_schema`, else itself.
PyValue extract_response_schema(const PyValue& response_format) {
  const PyValue& json_schema = get(response_format, "json_schema");
  if (json_schema.is_null()) return PyValue();
  if (!json_schema.is_object()) return json_schema;
  if (const PyValue* schema = json_schema.find("schema")) return *schema;
  if (const PyValue* nested = json_schema.find("json_schema")) return *nested;
  return json_schema;
}

}  // namespace

// ---- the renderer ----------------------------------------------------------------------------

Result<std::vector<Segment>> build_chat_segments(const PyValue& messages_in,
                                                 const PyValue& tools_in,
                                                 const ChatOptions& options) {
  Result<PyValue::Array> to_render = messages_to_render(messages_in);
  if (!to_render.ok()) return to_render.status();
  const PyValue::Array& messages = to_render.value();
  const PyValue tools = sort_keys_deep(tools_in);

  SegmentWriter w;
  if (is_truthy(tools)) write_tool_declare(w, tools, /*dynamic=*/false);

  const PyValue& effort = options.thinking_effort;
  if (options.thinking && !effort.is_null()) {
    const bool valid = equals_string(effort, "low") || equals_string(effort, "high") ||
                       equals_string(effort, "max");
    if (!valid)
      return Status::invalid("Unsupported thinking_effort=" + python_repr(effort) +
                             "; supported values are ['high', 'low', 'max'].");
    std::string body(kThinkingEffortPrefix);
    body += effort.as_string();
    body += kThinkingEffortSuffix;
    w.internal_system_message("thinking-effort", body, /*strip_body=*/true);
  }

  const PyValue* prior_calls = nullptr;  // tool_calls of the most recent assistant message
  size_t tool_index = 0;
  for (const PyValue& message : messages) {
    if (!message.is_object()) continue;
    const PyValue* role = message.find("role");
    if (!role) return Status::invalid("Kimi K3 messages need a `role`");
    if (equals_string(*role, "system") && is_truthy(get(message, "tools"))) {
      write_tool_declare(w, get(message, "tools"), /*dynamic=*/true);
    } else if (equals_string(*role, "user") || equals_string(*role, "system")) {
      w.open("message", with_name(role->as_string(), message));
      if (Status s = write_content(w, get(message, "content")); !s.ok()) return s;
      w.close("message");
      w.end_of_message();
    } else if (equals_string(*role, "assistant")) {
      prior_calls = &get(message, "tool_calls");
      tool_index = 0;
      w.open("message", with_name("assistant", message));
      if (Status s = write_assistant_body(w, message, options.thinking); !s.ok()) return s;
      w.close("message");
      w.end_of_message();
    } else if (equals_string(*role, "tool")) {
      ++tool_index;
      const PyValue* tool_name = message.find("tool");
      if (!tool_name) tool_name = &get(message, "name");
      // A truthy prior tool_calls is a list of call dicts here (the assistant rendered them);
      // a falsy one resolves nothing (len 0, or a TypeError for 0 / False: an error either way).
      if (tool_name->is_null() && prior_calls && prior_calls->is_array() &&
          tool_index <= prior_calls->as_array().size()) {
        const PyValue& call = prior_calls->as_array()[tool_index - 1];
        const PyValue& function = call.find("function") ? get(call, "function") : call;
        tool_name = function.find("name");
        if (!tool_name) return Status::invalid("Kimi K3 tool calls need a function `name`");
      }
      if (tool_name->is_null())
        return Status::invalid(
            "Kimi K3 tool messages need a resolvable tool name: carry `tool`/`name`, or match a "
            "preceding assistant tool_call by order.");
      w.open("message", {{"role", "tool"},
                         {"tool", python_str(*tool_name)},
                         {"index", std::to_string(tool_index)}});
      if (Status s = write_content(w, get(message, "content")); !s.ok()) return s;
      w.close("message");
      w.end_of_message();
    }
    // Any other role (developer, ...) is skipped.
  }

  if (equals_string(options.tool_choice, "required"))
    w.internal_system_message("tool-choice", kToolChoiceRequired, /*strip_body=*/true);
  else if (equals_string(options.tool_choice, "none"))
    w.internal_system_message("tool-choice", kToolChoiceNone, /*strip_body=*/true);

  const PyValue& response_format = options.response_format;
  const PyValue* response_type = &response_format;
  if (const PyValue* type = response_format.find("type")) response_type = type;
  if (equals_string(*response_type, "json_object")) {
    w.internal_system_message("response-format", kResponseFormatJsonObject, /*strip_body=*/true);
  } else if (equals_string(*response_type, "json_schema")) {
    const PyValue schema =
        sort_keys_deep(options.response_schema ? *options.response_schema
                                               : extract_response_schema(response_format));
    std::string body(kResponseFormatJsonSchema);
    body += dumps(schema, DumpStyle::kCompact);
    body += kJsonBlockEnd;
    w.internal_system_message("response-format", body, /*strip_body=*/true);
  }

  if (options.add_generation_prompt) {
    w.open("message", {{"role", "assistant"}});
    w.open(options.thinking ? "think" : "response");
  }
  return w.take();
}

std::string join_segments(const std::vector<Segment>& segments) {
  std::string out;
  for (const Segment& s : segments) out += s.text;
  return out;
}

Result<std::vector<Segment>> render_request(const PyValue& request) {
  if (!request.is_object()) return Status::invalid("a render request must be a JSON object");
  const PyValue* messages = request.find("messages");
  if (!messages) return Status::invalid("a render request needs `messages`");
  const PyValue& tools = get(request, "tools");
  const PyValue& options_value = get(request, "options");
  if (!options_value.is_null() && !options_value.is_object())
    return Status::invalid("render request `options` must be an object");

  const PyValue* entry = options_value.find("entry");
  const bool apply_chat_template = entry && equals_string(*entry, "apply_chat_template");
  if (entry && !apply_chat_template && !equals_string(*entry, "build_chat_segments"))
    return Status::invalid(
        "render request `options.entry` must be build_chat_segments or apply_chat_template");

  ChatOptions options;
  if (const PyValue* v = options_value.find("add_generation_prompt"))
    options.add_generation_prompt = is_truthy(*v);
  if (const PyValue* v = options_value.find("thinking")) options.thinking = is_truthy(*v);
  if (const PyValue* v = options_value.find("thinking_effort"))
    options.thinking_effort = *v;
  else if (apply_chat_template)
    options.thinking_effort = PyValue::string("max");
  options.tool_choice = get(options_value, "tool_choice");
  options.response_format = get(options_value, "response_format");
  if (const PyValue* v = options_value.find("response_schema")) options.response_schema = *v;
  return build_chat_segments(*messages, tools, options);
}

}  // namespace k3::text

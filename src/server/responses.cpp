// server/responses.cpp — the Responses API translation (see server/responses.h): input items →
// chat messages, the response object, and the stream of typed events.
#include "server/responses.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>

#include "request_fields.h"

namespace k3::server {
namespace {

using Kind = json::value_t;

ApiError unsupported_value(const std::string& param, const std::string& why) {
  return api_error(400, "invalid_request_error", "unsupported_value", why, param);
}

// A string without NUL, or the 400 naming `param`.
std::optional<ApiError> text_field(const json& v, const std::string& param) {
  if (!v.is_string()) return invalid_value(param, "'" + param + "' must be a string");
  if (v.get_ref<const std::string&>().find('\0') != std::string::npos)
    return invalid_value(param, "'" + param + "' contains a NUL character");
  return std::nullopt;
}

std::optional<ApiError> nonempty_text(const json& obj, const std::string& key,
                                      const std::string& at) {
  const std::string param = at + "." + key;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return invalid_value(param, "'" + param + "' is required");
  if (auto e = text_field(*it, param)) return e;
  if (it->get_ref<const std::string&>().empty())
    return invalid_value(param, "'" + param + "' must not be empty");
  return std::nullopt;
}

bool is_media(const std::string& type) {
  return type == "input_image" || type == "input_file" || type == "input_audio" ||
         type == "image_url" || type == "image" || type == "file" || type == "audio";
}

// Text parts of a message or a function_call_output: their texts in order, or a 400.
std::variant<std::vector<std::string>, ApiError> text_parts(const json& parts,
                                                            const std::string& at) {
  std::vector<std::string> texts;
  for (size_t j = 0; j < parts.size(); ++j) {
    const json& part = parts[j];
    const std::string pat = at + "." + std::to_string(j);
    if (!part.is_object()) return invalid_value(pat, "'" + pat + "' must be an object");
    auto type_it = part.find("type");
    if (type_it == part.end() || !type_it->is_string())
      return invalid_value(pat + ".type", "'" + pat + ".type' must be a string");
    const std::string& type = type_it->get_ref<const std::string&>();
    if (is_media(type))
      return api_error(400, "invalid_request_error", "unsupported_content_type",
                       "'" + pat + "' is of type '" + type + "': this model reads text only", pat);
    const char* key = type == "refusal" ? "refusal" : "text";
    if (type != "input_text" && type != "output_text" && type != "text" && type != "refusal")
      return invalid_value(pat + ".type",
                           "'" + pat + ".type' is an unknown content part type '" + type + "'");
    auto text = part.find(key);
    if (text == part.end())
      return invalid_value(pat + "." + key, "'" + pat + "." + key + "' is required");
    if (auto e = text_field(*text, pat + "." + key)) return *e;
    texts.push_back(text->get<std::string>());
  }
  return texts;
}

bool is_assistant(const json& messages) {
  return !messages.empty() && messages.back()["role"] == "assistant";
}

// The assistant turn a reasoning item, an output message or a function call belongs to: the
// open one (the last message, an assistant turn that has nothing of `slot` yet), else a new one.
json& assistant_turn(json& messages, const char* slot) {
  if (is_assistant(messages)) {
    json& last = messages.back();
    const bool has_reasoning = last.contains("reasoning_content");
    const bool has_content = !last["content"].is_null();
    const bool has_calls = last.contains("tool_calls");
    const std::string s = slot;
    if ((s == "reasoning" && !has_reasoning && !has_content && !has_calls) ||
        (s == "content" && !has_content && !has_calls) || s == "tool_calls")
      return last;
  }
  messages.push_back(json{{"role", "assistant"}, {"content", nullptr}});
  return messages.back();
}

// One input item appended to the chat messages, or a 400 naming it.
std::optional<ApiError> add_item(const json& item, size_t i, json& messages) {
  const std::string at = "input." + std::to_string(i);
  if (!item.is_object()) return invalid_value(at, "'" + at + "' must be an object");
  std::string type = "message";
  if (auto t = item.find("type"); t != item.end() && !t->is_null()) {
    if (!t->is_string()) return invalid_value(at + ".type", "'" + at + ".type' must be a string");
    type = t->get<std::string>();
  }
  if (type == "message") {
    auto role_it = item.find("role");
    if (role_it == item.end() || !role_it->is_string())
      return invalid_value(at + ".role", "'" + at + ".role' must be a string");
    std::string role = role_it->get<std::string>();
    if (role != "user" && role != "assistant" && role != "system" && role != "developer")
      return invalid_value(at + ".role",
                           "'" + at + ".role' must be one of user, assistant, system, developer");
    if (role == "developer") role = "system";
    auto content = item.find("content");
    json text;
    if (content == item.end() || content->is_null())
      return invalid_value(at + ".content", "'" + at + ".content' is required");
    if (content->is_string()) {
      if (auto e = text_field(*content, at + ".content")) return e;
      text = *content;
    } else if (content->is_array()) {
      auto texts = text_parts(*content, at + ".content");
      if (auto* e = std::get_if<ApiError>(&texts)) return *e;
      text = json::array();
      for (std::string& t : std::get<std::vector<std::string>>(texts))
        text.push_back(json{{"type", "text"}, {"text", std::move(t)}});
    } else {
      return invalid_value(at + ".content",
                           "'" + at + ".content' must be a string or an array of content parts");
    }
    if (role == "assistant")
      assistant_turn(messages, "content")["content"] = std::move(text);
    else
      messages.push_back(json{{"role", role}, {"content", std::move(text)}});
    return std::nullopt;
  }
  if (type == "function_call") {
    for (const char* key : {"call_id", "name"})
      if (auto e = nonempty_text(item, key, at)) return e;
    json arguments = "{}";
    if (auto a = item.find("arguments"); a != item.end() && !a->is_null()) {
      if (auto e = text_field(*a, at + ".arguments")) return e;
      arguments = *a;
    }
    json& turn = assistant_turn(messages, "tool_calls");
    if (!turn.contains("tool_calls")) turn["tool_calls"] = json::array();
    turn["tool_calls"].push_back(
        json{{"id", item["call_id"]},
             {"type", "function"},
             {"function", json{{"name", item["name"]}, {"arguments", std::move(arguments)}}}});
    return std::nullopt;
  }
  if (type == "function_call_output") {
    if (auto e = nonempty_text(item, "call_id", at)) return e;
    auto output = item.find("output");
    std::string text;
    if (output == item.end() || output->is_null())
      return invalid_value(at + ".output", "'" + at + ".output' is required");
    if (output->is_string()) {
      if (auto e = text_field(*output, at + ".output")) return e;
      text = output->get<std::string>();
    } else if (output->is_array()) {
      auto texts = text_parts(*output, at + ".output");
      if (auto* e = std::get_if<ApiError>(&texts)) return *e;
      for (const std::string& t : std::get<std::vector<std::string>>(texts)) text += t;
    } else {
      return invalid_value(at + ".output",
                           "'" + at + ".output' must be a string or an array of content parts");
    }
    messages.push_back(
        json{{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", text}});
    return std::nullopt;
  }
  if (type == "reasoning") {
    // The reasoning text: its `content` (reasoning_text parts), else its summary parts.
    // `encrypted_content` is another server's; ours never sends one.
    std::string reasoning;
    for (const char* key : {"content", "summary"}) {
      auto parts = item.find(key);
      if (parts == item.end() || parts->is_null()) continue;
      const std::string pat = at + "." + key;
      if (!parts->is_array()) return invalid_value(pat, "'" + pat + "' must be an array");
      std::string joined;
      for (size_t j = 0; j < parts->size(); ++j) {
        const json& part = (*parts)[j];
        const std::string jat = pat + "." + std::to_string(j);
        if (!part.is_object() || !part.contains("text"))
          return invalid_value(jat, "'" + jat + "' must be an object with a 'text'");
        if (auto e = text_field(part["text"], jat + ".text")) return e;
        if (!joined.empty() && std::string(key) == "summary") joined += "\n\n";
        joined += part["text"].get<std::string>();
      }
      if (!joined.empty() && reasoning.empty()) reasoning = std::move(joined);
    }
    assistant_turn(messages, "reasoning")["reasoning_content"] = std::move(reasoning);
    return std::nullopt;
  }
  if (type == "item_reference")
    return unsupported_parameter(at,
                                 "'" + at +
                                     "' is an item_reference: this server stores nothing; send the "
                                     "items themselves");
  return unsupported_value(at + ".type", "'" + at + ".type' '" + type +
                                             "' is not supported: input items are messages, "
                                             "function calls, their outputs and reasoning");
}

// Function tools → the chat tools (and the response's copy); built-in tools are refused by name.
std::optional<ApiError> translate_tools(const json& tools, json& chat_tools, json& echo_tools) {
  if (!tools.is_array()) return invalid_value("tools", "'tools' must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = "tools." + std::to_string(i);
    if (!t.is_object()) return invalid_value(at, "'" + at + "' must be an object");
    auto type = t.find("type");
    if (type == t.end() || !type->is_string())
      return invalid_value(at + ".type", "'" + at + ".type' must be a string");
    if (*type != "function")
      return unsupported_value(at + ".type", "'" + at + ".type': the built-in tool '" +
                                                 type->get<std::string>() +
                                                 "' is not available here: only function tools");
    if (auto e = nonempty_text(t, "name", at)) return e;
    json function = json{{"name", t["name"]}};
    if (auto d = t.find("description"); d != t.end() && !d->is_null()) {
      if (auto e = text_field(*d, at + ".description")) return e;
      function["description"] = *d;
    }
    if (auto p = t.find("parameters"); p != t.end() && !p->is_null()) {
      if (!p->is_object())
        return invalid_value(at + ".parameters", "'" + at + ".parameters' must be an object");
      function["parameters"] = *p;
    }
    json strict = nullptr;
    if (auto s = t.find("strict"); s != t.end() && !s->is_null()) {
      if (!s->is_boolean())
        return invalid_value(at + ".strict", "'" + at + ".strict' must be a boolean");
      strict = *s;
    }
    // The response repeats the tool in the Responses shape (parameters and strict always there).
    json echo = json{{"type", "function"}};
    echo.update(function);
    if (!echo.contains("parameters")) echo["parameters"] = nullptr;
    echo["strict"] = std::move(strict);
    echo_tools.push_back(std::move(echo));
    chat_tools.push_back(json{{"type", "function"}, {"function", std::move(function)}});
  }
  return std::nullopt;
}

std::optional<ApiError> translate_tool_choice(const json& v, const json& tools, json& chat) {
  if (v.is_string()) {
    if (v != "none" && v != "auto" && v != "required")
      return unsupported_value("tool_choice",
                               "'tool_choice' must be none, auto, required or a function");
    chat = v;
    return std::nullopt;
  }
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
    return invalid_value("tool_choice", "'tool_choice' must be a string or an object with 'type'");
  if (v["type"] != "function")
    return unsupported_value("tool_choice.type", "'tool_choice.type' '" +
                                                     v["type"].get<std::string>() +
                                                     "' is not supported: only function tools");
  if (auto e = nonempty_text(v, "name", "tool_choice")) return e;
  const bool declared = std::any_of(tools.begin(), tools.end(), [&](const json& t) {
    return t["function"]["name"] == v["name"];
  });
  if (!declared)
    return invalid_value("tool_choice.name", "'tool_choice.name' names no function in 'tools'");
  chat = json{{"type", "function"}, {"function", json{{"name", v["name"]}}}};
  return std::nullopt;
}

const char* status_of(const GenerationStats& stats) {
  return stats.finish == FinishReason::length || stats.finish == FinishReason::cancelled
             ? "incomplete"
             : "completed";
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Output item ids: a prefix, the response id's hex and the item's output index.
std::string item_id(const char* prefix, const ResponseIds& ids, size_t index) {
  const size_t cut = ids.id.find('_');
  return prefix + ids.id.substr(cut == std::string::npos ? 0 : cut + 1) + "_" +
         std::to_string(index);
}

json text_part(const std::string& text) {
  return json{{"type", "output_text"},
              {"text", text},
              {"annotations", json::array()},
              {"logprobs", json::array()}};
}

json reasoning_part(const std::string& text) {
  return json{{"type", "reasoning_text"}, {"text", text}};
}

// A reasoning or message item; `part` null: the item as opened (no content yet).
json text_item(bool reasoning, const std::string& id, json part, const char* status) {
  json item = json{{"id", id}, {"type", reasoning ? "reasoning" : "message"}, {"status", status}};
  if (reasoning) item["summary"] = json::array();
  if (!reasoning) item["role"] = "assistant";
  item["content"] = part.is_null() ? json::array() : json::array({std::move(part)});
  return item;
}

json function_call_item(const text::ToolCallOut& call, const ResponseIds& ids, size_t index,
                        const std::string& arguments, const char* status) {
  return json{{"id", item_id("fc_", ids, index)},
              {"type", "function_call"},
              {"status", status},
              {"arguments", arguments},
              {"call_id", tool_call_json(call, ids)["id"]},
              {"name", call.name}};
}

}  // namespace

std::variant<ResponsesRequest, ApiError> parse_responses_request(std::string_view body,
                                                                 const ApiConfig& config) {
  auto parsed = parse_json_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& b = std::get<json>(parsed);
  auto field = [&b](const char* key) { return given(b, key); };
  ResponsesRequest r;
  json& echo = r.echo;

  // Stored state: refused first, so a client that relies on it learns why at once.
  if (field("previous_response_id"))
    return unsupported_parameter(
        "previous_response_id",
        "'previous_response_id' needs stored responses; this server is stateless: "
        "send the whole conversation in 'input'");
  if (field("conversation"))
    return unsupported_parameter(
        "conversation",
        "'conversation' needs stored conversations; this server is stateless: "
        "send the whole conversation in 'input'");
  if (field("prompt"))
    return unsupported_parameter("prompt", "'prompt' (stored prompt templates) is not supported");
  if (const json* v = field("background"); v && !(v->is_boolean() && !v->get<bool>()))
    return unsupported_parameter("background", "'background' responses are not supported");
  if (const json* v = field("store"); v && !v->is_boolean())
    return invalid_value("store", "'store' must be a boolean");

  // OpenAI's chat fields a Responses body may carry by habit: refused as chat refuses them, never
  // dropped (the format of a Responses reply is 'text.format').
  if (auto e = check_one_plain_choice(b)) return *e;
  if (auto e = check_response_format(b, "; the Responses API's field is 'text.format'")) return *e;

  // The chat body the shared validation reads: the settings with the same meaning pass as they
  // are, the rest is translated below.
  json chat = json::object();
  for (const char* key : {"model", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                          "stream", "parallel_tool_calls", "cache_prompt"})
    if (const json* v = field(key)) chat[key] = *v;
  if (const json* v = field("stream_options"); v && !v->is_object())
    return invalid_value("stream_options", "'stream_options' must be an object");

  // input and instructions → messages.
  json messages = json::array();
  echo["instructions"] = nullptr;
  if (const json* v = field("instructions")) {
    if (auto e = text_field(*v, "instructions")) return *e;
    messages.push_back(json{{"role", "system"}, {"content", *v}});
    echo["instructions"] = *v;
  }
  const json* input = field("input");
  if (!input)
    return api_error(400, "invalid_request_error", "missing_required_parameter",
                     "'input' is required", "input");
  if (input->is_string()) {
    if (auto e = text_field(*input, "input")) return *e;
    messages.push_back(json{{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    if (input->empty()) return invalid_value("input", "'input' must contain at least one item");
    if (input->size() > 4096)
      return invalid_value(
          "input", "'input' holds " + std::to_string(input->size()) + " items; at most 4096");
    for (size_t i = 0; i < input->size(); ++i)
      if (auto e = add_item((*input)[i], i, messages)) return *e;
  } else {
    return invalid_value("input", "'input' must be a string or an array of input items");
  }
  // A reasoning item alone (a reply cut while it thought) is an assistant turn with no content and
  // no call, which a chat body may not send: its content is "".
  for (json& message : messages)
    if (message["role"] == "assistant" && message["content"].is_null() &&
        !message.contains("tool_calls"))
      message["content"] = "";
  chat["messages"] = std::move(messages);

  // Budget, reasoning, output format.
  echo["max_output_tokens"] = nullptr;
  if (const json* v = field("max_output_tokens")) {
    const bool integral =
        v->is_number_integer() || (v->is_number_float() && std::isfinite(v->get<double>()) &&
                                   std::floor(v->get<double>()) == v->get<double>());
    if (!integral || v->get<double>() < 1 || v->get<double>() > 2147483647.0)
      return invalid_value("max_output_tokens", "'max_output_tokens' is " + shown_value(*v) +
                                                    "; it must be an integer in [1, 2147483647]");
    chat["max_completion_tokens"] = *v;
    echo["max_output_tokens"] = *v;
  }
  json reasoning = json{{"effort", nullptr}, {"summary", nullptr}};
  if (const json* v = field("reasoning")) {
    if (!v->is_object()) return invalid_value("reasoning", "'reasoning' must be an object");
    if (auto it = v->find("effort"); it != v->end() && !it->is_null()) {
      static const char* const kEfforts[] = {"none", "minimal", "low", "medium",
                                             "high", "xhigh",   "max"};
      if (!it->is_string() || std::find(std::begin(kEfforts), std::end(kEfforts),
                                        it->get<std::string>()) == std::end(kEfforts))
        return unsupported_value(
            "reasoning.effort",
            "'reasoning.effort' must be one of none, minimal, low, medium, high, xhigh, max");
      chat["reasoning_effort"] = *it;
      reasoning["effort"] = *it;
    }
    for (const char* key : {"summary", "generate_summary"}) {
      auto it = v->find(key);
      if (it == v->end() || it->is_null()) continue;
      if (*it != "auto" && *it != "concise" && *it != "detailed")
        return invalid_value(
            std::string("reasoning.") + key,
            std::string("'reasoning.") + key + "' must be auto, concise or detailed");
      reasoning["summary"] = *it;
    }
  }
  echo["reasoning"] = std::move(reasoning);
  if (const json* v = field("text")) {
    if (!v->is_object()) return invalid_value("text", "'text' must be an object");
    if (auto f = v->find("format"); f != v->end() && !f->is_null()) {
      if (!f->is_object() || !f->contains("type") || !(*f)["type"].is_string())
        return invalid_value("text.format", "'text.format' must be an object with a 'type'");
      // Structured output: json_object, or json_schema with its schema beside the type.
      const std::string type = (*f)["type"];
      if (type == "json_object") {
        chat["response_format"] = json{{"type", "json_object"}};
      } else if (type == "json_schema") {
        if (!f->contains("schema"))
          return invalid_value("text.format.schema",
                               "'text.format.schema' is required for json_schema");
        chat["response_format"] = json{
            {"type", "json_schema"},
            {"json_schema",
             {{"name", f->value("name", std::string("response"))}, {"schema", (*f)["schema"]}}}};
      } else if (type != "text") {
        return unsupported_parameter("text.format",
                                     "'text.format' must be text, json_object or json_schema");
      }
      echo["text"] = json{{"format", *f}};
    }
  }
  if (!echo.contains("text")) echo["text"] = json{{"format", json{{"type", "text"}}}};
  if (const json* v = field("truncation"); v && *v != "disabled")
    return unsupported_value("truncation",
                             "'truncation' must be 'disabled': a prompt longer than the context "
                             "is refused, never cut");
  if (const json* v = field("top_logprobs"); v && !(v->is_number() && v->get<double>() == 0))
    return unsupported_parameter("top_logprobs", "'top_logprobs' is not supported");
  if (const json* v = field("include")) {
    if (!v->is_array()) return invalid_value("include", "'include' must be an array of strings");
    for (const json& x : *v) {
      if (!x.is_string()) return invalid_value("include", "'include' must be an array of strings");
      if (x == "message.output_text.logprobs")
        return unsupported_parameter("include",
                                     "'include' of 'message.output_text.logprobs' (logprobs) "
                                     "is not supported");
    }
  }
  echo["metadata"] = json::object();
  if (const json* v = field("metadata")) {
    if (!v->is_object() ||
        !std::all_of(v->begin(), v->end(), [](const json& x) { return x.is_string(); }))
      return invalid_value("metadata", "'metadata' must be an object of strings");
    echo["metadata"] = *v;
  }

  // Tools.
  json chat_tools = json::array(), echo_tools = json::array();
  if (const json* v = field("tools"))
    if (auto e = translate_tools(*v, chat_tools, echo_tools)) return *e;
  if (!chat_tools.empty()) chat["tools"] = chat_tools;
  echo["tools"] = std::move(echo_tools);
  echo["tool_choice"] = "auto";
  if (const json* v = field("tool_choice")) {
    json choice;
    if (auto e = translate_tool_choice(*v, chat_tools, choice)) return *e;
    chat["tool_choice"] = std::move(choice);
    echo["tool_choice"] = *v;
  }
  echo["parallel_tool_calls"] = true;
  if (const json* v = field("parallel_tool_calls"); v && v->is_boolean())
    echo["parallel_tool_calls"] = *v;

  auto validated = chat_request_from_json(chat, config);
  if (auto* e = std::get_if<ApiError>(&validated)) return *e;
  r.chat = std::move(std::get<ChatRequest>(validated));
  echo["temperature"] = r.chat.temperature;
  echo["top_p"] = r.chat.top_p;
  echo["previous_response_id"] = nullptr;
  echo["store"] = false;  // nothing is kept, whatever the request said
  echo["truncation"] = "disabled";
  echo["service_tier"] = "default";
  echo["top_logprobs"] = 0;
  echo["max_tool_calls"] = nullptr;
  return r;
}

json responses_usage_json(const GenerationStats& stats) {
  return json{{"input_tokens", stats.prompt_tokens},
              {"input_tokens_details",
               json{{"cached_tokens", stats.cached_tokens}, {"cache_write_tokens", 0}}},
              {"output_tokens", stats.completion_tokens},
              {"output_tokens_details", json{{"reasoning_tokens", stats.reasoning_tokens}}},
              {"total_tokens", stats.prompt_tokens + stats.completion_tokens}};
}

json response_object(const ResponsesRequest& request, const ResponseIds& ids, const char* status,
                     json output, const GenerationStats* stats, json error) {
  const std::string s = status;
  json o = json::object();
  o["id"] = ids.id;
  o["object"] = "response";
  o["created_at"] = ids.created;
  o["status"] = s;
  o["background"] = false;
  o["completed_at"] = s == "completed" ? json(std::max(unix_now(), ids.created)) : json(nullptr);
  o["error"] = std::move(error);
  // A reply the server cut (cancelled: a drain that timed out) is incomplete as one cut by the
  // budget: the schema's reasons are max_output_tokens and content_filter.
  o["incomplete_details"] =
      s == "incomplete" && stats ? json{{"reason", "max_output_tokens"}} : json(nullptr);
  o["model"] = request.chat.model;
  o["output"] = std::move(output);
  for (auto it = request.echo.begin(); it != request.echo.end(); ++it) o[it.key()] = it.value();
  if (stats) {  // absent while in progress (the schema has no null usage)
    o["usage"] = responses_usage_json(*stats);
    o["timings"] = timings_json(*stats);
    o["x_k3"] = x_k3_json(*stats);
  }
  return o;
}

json responses_json(const ChatResult& result, const ResponsesRequest& request,
                    const ResponseIds& ids) {
  const char* status = status_of(result.stats);
  const bool finished = std::string(status) == "completed";
  json output = json::array();
  if (!result.reasoning.empty())
    output.push_back(
        text_item(true, item_id("rs_", ids, 0), reasoning_part(result.reasoning), "completed"));
  if (!result.content.empty() || (output.empty() && result.tool_calls.empty()))
    output.push_back(text_item(false, item_id("msg_", ids, output.size()),
                               text_part(result.content), "completed"));
  // The last text item is the one a cut reply was writing.
  if (!finished && result.tool_calls.empty()) output.back()["status"] = "incomplete";
  for (const auto& call : result.tool_calls)
    output.push_back(function_call_item(call, ids, output.size(), call.arguments_json,
                                        call.complete ? "completed" : "incomplete"));
  return response_object(request, ids, status, std::move(output), &result.stats);
}

ResponsesStream::ResponsesStream(const ResponsesRequest& request, ResponseIds ids)
    : request_(request), ids_(std::move(ids)) {}

json ResponsesStream::event(const char* type, json fields) {
  json e = json{{"type", type}};
  for (auto it = fields.begin(); it != fields.end(); ++it) e[it.key()] = std::move(it.value());
  e["sequence_number"] = sequence_++;
  return e;
}

std::vector<json> ResponsesStream::start() {
  std::vector<json> out;
  for (const char* type : {"response.created", "response.in_progress"})
    out.push_back(event(type, json{{"response", response_object(request_, ids_, "in_progress",
                                                                json::array(), nullptr)}}));
  return out;
}

void ResponsesStream::open_item(std::vector<json>& out, Open kind) {
  const bool reasoning = kind == Open::reasoning;
  const size_t index = output_.size();
  const std::string id = item_id(reasoning ? "rs_" : "msg_", ids_, index);
  json item = text_item(reasoning, id, nullptr, "in_progress");
  output_.push_back(item);
  out.push_back(event("response.output_item.added",
                      json{{"output_index", index}, {"item", std::move(item)}}));
  out.push_back(event("response.content_part.added",
                      json{{"item_id", id},
                           {"output_index", index},
                           {"content_index", 0},
                           {"part", reasoning ? reasoning_part("") : text_part("")}}));
  open_ = kind;
  text_.clear();
}

void ResponsesStream::close_open(std::vector<json>& out, const char* status) {
  if (open_ == Open::none) return;
  const bool reasoning = open_ == Open::reasoning;
  const size_t index = output_.size() - 1;
  const std::string id = output_.back()["id"];
  json place = json{{"item_id", id}, {"output_index", index}, {"content_index", 0}};
  json done = place;
  done["text"] = text_;
  if (!reasoning) done["logprobs"] = json::array();
  out.push_back(event(reasoning ? "response.reasoning_text.done" : "response.output_text.done",
                      std::move(done)));
  json part = reasoning ? reasoning_part(text_) : text_part(text_);
  place["part"] = part;
  out.push_back(event("response.content_part.done", std::move(place)));
  output_.back() = text_item(reasoning, id, std::move(part), status);
  out.push_back(
      event("response.output_item.done", json{{"output_index", index}, {"item", output_.back()}}));
  open_ = Open::none;
  text_.clear();
}

std::vector<json> ResponsesStream::on_event(const ServiceEvent& e) {
  std::vector<json> out;
  switch (e.kind) {
    case ServiceEvent::Kind::reasoning:
    case ServiceEvent::Kind::content: {
      if (e.text.empty()) break;
      const Open kind = e.kind == ServiceEvent::Kind::reasoning ? Open::reasoning : Open::message;
      if (open_ != kind) {
        close_open(out, "completed");
        open_item(out, kind);
      }
      text_ += e.text;
      json delta = json{{"item_id", output_.back()["id"]},
                        {"output_index", output_.size() - 1},
                        {"content_index", 0},
                        {"delta", e.text}};
      if (kind == Open::message) delta["logprobs"] = json::array();
      out.push_back(event(
          kind == Open::reasoning ? "response.reasoning_text.delta" : "response.output_text.delta",
          std::move(delta)));
      break;
    }
    case ServiceEvent::Kind::tool_call: {
      close_open(out, "completed");
      const size_t index = output_.size();
      json item = function_call_item(e.call, ids_, index, "", "in_progress");
      const std::string id = item["id"];
      out.push_back(
          event("response.output_item.added", json{{"output_index", index}, {"item", item}}));
      out.push_back(
          event("response.function_call_arguments.delta",
                json{{"item_id", id}, {"output_index", index}, {"delta", e.call.arguments_json}}));
      out.push_back(event("response.function_call_arguments.done",
                          json{{"item_id", id},
                               {"output_index", index},
                               {"name", e.call.name},
                               {"arguments", e.call.arguments_json}}));
      item = function_call_item(e.call, ids_, index, e.call.arguments_json,
                                e.call.complete ? "completed" : "incomplete");
      output_.push_back(item);
      out.push_back(
          event("response.output_item.done", json{{"output_index", index}, {"item", item}}));
      break;
    }
    case ServiceEvent::Kind::done: {
      const char* status = status_of(e.stats);
      const bool finished = std::string(status) == "completed";
      close_open(out, finished ? "completed" : "incomplete");
      if (output_.empty()) {  // nothing was written: the answer is an empty message
        open_item(out, Open::message);
        close_open(out, finished ? "completed" : "incomplete");
      }
      out.push_back(
          event(finished ? "response.completed" : "response.incomplete",
                json{{"response", response_object(request_, ids_, status, output_, &e.stats)}}));
      break;
    }
    default:
      break;
  }
  return out;
}

std::vector<json> ResponsesStream::on_error(const ApiError& error) {
  if (open_ != Open::none) {  // the open item as it stands
    const bool reasoning = open_ == Open::reasoning;
    output_.back() = text_item(reasoning, output_.back()["id"],
                               reasoning ? reasoning_part(text_) : text_part(text_), "incomplete");
    open_ = Open::none;
  }
  json failure = json{{"code", "server_error"}, {"message", error.message}};
  return {
      event("response.failed", json{{"response", response_object(request_, ids_, "failed", output_,
                                                                 nullptr, std::move(failure))}})};
}

}  // namespace k3::server

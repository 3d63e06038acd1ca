// server/anthropic.cpp — the Anthropic Messages request translation and the Message / SSE
// shapes (see server/anthropic.h, docs/serving.md §3.18).
#include "server/anthropic.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>

#include "request_fields.h"
#include "util/hash.h"

namespace k3::server {
namespace {

std::string at(const std::string& base, size_t i) {
  return base + "." + std::to_string(i);
}

ApiError missing(const std::string& param) {
  return api_error(400, "invalid_request_error", "missing_required_parameter",
                   "'" + param + "' is required", param);
}

ApiError unsupported_content(const std::string& param, const std::string& why) {
  return api_error(400, "invalid_request_error", "unsupported_content_type", why, param);
}

// A block's `type`, or a 400 naming it.
std::variant<std::string, ApiError> block_type(const json& block, const std::string& where) {
  if (!block.is_object()) return invalid_value(where, "'" + where + "' must be an object");
  auto t = block.find("type");
  if (t == block.end() || !t->is_string())
    return invalid_value(where + ".type", "'" + where + ".type' must be a string");
  return t->get<std::string>();
}

// A block's text field (required, a string without NUL).
std::variant<std::string, ApiError> block_text(const json& block, const std::string& where,
                                               const char* key) {
  const std::string param = where + "." + key;
  auto it = block.find(key);
  if (it == block.end()) return invalid_value(param, "'" + param + "' is required");
  if (auto e = check_text(*it, param)) return *e;
  return it->get<std::string>();
}

// A text block's `text`: as block_text, and not empty (Anthropic's rule: "text content blocks
// must be non-empty").
std::variant<std::string, ApiError> nonempty_block_text(const json& block,
                                                        const std::string& where) {
  auto text = block_text(block, where, "text");
  if (auto* s = std::get_if<std::string>(&text); s && s->empty())
    return invalid_value(where + ".text", "'" + where + ".text' must not be empty");
  return text;
}

bool is_document_block(const std::string& type) {
  return is_media_part(type) || type == "document" || type == "search_result" ||
         type == "container_upload";
}

// `system` (or a system message's content at `param`): a string or text blocks → one system
// message (text parts).
std::optional<ApiError> add_system(const json& v, json& messages,
                                   const std::string& param = "system") {
  if (v.is_string()) {
    if (auto e = check_text(v, param)) return e;
    if (!v.get_ref<const std::string&>().empty())
      messages.push_back(json{{"role", "system"}, {"content", v}});
    return std::nullopt;
  }
  if (!v.is_array()) return invalid_value(param, "'" + param + "' must be a string or text blocks");
  json parts = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string where = at(param, i);
    auto type = block_type(v[i], where);
    if (auto* e = std::get_if<ApiError>(&type)) return *e;
    if (std::get<std::string>(type) != "text")
      return invalid_value(where + ".type", "system blocks must be of type 'text'");
    auto text = block_text(v[i], where, "text");
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    parts.push_back(json{{"type", "text"}, {"text", std::get<std::string>(text)}});
  }
  if (!parts.empty()) messages.push_back(json{{"role", "system"}, {"content", std::move(parts)}});
  return std::nullopt;
}

// A tool_result's content: a string, text blocks, or absent ("").
std::variant<json, ApiError> tool_result_content(const json& block, const std::string& where) {
  auto it = block.find("content");
  if (it == block.end() || it->is_null()) return json("");
  const std::string param = where + ".content";
  if (it->is_string()) {
    if (auto e = check_text(*it, param)) return *e;
    return *it;
  }
  if (!it->is_array())
    return invalid_value(param, "'" + param + "' must be a string or text blocks");
  json parts = json::array();
  for (size_t k = 0; k < it->size(); ++k) {
    const std::string part = at(param, k);
    auto type = block_type((*it)[k], part);
    if (auto* e = std::get_if<ApiError>(&type)) return *e;
    const std::string& t = std::get<std::string>(type);
    if (is_document_block(t))
      return unsupported_content(
          part, "tool results of type '" + t + "' are not supported: this model reads text only");
    if (t != "text") return invalid_value(part + ".type", "unknown block type '" + t + "'");
    auto text = block_text((*it)[k], part, "text");
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    parts.push_back(json{{"type", "text"}, {"text", std::get<std::string>(text)}});
  }
  return parts;
}

// One user message → the renderer's user and tool messages, in block order. `names` maps the
// tool_use ids of earlier assistant turns to their tool names.
std::optional<ApiError> add_user(const json& content, const std::string& where,
                                 const std::map<std::string, std::string>& names, json& messages) {
  if (content.is_string()) {
    messages.push_back(json{{"role", "user"}, {"content", content}});
    return std::nullopt;
  }
  json parts = json::array();
  auto flush = [&] {
    if (!parts.empty())
      messages.push_back(json{{"role", "user"}, {"content", std::exchange(parts, json::array())}});
  };
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string block = at(where + ".content", j);
    auto type = block_type(content[j], block);
    if (auto* e = std::get_if<ApiError>(&type)) return *e;
    const std::string& t = std::get<std::string>(type);
    if (t == "text") {
      auto text = nonempty_block_text(content[j], block);
      if (auto* e = std::get_if<ApiError>(&text)) return *e;
      parts.push_back(json{{"type", "text"}, {"text", std::get<std::string>(text)}});
    } else if (t == "tool_result") {
      auto id = block_text(content[j], block, "tool_use_id");
      if (auto* e = std::get_if<ApiError>(&id)) return *e;
      const auto name = names.find(std::get<std::string>(id));
      if (name == names.end())
        return invalid_value(block + ".tool_use_id",
                             "'" + block +
                                 ".tool_use_id' matches no tool_use block of an earlier assistant "
                                 "message");
      if (auto e = content[j].find("is_error"); e != content[j].end() && !e->is_null()) {
        bool ignored = false;
        if (auto err = get_bool(*e, block + ".is_error", ignored)) return err;
      }
      auto result = tool_result_content(content[j], block);
      if (auto* e = std::get_if<ApiError>(&result)) return *e;
      flush();
      messages.push_back(json{{"role", "tool"},
                              {"tool_call_id", name->first},
                              {"name", name->second},
                              {"content", std::move(std::get<json>(result))}});
    } else if (is_document_block(t)) {
      return unsupported_content(block, "content blocks of type '" + t +
                                            "' are not supported: this model reads text only");
    } else {
      return invalid_value(block + ".type", "'" + t + "' blocks are not allowed in a user message");
    }
  }
  flush();
  return std::nullopt;
}

// One assistant message → the renderer's assistant message (reasoning_content, content,
// tool_calls); its tool_use ids join `names`.
std::optional<ApiError> add_assistant(const json& content, const std::string& where,
                                      std::map<std::string, std::string>& names, json& messages) {
  json m = json{{"role", "assistant"}};
  if (content.is_string()) {
    m["content"] = content;
    messages.push_back(std::move(m));
    return std::nullopt;
  }
  std::string reasoning, text;
  bool has_text = false, has_reasoning = false;
  json calls = json::array();
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string block = at(where + ".content", j);
    auto type = block_type(content[j], block);
    if (auto* e = std::get_if<ApiError>(&type)) return *e;
    const std::string& t = std::get<std::string>(type);
    if (t == "text" || t == "thinking") {
      auto s = t == "text" ? nonempty_block_text(content[j], block)
                           : block_text(content[j], block, "thinking");
      if (auto* e = std::get_if<ApiError>(&s)) return *e;
      (t == "text" ? text : reasoning) += std::get<std::string>(s);
      (t == "text" ? has_text : has_reasoning) = true;
    } else if (t == "redacted_thinking") {
      continue;  // never written by this server; nothing of it can be rendered
    } else if (t == "tool_use") {
      auto id = block_text(content[j], block, "id");
      if (auto* e = std::get_if<ApiError>(&id)) return *e;
      auto name = block_text(content[j], block, "name");
      if (auto* e = std::get_if<ApiError>(&name)) return *e;
      if (std::get<std::string>(name).empty())
        return invalid_value(block + ".name", "'" + block + ".name' must not be empty");
      auto input = content[j].find("input");
      if (input == content[j].end() || !input->is_object())
        return invalid_value(block + ".input", "'" + block + ".input' must be an object");
      names[std::get<std::string>(id)] = std::get<std::string>(name);
      calls.push_back(
          json{{"id", std::get<std::string>(id)},
               {"type", "function"},
               {"function", json{{"name", std::get<std::string>(name)}, {"arguments", *input}}}});
    } else if (is_document_block(t)) {
      return unsupported_content(block, "content blocks of type '" + t + "' are not supported");
    } else {
      return invalid_value(block + ".type",
                           "'" + t + "' blocks are not allowed in an assistant message");
    }
  }
  m["content"] = has_text ? json(text) : json(nullptr);
  if (has_reasoning) m["reasoning_content"] = reasoning;
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  messages.push_back(std::move(m));
  return std::nullopt;
}

// `tools` → OpenAI function tools (only name, description and input_schema are rendered).
std::optional<ApiError> convert_tools(const json& v, json& out) {
  if (!v.is_array()) return invalid_value("tools", "'tools' must be an array");
  out = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string where = at("tools", i);
    const json& t = v[i];
    if (!t.is_object()) return invalid_value(where, "'" + where + "' must be an object");
    if (auto type = t.find("type"); type != t.end() && !type->is_null() && *type != "custom")
      return api_error(400, "invalid_request_error", "unsupported_value",
                       "server tools ('" + (type->is_string() ? type->get<std::string>() : "?") +
                           "') are not supported: declare client tools with an input_schema",
                       where + ".type");
    auto name = block_text(t, where, "name");
    if (auto* e = std::get_if<ApiError>(&name)) return *e;
    if (std::get<std::string>(name).empty())
      return invalid_value(where + ".name", "'" + where + ".name' must not be empty");
    json fn = json{{"name", std::get<std::string>(name)}};
    if (auto d = t.find("description"); d != t.end() && !d->is_null()) {
      if (auto e = check_text(*d, where + ".description")) return e;
      fn["description"] = *d;
    }
    auto schema = t.find("input_schema");
    if (schema == t.end() || !schema->is_object())
      return invalid_value(where + ".input_schema",
                           "'" + where + ".input_schema' must be a JSON Schema object");
    fn["parameters"] = *schema;
    out.push_back(json{{"type", "function"}, {"function", std::move(fn)}});
  }
  return std::nullopt;
}

// `tool_choice` → the renderer's tool_choice ("required" / "none" / null), narrowing the
// declared tools to the named one for {"type":"tool"}.
std::optional<ApiError> apply_tool_choice(const json& v, json& tools, ChatRequest& r) {
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
    return invalid_value("tool_choice", "'tool_choice' must be an object with a 'type'");
  const std::string type = v["type"].get<std::string>();
  if (auto d = v.find("disable_parallel_tool_use"); d != v.end() && !d->is_null()) {
    bool ignored = false;
    if (auto e = get_bool(*d, "tool_choice.disable_parallel_tool_use", ignored)) return e;
  }
  if (type == "auto") return std::nullopt;
  if (type == "none") {
    r.tool_choice = text::PyValue::string("none");
    return std::nullopt;
  }
  if (type != "any" && type != "tool")
    return api_error(400, "invalid_request_error", "unsupported_value",
                     "'tool_choice.type' must be auto, any, tool or none", "tool_choice.type");
  if (tools.empty())
    return invalid_value("tool_choice", "tool_choice '" + type + "' needs 'tools'");
  if (type == "tool") {
    auto name = block_text(v, "tool_choice", "name");
    if (auto* e = std::get_if<ApiError>(&name)) return *e;
    json kept = json::array();
    for (const json& t : tools)
      if (t["function"]["name"] == std::get<std::string>(name)) kept.push_back(t);
    if (kept.empty())
      return invalid_value("tool_choice.name", "'tool_choice.name' names no declared tool");
    tools = std::move(kept);
  }
  r.tool_choice = text::PyValue::string("required");
  return std::nullopt;
}

// The sampling fields, the budget and the stop sequences.
std::optional<ApiError> parse_generation_fields(const json& b, const ApiConfig& config,
                                                int64_t& requested_max, ChatRequest& r) {
  auto field = [&](const char* key) { return present(b, key); };
  const json* max = field("max_tokens");
  if (!max) return missing("max_tokens");
  if (auto e = get_int(*max, "max_tokens", 1, (int64_t{1} << 31) - 1, requested_max)) return e;
  r.max_tokens = std::min(requested_max, config.max_tokens_ceiling);
  if (const json* v = field("stream"))
    if (auto e = get_bool(*v, "stream", r.stream)) return e;
  if (const json* v = field("temperature"))
    if (auto e = get_number(*v, "temperature", 0.0, 1.0, false, r.temperature)) return e;
  if (const json* v = field("top_p"))
    if (auto e = get_number(*v, "top_p", 0.0, 1.0, true, r.top_p)) return e;
  if (const json* v = field("top_k"))
    if (auto e = get_int(*v, "top_k", 0, int64_t{1} << 30, r.top_k)) return e;
  if (const json* v = field("stop_sequences")) {
    if (!v->is_array())
      return invalid_value("stop_sequences", "'stop_sequences' must be an array of strings");
    if (v->size() > 16)
      return invalid_value("stop_sequences", "'stop_sequences' holds " + std::to_string(v->size()) +
                                                 " strings; at most 16");
    for (size_t i = 0; i < v->size(); ++i) {
      const json& s = (*v)[i];
      const std::string where = at("stop_sequences", i);
      if (!s.is_string() || s.get_ref<const std::string&>().empty() ||
          s.get_ref<const std::string&>().size() > 256 || has_nul(s.get<std::string>()))
        return invalid_value(
            where,
            "'" + where + "' must be a non-empty string of at most 256 bytes" +
                (s.is_string()
                     ? " (it is " + std::to_string(s.get_ref<const std::string&>().size()) + ")"
                     : std::string()));
      r.stop.push_back(s.get<std::string>());
    }
  }
  if (const json* v = field("metadata"); v && !v->is_object())
    return invalid_value("metadata", "'metadata' must be an object");
  return std::nullopt;
}

}  // namespace

std::variant<MessagesRequest, ApiError> parse_messages_request(std::string_view body,
                                                               const ApiConfig& config,
                                                               bool count_only) {
  auto parsed = parse_json_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& b = std::get<json>(parsed);
  auto field = [&](const char* key) { return present(b, key); };
  MessagesRequest out;
  ChatRequest& r = out.chat;
  r.thinking = config.default_thinking;
  set_sampling_defaults(config, r);

  const json* model = field("model");
  if (!model) return missing("model");
  if (!model->is_string()) return invalid_value("model", "'model' must be a string");
  r.model = model->get<std::string>();
  const json* messages = field("messages");
  if (auto e = check_messages(messages)) return *e;
  int64_t requested_max = 0;
  if (!count_only)
    if (auto e = parse_generation_fields(b, config, requested_max, r)) return *e;
  for (const char* key : {"mcp_servers", "container"})
    if (field(key))
      return api_error(400, "invalid_request_error", "unsupported_parameter",
                       std::string("'") + key + "' is not supported", key);
  // OpenAI's fields, which a client may send here by habit: refused as chat refuses them, never
  // dropped.
  if (auto e = check_one_plain_choice(b)) return *e;
  if (auto e = check_response_format(b)) return *e;

  json normalised = json::array();
  if (const json* v = field("system"))
    if (auto e = add_system(*v, normalised)) return *e;
  std::map<std::string, std::string> tool_names;
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string where = at("messages", i);
    const json& m = (*messages)[i];
    if (!m.is_object()) return invalid_value(where, "'" + where + "' must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string() ||
        (*role != "user" && *role != "assistant" && *role != "system"))
      return invalid_value(where + ".role",
                           "'" + where + ".role' must be user, assistant or system");
    auto content = m.find("content");
    if (content == m.end())
      return invalid_value(where + ".content", "'" + where + ".content' is required");
    if (content->is_string()) {
      if (auto e = check_text(*content, where + ".content")) return *e;
    } else if (!content->is_array()) {
      return invalid_value(where + ".content",
                           "'" + where + ".content' must be a string or an array of blocks");
    }
    // Anthropic's rule: every message has non-empty content (a turn of nothing renders as nothing).
    const bool empty =
        content->is_string() ? content->get_ref<const std::string&>().empty() : content->empty();
    if (*role != "system" && empty)
      return invalid_value(where + ".content",
                           "'" + where +
                               ".content' must not be empty: a non-empty string or at "
                               "least one content block");
    if (*role == "system") {  // a system message between the turns (Claude Code sends them)
      if (auto e = add_system(*content, normalised, where + ".content")) return *e;
      continue;
    }
    const bool user = *role == "user";
    if (!user && i + 1 == messages->size())
      return invalid_value(where,
                           "a final assistant message (a prefill to continue) is not "
                           "supported: the reply always starts a new assistant turn");
    if (auto e = user ? add_user(*content, where, tool_names, normalised)
                      : add_assistant(*content, where, tool_names, normalised))
      return *e;
  }
  r.messages = to_py(normalised);

  json tools = json::array();
  if (const json* v = field("tools"))
    if (auto e = convert_tools(*v, tools)) return *e;
  if (const json* v = field("tool_choice"))
    if (auto e = apply_tool_choice(*v, tools, r)) return *e;
  if (!tools.empty()) r.tools = to_py(tools);
  // tool_choice any / tool: the tool_use input matches the tool's input_schema.
  if (!tools.empty() && r.tool_choice.is_string() && r.tool_choice.as_string() == "required")
    if (auto e = parse_forced_tools(tools, json("required"), r)) return *e;

  if (const json* v = field("output_config")) {
    if (!v->is_object()) return invalid_value("output_config", "'output_config' must be an object");
    if (auto f = v->find("format"); f != v->end() && !f->is_null()) {
      // Structured output: {"type": "json_schema", "schema": {...}}, as response_format.
      if (!f->is_object() || f->value("type", json()) != "json_schema" || !f->contains("schema"))
        return invalid_value(
            "output_config.format",
            "'output_config.format' must be {\"type\":\"json_schema\",\"schema\":{...}}");
      const json rf = {{"response_format",
                        {{"type", "json_schema"}, {"json_schema", {{"schema", (*f)["schema"]}}}}}};
      if (auto e = parse_structured_output(rf, r, &r.response_format)) {
        if (e->param && *e->param == "response_format.json_schema.schema")
          e->param = "output_config.format.schema";
        return *e;
      }
    }
    if (auto effort = v->find("effort"); effort != v->end() && !effort->is_null()) {
      const std::string e = effort->is_string() ? effort->get<std::string>() : "";
      if (e == "low")
        r.effort = "low";
      else if (e == "medium" || e == "high")
        r.effort = "high";
      else if (e == "xhigh" || e == "max")
        r.effort = "max";
      else
        return api_error(400, "invalid_request_error", "unsupported_value",
                         "'output_config.effort' must be low, medium, high, xhigh or max",
                         "output_config.effort");
    }
  }
  if (const json* v = field("thinking")) {
    const std::string type = v->is_object() && v->contains("type") && (*v)["type"].is_string()
                                 ? (*v)["type"].get<std::string>()
                                 : "";
    if (type != "enabled" && type != "adaptive" && type != "disabled")
      return invalid_value("thinking.type",
                           "'thinking.type' must be enabled, adaptive or disabled");
    r.thinking = type != "disabled";
    if (auto display = v->find("display"); display != v->end() && !display->is_null()) {
      if (!display->is_string())
        return invalid_value("thinking.display", "'thinking.display' must be a string");
      // "omitted" drops the text; the other displays (summarized, updates, ...) get it whole.
      out.omit_thinking = *display == "omitted";
    }
    if (type == "enabled") {
      auto budget = v->find("budget_tokens");
      if (budget == v->end() || budget->is_null()) return missing("thinking.budget_tokens");
      if (auto e = get_int(*budget, "thinking.budget_tokens", 1024, (int64_t{1} << 31) - 1,
                           out.budget_tokens))
        return *e;
      if (!count_only && out.budget_tokens >= requested_max)
        return invalid_value("thinking.budget_tokens", "'thinking.budget_tokens' (" +
                                                           std::to_string(out.budget_tokens) +
                                                           ") must be less than 'max_tokens' (" +
                                                           std::to_string(requested_max) + ")");
      // The template's effort message closest to the budget (docs/serving.md §3.18.3).
      r.effort = out.budget_tokens < 4096 ? "low" : out.budget_tokens < 16384 ? "high" : "max";
    }
  }

  if (auto e = resolve_model(r.model, config)) return *e;
  return out;
}

const char* anthropic_stop_reason(const GenerationStats& stats) {
  switch (stats.finish) {
    case FinishReason::length:
    case FinishReason::cancelled:  // cut by the server (a drain that timed out): cut short
      return "max_tokens";
    case FinishReason::tool_calls:
      return "tool_use";
    default:
      return stats.stop_sequence.empty() ? "end_turn" : "stop_sequence";
  }
}

json anthropic_usage_json(const GenerationStats& stats) {
  json u = json::object();
  u["input_tokens"] = stats.prompt_tokens - stats.cached_tokens;
  u["cache_creation_input_tokens"] = 0;
  u["cache_read_input_tokens"] = stats.cached_tokens;
  u["output_tokens"] = stats.completion_tokens;
  return u;
}

std::string tool_use_id(const std::string& message_id, int index) {
  const std::string tail =
      message_id.size() > 12 ? message_id.substr(message_id.size() - 12) : message_id;
  return "toolu_" + std::to_string(index) + "_" + tail;
}

std::string thinking_signature(const std::string& thinking) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "k3-%016llx", static_cast<unsigned long long>(fnv1a_64(thinking)));
  return buf;
}

json tool_input_json(const text::ToolCallOut& call) {
  json input = json::parse(call.arguments_json, nullptr, false);
  if (input.is_object()) return input;
  return json{{"arguments", call.arguments_json}};
}

namespace {
json stop_sequence_json(const GenerationStats& stats) {
  return stats.finish == FinishReason::stop && !stats.stop_sequence.empty()
             ? json(stats.stop_sequence)
             : json(nullptr);
}
}  // namespace

json messages_response_json(const ChatResult& result, const std::string& id,
                            const std::string& model, bool omit_thinking) {
  json content = json::array();
  if (!result.reasoning.empty())
    content.push_back(json{{"type", "thinking"},
                           {"thinking", omit_thinking ? "" : result.reasoning},
                           {"signature", thinking_signature(result.reasoning)}});
  if (!result.content.empty()) content.push_back(json{{"type", "text"}, {"text", result.content}});
  for (const auto& call : result.tool_calls)
    content.push_back(json{{"type", "tool_use"},
                           {"id", tool_use_id(id, call.index)},
                           {"name", call.name},
                           {"input", tool_input_json(call)}});
  json out = json::object();
  out["id"] = id;
  out["type"] = "message";
  out["role"] = "assistant";
  out["model"] = model;
  out["content"] = std::move(content);
  out["stop_reason"] = anthropic_stop_reason(result.stats);
  out["stop_sequence"] = stop_sequence_json(result.stats);
  out["usage"] = anthropic_usage_json(result.stats);
  return out;
}

NamedEvents MessagesStream::start(const GenerationStats& accepted) const {
  GenerationStats usage = accepted;
  usage.completion_tokens = 0;
  json message = json::object();
  message["id"] = id_;
  message["type"] = "message";
  message["role"] = "assistant";
  message["model"] = model_;
  message["content"] = json::array();
  message["stop_reason"] = nullptr;
  message["stop_sequence"] = nullptr;
  message["usage"] = anthropic_usage_json(usage);
  return {{"message_start", json{{"type", "message_start"}, {"message", std::move(message)}}},
          {"ping", json{{"type", "ping"}}}};
}

void MessagesStream::close_block(NamedEvents& out) {
  if (open_ == Block::none) return;
  if (open_ == Block::thinking)
    out.push_back({"content_block_delta",
                   json{{"type", "content_block_delta"},
                        {"index", index_},
                        {"delta", json{{"type", "signature_delta"},
                                       {"signature", thinking_signature(thinking_)}}}}});
  out.push_back({"content_block_stop", json{{"type", "content_block_stop"}, {"index", index_}}});
  open_ = Block::none;
  thinking_.clear();
}

void MessagesStream::open_block(NamedEvents& out, Block kind) {
  if (open_ == kind) return;
  close_block(out);
  open_ = kind;
  const json block = kind == Block::thinking
                         ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                         : json{{"type", "text"}, {"text", ""}};
  out.push_back(
      {"content_block_start",
       json{{"type", "content_block_start"}, {"index", ++index_}, {"content_block", block}}});
}

NamedEvents MessagesStream::on_event(const ServiceEvent& e) {
  NamedEvents out;
  auto delta = [&](json d) {
    out.push_back(
        {"content_block_delta",
         json{{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}}});
  };
  switch (e.kind) {
    case ServiceEvent::Kind::reasoning:
      open_block(out, Block::thinking);
      thinking_ += e.text;
      if (!omit_thinking_) delta(json{{"type", "thinking_delta"}, {"thinking", e.text}});
      break;
    case ServiceEvent::Kind::content:
      open_block(out, Block::text);
      delta(json{{"type", "text_delta"}, {"text", e.text}});
      break;
    case ServiceEvent::Kind::tool_call: {
      close_block(out);
      const json block = json{{"type", "tool_use"},
                              {"id", tool_use_id(id_, e.call.index)},
                              {"name", e.call.name},
                              {"input", json::object()}};
      out.push_back(
          {"content_block_start",
           json{{"type", "content_block_start"}, {"index", ++index_}, {"content_block", block}}});
      delta(json{{"type", "input_json_delta"},
                 {"partial_json",
                  tool_input_json(e.call).dump(-1, ' ', false, json::error_handler_t::replace)}});
      out.push_back(
          {"content_block_stop", json{{"type", "content_block_stop"}, {"index", index_}}});
      break;
    }
    case ServiceEvent::Kind::done: {
      close_block(out);
      json d = json::object();
      d["stop_reason"] = anthropic_stop_reason(e.stats);
      d["stop_sequence"] = stop_sequence_json(e.stats);
      out.push_back({"message_delta", json{{"type", "message_delta"},
                                           {"delta", std::move(d)},
                                           {"usage", anthropic_usage_json(e.stats)}}});
      out.push_back({"message_stop", json{{"type", "message_stop"}}});
      break;
    }
    default:
      break;
  }
  return out;
}

}  // namespace k3::server

// server/api.cpp — validation of the OpenAI request bodies and the response / chunk shapes
// (see server/api.h).
#include "server/api.h"

#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "request_fields.h"
#include "text/chat.h"
#include "text/prompt.h"
#include "text/utf8.h"

namespace k3::server {
namespace {

using Kind = json::value_t;

// Nesting depth of a JSON text, counted outside strings, without parsing it (so a 100k-deep
// body never reaches a recursive parser).
bool depth_within(std::string_view body, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

}  // namespace

// The field checks shared with the other API shapes (server/request_fields.h).
std::string shown_value(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 40) + "...";
  return text;
}

bool is_int(const json& v) {
  return v.is_number_integer() ||
         (v.is_number_float() && std::isfinite(v.get<double>()) &&
          std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9.2e18);
}

// An integer field (an integral float such as 256.0 is accepted, as SDKs write them).
// Out of range: "'top_k' is -1; it must be in [0, 1073741824]" (the field, the value as sent,
// the range).
std::optional<ApiError> get_int(const json& v, const std::string& param, int64_t lo, int64_t hi,
                                int64_t& out) {
  const auto out_of_range = [&] {
    return invalid_value(param, "'" + param + "' is " + shown_value(v) + "; it must be in [" +
                                    std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  // Whole numbers beyond int64 (1e20, 18446744073709551615) are integers out of range.
  if (v.is_number_float() && std::isfinite(v.get<double>()) &&
      std::floor(v.get<double>()) == v.get<double>() && !is_int(v))
    return out_of_range();
  if (!is_int(v)) return invalid_value(param, "'" + param + "' must be an integer");
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return out_of_range();
  const int64_t x = v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>();
  if (x < lo || x > hi) return out_of_range();
  out = x;
  return std::nullopt;
}

std::optional<ApiError> get_number(const json& v, const std::string& param, double lo, double hi,
                                   bool lo_open, double& out) {
  if (!v.is_number()) return invalid_value(param, "'" + param + "' must be a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || x < lo || (lo_open && x == lo)) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "; it must be in %s%g, %g]", lo_open ? "(" : "[", lo, hi);
    return invalid_value(param, "'" + param + "' is " + shown_value(v) + buf);
  }
  out = x;
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& v, const std::string& param, bool& out) {
  if (!v.is_boolean()) return invalid_value(param, "'" + param + "' must be a boolean");
  out = v.get<bool>();
  return std::nullopt;
}

bool has_nul(const std::string& s) {
  return s.find('\0') != std::string::npos;
}

std::optional<ApiError> check_text(const json& v, const std::string& param) {
  if (!v.is_string()) return invalid_value(param, "'" + param + "' must be a string");
  if (has_nul(v.get_ref<const std::string&>()))
    return invalid_value(param, "'" + param + "' contains a NUL character");
  return std::nullopt;
}

text::PyValue to_py(const json& v) {
  switch (v.type()) {
    case Kind::null:
      return {};
    case Kind::boolean:
      return text::PyValue::boolean(v.get<bool>());
    case Kind::number_integer:
      return text::PyValue::integer(v.get<int64_t>());
    case Kind::number_unsigned:
      return text::PyValue::integer_text(std::to_string(v.get<uint64_t>()));
    case Kind::number_float:
      return text::PyValue::floating(v.get<double>());
    case Kind::string:
      return text::PyValue::string(v.get<std::string>());
    case Kind::array: {
      text::PyValue::Array items;
      for (const json& x : v) items.push_back(to_py(x));
      return text::PyValue::array(std::move(items));
    }
    case Kind::object: {
      text::PyValue out = text::PyValue::object();
      for (auto it = v.begin(); it != v.end(); ++it) out.set(it.key(), to_py(it.value()));
      return out;
    }
    default:
      return {};
  }
}

bool is_media_part(const std::string& type) {
  return type == "image_url" || type == "input_image" || type == "image" || type == "input_audio" ||
         type == "audio" || type == "file" || type == "input_file" || type == "video" ||
         type == "video_url";
}

namespace {

// Validates one message and returns it normalised for the renderer.
std::variant<json, ApiError> normalise_message(const json& m, size_t i) {
  const std::string at = "messages." + std::to_string(i);
  if (!m.is_object()) return invalid_value(at, "'" + at + "' must be an object");
  auto role_it = m.find("role");
  if (role_it == m.end()) return invalid_value(at + ".role", "'" + at + ".role' is required");
  if (!role_it->is_string())
    return invalid_value(at + ".role", "'" + at + ".role' must be a string");
  std::string role = role_it->get<std::string>();
  if (role == "developer") role = "system";
  if (role != "system" && role != "user" && role != "assistant" && role != "tool")
    return invalid_value(
        at + ".role", "'" + at + ".role' must be one of system, developer, user, assistant, tool");
  json out = json::object();
  out["role"] = role;
  // content: a string, or text parts (at least one). Absent, null or [] only on an assistant turn
  // that carries tool calls (OpenAI's rule) or its reasoning (a reply cut while it thought, sent
  // back): any other turn would render as nothing.
  auto content_it = m.find("content");
  const bool no_content = content_it == m.end() || content_it->is_null() ||
                          (content_it->is_array() && content_it->empty());
  if (no_content) {
    const auto carries = [&](const char* key) {
      const auto it = m.find(key);
      return it != m.end() && ((it->is_array() && !it->empty()) ||
                               (it->is_string() && !it->get_ref<const std::string&>().empty()));
    };
    if (role != "assistant" ||
        !(carries("tool_calls") || carries("reasoning_content") || carries("reasoning")))
      return invalid_value(
          at + ".content",
          "'" + at + ".content' is required" +
              (role == "assistant" ? " (an assistant message without tool_calls or reasoning)"
                                   : "") +
              ": a string or a non-empty array of text parts");
    out["content"] = nullptr;
  } else if (content_it->is_string()) {
    if (auto e = check_text(*content_it, at + ".content")) return *e;
    out["content"] = *content_it;
  } else if (content_it->is_array()) {
    json parts = json::array();
    for (size_t j = 0; j < content_it->size(); ++j) {
      const json& part = (*content_it)[j];
      const std::string pat = at + ".content." + std::to_string(j);
      if (!part.is_object()) return invalid_value(pat, "'" + pat + "' must be an object");
      auto type_it = part.find("type");
      if (type_it == part.end() || !type_it->is_string())
        return invalid_value(pat + ".type", "'" + pat + ".type' must be a string");
      const std::string type = type_it->get<std::string>();
      if (is_media_part(type))
        return api_error(
            400, "invalid_request_error", "unsupported_content_type",
            "content parts of type '" + type + "' are not supported: this model reads text only",
            pat);
      if (type != "text" && type != "input_text" && type != "output_text")
        return invalid_value(pat + ".type", "unknown content part type '" + type + "'");
      auto text_it = part.find("text");
      if (text_it == part.end())
        return invalid_value(pat + ".text", "'" + pat + ".text' is required");
      if (auto e = check_text(*text_it, pat + ".text")) return *e;
      parts.push_back(json{{"type", "text"}, {"text", *text_it}});
    }
    out["content"] = std::move(parts);
  } else {
    return invalid_value(at + ".content",
                         "'" + at + ".content' must be a string, null or an array of text parts");
  }
  if (auto name_it = m.find("name"); name_it != m.end() && !name_it->is_null()) {
    if (auto e = check_text(*name_it, at + ".name")) return *e;
    out["name"] = *name_it;
  }
  if (role == "assistant") {
    for (const char* key : {"reasoning_content", "reasoning"}) {
      auto it = m.find(key);
      if (it == m.end() || it->is_null()) continue;
      if (auto e = check_text(*it, at + "." + key)) return *e;
      if (!out.contains("reasoning_content")) out["reasoning_content"] = *it;
    }
    if (auto calls_it = m.find("tool_calls"); calls_it != m.end() && !calls_it->is_null()) {
      if (!calls_it->is_array())
        return invalid_value(at + ".tool_calls", "'" + at + ".tool_calls' must be an array");
      json calls = json::array();
      for (size_t j = 0; j < calls_it->size(); ++j) {
        const json& call = (*calls_it)[j];
        const std::string cat = at + ".tool_calls." + std::to_string(j);
        if (!call.is_object()) return invalid_value(cat, "'" + cat + "' must be an object");
        auto fn = call.find("function");
        if (fn == call.end() || !fn->is_object())
          return invalid_value(cat + ".function", "'" + cat + ".function' must be an object");
        auto name = fn->find("name");
        if (name == fn->end())
          return invalid_value(cat + ".function.name", "'" + cat + ".function.name' is required");
        if (auto e = check_text(*name, cat + ".function.name")) return *e;
        json norm = json::object();
        if (auto id = call.find("id"); id != call.end() && id->is_string()) norm["id"] = *id;
        norm["type"] = "function";
        json f = json::object();
        f["name"] = *name;
        auto args = fn->find("arguments");
        if (args == fn->end() || args->is_null())
          f["arguments"] = "{}";
        else if (args->is_string() || args->is_object())
          f["arguments"] = *args;
        else
          return invalid_value(cat + ".function.arguments",
                               "'" + cat + ".function.arguments' must be a string");
        norm["function"] = std::move(f);
        calls.push_back(std::move(norm));
      }
      out["tool_calls"] = std::move(calls);
    }
  }
  if (role == "tool") {
    auto id = m.find("tool_call_id");
    if (id != m.end() && !id->is_null()) {
      if (auto e = check_text(*id, at + ".tool_call_id")) return *e;
      out["tool_call_id"] = *id;
    }
  }
  return out;
}

std::optional<ApiError> check_tools(const json& tools) {
  if (!tools.is_array()) return invalid_value("tools", "'tools' must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = "tools." + std::to_string(i);
    if (!t.is_object()) return invalid_value(at, "'" + at + "' must be an object");
    auto type = t.find("type");
    if (type != t.end() && (!type->is_string() || type->get<std::string>() != "function"))
      return api_error(400, "invalid_request_error", "unsupported_value",
                       "only tools of type 'function' are supported", at + ".type");
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object())
      return invalid_value(at + ".function", "'" + at + ".function' must be an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get_ref<const std::string&>().empty())
      return invalid_value(at + ".function.name",
                           "'" + at + ".function.name' must be a non-empty string");
    if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null() && !p->is_object())
      return invalid_value(at + ".function.parameters",
                           "'" + at + ".function.parameters' must be an object");
  }
  return std::nullopt;
}

// The generation fields shared by /v1/chat/completions and /v1/completions.
std::optional<ApiError> parse_generation(const json& b, const ApiConfig& config,
                                         int64_t default_max_tokens, GenerationParams& r) {
  set_sampling_defaults(config, r);
  r.max_tokens = std::min(default_max_tokens, config.max_tokens_ceiling);
  auto field = [&](const char* key) { return present(b, key); };
  // Penalties: OpenAI's frequency / presence, llama.cpp's repeat_penalty with repeat_last_n.
  // HF/vLLM's repetition_penalty (a window of everything) is not ours: only its neutral values.
  if (const json* v = field("repetition_penalty");
      v && !(v->is_number() && (v->get<double>() == 0.0 || v->get<double>() == 1.0)))
    return unsupported_parameter(
        "repetition_penalty",
        "'repetition_penalty' is not supported; use 'repeat_penalty' with 'repeat_last_n'");
  if (const json* v = field("frequency_penalty"))
    if (auto e = get_number(*v, "frequency_penalty", -2.0, 2.0, false, r.frequency_penalty))
      return e;
  if (const json* v = field("presence_penalty"))
    if (auto e = get_number(*v, "presence_penalty", -2.0, 2.0, false, r.presence_penalty)) return e;
  if (const json* v = field("repeat_penalty"))
    if (auto e = get_number(*v, "repeat_penalty", 0.0, 10.0, true, r.repeat_penalty)) return e;
  if (const json* v = field("repeat_last_n"))
    if (auto e = get_int(*v, "repeat_last_n", -1, int64_t{1} << 30, r.repeat_last_n)) return e;
  if (auto e = check_one_plain_choice(b)) return e;

  // Sampling and budget.
  if (const json* v = field("stream"); v)
    if (auto e = get_bool(*v, "stream", r.stream)) return e;
  if (const json* v = field("stream_options")) {
    if (!v->is_object())
      return invalid_value("stream_options", "'stream_options' must be an object");
    if (auto it = v->find("include_usage"); it != v->end() && !it->is_null())
      if (auto e = get_bool(*it, "stream_options.include_usage", r.include_usage)) return e;
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (const json* v = field(key)) {
      int64_t n = 0;
      if (auto e = get_int(*v, key, 1, (int64_t{1} << 31) - 1, n)) return e;
      r.max_tokens = std::min(n, config.max_tokens_ceiling);  // max_completion_tokens (later) wins
    }
  }
  // llama-server's name, which wins over max_tokens there too; -1 = no limit of its own (the
  // --max-tokens ceiling, then the context). 0 (llama-server: evaluate the prompt only) is not
  // something this server does.
  if (const json* v = field("n_predict")) {
    int64_t n = 0;
    if (auto e = get_int(*v, "n_predict", -1, (int64_t{1} << 31) - 1, n)) return e;
    if (n == 0)
      return invalid_value("n_predict",
                           "'n_predict' is 0; it must be -1 (up to --max-tokens) or in [1, " +
                               std::to_string((int64_t{1} << 31) - 1) + "]");
    r.max_tokens = n < 0 ? config.max_tokens_ceiling : std::min(n, config.max_tokens_ceiling);
  }
  if (const json* v = field("temperature"))
    if (auto e = get_number(*v, "temperature", 0.0, 2.0, false, r.temperature)) return e;
  if (const json* v = field("top_p"))
    if (auto e = get_number(*v, "top_p", 0.0, 1.0, true, r.top_p)) return e;
  if (const json* v = field("min_p"))
    if (auto e = get_number(*v, "min_p", 0.0, 1.0, false, r.min_p)) return e;
  if (const json* v = field("top_k"))
    if (auto e = get_int(*v, "top_k", 0, int64_t{1} << 30, r.top_k)) return e;
  if (const json* v = field("seed")) {
    if (!is_int(*v)) return invalid_value("seed", "'seed' must be an integer");
    if (v->is_number_unsigned())
      r.seed = v->get<uint64_t>();
    else if (v->is_number_integer())
      r.seed = static_cast<uint64_t>(v->get<int64_t>());
    else
      r.seed = static_cast<uint64_t>(static_cast<int64_t>(v->get<double>()));
  }
  if (const json* v = field("stop")) {
    if (v->is_string()) {
      if (v->get_ref<const std::string&>().empty())
        return invalid_value("stop", "'stop' must not be empty");
      if (v->get_ref<const std::string&>().size() > 256)
        return invalid_value("stop", "'stop' is " +
                                         std::to_string(v->get_ref<const std::string&>().size()) +
                                         " bytes long; at most 256");
      r.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > 16)
        return invalid_value("stop",
                             "'stop' holds " + std::to_string(v->size()) + " strings; at most 16");
      for (size_t i = 0; i < v->size(); ++i) {
        const json& s = (*v)[i];
        const std::string at = "stop." + std::to_string(i);
        if (!s.is_string() || s.get_ref<const std::string&>().empty() ||
            s.get_ref<const std::string&>().size() > 256)
          return invalid_value(
              at,
              "'" + at + "' must be a non-empty string of at most 256 bytes" +
                  (s.is_string()
                       ? " (it is " + std::to_string(s.get_ref<const std::string&>().size()) + ")"
                       : std::string()));
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      return invalid_value("stop", "'stop' must be a string or an array of strings");
    }
  }

  if (const json* v = field("return_progress"))
    if (auto e = get_bool(*v, "return_progress", r.return_progress)) return e;
  if (const json* v = field("cache_prompt"))
    if (auto e = get_bool(*v, "cache_prompt", r.cache_prompt)) return e;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> check_one_plain_choice(const json& b) {
  if (const json* v = present(b, "logit_bias"); v && !(v->is_object() && v->empty()))
    return unsupported_parameter("logit_bias", "'logit_bias' is not supported");
  if (const json* v = present(b, "n")) {
    int64_t n = 0;
    if (auto e = get_int(*v, "n", std::numeric_limits<int64_t>::min(),
                         std::numeric_limits<int64_t>::max(), n))
      return e;
    if (n != 1)
      return api_error(400, "invalid_request_error", "unsupported_value",
                       "'n' must be 1: one choice per request", "n");
  }
  return std::nullopt;
}

namespace {

// A schema the grammar cannot enforce, as a 400 naming the parameter, the keyword and where.
ApiError schema_refused(const std::string& param, const grammar::SchemaError& e) {
  std::string message = "'" + param + "': " + e.what();
  return api_error(400, "invalid_request_error", "unsupported_schema", message, param);
}

// A GBNF text (llama-server's `grammar`) checked now, so a malformed one is a 400 with its line
// and column rather than a failed generation.
std::optional<ApiError> check_gbnf(const std::string& gbnf, const std::string& param) {
  try {
    grammar::Grammar::parse(gbnf);
  } catch (const grammar::GrammarError& e) {
    return api_error(400, "invalid_request_error", "invalid_grammar",
                     "'" + param + "': " + e.what(), param);
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_structured_output(const json& b, GenerationParams& r,
                                                text::PyValue* response_format) {
  if (const json* v = present(b, "response_format")) {
    if (!v->is_object() || !v->contains("type") || !(*v)["type"].is_string())
      return invalid_value("response_format", "'response_format' must be an object with a 'type'");
    const std::string type = (*v)["type"];
    if (type == "json_object") {
      r.grammar = grammar::json_object_gbnf();
    } else if (type == "json_schema") {
      const json* spec = v->contains("json_schema") ? &(*v)["json_schema"] : nullptr;
      if (!spec || !spec->is_object() || !spec->contains("schema") ||
          !((*spec)["schema"].is_object() || (*spec)["schema"].is_boolean()))
        return invalid_value("response_format.json_schema.schema",
                             "'response_format.json_schema.schema' must be a JSON Schema object");
      try {
        r.grammar = grammar::json_schema_to_gbnf((*spec)["schema"].dump());
      } catch (const grammar::SchemaError& e) {
        return schema_refused("response_format.json_schema.schema", e);
      }
    } else if (type != "text") {
      return api_error(400, "invalid_request_error", "unsupported_value",
                       "'response_format.type' must be text, json_object or json_schema",
                       "response_format.type");
    }
    if (type != "text" && response_format) *response_format = to_py(*v);
  }
  // llama-server's fields: a JSON Schema, or a GBNF grammar.
  if (const json* v = present(b, "json_schema")) {
    if (!r.grammar.empty())
      return invalid_value("json_schema",
                           "give one of 'response_format', 'json_schema' and 'grammar'");
    try {
      r.grammar = grammar::json_schema_to_gbnf(v->dump());
    } catch (const grammar::SchemaError& e) {
      return schema_refused("json_schema", e);
    }
  }
  if (const json* v = present(b, "grammar")) {
    if (!v->is_string()) return invalid_value("grammar", "'grammar' must be a GBNF text");
    if (!r.grammar.empty())
      return invalid_value("grammar", "give one of 'response_format', 'json_schema' and 'grammar'");
    if (auto e = check_gbnf(v->get<std::string>(), "grammar")) return e;
    r.grammar = v->get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> parse_forced_tools(const json& tools, const json& tool_choice,
                                           GenerationParams& r) {
  std::vector<std::string> names, schemas;
  const bool named = tool_choice.is_object();
  for (const json& t : tools) {
    const json& fn = t.contains("function") ? t["function"] : t;
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) continue;
    const std::string name = fn["name"];
    if (named && tool_choice["function"]["name"] != name) continue;
    const bool strict = fn.contains("strict") && fn["strict"] == true;
    std::string schema = fn.contains("parameters") && fn["parameters"].is_object()
                             ? fn["parameters"].dump()
                             : std::string(R"({"type":"object"})");
    // A tool that is not strict whose parameters the grammar cannot enforce gets any object.
    try {
      grammar::json_schema_to_gbnf(schema);
    } catch (const grammar::SchemaError& e) {
      if (strict)
        return schema_refused("tools[" + std::to_string(names.size()) + "].function.parameters", e);
      schema = R"({"type":"object"})";
    }
    names.push_back(name);
    schemas.push_back(std::move(schema));
  }
  if (names.empty()) return std::nullopt;
  r.grammar = grammar::json_schemas_to_gbnf(schemas, "tool");
  r.grammar_tools = std::move(names);
  return std::nullopt;
}

std::optional<ApiError> check_response_format(const json& b, const std::string& note) {
  const json* v = present(b, "response_format");
  if (!v) return std::nullopt;
  if (!v->is_object() || !v->contains("type") || !(*v)["type"].is_string())
    return invalid_value("response_format", "'response_format' must be an object with a 'type'");
  if ((*v)["type"] != "text")
    return unsupported_parameter("response_format",
                                 "'response_format' other than {\"type\":\"text\"} is not "
                                 "supported (structured output is not implemented)" +
                                     note);
  return std::nullopt;
}

void set_sampling_defaults(const ApiConfig& config, GenerationParams& r) {
  r.temperature = config.default_temperature;
  r.top_p = config.default_top_p;
  r.top_k = config.default_top_k;
  r.min_p = config.default_min_p;
}

const json* present(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<ApiError> check_messages(const json* messages) {
  if (!messages)
    return api_error(400, "invalid_request_error", "missing_required_parameter",
                     "'messages' is required", "messages");
  if (!messages->is_array()) return invalid_value("messages", "'messages' must be an array");
  if (messages->empty())
    return invalid_value("messages", "'messages' must contain at least one message");
  if (messages->size() > 4096)
    return invalid_value("messages", "'messages' holds " + std::to_string(messages->size()) +
                                         " messages; at most 4096");
  return std::nullopt;
}

bool names_served_model(const std::string& name, const ApiConfig& config) {
  return name == config.model_id ||
         std::find(config.aliases.begin(), config.aliases.end(), name) != config.aliases.end();
}

std::optional<ApiError> resolve_model(std::string& model, const ApiConfig& config) {
  // Any name, but a name: not blank, no control characters.
  if (model.find_first_not_of(" \t") == std::string::npos)
    return invalid_value("model", "'model' must name a model (any name gets the served one)");
  if (std::any_of(model.begin(), model.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20; }))
    return invalid_value("model", "'model' contains a control character");
  if (config.strict_model && !names_served_model(model, config)) {
    std::string served = "'" + config.model_id + "'";
    for (const std::string& alias : config.aliases) served += ", '" + alias + "'";
    return api_error(404, "invalid_request_error", "model_not_found",
                     "the model '" + model + "' does not exist: this server serves " + served +
                         " and --strict-model refuses other names (without it any name gets "
                         "the served model)",
                     "model");
  }
  model = config.model_id;
  return std::nullopt;
}

std::variant<json, ApiError> parse_json_object(std::string_view body) {
  if (!depth_within(body, kMaxJsonDepth))
    return api_error(400, "invalid_request_error", "invalid_json",
                     "the body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  json parsed;
  try {
    parsed = json::parse(body.begin(), body.end());
  } catch (const json::parse_error& e) {
    return api_error(400, "invalid_request_error", "invalid_json",
                     "the body is not valid UTF-8 JSON (at byte " + std::to_string(e.byte) + ")");
  } catch (const json::exception&) {  // out_of_range: a number beyond a double (1e400)
    return api_error(400, "invalid_request_error", "invalid_json",
                     "the body holds a number out of range");
  }
  if (!parsed.is_object())
    return api_error(400, "invalid_request_error", "invalid_json",
                     "the body must be a JSON object");
  return parsed;
}

const json* given(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body,
                                                       const ApiConfig& config) {
  auto parsed = parse_json_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  return chat_request_from_json(std::get<json>(parsed), config);
}

std::variant<ChatRequest, ApiError> chat_request_from_json(const json& b, const ApiConfig& config) {
  ChatRequest r;
  r.thinking = config.default_thinking;
  auto field = [&](const char* key) -> const json* {
    auto it = b.find(key);
    return it == b.end() || it->is_null() ? nullptr : &*it;
  };

  // Required fields.
  const json* model = field("model");
  if (!model)
    return api_error(400, "invalid_request_error", "missing_required_parameter",
                     "'model' is required", "model");
  if (!model->is_string()) return invalid_value("model", "'model' must be a string");
  r.model = model->get<std::string>();
  const json* messages = field("messages");
  if (auto e = check_messages(messages)) return *e;
  if (auto e = parse_generation(b, config, config.max_tokens_ceiling, r)) return *e;

  // Log-probabilities: logprobs true, with top_logprobs alternatives (0..20) per token.
  bool logprobs = false;
  if (const json* v = field("logprobs"))
    if (auto e = get_bool(*v, "logprobs", logprobs)) return *e;
  int64_t top = 0;
  if (const json* v = field("top_logprobs")) {
    if (auto e = get_int(*v, "top_logprobs", 0, 20, top)) return *e;
    if (!logprobs && top > 0)
      return invalid_value("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  r.top_logprobs = logprobs ? static_cast<int>(top) : -1;

  // Structured output; features we do not implement are refused by name, never dropped.
  if (auto e = parse_structured_output(b, r, &r.response_format)) return *e;
  for (const char* key :
       {"functions", "function_call", "audio", "prediction", "web_search_options"})
    if (field(key))
      return unsupported_parameter(key, std::string("'") + key + "' is not supported");
  if (const json* v = field("modalities")) {
    if (!v->is_array()) return invalid_value("modalities", "'modalities' must be an array");
    for (const json& m : *v)
      if (m != "text")
        return unsupported_parameter("modalities", "only the 'text' modality is supported");
  }
  // Messages.
  json normalised = json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    auto m = normalise_message((*messages)[i], i);
    if (auto* e = std::get_if<ApiError>(&m)) return *e;
    normalised.push_back(std::move(std::get<json>(m)));
  }
  r.messages = to_py(normalised);

  // Tools.
  if (const json* v = field("tools")) {
    if (auto e = check_tools(*v)) return *e;
    if (!v->empty()) r.tools = to_py(*v);
  }
  if (const json* v = field("tool_choice")) {
    // A choice the tools cannot satisfy is refused, as Responses and Messages refuse it: "required"
    // with no tool, or a function that is not declared.
    const json* tools = field("tools");
    const bool have_tools = tools && !tools->empty();
    if (v->is_string()) {
      const std::string c = v->get<std::string>();
      if (c != "none" && c != "auto" && c != "required")
        return api_error(400, "invalid_request_error", "unsupported_value",
                         "'tool_choice' must be none, auto, required or a function", "tool_choice");
      if (c == "required" && !have_tools)
        return invalid_value("tool_choice", "'tool_choice' is 'required' but 'tools' is empty");
    } else if (!v->is_object() || !v->contains("function")) {
      return invalid_value(
          "tool_choice",
          "'tool_choice' must be a string or {\"type\":\"function\",\"function\":{\"name\":...}}");
    } else {
      const json& fn = (*v)["function"];
      const auto name = fn.is_object() ? fn.find("name") : fn.end();
      if (!fn.is_object() || name == fn.end() || !name->is_string())
        return invalid_value("tool_choice.function.name",
                             "'tool_choice.function.name' must be a string");
      const bool declared =
          have_tools && std::any_of(tools->begin(), tools->end(),
                                    [&](const json& t) { return t["function"]["name"] == *name; });
      if (!declared)
        return invalid_value("tool_choice.function.name", "'tool_choice.function.name' ('" +
                                                              name->get<std::string>() +
                                                              "') names no function in 'tools'");
    }
    r.tool_choice = to_py(*v);
    // A call the request forces (required, or a named function): its arguments match the
    // tool's parameters.
    if (have_tools && (v->is_object() || *v == "required"))
      if (auto e = parse_forced_tools(*tools, *v, r)) return *e;
  }
  if (const json* v = field("parallel_tool_calls")) {
    bool ignored = false;
    if (auto e = get_bool(*v, "parallel_tool_calls", ignored)) return *e;
  }

  // Thinking: reasoning_effort is a switch (none = off); an explicit enable_thinking wins.
  std::optional<bool> thinking;
  if (const json* v = field("reasoning_effort")) {
    if (!v->is_string())
      return invalid_value("reasoning_effort", "'reasoning_effort' must be a string");
    const std::string effort = v->get<std::string>();
    static const char* const kEfforts[] = {"none", "minimal", "low", "medium",
                                           "high", "xhigh",   "max"};
    if (std::find(std::begin(kEfforts), std::end(kEfforts), effort) == std::end(kEfforts))
      return api_error(
          400, "invalid_request_error", "unsupported_value",
          "'reasoning_effort' must be one of none, minimal, low, medium, high, xhigh, max",
          "reasoning_effort");
    thinking = effort != "none";
    if (effort == "minimal" || effort == "low")
      r.effort = "low";
    else if (effort == "medium" || effort == "high")
      r.effort = "high";
    else
      r.effort = "max";
  }
  if (const json* v = field("thinking")) {
    if (v->is_boolean())
      thinking = v->get<bool>();
    else if (v->is_object() && v->contains("type") && (*v)["type"].is_string() &&
             ((*v)["type"] == "enabled" || (*v)["type"] == "disabled"))
      thinking = (*v)["type"] == "enabled";
    else
      return invalid_value("thinking",
                           "'thinking' must be a boolean or {\"type\":\"enabled\"|\"disabled\"}");
  }
  if (const json* v = field("chat_template_kwargs")) {
    if (!v->is_object())
      return invalid_value("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (const char* key : {"thinking", "enable_thinking"})
      if (auto it = v->find(key); it != v->end() && !it->is_null()) {
        bool on = false;
        if (auto e = get_bool(*it, std::string("chat_template_kwargs.") + key, on)) return *e;
        thinking = on;
      }
  }
  if (const json* v = field("enable_thinking")) {
    bool on = false;
    if (auto e = get_bool(*v, "enable_thinking", on)) return *e;
    thinking = on;
  }
  if (thinking) r.thinking = *thinking;
  if (const json* v = field("reasoning_format")) {
    if (!v->is_string() || (*v != "deepseek" && *v != "none" && *v != "auto"))
      return api_error(400, "invalid_request_error", "unsupported_value",
                       "'reasoning_format' must be deepseek or none", "reasoning_format");
    r.reasoning_inline = *v == "none";
  }

  // The model last: a bad body is a 400 whatever the model says.
  if (auto e = resolve_model(r.model, config)) return *e;
  return r;
}

std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body,
                                                                   const ApiConfig& config) {
  auto parsed = parse_json_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& b = std::get<json>(parsed);
  auto field = [&](const char* key) -> const json* {
    auto it = b.find(key);
    return it == b.end() || it->is_null() ? nullptr : &*it;
  };
  CompletionRequest r;
  const json* model = field("model");
  if (!model)
    return api_error(400, "invalid_request_error", "missing_required_parameter",
                     "'model' is required", "model");
  if (!model->is_string()) return invalid_value("model", "'model' must be a string");
  r.model = model->get<std::string>();
  const json* prompt = field("prompt");
  if (!prompt)
    return api_error(400, "invalid_request_error", "missing_required_parameter",
                     "'prompt' is required", "prompt");
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) prompt = &(*prompt)[0];
  if (prompt->is_string()) {
    if (auto e = check_text(*prompt, "prompt")) return *e;
    if (prompt->get_ref<const std::string&>().empty())
      return invalid_value("prompt", "'prompt' must not be empty");
    r.prompt = prompt->get<std::string>();
  } else if (prompt->is_array() && !prompt->empty() &&
             std::all_of(prompt->begin(), prompt->end(),
                         [](const json& x) { return x.is_number_integer(); })) {
    for (size_t i = 0; i < prompt->size(); ++i) {
      const int64_t id = (*prompt)[i].get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max())
        return invalid_value(
            "prompt." + std::to_string(i),
            "'prompt." + std::to_string(i) + "' is " + std::to_string(id) + ", not a token id");
      r.prompt_ids.push_back(id);
    }
    r.ids_given = true;
  } else {
    return api_error(400, "invalid_request_error", "unsupported_value",
                     "'prompt' must be a string or an array of token ids (one prompt per request)",
                     "prompt");
  }
  if (const json* v = field("echo"); v && !(v->is_boolean() && !v->get<bool>()))
    return unsupported_parameter("echo", "'echo' is not supported");
  if (const json* v = field("suffix");
      v && !(v->is_string() && v->get_ref<const std::string&>().empty()))
    return unsupported_parameter("suffix", "'suffix' is not supported");
  if (const json* v = field("best_of"); v && !(is_int(*v) && v->get<double>() == 1))
    return api_error(400, "invalid_request_error", "unsupported_value", "'best_of' must be 1",
                     "best_of");
  if (auto e = parse_generation(b, config, 16, r)) return *e;
  if (auto e = parse_structured_output(b, r, nullptr)) return *e;
  if (const json* v = field("logprobs")) {
    int64_t n = 0;
    if (auto e = get_int(*v, "logprobs", 0, 20, n)) return *e;
    r.top_logprobs = static_cast<int>(n);
  }
  if (auto e = resolve_model(r.model, config)) return *e;
  return r;
}

ApiError context_exceeded(int64_t tokens, int64_t context, const char* param) {
  return api_error(400, "invalid_request_error", "context_length_exceeded",
                   context_overflow_message("the prompt", tokens, context), param);
}

namespace {

// The template's options for a request (thinking, effort message, tool choice).
text::ChatOptions chat_options(const ChatRequest& request) {
  text::ChatOptions options;
  options.thinking = request.thinking;
  if (request.thinking && !request.effort.empty())
    options.thinking_effort = text::PyValue::string(request.effort);
  options.tool_choice = request.tool_choice;
  options.response_format = request.response_format;
  return options;
}

// The XTML segments of the whole prompt, or a 400 naming `messages`.
std::variant<std::vector<text::Segment>, ApiError> chat_segments(const ChatRequest& request) {
  auto segments = text::build_chat_segments(request.messages, request.tools, chat_options(request));
  if (!segments.ok())
    return invalid_value("messages",
                         "the conversation cannot be rendered: " + segments.status().message());
  return std::move(*segments);
}

}  // namespace

std::variant<RenderedPrompt, ApiError> render_chat_prompt(const ChatRequest& request,
                                                          const text::Tokenizer& tokenizer,
                                                          int64_t context,
                                                          const char* prompt_param) {
  auto segments = chat_segments(request);
  if (auto* e = std::get_if<ApiError>(&segments)) return *e;
  std::vector<int32_t> ids32;
  text::encode_segments(tokenizer, std::get<std::vector<text::Segment>>(segments), ids32);
  if (static_cast<int64_t>(ids32.size()) >= context)
    return context_exceeded(static_cast<int64_t>(ids32.size()), context, prompt_param);
  RenderedPrompt out;
  out.ids.assign(ids32.begin(), ids32.end());
  const auto& all = request.messages.as_array();
  if (all.size() > 1) {
    text::PyValue head = text::PyValue::array(text::PyValue::Array(all.begin(), all.end() - 1));
    text::ChatOptions head_options = chat_options(request);
    head_options.add_generation_prompt = false;
    auto head_segments = text::build_chat_segments(head, request.tools, head_options);
    if (head_segments.ok()) {
      std::vector<int32_t> head_ids;
      text::encode_segments(tokenizer, *head_segments, head_ids);
      if (head_ids.size() < ids32.size() &&
          std::equal(head_ids.begin(), head_ids.end(), ids32.begin()))
        out.anchor = static_cast<int64_t>(head_ids.size());
    }
  }
  return out;
}

std::variant<std::string, ApiError> render_chat_text(const ChatRequest& request) {
  auto segments = chat_segments(request);
  if (auto* e = std::get_if<ApiError>(&segments)) return *e;
  return text::join_segments(std::get<std::vector<text::Segment>>(segments));
}

namespace {
// A token's text for the JSON (invalid UTF-8 — half a character — as U+FFFD) and its bytes.
std::string token_text(std::string_view bytes) {
  text::Utf8StreamDecoder decoder;
  std::string out = decoder.push(bytes);
  return out + decoder.finish();
}
json token_bytes_json(std::string_view bytes) {
  json out = json::array();
  for (unsigned char b : bytes) out.push_back(static_cast<int>(b));
  return out;
}
}  // namespace

json chat_logprobs_json(const std::vector<TokenLogprobs>& tokens,
                        const text::Tokenizer& tokenizer) {
  auto entry = [&](const TokenLogprob& t) {
    const std::string_view bytes = tokenizer.token_bytes(static_cast<int32_t>(t.id));
    json e = json::object();
    e["token"] = token_text(bytes);
    e["logprob"] = t.logprob;
    e["bytes"] = token_bytes_json(bytes);
    return e;
  };
  json content = json::array();
  for (const TokenLogprobs& t : tokens) {
    json e = entry(t.chosen);
    json top = json::array();
    for (const TokenLogprob& alt : t.top) top.push_back(entry(alt));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return json{{"content", std::move(content)}, {"refusal", nullptr}};
}

json completion_logprobs_json(const std::vector<TokenLogprobs>& tokens,
                              const text::Tokenizer& tokenizer, int64_t& offset) {
  json text_tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  for (const TokenLogprobs& t : tokens) {
    const std::string_view bytes = tokenizer.token_bytes(static_cast<int32_t>(t.chosen.id));
    text_tokens.push_back(token_text(bytes));
    token_logprobs.push_back(t.chosen.logprob);
    json top = json::object();
    for (const TokenLogprob& alt : t.top)
      top[token_text(tokenizer.token_bytes(static_cast<int32_t>(alt.id)))] = alt.logprob;
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += static_cast<int64_t>(bytes.size());
  }
  return json{{"tokens", std::move(text_tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)},
              {"text_offset", std::move(text_offset)}};
}

void put_reasoning(json& delta, const std::string& text, const ApiConfig& config) {
  if (config.reasoning_field != "reasoning") delta["reasoning_content"] = text;
  if (config.reasoning_field != "reasoning_content") delta["reasoning"] = text;
}

json tool_call_json(const text::ToolCallOut& call, const ResponseIds& ids) {
  const std::string tail = ids.id.size() > 12 ? ids.id.substr(ids.id.size() - 12) : ids.id;
  json out = json::object();
  out["id"] = "call_" + std::to_string(call.index) + "_" + tail;
  out["type"] = "function";
  out["function"] = json{{"name", call.name}, {"arguments", call.arguments_json}};
  return out;
}

const char* openai_finish_reason(FinishReason finish) {
  return finish == FinishReason::cancelled ? "length" : finish_reason_name(finish);
}

json usage_json(const GenerationStats& stats) {
  json u = json::object();
  u["prompt_tokens"] = stats.prompt_tokens;
  u["completion_tokens"] = stats.completion_tokens;
  u["total_tokens"] = stats.prompt_tokens + stats.completion_tokens;
  u["prompt_tokens_details"] = json{{"cached_tokens", stats.cached_tokens}};
  u["completion_tokens_details"] = json{{"reasoning_tokens", stats.reasoning_tokens}};
  return u;
}

json timings_json(const GenerationStats& stats) {
  const int64_t prompt_n = stats.prompt_tokens - stats.cached_tokens;
  auto rate = [](int64_t n, double ms) { return ms > 0 ? static_cast<double>(n) * 1e3 / ms : 0.0; };
  json t = json::object();
  t["cache_n"] = stats.cached_tokens;
  t["prompt_n"] = prompt_n;
  t["prompt_ms"] = stats.prefill_ms;
  t["prompt_per_second"] = rate(prompt_n, stats.prefill_ms);
  t["predicted_n"] = stats.completion_tokens;
  t["predicted_ms"] = stats.decode_ms;
  t["predicted_per_second"] = rate(stats.completion_tokens, stats.decode_ms);
  return t;
}

namespace {
// The fields every response and chunk opens with.
json envelope(const ResponseIds& ids, const char* object, const std::string& model,
              const ApiConfig& config) {
  json c = json::object();
  c["id"] = ids.id;
  c["object"] = object;
  c["created"] = ids.created;
  c["model"] = model;
  c["system_fingerprint"] = config.fingerprint;
  return c;
}
}  // namespace

json x_k3_json(const GenerationStats& stats) {
  json x = json::object();
  x["reuse"] = reuse_kind_name(stats.reuse);
  x["checkpoint_restored_at"] = stats.restored_at >= 0 ? json(stats.restored_at) : json(nullptr);
  x["queue_wait_ms"] = stats.queue_wait_ms;
  x["finish"] = finish_reason_name(stats.finish);  // "cancelled" where finish_reason says length
  x["session"] = stats.session;                    // which of the --parallel sessions ran it
  x["batch_max"] = stats.batch_max;  // the most sessions of a decode step it was part of
  return x;
}

json chat_completion_json(const ChatResult& result, const ChatRequest& request,
                          const ApiConfig& config, const ResponseIds& ids,
                          const text::Tokenizer* tokenizer) {
  json message = json::object();
  message["role"] = "assistant";
  if (request.reasoning_inline && !result.reasoning.empty())
    message["content"] = result.reasoning + "</think>" + result.content;
  else
    message["content"] = result.content;
  if (!request.reasoning_inline && !result.reasoning.empty())
    put_reasoning(message, result.reasoning, config);
  message["refusal"] = nullptr;
  if (!result.tool_calls.empty()) {
    json calls = json::array();
    for (const auto& call : result.tool_calls) calls.push_back(tool_call_json(call, ids));
    message["tool_calls"] = std::move(calls);
  }
  json choice = json::object();
  choice["index"] = 0;
  choice["message"] = std::move(message);
  choice["logprobs"] = request.top_logprobs >= 0 && tokenizer
                           ? chat_logprobs_json(result.logprobs, *tokenizer)
                           : json(nullptr);
  choice["finish_reason"] = openai_finish_reason(result.stats.finish);
  json out = envelope(ids, "chat.completion", request.model, config);
  out["choices"] = json::array({std::move(choice)});
  out["usage"] = usage_json(result.stats);
  out["timings"] = timings_json(result.stats);
  out["x_k3"] = x_k3_json(result.stats);
  return out;
}

namespace {
json chunk_base(const ResponseIds& ids, const ApiConfig& config) {
  return envelope(ids, "chat.completion.chunk", config.model_id, config);
}
}  // namespace

json chunk_json(const ResponseIds& ids, const ApiConfig& config, json delta,
                const char* finish_reason, bool include_usage, json logprobs) {
  json c = chunk_base(ids, config);
  json choice = json::object();
  choice["index"] = 0;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
  c["choices"] = json::array({std::move(choice)});
  if (include_usage) c["usage"] = nullptr;
  return c;
}

json usage_chunk_json(const ResponseIds& ids, const ApiConfig& config,
                      const GenerationStats& stats) {
  json c = chunk_base(ids, config);
  c["choices"] = json::array();
  c["usage"] = usage_json(stats);
  c["timings"] = timings_json(stats);
  c["x_k3"] = x_k3_json(stats);
  return c;
}

json progress_chunk_json(const ResponseIds& ids, const ApiConfig& config, int64_t total,
                         int64_t cached, int64_t processed, double time_ms) {
  json c = chunk_base(ids, config);
  c["choices"] = json::array();
  c["usage"] = nullptr;
  c["prompt_progress"] =
      json{{"total", total}, {"cache", cached}, {"processed", processed}, {"time_ms", time_ms}};
  return c;
}

json completion_json(const std::string& text, const GenerationStats& stats,
                     const std::string& model, const ApiConfig& config, const ResponseIds& ids,
                     json logprobs) {
  json choice = json::object();
  choice["text"] = text;
  choice["index"] = 0;
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = openai_finish_reason(stats.finish);
  json out = envelope(ids, "text_completion", model, config);
  out["choices"] = json::array({std::move(choice)});
  out["usage"] = usage_json(stats);
  out["timings"] = timings_json(stats);
  out["x_k3"] = x_k3_json(stats);
  return out;
}

json completion_chunk_json(const ResponseIds& ids, const ApiConfig& config, const std::string& text,
                           const char* finish_reason, json logprobs) {
  json choice = json::object();
  choice["text"] = text;
  choice["index"] = 0;
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
  json c = envelope(ids, "text_completion", config.model_id, config);
  c["choices"] = json::array({std::move(choice)});
  return c;
}

json completion_usage_chunk_json(const ResponseIds& ids, const ApiConfig& config,
                                 const GenerationStats& stats) {
  json c = completion_chunk_json(ids, config, "", nullptr);
  c["choices"] = json::array();
  c["usage"] = usage_json(stats);
  c["timings"] = timings_json(stats);
  return c;
}

ResponseIds new_response_ids(const char* prefix) {
  unsigned char bytes[16] = {};
  if (getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) {
    const uint64_t t =
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    for (size_t i = 0; i < sizeof bytes; ++i)
      bytes[i] = static_cast<unsigned char>(t >> ((i % 8) * 8));
  }
  static const char* hex = "0123456789abcdef";
  ResponseIds ids;
  ids.id = prefix;
  for (unsigned char b : bytes) {
    ids.id += hex[b >> 4];
    ids.id += hex[b & 15];
  }
  ids.created = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  return ids;
}

}  // namespace k3::server

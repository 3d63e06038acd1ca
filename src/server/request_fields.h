// server/request_fields.h — the field checks every request shape of `coli serve` validates its
// JSON body with (OpenAI's in api.cpp, Anthropic's in anthropic.cpp): typed getters that return
// a 400 naming the parameter, the JSON → PyValue conversion for the XTML renderer, the model
// check. Private to server/ (defined in api.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "server/api.h"
#include "server/error.h"
#include "server/server_options.h"
#include "text/pyjson.h"

namespace k3::server {

// A request's value as an error message quotes it: its JSON, cut at 40 bytes ("...").
std::string shown_value(const json& v);
// An integer, or a float with an integral value (256.0: SDKs write them).
bool is_int(const json& v);
// Each sets `out` or returns a 400 invalid_value naming `param` (type, or the range).
std::optional<ApiError> get_int(const json& v, const std::string& param, int64_t lo, int64_t hi,
                                int64_t& out);
// A finite number in [lo, hi] ((lo, hi] when `lo_open`).
std::optional<ApiError> get_number(const json& v, const std::string& param, double lo, double hi,
                                   bool lo_open, double& out);
std::optional<ApiError> get_bool(const json& v, const std::string& param, bool& out);
bool has_nul(const std::string& s);
// A string without NUL characters.
std::optional<ApiError> check_text(const json& v, const std::string& param);
// The JSON value as the renderer's PyValue (object key order kept).
text::PyValue to_py(const json& v);
// A content-part type that is not text (images, audio, files, video).
bool is_media_part(const std::string& type);
// The field `key` of a request body, or nullptr when absent or null.
const json* present(const json& body, const char* key);
// `messages` (present()'s result): required, an array of 1 to 4096 entries.
std::optional<ApiError> check_messages(const json* messages);
// The fields the server has one answer for, on every API shape: `n` (1: one choice per request;
// other values 400 unsupported_value) and `logit_bias` ({} only; else 400 unsupported_parameter).
std::optional<ApiError> check_one_plain_choice(const json& body);
// `response_format`: absent or {"type":"text"}; another type is a 400 unsupported_parameter
// naming it (structured output is not implemented), `note` appended to that message.
std::optional<ApiError> check_response_format(const json& body, const std::string& note = "");
// Structured output (docs/structured_output.md): `response_format` text / json_object /
// json_schema, llama-server's `json_schema` and `grammar` fields → r.grammar; a schema or grammar
// the engine cannot enforce is a 400 naming the field and the keyword (or line and column).
// `response_format` (when not null) receives the format for the chat template.
std::optional<ApiError> parse_structured_output(const json& body, GenerationParams& r,
                                                text::PyValue* response_format);
// A forced tool call (tool_choice "required" or a named function): r.grammar holds each
// candidate tool's arguments grammar (rules tool-0, ...) and r.grammar_tools their names. A
// strict tool whose parameters cannot be enforced is a 400; another gets any object.
std::optional<ApiError> parse_forced_tools(const json& tools, const json& tool_choice,
                                           GenerationParams& r);
// The server's sampling defaults (--temp, --top-p, --top-k, --min-p) into `params`, before a
// request's own fields override them.
void set_sampling_defaults(const ApiConfig& config, GenerationParams& params);
// The model a request names, resolved to the one the server serves: `model` becomes
// config.model_id (responses name the served id). Any name (not blank, without control
// characters: 400 invalid_value) is accepted unless
// config.strict_model, which answers 404 model_not_found for a name other than the id and the
// aliases.
std::optional<ApiError> resolve_model(std::string& model, const ApiConfig& config);
// Whether `name` is the served id or one of its aliases.
bool names_served_model(const std::string& name, const ApiConfig& config);

}  // namespace k3::server

// server/error.h — the one place an error response of `coli serve` is built: the ApiError value
// (status, OpenAI type and code, message, parameter, Retry-After) and its OpenAI-style JSON body
// {"error":{"message","type","param","code"}}. Request validation (server/api.h), the guards and
// the handlers (server/routes.h) and the socket adapter all make their errors here, so every
// refusal has the same shape (docs/serving.md).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "server/http_types.h"

namespace k3::server {

using json = nlohmann::ordered_json;

// An error in OpenAI's envelope: {"error":{"message","type","param","code"}}.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;
  std::string message;
  std::optional<std::string> param;
  int retry_after = 0;  // seconds; 0 = no Retry-After header
};

ApiError api_error(int status, std::string type, std::string code, std::string message,
                   std::optional<std::string> param = std::nullopt, int retry_after = 0);
// 400 invalid_value naming the parameter.
ApiError invalid_value(std::string param, std::string message);
// 400 unsupported_parameter naming the parameter (a field the server does not implement).
ApiError unsupported_parameter(std::string param, std::string message);
// The error for a status the HTTP library set itself (unknown path on POST, bad request line,
// URI or headers too long, ...): code from the status, a generic message.
ApiError http_status_error(int status);

// {"error":{...}}: code null when empty, param null when absent.
json error_body(const ApiError& error);
// The response for `error`: status, JSON body, Retry-After when set, WWW-Authenticate on 401.
HttpResponse error_response(const ApiError& error);

// The envelope of a path's errors: Anthropic's on /v1/messages and the paths below it (the
// Messages API, server/anthropic.h), OpenAI's everywhere else. The guards that refuse a request
// before its handler runs (server/routes.h) and the socket adapter's body-read refusals pick the
// envelope with it, so an Anthropic client parses every refusal.
enum class ErrorStyle { openai, anthropic };
ErrorStyle error_style_for(std::string_view path);
// Anthropic's {"type":"error","error":{"type","message","details"}}, the type from the status,
// details {"error_code": code, "param"} when the error has a code (docs/serving.md §3.18.5).
json anthropic_error_body(const ApiError& error);
// The response for `error` in `style` (the headers as error_response's).
HttpResponse error_response(const ApiError& error, ErrorStyle style);

}  // namespace k3::server

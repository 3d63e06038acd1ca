// server/error.cpp — ApiError construction and its JSON body (see server/error.h).
#include "server/error.h"

namespace k3::server {

ApiError api_error(int status, std::string type, std::string code, std::string message,
                   std::optional<std::string> param, int retry_after) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  e.param = std::move(param);
  e.retry_after = retry_after;
  return e;
}

ApiError invalid_value(std::string param, std::string message) {
  return api_error(400, "invalid_request_error", "invalid_value", std::move(message),
                   std::move(param));
}

ApiError unsupported_parameter(std::string param, std::string message) {
  return api_error(400, "invalid_request_error", "unsupported_parameter", std::move(message),
                   std::move(param));
}

ApiError http_status_error(int s) {
  const char* code = s == 404   ? "not_found"
                     : s == 405 ? "method_not_allowed"
                     : s == 413 ? "request_too_large"
                     : s == 408 ? "request_timeout"
                     : s == 414 ? "uri_too_long"
                     : s == 431 ? "headers_too_large"
                                : "bad_request";
  return api_error(s, s >= 500 ? "server_error" : "invalid_request_error", code,
                   "the request could not be served (HTTP " + std::to_string(s) + ")");
}

json error_body(const ApiError& error) {
  json e = json::object();
  e["message"] = error.message;
  e["type"] = error.type;
  e["param"] = error.param ? json(*error.param) : json(nullptr);
  e["code"] = error.code.empty() ? json(nullptr) : json(error.code);
  return json{{"error", std::move(e)}};
}

HttpResponse error_response(const ApiError& error) {
  HttpResponse res;
  if (error.retry_after > 0) res.set_header("Retry-After", std::to_string(error.retry_after));
  if (error.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  res.status = error.status;
  res.body = error_body(error).dump(-1, ' ', false, json::error_handler_t::replace);
  res.content_type = "application/json";
  return res;
}

ErrorStyle error_style_for(std::string_view path) {
  constexpr std::string_view kMessages = "/v1/messages";
  const bool messages = path.rfind(kMessages, 0) == 0 &&
                        (path.size() == kMessages.size() || path[kMessages.size()] == '/');
  return messages ? ErrorStyle::anthropic : ErrorStyle::openai;
}

json anthropic_error_body(const ApiError& error) {
  const int s = error.status;
  const char* type = s == 401   ? "authentication_error"
                     : s == 403 ? "permission_error"
                     : s == 404 ? "not_found_error"
                     : s == 413 ? "request_too_large"
                     : s == 429 ? "rate_limit_error"
                     : s == 503 ? "overloaded_error"
                     : s == 504 ? "timeout_error"
                     : s >= 500 ? "api_error"
                                : "invalid_request_error";
  json e = json{{"type", type}, {"message", error.message}};
  if (!error.code.empty()) {  // the SDK's APIError.errorCode / .details
    json details = json{{"error_code", error.code}};
    if (error.param) details["param"] = *error.param;
    e["details"] = std::move(details);
  }
  return json{{"type", "error"}, {"error", std::move(e)}};
}

HttpResponse error_response(const ApiError& error, ErrorStyle style) {
  HttpResponse res = error_response(error);
  if (style == ErrorStyle::anthropic)
    res.body = anthropic_error_body(error).dump(-1, ' ', false, json::error_handler_t::replace);
  return res;
}

}  // namespace k3::server

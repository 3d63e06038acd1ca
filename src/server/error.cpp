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

}  // namespace k3::server

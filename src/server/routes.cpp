// server/routes.cpp — the route table of `coli serve` and the guards run before a body is read
// (see server/routes.h).
#include "server/routes.h"

#include <malloc.h>
#include <sys/random.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "anthropic_handlers.h"
#include "auth_brake.h"
#include "handlers.h"
#include "responses_handlers.h"
#include "server/security.h"
#include "util/sys.h"

namespace k3::server {
namespace {

constexpr size_t kTrimAfterBody = size_t{1} << 20;

std::string random_hex(size_t bytes) {
  std::vector<unsigned char> b(bytes);
  if (getrandom(b.data(), b.size(), 0) != static_cast<ssize_t>(b.size()))
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = static_cast<unsigned char>(
          std::chrono::steady_clock::now().time_since_epoch().count() >> (i % 8));
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

// `from` over `into`: its headers replace or join those already set, the rest is taken whole.
void merge(HttpResponse& into, HttpResponse from) {
  for (auto& [k, v] : from.headers) into.set_header(std::move(k), std::move(v));
  into.status = from.status;
  into.content_type = std::move(from.content_type);
  into.body = std::move(from.body);
  into.stream = std::move(from.stream);
  into.on_finish = std::move(from.on_finish);
  into.unread_body = into.unread_body || from.unread_body;
}

// A refusal before (or instead of) reading the body: the connection closes after it, and what
// the client still sends is drained, never read as a next request.
void refuse(const HttpRequest& req, HttpResponse& res, const ApiError& error) {
  merge(res, error_response(error, error_style_for(req.path)));
  res.set_header("Connection", "close");
  res.unread_body = req.method == "POST" || req.has_header("Content-Length") ||
                    req.has_header("Transfer-Encoding");
}

}  // namespace

bool Route::matches(std::string_view m, std::string_view path, std::string* param) const {
  if (method != "*" && method != m && !(method == "GET" && m == "HEAD")) return false;
  if (!pattern.empty() && pattern.back() == '*')
    return path.rfind(std::string_view(pattern).substr(0, pattern.size() - 1), 0) == 0;
  if (const size_t brace = pattern.find('{'); brace != std::string::npos) {
    const std::string_view prefix = std::string_view(pattern).substr(0, brace);
    if (path.size() <= prefix.size() || path.rfind(prefix, 0) != 0) return false;
    if (param) *param = std::string(path.substr(prefix.size()));
    return true;
  }
  return path == pattern;
}

namespace {
// "8 MiB", "0.5 MiB": a byte count as --max-body-mb states it.
std::string mib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%g MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}
}  // namespace

ApiError body_too_large(size_t limit, size_t size, bool at_least) {
  return api_error(413, "invalid_request_error", "request_too_large",
                   "the body is " + std::string(at_least ? "at least " : "") +
                       std::to_string(size) + " bytes, over the limit of " + std::to_string(limit) +
                       " bytes (" + mib(limit) + "): raise --max-body-mb / COLI_MAX_BODY_MB");
}

ApiError body_too_slow(double seconds) {
  return api_error(408, "invalid_request_error", "request_timeout",
                   "the body was not received within " + std::to_string(static_cast<int>(seconds)) +
                       " s of the request's start (--read-deadline / COLI_READ_DEADLINE)");
}

ApiError body_unreadable() {
  return api_error(400, "invalid_request_error", "invalid_json", "the body could not be read");
}

struct Router::State {
  ServerOptions options;
  RequestCounters counters;
  AuthBrake brake;
  std::atomic<bool> draining{false};
  HandlerContext context;

  State(EngineService& service, ServerOptions o)
      : options(std::move(o)),
        context{service,
                options,
                counters,
                draining,
                now_seconds(),
                std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count()} {}
};

Router::Router(EngineService& service, ServerOptions options)
    : state_(std::make_unique<State>(service, std::move(options))) {
  const HandlerContext* c = &state_->context;
  const size_t limit = state_->options.max_body_bytes;
  using A = AuthClass;
  auto route = [&](const char* method, const char* pattern, A auth, Handler handler,
                   const char* label = nullptr, bool logged = true) {
    routes_.push_back(
        Route{method, pattern, label ? label : pattern, auth, limit, logged, std::move(handler)});
  };
  auto bind = [c](HttpResponse (*fn)(const HandlerContext&, const HttpRequest&)) {
    return [c, fn](const HttpRequest& r) { return fn(*c, r); };
  };
  // method, pattern,              auth,       handler                       (label, logged)
  // /health and /v1/health: one route under two paths (the same answer in every state, open,
  // details only with a key, not logged).
  for (const char* path : {"/health", "/v1/health"}) {
    route("GET", path, A::open, bind(health), "/health", false);
    route("*", path, A::open, not_found, "/health", false);
  }
  route("GET", "/v1/models", A::api_key, bind(list_models));
  route("GET", "/v1/models/{id}", A::api_key, bind(get_model));
  route("POST", "/v1/chat/completions", A::api_key, bind(chat_completions));
  route("GET", "/v1/chat/completions", A::api_key, post_only);
  route("POST", "/v1/completions", A::api_key, bind(completions));
  route("GET", "/v1/completions", A::api_key, post_only);
  route("POST", "/completion", A::api_key, bind(llama_completion));
  route("GET", "/completion", A::api_key, post_only);
  route("POST", "/v1/responses", A::api_key, bind(responses));
  route("GET", "/v1/responses", A::api_key, post_only);
  route("*", "/v1/responses/{id}", A::api_key, bind(response_not_stored));
  // The Anthropic Messages API (server/anthropic_handlers.h): its refusals in its own envelope.
  route("POST", "/v1/messages", A::api_key, bind(anthropic_messages));
  route("POST", "/v1/messages/count_tokens", A::api_key, bind(anthropic_count_tokens));
  route("GET", "/v1/messages", A::api_key, anthropic_post_only);
  route("GET", "/v1/messages/count_tokens", A::api_key, anthropic_post_only);
  route("*", "/v1/messages", A::api_key, anthropic_not_found);
  route("*", "/v1/messages/*", A::api_key, anthropic_not_found);
  route("GET", "/metrics", A::api_key, bind(metrics), nullptr, false);
  route("*", "/metrics", A::api_key, not_found, nullptr, false);
  route("GET", "/slots", A::api_key, bind(slots));
  route("POST", "/slots/0", A::api_key, bind(erase_slot));
  route("POST", "/tokenize", A::api_key, bind(tokenize));
  route("GET", "/tokenize", A::api_key, post_only);
  route("*", "/tokenize", A::api_key, not_found);
  route("POST", "/detokenize", A::api_key, bind(detokenize));
  route("GET", "/detokenize", A::api_key, post_only);
  route("*", "/detokenize", A::api_key, not_found);
  route("GET", "/props", A::api_key, bind(props));
  route("*", "/props", A::api_key, not_found);
  route("POST", "/apply-template", A::api_key, bind(apply_template));
  route("GET", "/apply-template", A::api_key, post_only);
  route("*", "/apply-template", A::api_key, not_found);
  // Everything else under the API prefixes: 404, after the key check.
  route("GET", "/v1/*", A::api_key, no_such_path);
  route("*", "/v1/*", A::api_key, not_found);
  route("GET", "/slots*", A::api_key, no_such_path);
  route("*", "/slots*", A::api_key, not_found);
  // The embedded web page (SPA fallback); other methods elsewhere are 404.
  route("GET", "/*", A::open, bind(web_page), "static");
  route("*", "/*", A::open, not_found, "static");
}

Router::~Router() = default;

const ServerOptions& Router::options() const {
  return state_->options;
}

const Route* Router::find(std::string_view method, std::string_view path,
                          std::string* param) const {
  for (const Route& r : routes_)
    if (r.matches(method, path, param)) return &r;
  return nullptr;
}

bool Router::screen(const HttpRequest& req, HttpResponse& res) {
  const ServerOptions& options = state_->options;
  res.set_header("x-request-id", req.request_id.empty() ? "req-" + random_hex(8) : req.request_id);
  const bool has_origin = req.has_header("Origin");
  const std::string origin = req.header("Origin");
  const bool origin_ok = !has_origin || origin_allowed(origin, options.security);
  if (has_origin) {
    res.set_header("Vary", "Origin");
    if (origin_ok) {
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Access-Control-Expose-Headers",
                     "x-request-id, x-queue-wait-ms, x-colibri-queue-wait-ms, Retry-After");
    }
  }
  size_t header_bytes = req.method.size() + req.target.size() + 12;
  for (const auto& [k, v] : req.headers) header_bytes += k.size() + v.size() + 4;
  if (header_bytes > options.max_header_bytes || req.headers.size() > 100) {
    refuse(req, res,
           api_error(431, "invalid_request_error", "headers_too_large",
                     "the request head is " + std::to_string(header_bytes) + " bytes in " +
                         std::to_string(req.headers.size()) + " headers; the limit is " +
                         std::to_string(options.max_header_bytes) + " bytes and 100 headers"));
    return true;
  }
  // Framing (request smuggling): at most one Content-Length, never together with
  // Transfer-Encoding, and no Transfer-Encoding but chunked: a proxy in front may read either.
  size_t lengths = 0, encodings = 0;
  for (const auto& [k, v] : req.headers) {
    lengths += same_field_name(k, "Content-Length") ? 1 : 0;
    encodings += same_field_name(k, "Transfer-Encoding") ? 1 : 0;
  }
  std::string encoding;
  for (char ch : req.header("Transfer-Encoding"))
    if (ch != ' ' && ch != '\t')
      encoding += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lengths > 1 || encodings > 1 || (lengths && encodings) ||
      (encodings && encoding != "chunked")) {
    refuse(req, res,
           api_error(400, "invalid_request_error", "invalid_framing",
                     lengths > 1 ? "more than one Content-Length header"
                     : encodings > 1 || encoding != "chunked"
                         ? "Transfer-Encoding must be exactly chunked"
                         : "Content-Length together with Transfer-Encoding"));
    return true;
  }
  if (!host_allowed(req.header("Host"), options.security)) {
    refuse(req, res,
           api_error(403, "permission_error", "host_not_allowed",
                     "the Host header '" + req.header("Host").substr(0, 256) +
                         "' is not allowed: the server answers loopback names and its --host "
                         "(--allowed-host / COLI_ALLOWED_HOSTS adds names)"));
    return true;
  }
  if (req.method == "OPTIONS") {
    res.status = 204;
    if (origin_ok && has_origin) {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers",
                     "Authorization, Content-Type, x-api-key, anthropic-version, x-request-id");
      res.set_header("Access-Control-Max-Age", "600");
      if (req.header("Access-Control-Request-Private-Network") == "true")
        res.set_header("Access-Control-Allow-Private-Network", "true");
    }
    return true;
  }
  const Route* route = find(req.method, req.path);
  if (route && route->auth == AuthClass::api_key && !options.security.api_keys.empty()) {
    const std::string& client = req.client.empty() ? req.remote_addr : req.client;
    const bool presented =
        !presented_key(req.header("Authorization"), req.header("x-api-key")).empty();
    const KeyState key = !presented                 ? KeyState::missing
                         : authorised(options, req) ? KeyState::right
                                                    : KeyState::wrong;
    const AuthAnswer brake = state_->brake.check(client, key);
    if (brake.status == 429) {
      refuse(req, res,
             api_error(429, "rate_limit_error", "too_many_auth_failures",
                       "too many failed API keys from this address: retry in " +
                           std::to_string(brake.retry_after) + " s",
                       std::nullopt, brake.retry_after));
      return true;
    }
    if (brake.status != 0) {
      refuse(req, res,
             api_error(401, "authentication_error", "invalid_api_key",
                       "a valid API key is required (Authorization: Bearer KEY or x-api-key: KEY; "
                       "the server's keys are --api-key / COLI_API_KEY)"));
      return true;
    }
  }
  if (req.method == "POST") {
    if (!origin_ok) {
      refuse(req, res,
             api_error(403, "permission_error", "origin_not_allowed",
                       "the Origin '" + origin.substr(0, 256) +
                           "' is not allowed (--cors-origin / COLI_CORS_ORIGINS adds origins)"));
      return true;
    }
    const std::string type = req.header("Content-Type");
    const std::string media = type.substr(0, type.find(';'));
    std::string lowered;
    for (char ch : media)
      if (ch != ' ' && ch != '\t')
        lowered += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lowered != "application/json") {
      refuse(req, res,
             api_error(415, "invalid_request_error", "unsupported_media_type",
                       "POST bodies must be application/json, not '" + type.substr(0, 128) + "'"));
      return true;
    }
    const size_t limit = route ? route->body_limit : options.max_body_bytes;
    if (req.has_header("Content-Length")) {
      const std::string length = req.header("Content-Length");
      char* end = nullptr;
      errno = 0;
      const unsigned long long n = std::strtoull(length.c_str(), &end, 10);
      if (length.empty() || *end != '\0' || errno != 0 || length[0] == '-') {
        refuse(req, res,
               api_error(400, "invalid_request_error", "invalid_value",
                         "bad Content-Length '" + length.substr(0, 64) + "'"));
        return true;
      }
      if (n > limit) {
        refuse(req, res, body_too_large(limit, static_cast<size_t>(n)));
        return true;
      }
    } else if (req.header("Transfer-Encoding").find("chunked") == std::string::npos) {
      refuse(req, res,
             api_error(411, "invalid_request_error", "length_required",
                       "POST needs a Content-Length"));
      return true;
    }
  }
  return false;
}

void Router::handle(HttpRequest request, HttpResponse& res) const {
  const Route* route = find(request.method, request.path, &request.path_param);
  if (request.request_id.empty()) request.request_id = res.header("x-request-id");
  merge(res, route ? route->handler(request) : not_found(request));
  // A large body leaves megabytes of freed heap (the body, its JSON, the rendered prompt) in this
  // connection thread's malloc arena, which glibc keeps: give it back to the system now, so RSS
  // after a burst of large requests returns to its level before them (serve_test checks it).
  if (request.body.size() >= kTrimAfterBody) {
    std::string().swap(request.body);
    ::malloc_trim(0);
  }
}

HttpResponse Router::serve(HttpRequest request) {
  HttpResponse res;
  if (screen(request, res)) return res;
  request.request_id = res.header("x-request-id");
  const Route* route = find(request.method, request.path);
  if (route && request.body.size() > route->body_limit) {
    refuse(request, res, body_too_large(route->body_limit, request.body.size()));
    return res;
  }
  handle(std::move(request), res);
  return res;
}

bool Router::record(std::string_view method, std::string_view path, int status) {
  const Route* route = find(method, path);
  const std::string label = route ? route->label : "static";
  {
    std::lock_guard<std::mutex> lock(state_->counters.mutex);
    ++state_->counters.by_route_status[{label, status}];
  }
  return !route || route->logged;
}

std::string Router::label(std::string_view method, std::string_view path) const {
  const Route* route = find(method, path);
  return route ? route->label : "static";
}

std::string log_path(std::string_view path) {
  constexpr size_t kMostBytes = 256;
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (size_t i = 0; i < path.size() && i < kMostBytes; ++i) {
    const auto c = static_cast<unsigned char>(path[i]);
    if (c <= ' ' || c >= 0x7f || c == '%') {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (path.size() > kMostBytes) out += "...";
  return out.empty() ? "/" : out;
}

std::string Router::log_line(std::string_view method, std::string_view path, int status,
                             const std::string& request_id) {
  std::string line = "[http] " + request_id + " " + log_path(method) + " " + log_path(path) + " " +
                     std::to_string(status);
  std::optional<GenerationStats> stats;
  {
    std::lock_guard<std::mutex> lock(state_->counters.mutex);
    auto& finished = state_->counters.finished;
    if (auto it = finished.find(request_id); it != finished.end()) {
      stats = it->second;
      finished.erase(it);
    }
  }
  if (stats) {
    char figures[224];
    const double tok_s =
        stats->decode_ms > 0
            ? 1e3 * static_cast<double>(stats->completion_tokens) / stats->decode_ms
            : 0.0;
    std::snprintf(
        figures, sizeof figures,
        " prompt=%lld cached=%lld gen=%lld ttft_ms=%.0f tok_s=%.1f finish=%s session=%d "
        "batch=%.1f batch_max=%lld",
        static_cast<long long>(stats->prompt_tokens), static_cast<long long>(stats->cached_tokens),
        static_cast<long long>(stats->completion_tokens), stats->queue_wait_ms + stats->prefill_ms,
        tok_s, finish_reason_name(stats->finish), stats->session, stats->batch_mean,
        static_cast<long long>(stats->batch_max));
    line += figures;
    if (stats->device.on) {
      // The Vulkan tier's share of this turn (docs/vulkan.md §8).
      const DeviceStats& d = stats->device;
      char device[256];
      std::snprintf(
          device, sizeof device,
          "\n[VK] %s | %llu of %llu routed pairs on the device (%.1f%%) | residents "
          "%llu / %llu | uploads %llu, evictions %llu | join wait %.0f ms | dense matmuls %llu%s",
          request_id.c_str(), static_cast<unsigned long long>(d.pairs_served),
          static_cast<unsigned long long>(d.pairs_total), 100.0 * d.served_share(),
          static_cast<unsigned long long>(d.residents), static_cast<unsigned long long>(d.budget),
          static_cast<unsigned long long>(d.uploads), static_cast<unsigned long long>(d.evictions),
          1e3 * d.join_wait_seconds, static_cast<unsigned long long>(d.dense_matmuls),
          d.off ? " | off: the device was lost" : "");
      line += device;
    }
  }
  return line + "\n";
}

void Router::set_port(int port) {
  state_->options.security.port = port;
}

void Router::drain() {
  state_->draining.store(true);
  drain_generations(state_->context);
}

}  // namespace k3::server

// server/routes.h — the one route table of `coli serve` and the request pipeline over it, with
// no socket (docs/serving.md). Each route names its method, path, handler, auth class, body
// limit, metrics label and whether it is logged; the same table answers routing, the API-key
// check, the body cap, the k3_requests_total label and the log line, so a path is classified
// in one place. The socket adapter (server/http_server.h) calls screen() once the headers are
// in, reads the body up to the route's limit, then handle(); a test calls serve().
//
// The guards of screen(), in order, before any body is read: headers over the cap (431),
// ambiguous framing (400: two Content-Lengths, Content-Length with Transfer-Encoding, an encoding
// but chunked), Host allowlist (403), OPTIONS preflight (204), API key for api_key routes (429
// after repeated failures, 401), and on POST: foreign Origin (403), Content-Type application/json
// (415), Content-Length over the route's limit (413) or missing without chunked encoding (411).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/error.h"
#include "server/http_types.h"
#include "server/server_options.h"

namespace k3 {
class EngineService;
struct ServiceStats;
}  // namespace k3

namespace k3::server {

enum class AuthClass {
  open,     // no key needed (/health shows its details only with one; the web page)
  api_key,  // the API key when keys are configured
};

using Handler = std::function<HttpResponse(const HttpRequest&)>;

struct Route {
  // "GET" (HEAD is served as GET), "POST", or "*": any method (the catch-alls after the routes
  // that name a method).
  std::string method;
  // "/v1/models" matches exactly; "/v1/models/{id}" the prefix and a non-empty rest (the
  // request's path_param); "/v1/*" the prefix and anything after it.
  std::string pattern;
  std::string label;  // k3_requests_total{endpoint=...} and the log line
  AuthClass auth = AuthClass::api_key;
  size_t body_limit = 0;  // bytes a body may hold
  bool logged = true;     // a line on stderr per request
  Handler handler;

  // Whether this route serves (method, path); `param` gets the {id} part.
  bool matches(std::string_view method, std::string_view path, std::string* param = nullptr) const;
};

// Thread-safe: screen(), handle(), serve() and record() may run on many connection threads at
// once (the brake and the counters are locked; the service is thread-safe). `service` must
// outlive the Router. A handler may block (a generation waits for the worker and streams), so
// it runs on its connection's thread, never on a shared one.
class Router {
 public:
  Router(EngineService& service, ServerOptions options);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  const std::vector<Route>& routes() const { return routes_; }
  const ServerOptions& options() const;
  // The first route of the table that serves (method, path); nullptr only for a method the
  // table has no catch-all for (never: "*" routes end the table).
  const Route* find(std::string_view method, std::string_view path,
                    std::string* param = nullptr) const;

  // Once the headers are in: sets the headers every response carries (x-request-id — the
  // request's own when it has one — and CORS) on `res`; true when `res` is the whole answer
  // (a refusal, or the OPTIONS preflight).
  bool screen(const HttpRequest& head, HttpResponse& res);
  // Once the body is read: the route's answer, merged over the headers screen() set in `res`.
  void handle(HttpRequest request, HttpResponse& res) const;
  // The whole pipeline for a request with its body: screen, the route's body limit, handle.
  HttpResponse serve(HttpRequest request);

  // Counts a written response under its route's label; true when the route logs a line.
  bool record(std::string_view method, std::string_view path, int status);
  // The label (metrics, log) of the route serving (method, path).
  std::string label(std::string_view method, std::string_view path) const;
  // The one log line of a written response, llama-server style: request id, method, the path
  // (log_path: the query left out), status and, for a generation, prompt / cached / generated
  // tokens, time to first token and decode tokens per second, e.g.
  //   [http] req-1f.. POST /v1/chat/completions 200 prompt=41 cached=30 gen=12 ttft_ms=85
  //   tok_s=38.2
  std::string log_line(std::string_view method, std::string_view path, int status,
                       const std::string& request_id);

  void set_port(int port);  // the bound port (the server's own origin); before serving
  // Graceful stop of the generations: new ones answer 503 shutting_down, the active one may
  // finish up to the drain timeout, then it is cancelled. Returns once nothing runs.
  void drain();

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::vector<Route> routes_;
};

// A request path (or method) as a log line shows it: bytes outside printable ASCII, spaces and
// '%' percent-encoded (the path arrives decoded: an encoded newline must not start a forged
// line), at most 256 bytes then "...".
std::string log_path(std::string_view path);

// The refusals of a body read: over the route's limit (413: `size` bytes, or at least that many
// when the read stopped there), not received within the read deadline (408), or broken off (400).
ApiError body_too_large(size_t limit, size_t size, bool at_least = false);
ApiError body_too_slow(double seconds);
ApiError body_unreadable();

// The Prometheus text of /metrics from the service stats and the HTTP counters (label set,
// count), e.g. {"endpoint=\"/v1/models\",status=\"200\"", 3}.
std::string metrics_text(const ServiceStats& s,
                         const std::vector<std::pair<std::string, int64_t>>& requests);

}  // namespace k3::server

// server/http_server.h — `coli serve`: the OpenAI-compatible HTTP front end (cpp-httplib) over
// one EngineService (SERVING.md §3.5–3.9, Part 4). HTTP threads parse, validate, render the
// prompt and stream events; they never touch model state.
//
// Routes: POST /v1/chat/completions (JSON or SSE), GET /v1/models[/id], GET /health (and
// /v1/health: 503 + progress while loading), GET /metrics (Prometheus), GET /slots, POST
// /slots/0?action=erase, POST /tokenize, POST /detokenize, OPTIONS (CORS preflight), and the
// embedded web page at / (SPA fallback).
// Guards, before any body is read: Host allowlist (403), API key (401), Content-Type
// application/json on POST (415), foreign Origin on POST (403), Content-Length over the cap
// (413), headers over 16 KiB (431). Generation: one at a time, a bounded FIFO (429 queue_full /
// queue_timeout with Retry-After), the 200 committed only once the worker accepts, client
// disconnects detected within 100 ms (the queued request leaves the queue, the active one is
// cancelled), `: ping` comments during silent prefills, an SSE error event after a commit.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "engine/service.h"
#include "server/api.h"
#include "server/security.h"

namespace httplib {
class Server;
}

namespace k3::server {

struct ServerOptions {
  SecurityOptions security;         // bind_host is where we listen
  int port = 8000;                  // 0 = an ephemeral port
  ApiConfig api;
  size_t max_body_bytes = 8u << 20;
  size_t max_header_bytes = 16u << 10;
  double queue_timeout_s = 300;
  double sse_ping_s = 10;           // 0 = no keep-alive comments
  double drain_timeout_s = 30;
  int max_connections = 64;         // live connections (more are closed at accept)
  // Live connections from one remote address; loopback clients (every local process shares
  // 127.0.0.1: an agent's connection pool, the web page, a script) only count against the
  // global cap unless `cap_loopback`.
  int max_connections_per_ip = 8;
  bool cap_loopback = false;
  double read_timeout_s = 30;       // cumulative: request line + headers (+ body), then closed / 408
  bool log_prompts = false;
  bool web_ui = true;
};

class HttpServer {
 public:
  HttpServer(EngineService& service, ServerOptions options);
  ~HttpServer();
  // Binds the listening socket; returns the port (the ephemeral one when port is 0). Throws
  // k3::Error when it cannot.
  int bind();
  // Serves until shutdown() (blocks).
  void run();
  // Graceful stop: refuse new generations (503), let the active one finish up to the drain
  // timeout, then cancel it; then stop listening. Safe from any thread (not a signal handler).
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The Prometheus text of /metrics from the service stats and the HTTP counters.
std::string metrics_text(const ServiceStats& s, const std::vector<std::pair<std::string, int64_t>>& requests);

}  // namespace k3::server

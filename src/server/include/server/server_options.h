// server/server_options.h — what `coli serve` is told at start-up: where to listen, the API
// settings requests are checked against, and the limits of the guards (body and header caps,
// connection caps, the read deadline, the queue timeout). Filled by apps/coli_serve.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "server/security.h"

namespace k3::server {

// What the server was told at start-up that requests are checked against.
struct ApiConfig {
  std::string model_id = "kimi-k3";
  std::vector<std::string> aliases;
  // Off: any `model` a request names gets the one served model (responses name model_id); on
  // (--strict-model): a name other than model_id and the aliases is a 404 model_not_found.
  bool strict_model = false;
  int64_t max_tokens_ceiling = 16384;
  double default_temperature = 0.6;
  double default_top_p = 0.95;
  int64_t default_top_k = 0;
  double default_min_p = 0.0;
  bool default_thinking = true;                       // --reasoning on|off
  std::string reasoning_field = "reasoning_content";  // reasoning_content | reasoning | both
  std::string fingerprint = "kimi_k3-1.0.0-cpu";
  // One line on what the model is, for people (GET /v1/models meta.description; the web page's
  // start screen). Empty: none is said (a model given with --model).
  std::string model_description;
};

struct ServerOptions {
  SecurityOptions security;  // bind_host is where we listen
  int port = 8000;           // 0 = an ephemeral port
  ApiConfig api;
  size_t max_body_bytes = 8u << 20;
  size_t max_header_bytes = 16u << 10;
  double queue_timeout_s = 300;
  double sse_ping_s = 10;  // 0 = no keep-alive comments
  double drain_timeout_s = 30;
  // Live connections; when full, an idle one is evicted for a new one (docs/serving.md §4.6).
  int max_connections = 64;
  // Live connections from one remote address; loopback clients (every local process shares
  // 127.0.0.1: an agent's connection pool, the web page, a script) only count against the
  // global cap unless `cap_loopback`.
  int max_connections_per_ip = 8;
  bool cap_loopback = false;
  double read_timeout_s = 30;  // cumulative: request line + headers (+ body), then closed / 408
  bool log_prompts = false;
  bool web_ui = true;
};

}  // namespace k3::server

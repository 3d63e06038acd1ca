// server/http_server.h — `coli serve`: the OpenAI-compatible HTTP front end over one
// EngineService (docs/serving.md §4.10). This is the socket side only: listening (no port
// sharing, a real backlog), each connection on its own thread through the connection gate (caps,
// eviction of idle connections when full), the read deadline, reading bodies up to the route's
// limit, writing responses and SSE streams, and ending connections that must serve nothing more.
// What each request gets is decided by the route table and its handlers (server/routes.h), which
// never see a socket. HTTP threads never touch model state.
#pragma once

#include <memory>

#include "server/server_options.h"

namespace k3 {
class EngineService;
}

namespace k3::server {

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

}  // namespace k3::server

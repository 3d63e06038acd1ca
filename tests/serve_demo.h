// tests/serve_demo.h — the one EngineService the server tests run through the route table: the
// k3_synth "demo" checkpoint (random weights, the real vocabulary and tokenizer; test_util.h's
// kDemoDir, written once a build), context 256, no checkpoints. A test builds its own Router over
// it, so the brake and the counters start empty.
#pragma once

#include <string>

#include "engine/service.h"
#include "server/http_types.h"
#include "test_util.h"

namespace k3::testing {

inline ServiceOptions serve_demo_options() {
  ServiceOptions o;
  o.model_dir = kDemoDir;
  o.context = 256;
  o.ckpt_slots = 0;
  return o;
}

inline EngineService& serve_demo_service() {
  static EngineService service(serve_demo_options());
  return service;
}

// A request as a local client sends it to 127.0.0.1:8000: Host, the key as a Bearer token (none
// when null) and, for a POST, the JSON content type and the body's length.
inline server::HttpRequest demo_request(std::string method, std::string path, std::string body = "",
                                        const char* key = nullptr) {
  server::HttpRequest r;
  r.method = std::move(method);
  r.path = path;
  r.target = std::move(path);
  r.remote_addr = "127.0.0.1";
  r.headers = {{"Host", "127.0.0.1:8000"}};
  if (key) r.headers.emplace_back("Authorization", std::string("Bearer ") + key);
  if (r.method == "POST") {
    r.headers.emplace_back("Content-Type", "application/json");
    r.headers.emplace_back("Content-Length", std::to_string(body.size()));
  }
  r.body = std::move(body);
  return r;
}

}  // namespace k3::testing

// tests/serve_demo.h — the one EngineService the server tests run through the route table: the
// k3_synth "demo" checkpoint (random weights, the real vocabulary and tokenizer) written once per
// test binary, context 256, no checkpoints. A test builds its own Router over it, so the brake
// and the counters start empty.
#pragma once

#include <string>

#include "engine/service.h"
#include "synth_lib.h"
#include "test_util.h"

namespace k3::testing {

inline const std::string& serve_demo_dir() {
  static const TempDir dir("serve-demo");
  static const bool written = [] {
    synth::write_checkpoint(synth::preset_spec("demo"), dir.path());
    return true;
  }();
  (void)written;
  return dir.path();
}

inline ServiceOptions serve_demo_options() {
  ServiceOptions o;
  o.model_dir = serve_demo_dir();
  o.context = 256;
  o.ckpt_slots = 0;
  return o;
}

inline EngineService& serve_demo_service() {
  static EngineService service(serve_demo_options());
  return service;
}

}  // namespace k3::testing

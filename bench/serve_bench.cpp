// bench/serve_bench.cpp — `k3_bench serve` (benchmarks, not tests).
//
//   k3_bench serve [MODEL_DIR] [--tokens T] [--prompt P] [--concurrency 1,2,4,8]
//       The engine service with N sessions (coli serve --parallel): aggregate generated tok/s at
//       each number of concurrent streams (ratio to the first), routed-expert MB read per token
//       and the mean decode batch, then the time to first token of a new request while three
//       others decode against alone. Without MODEL_DIR the demo checkpoint (k3_synth --preset
//       demo, with the tokenizer) is written once beside the build.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "engine/engine.h"
#include "engine/service.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3bench {
namespace {

// ---------------------------------------------------------------------------------------------
// serve: the engine service with N sessions (coli serve --parallel, docs/serving.md §3.1)

struct ServeArgs : CommonOptions {
  std::string model_dir;  // a checkpoint with its tokenizer; empty = the demo checkpoint
  int64_t tokens = 32;    // generated per stream
  int64_t prompt = 48;    // prompt tokens per stream
  std::string concurrency = "1,2,4,8";
  double expert_gb = 8;
};

int run_serve(const ServeArgs& a) {
  const k3::Isa isa = apply_common_options(a);
  print_machine(isa);
  std::string dir = a.model_dir;
  if (dir.empty()) {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    dir = ec ? "build/demo-model" : (exe.parent_path().parent_path() / "demo-model").string();
    ensure_demo(dir);
  }
  std::vector<int> levels;
  {
    std::stringstream ss(a.concurrency);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) levels.push_back(std::max(1, std::stoi(item)));
  }
  if (levels.empty()) throw k3::Error("--concurrency: give a list like 1,2,4,8");
  const int most = std::max(4, *std::max_element(levels.begin(), levels.end()));
  k3::ServiceOptions so;
  so.model_dir = dir;
  so.load.isa = a.isa;
  so.load.cache.expert_gb = a.expert_gb;
  so.context = a.prompt + a.tokens + 8;
  so.parallel = most;
  so.ckpt_slots = 0;
  so.threads = a.threads;
  k3::EngineService service(so);
  while (!service.engine()) {
    const k3::ServiceStats s = service.stats();
    if (s.state == k3::ServiceStats::State::failed)
      throw k3::Error(s.failed_step + ": " + s.load_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const k3::Engine& engine = *service.engine();
  std::printf("\n== serve on %s: %d sessions, %lld prompt + %lld generated tokens per stream\n",
              dir.c_str(), most, static_cast<long long>(a.prompt),
              static_cast<long long>(a.tokens));
  std::printf("engine: %s\n", engine.describe().c_str());
  const int64_t vocab = engine.info().vocab_size;
  auto request = [&](int64_t salt, int64_t prompt_tokens, int64_t tokens) {
    k3::ServiceRequest r;
    for (int64_t i = 0; i < prompt_tokens; ++i)
      r.prompt.push_back(1 + (salt * 104729 + i * 7919) % (std::min<int64_t>(vocab, 150000) - 1));
    r.starts_in_think = false;
    r.raw = true;
    r.max_tokens = tokens;
    r.cache_prompt = false;  // every stream prefills its whole prompt
    r.stop.clear();
    return r;
  };
  auto finish = [](const std::shared_ptr<k3::RequestHandle>& h, double* first_token) {
    k3::ServiceEvent e;
    const double t0 = k3::now_seconds();
    for (;;) {
      if (!h->next(e, std::chrono::seconds(600))) throw k3::Error("serve bench: no event in 600 s");
      if (first_token && *first_token < 0 &&
          (e.kind == k3::ServiceEvent::Kind::content ||
           e.kind == k3::ServiceEvent::Kind::reasoning ||
           (e.kind == k3::ServiceEvent::Kind::done && e.stats.completion_tokens > 0)))
        *first_token = k3::now_seconds() - t0;
      if (e.kind == k3::ServiceEvent::Kind::error) throw k3::Error("serve bench: " + e.text);
      if (e.kind == k3::ServiceEvent::Kind::done) return e.stats;
    }
  };
  std::printf("\n%-8s %10s %12s %14s %14s %10s\n", "streams", "tokens", "seconds",
              "aggregate tok/s", "expert MB/tok", "mean batch");
  double single = 0;
  int64_t salt = 0;
  for (int n : levels) {
    const k3::ExpertStats e0 = engine.expert_stats();
    const k3::ServiceStats s0 = service.stats();
    std::vector<std::shared_ptr<k3::RequestHandle>> handles;
    const double t0 = k3::now_seconds();
    for (int i = 0; i < n; ++i) {
      auto h = service.submit(request(++salt, a.prompt, a.tokens));
      if (!h.ok()) throw k3::Error("serve bench: " + h.status().message());
      handles.push_back(*h);
    }
    int64_t generated = 0;
    for (auto& h : handles) generated += finish(h, nullptr).completion_tokens;
    const double dt = k3::now_seconds() - t0;
    const k3::ExpertStats e1 = engine.expert_stats();
    const k3::ServiceStats s1 = service.stats();
    const double rate = static_cast<double>(generated) / dt;
    if (n == levels.front()) single = rate;
    const double mb_per_token = static_cast<double>(e1.bytes_read - e0.bytes_read) / 1e6 /
                                static_cast<double>(std::max<int64_t>(1, generated));
    const int64_t steps = s1.decode_steps - s0.decode_steps;
    const double batch = steps > 0 ? static_cast<double>(s1.decode_rows - s0.decode_rows) /
                                         static_cast<double>(steps)
                                   : 0;
    std::printf("%-8d %10lld %12.2f %14.1f %14.2f %10.2f\n", n, static_cast<long long>(generated),
                dt, rate, mb_per_token, batch);
    add_result("serve_tok_s_" + std::to_string(n), rate, "tok/s",
               single > 0 ? rate / single : std::nan(""));
    add_result("serve_expert_mb_per_token_" + std::to_string(n), mb_per_token, "MB/tok",
               std::nan(""));
  }
  // Time to first token of a new request while three others decode, against the same request
  // alone.
  double alone = -1, beside = -1;
  finish(*service.submit(request(++salt, a.prompt, 4)), &alone);
  std::vector<std::shared_ptr<k3::RequestHandle>> running;
  for (int i = 0; i < 3; ++i)
    running.push_back(*service.submit(request(++salt, a.prompt, a.tokens * 4)));
  for (auto& h : running) {  // each has started decoding
    k3::ServiceEvent e;
    while (h->next(e, std::chrono::seconds(600)) && e.kind != k3::ServiceEvent::Kind::content &&
           e.kind != k3::ServiceEvent::Kind::done) {
    }
  }
  finish(*service.submit(request(++salt, a.prompt, 4)), &beside);
  for (auto& h : running) service.cancel(h);
  service.wait_idle(600);
  std::printf(
      "\nTTFT of a %lld-token prompt: alone %.1f ms, while 3 streams decode %.1f ms "
      "(%.2fx)\n",
      static_cast<long long>(a.prompt), alone * 1e3, beside * 1e3, beside / alone);
  add_result("serve_ttft_alone", alone * 1e3, "ms", std::nan(""));
  add_result("serve_ttft_beside_3", beside * 1e3, "ms", beside / alone);
  print_results();
  return 0;
}

}  // namespace

Subcommand register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  Command c(app, "serve",
            "the service with N sessions: aggregate tok/s at 1,2,4,8 streams, TTFT beside 3");
  c.option("model_dir", a->model_dir, "a checkpoint with its tokenizer")
      .default_text("the demo checkpoint");
  c.option("--tokens", a->tokens, "generated tokens per stream").show_default();
  c.option("--prompt", a->prompt, "prompt tokens per stream").show_default();
  c.option("--concurrency", a->concurrency, "stream counts").show_default();
  c.option("--expert-gb", a->expert_gb, "expert cache budget (GB)").show_default();
  add_common_options(c, *a);
  return {c.app(), [a] {
            if (a->tokens < 1 || a->prompt < 1)
              throw k3::Error("--tokens and --prompt must be >= 1");
            return run_serve(*a);
          }};
}

}  // namespace k3bench

// bench/stream_bench.cpp — `k3_bench stream` (benchmarks, not tests).
//
//   k3_bench stream [MODEL_DIR] [--layers N] [--experts E] [--tokens T] [--dir DIR]
//                   [--chunks C1,C2,...] [--chunk-prompt P]
//       Decode with routed experts streamed from disk, against the drive's O_DIRECT rate, with and
//       without the pipe and the read-ahead (K3_PREFETCH) and its recall; with --chunks, the
//       prefill of one P-token prompt of real text at each chunk size: ms/token, disk MB/token,
//       experts applied per token, distinct experts per chunk, and whether the logits equal the
//       first size's.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "engine/engine.h"
#include "engine/internal.h"
#include "engine/sampler.h"
#include "experts/expert_cache.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3bench {
namespace {

// ---------------------------------------------------------------------------------------------
// stream: routed experts read from disk (O_DIRECT) during decode, against the drive's own rate

struct StreamArgs : CommonOptions {
  std::string model_dir;  // an existing checkpoint; empty = the cached slice
  int64_t layers = 4;     // slice layers (the first is dense)
  int64_t experts = 128;  // slice routed experts per MoE layer
  int64_t tokens = 8;     // decode tokens per configuration
  int64_t prefill = 64;   // prompt tokens (chunked, C = 32)
  double expert_gb = 1;   // expert cache budget: small, so decode streams
  double probe_gb = 3;    // bytes dd reads for the drive rate
  std::string dir;
  std::string io_engine = "auto";
  std::vector<int64_t> chunks;  // the prefill sweep's chunk sizes (empty: no sweep)
  int64_t chunk_prompt = 0;     // its prompt tokens (0: the largest chunk)
};

// The prefill of one prompt at each chunk size, the cache emptied before each (docs/streaming.md
// §1.8): a chunk reads each distinct expert of its rows once, so the disk bytes per prompt token
// fall as the chunk grows, to one read of the layer's union per chunk. The logits are those of
// C = 1 at every size (tests/chunked_prefill_test.cpp); here they are compared with the first
// size's, bit for bit.
void chunk_sweep(const StreamArgs& a, k3::Engine& engine, double best_drive) {
  k3::ExpertCache& cache = k3::internal::model(engine).experts();
  const k3::K3Config& c = k3::internal::config(engine);
  const int64_t moe_layers =
      engine.info().num_layers - std::min(engine.info().num_layers, c.first_k_dense_replace);
  const int64_t P =
      a.chunk_prompt > 0 ? a.chunk_prompt : *std::max_element(a.chunks.begin(), a.chunks.end());
  std::string what;
  const std::vector<int64_t> prompt = realistic_prompt(P, c.vocab_size, &what);
  std::printf(
      "\n== prefill of %lld tokens (%s) at each chunk size, routed experts from the drive (cache "
      "emptied before each, %lld slots/layer, pipe on, read-ahead off)\n",
      static_cast<long long>(P), what.c_str(), static_cast<long long>(cache.slots_per_layer()));
  std::printf("%6s %9s %9s %10s %12s %11s %9s %7s %s\n", "C", "s", "ms/token", "MB/token",
              "exp/token", "exp/chunk", "x layer", "x drive", "logits");
  cache.set_pipe(true);
  cache.set_prefetch(false);
  std::vector<float> first;
  double first_gb = 0;
  for (const int64_t C : a.chunks) {
    cache.clear();
    const k3::ExpertCacheStats s0 = cache.stats();
    k3::Session s(engine, P + 2);
    s.set_prefill_chunk(C);
    const double t0 = k3::now_seconds();
    const std::vector<float> logits = s.prefill(prompt);
    const double dt = k3::now_seconds() - t0;
    const k3::ExpertCacheStats s1 = cache.stats();
    const double gb = static_cast<double>(s1.drive_bytes - s0.drive_bytes) / 1e9;
    const double reads = static_cast<double>(s.stats().expert_reads);  // experts applied
    const double chunks = static_cast<double>((P + C - 1) / C);
    // Distinct experts applied per chunk and MoE layer (a chunk reads each at most once, from the
    // drive unless the cache still holds it), as a share of the layer's experts.
    const double per_chunk = reads / chunks / static_cast<double>(std::max<int64_t>(1, moe_layers));
    const double cover = per_chunk / static_cast<double>(std::max<int64_t>(1, c.num_experts));
    // The prefill's time against reading its expert bytes at the run's best drive probe.
    const double vs_drive = best_drive > 0 && gb > 0 ? dt / (gb / best_drive) : std::nan("");
    const char* same = "(reference)";
    if (first.empty()) {
      first = logits;
      first_gb = gb;
    } else {
      same = logits.size() == first.size() &&
                     std::memcmp(logits.data(), first.data(), first.size() * sizeof(float)) == 0
                 ? "identical"
                 : "DIFFER";
    }
    const double Pd = static_cast<double>(P);
    std::printf("%6lld %9.2f %9.3f %10.3f %12.1f %11.1f %8.1f%% %7.2f %s\n",
                static_cast<long long>(C), dt, 1e3 * dt / Pd, 1e3 * gb / Pd, reads / Pd, per_chunk,
                100 * cover, vs_drive, same);
    const std::string n = "stream_prefill_C" + std::to_string(C);
    add_result(n, 1e3 * dt / Pd, "ms/token", std::nan(""));
    add_result(n + "_disk_mb_per_token", 1e3 * gb / Pd, "MB/token",
               first_gb > 0 ? gb / first_gb : std::nan(""));
    add_result(n + "_layer_cover", cover, "fraction", cover);
  }
  std::printf(
      "(MB/token: read from the drive; exp/token: routed experts applied per token; exp/chunk: "
      "distinct experts applied per chunk and MoE layer, each read at most once; x layer: of the "
      "layer's %lld experts; x drive: the prefill's time / its expert bytes at %.3f GB/s; RESULT "
      "MB/token ratio: x the first size's)\n",
      static_cast<long long>(c.num_experts), best_drive);
}

int run_stream(const StreamArgs& a) {
  const k3::Isa isa = apply_common_options(a);
  print_machine(isa);
  std::string dir = a.model_dir;
  if (dir.empty()) {
    dir = a.dir.empty() ? default_slice_dir() + "-stream" : a.dir;
    std::printf("\n== stream on a slice checkpoint (%lld layers, %lld experts of real size)\n",
                static_cast<long long>(a.layers), static_cast<long long>(a.experts));
    ensure_slice(dir, a.layers, a.experts);
  } else {
    std::printf("\n== stream on %s\n", dir.c_str());
  }
  std::string shards;
  const double drive = drive_rate_dd(dir, a.probe_gb, &shards);
  std::printf("drive: dd iflag=direct bs=4M over %.1f GB of %s: %.3f GB/s\n", a.probe_gb,
              shards.c_str(), drive);
  std::string engine_name;
  const double deep = drive_rate_queue(dir, a.probe_gb, 32, uint64_t{4} << 20, &engine_name);
  std::printf("drive: O_DIRECT via %s, 32 x 4 MiB in flight, same shards: %.3f GB/s (%.2fx dd)\n",
              engine_name.c_str(), deep, drive > 0 ? deep / drive : 0);
  add_result("stream_drive_dd", drive, "GB/s", 1.0);
  add_result("stream_drive_queue", deep, "GB/s", drive > 0 ? deep / drive : std::nan(""));
  // The whole files, small ones included (dd and the queue skip shards under 4 MiB): the
  // floor's third candidate.
  std::vector<fs::path> files;
  for (const auto& [size, path] : largest_shards(dir)) files.push_back(path);
  std::string why;
  const double whole = direct_read_rate(files, static_cast<uint64_t>(a.probe_gb * 1e9), 8, &why);
  std::printf("drive: O_DIRECT, 8 x 4 MiB in flight, the shards read whole: %.3f GB/s%s\n", whole,
              why.empty() ? "" : (" (" + why + ")").c_str());
  add_result("stream_drive_files", whole, "GB/s", drive > 0 ? whole / drive : std::nan(""));

  const std::string state =
      (fs::temp_directory_path() / ("k3_bench-state-" + std::to_string(::getpid()))).string();
  k3::LoadOptions load;
  load.isa = a.isa;
  load.cache.expert_gb = a.expert_gb;
  load.cache.pin = false;
  load.cache.state_dir = state;  // the benchmark's routing never seeds a user's pins
  load.cache.io_engine = a.io_engine;
  k3::Engine engine(dir, load);
  fs::remove_all(state);
  k3::ExpertCache& cache = k3::internal::model(engine).experts();
  const k3::K3Config& c = k3::internal::config(engine);
  const int64_t moe_layers =
      engine.info().num_layers - std::min(engine.info().num_layers, c.first_k_dense_replace);
  std::printf("engine: %s, loaded in %.2f s\n", engine.describe().c_str(), engine.load_seconds());
  std::printf(
      "experts: %lld MoE layers x %lld, %.1f MB each, %lld slots/layer (K3_EXPERT_GB=%g), reads "
      "via %s\n",
      static_cast<long long>(moe_layers), static_cast<long long>(c.num_experts),
      static_cast<double>(
          k3::ExpertGeometry{c.routed_expert_hidden_size, c.moe_intermediate_size}.expert_bytes()) /
          1e6,
      static_cast<long long>(cache.slots_per_layer()), a.expert_gb, cache.stats().io_engine);

  // Prefill dedup at C = 32: token at a time reads k experts per token per MoE layer; a chunk
  // reads each distinct expert of its rows once.
  std::string what;
  const std::vector<int64_t> prompt = realistic_prompt(a.prefill, c.vocab_size, &what);
  k3::Session session(engine, a.prefill + 3 * a.tokens + 2);
  session.set_prefill_chunk(32);
  double t0 = k3::now_seconds();
  std::vector<float> logits = session.prefill(prompt);
  const double prefill_s = k3::now_seconds() - t0;
  const double selections = static_cast<double>(a.prefill * c.num_experts_per_token * moe_layers);
  const double dedup = selections / static_cast<double>(session.stats().expert_reads);
  std::printf(
      "prefill: %lld tokens (%s), C=32: %.1f s, %llu expert reads for %.0f selections: dedup "
      "%.2fx\n",
      static_cast<long long>(a.prefill), what.c_str(), prefill_s,
      static_cast<unsigned long long>(session.stats().expert_reads), selections, dedup);
  add_result("stream_prefill_dedup_C32", dedup, "x", dedup);

  struct Config {
    const char* name;
    bool pipe, prefetch;
  };
  const Config configs[] = {
      {"wait_all", false, false}, {"pipe", true, false}, {"pipe_prefetch", true, true}};
  std::vector<std::string> stage_lines, floor_lines;
  std::printf("\n%-14s %9s %8s %9s %7s %7s %8s %8s %8s\n", "config", "s/token", "GB read",
              "exp GB/s", "x dd", "x queue", "busy", "wait", "recall");
  for (const Config& cfg : configs) {
    cache.set_pipe(cfg.pipe);
    cache.set_prefetch(cfg.prefetch);
    cache.clear();
    const k3::ExpertCacheStats s0 = cache.stats();
    const k3::StageStats stages0 = k3::internal::stage_stats(session);
    t0 = k3::now_seconds();
    for (int64_t i = 0; i < a.tokens; ++i) logits = session.step(k3::argmax(logits));
    const double dt = k3::now_seconds() - t0;
    const k3::ExpertCacheStats s1 = cache.stats();
    k3::StageStats stages = k3::internal::stage_stats(session);
    for (int i = 0; i < static_cast<int>(k3::Stage::kCount); ++i)
      stages.seconds[i] -= stages0.seconds[i];
    stage_lines.push_back(std::string(cfg.name) + ": " + stages.summary());
    const double gb = static_cast<double>(s1.drive_bytes - s0.drive_bytes) / 1e9;
    const double busy = s1.busy_seconds - s0.busy_seconds;
    const double wait = s1.wait_seconds - s0.wait_seconds;
    const double rate = busy > 0 ? gb / busy : 0;
    const double total = static_cast<double>(s1.predicted_total - s0.predicted_total);
    const double recall = total > 0
                              ? static_cast<double>(s1.predicted_hits - s0.predicted_hits) / total
                              : std::nan("");
    std::printf("%-14s %9.3f %8.2f %9.3f %7.2f %7.2f %7.0f%% %7.0f%% %7.1f%%\n", cfg.name,
                dt / static_cast<double>(a.tokens), gb, rate, drive > 0 ? rate / drive : 0,
                deep > 0 ? rate / deep : 0, 100 * busy / dt, 100 * wait / dt, 100 * recall);
    const std::string n = std::string("stream_") + cfg.name;
    // The drive's floor: the expert bytes this configuration read per token at the best
    // drive probe of the run (dd, the queue or the whole files); measured s/token / that.
    const double best_drive = std::max({drive, deep, whole});
    const double floor_s = best_drive > 0 ? gb / static_cast<double>(a.tokens) / best_drive : 0;
    const double vs_floor = floor_s > 0 ? dt / static_cast<double>(a.tokens) / floor_s : 0;
    char line[256];
    std::snprintf(line, sizeof line,
                  "%s: %.3f MB/token from the drive / %.3f GB/s = %.5f s/token floor; measured "
                  "%.2fx",
                  cfg.name, gb * 1e3 / static_cast<double>(a.tokens), best_drive, floor_s,
                  vs_floor);
    floor_lines.push_back(line);
    add_result(n + "_decode", dt / static_cast<double>(a.tokens), "s/token", std::nan(""));
    add_result(n + "_vs_drive_floor", vs_floor, "x", floor_s > 0 ? vs_floor : std::nan(""));
    add_result(n + "_expert_gbps", rate, "GB/s", drive > 0 ? rate / drive : std::nan(""));
    add_result(n + "_expert_vs_queue_probe", deep > 0 ? rate / deep : 0, "x",
               deep > 0 ? rate / deep : std::nan(""));
    add_result(n + "_unhidden_wait", wait / dt, "fraction", wait / dt);
    add_result(n + "_drive_busy", busy / dt, "fraction", busy / dt);
    if (cfg.prefetch) {
      add_result(n + "_recall", recall, "fraction", recall);
      for (const k3::ExpertCache::LayerRecall& r : cache.recall_by_layer()) {
        const double v =
            static_cast<double>(r.predicted_hits) / static_cast<double>(r.predicted_total);
        std::printf(
            "  read-ahead recall, layer %lld (predicted from layer %lld's input): %.1f%% of %llu "
            "selections\n",
            static_cast<long long>(r.layer), static_cast<long long>(r.layer - 1), 100 * v,
            static_cast<unsigned long long>(r.predicted_total));
        add_result(n + "_recall_layer" + std::to_string(r.layer), v, "fraction", v);
      }
      const double issued = static_cast<double>(s1.prefetch_issued - s0.prefetch_issued);
      add_result(n + "_prefetch_used",
                 issued > 0 ? static_cast<double>(s1.prefetch_used - s0.prefetch_used) / issued : 0,
                 "fraction", std::nan(""));
    }
  }
  std::printf(
      "(busy = time with a read in flight / decode time; wait = compute thread blocked on reads / "
      "decode time;\n"
      " exp GB/s = expert bytes / busy time; recall = selections the read-ahead predicted / "
      "selections)\n");
  std::printf(
      "decode stages (experts includes the wait on reads; no expert reads can be pending during "
      "embed,\n"
      "the dense layers and the head):\n");
  for (const std::string& line : stage_lines) std::printf("  %s\n", line.c_str());
  std::printf(
      "against the drive (s/token / (expert bytes from the drive per token / the best drive "
      "probe)):\n");
  for (const std::string& line : floor_lines) std::printf("  %s\n", line.c_str());
  if (!a.chunks.empty()) chunk_sweep(a, engine, std::max({drive, deep, whole}));
  std::printf("peak RSS: %.2f GB\n", static_cast<double>(k3::peak_rss_bytes()) / 1e9);
  print_results();
  return 0;
}

}  // namespace

Subcommand register_stream(CLI::App& app) {
  auto a = std::make_shared<StreamArgs>();
  Command c(app, "stream", "decode with experts streamed from disk vs the drive's O_DIRECT rate");
  c.option("model_dir", a->model_dir, "an existing checkpoint")
      .default_text("a cached slice with many experts");
  c.option("--layers", a->layers, "slice layers").show_default();
  c.option("--experts", a->experts, "slice routed experts").show_default();
  c.option("--tokens", a->tokens, "decode tokens per configuration").show_default();
  c.option("--prefill", a->prefill, "prompt tokens (C = 32)").show_default();
  c.option("--expert-gb", a->expert_gb, "expert cache budget (small: decode streams)")
      .show_default();
  c.option("--probe-gb", a->probe_gb, "bytes dd reads for the drive rate").show_default();
  c.option("--dir", a->dir, "cache directory of the slice")
      .default_text("<build>/bench-slice-stream");
  c.option("--io-engine", a->io_engine, "expert reads: auto, uring, threads").show_default();
  c.option("--chunks", a->chunks,
           "prefill one prompt at each of these chunk sizes (1..4096), e.g. 32,128,512,2048")
      .list(',')
      .default_text("none");
  c.option("--chunk-prompt", a->chunk_prompt, "prompt tokens of the --chunks sweep")
      .default_text("the largest chunk");
  add_common_options(c, *a);
  return {c.app(), [a] {
            if (a->layers < 2 || a->experts < 1 || a->tokens < 1 || a->prefill < 1)
              throw k3::Error("--layers must be >= 2; --experts, --tokens, --prefill >= 1");
            for (size_t i = 0; i < a->chunks.size(); ++i) {
              const int64_t C = a->chunks[i];
              if (C < 1 || C > 4096)
                throw k3::Error("--chunks: " + std::to_string(C) + " is not in 1..4096");
              if (std::find(a->chunks.begin(), a->chunks.begin() + static_cast<ptrdiff_t>(i), C) !=
                  a->chunks.begin() + static_cast<ptrdiff_t>(i))
                throw k3::Error("--chunks: " + std::to_string(C) + " is given twice");
            }
            if (a->chunk_prompt < 0) throw k3::Error("--chunk-prompt must be >= 0");
            if (a->chunk_prompt > 0 && a->chunks.empty())
              throw k3::Error("--chunk-prompt needs --chunks (the sizes to prefill it at)");
            return run_stream(*a);
          }};
}

}  // namespace k3bench

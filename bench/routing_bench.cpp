// bench/routing_bench.cpp — `k3_bench routing` (benchmarks, not tests).
//
//   k3_bench routing --model DIR --ids FILE [--window W] [--contrast DIR]
//       What the routers do on real text: held-out token ids (u32 little-endian, windows of W)
//       through the model, per MoE layer: expert reuse between neighbouring tokens, the prefill
//       dedup factor at C = 32, and the recall of the read-ahead (token at a time and C = 32);
//       then the same on the random-weights demo checkpoint (written once into --contrast), each
//       figure beside what random routing gives.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bench_common.h"
#include "engine/engine.h"
#include "engine/internal.h"
#include "experts/expert_cache.h"
#include "model/compute.h"
#include "util/error.h"

namespace k3bench {
namespace {

// ---------------------------------------------------------------------------------------------
// routing: per-layer routing statistics of held-out text, trained routers against random ones

struct RoutingArgs : CommonOptions {
  std::string model_dir;     // the trained model
  std::string ids_path;      // u32 LE token ids, windows of `window`
  std::string contrast_dir;  // the random-weights demo checkpoint (written when missing)
  int64_t window = 128;
};

// Records every position's routed experts, per layer (calls come in position order per layer).
class RoutingRecorder final : public k3::LayerObserver {
 public:
  void on_tensor(int64_t, Site, const float*) override {}
  void on_routing(int64_t layer, const Routing& routing) override {
    if (layer >= static_cast<int64_t>(by_layer.size()))
      by_layer.resize(static_cast<size_t>(layer + 1));
    by_layer[static_cast<size_t>(layer)].emplace_back(routing.ids.begin(), routing.ids.end());
  }
  std::vector<std::vector<std::vector<int64_t>>> by_layer;  // [layer][position]: ids, ascending
};

struct LayerRouting {
  int64_t layer = 0;
  double reuse = 0, dedup = 0;  // means over token pairs / 32-token chunks
  double recall_c1 = std::nan(""),
         recall_c32 = std::nan("");  // nan: no prediction (first MoE layer)
  uint64_t selections_c1 = 0;
};

struct ModelRouting {
  std::string dir;
  int64_t experts = 0, top_k = 0, tokens = 0;
  std::string settings;
  std::vector<LayerRouting> layers;
  uint64_t prefetch_issued = 0, prefetch_used = 0;  // token at a time, one cache slot per layer
  // Random routing: k of E uniformly, independently per token.
  double chance_reuse() const { return static_cast<double>(top_k) / static_cast<double>(experts); }
  double chance_distinct(int64_t rows) const {  // expected distinct experts of `rows` tokens
    const double E = static_cast<double>(experts);
    return E * (1 - std::pow(1 - static_cast<double>(top_k) / E, static_cast<double>(rows)));
  }
  double chance_dedup(int64_t rows) const {
    return static_cast<double>(rows * top_k) / chance_distinct(rows);
  }
};

std::vector<int64_t> read_u32_ids(const std::string& path, int64_t window, int64_t vocab) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw k3::Error(path + ": cannot read the token id file");
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  if (bytes.size() % 4 != 0 || bytes.empty())
    throw k3::Error(path + ": " + std::to_string(bytes.size()) +
                    " bytes is not a whole number of u32 token ids");
  std::vector<int64_t> ids(bytes.size() / 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);  // little-endian host (x86-64)
    if (v >= vocab)
      throw k3::Error(path + ": token id " + std::to_string(v) + " at index " + std::to_string(i) +
                      " is outside the vocabulary (" + std::to_string(vocab) + ")");
    ids[i] = v;
  }
  if (static_cast<int64_t>(ids.size()) % window != 0)
    throw k3::Error(path + ": " + std::to_string(ids.size()) + " ids are not whole windows of " +
                    std::to_string(window) + " (--window)");
  return ids;
}

ModelRouting measure_routing(const std::string& dir, const std::string& ids_path, int64_t window,
                             const std::string& isa) {
  const std::string state =
      (fs::temp_directory_path() / ("k3_bench-state-" + std::to_string(::getpid()))).string();
  k3::LoadOptions load;  // the release defaults (what users run), experts streamed
  load.isa = isa;
  load.cache.expert_gb = 1e-9;  // one slot per layer: nearly every selection is a read
  load.cache.pin = false;
  load.cache.state_dir = state;  // the benchmark's routing never seeds a user's pins
  load.cache.prefetch = true;
  k3::Engine engine(dir, load);
  fs::remove_all(state);
  const k3::K3Config& c = k3::internal::config(engine);
  k3::ExpertCache& cache = k3::internal::model(engine).experts();
  const std::vector<int64_t> ids = read_u32_ids(ids_path, window, c.vocab_size);
  ModelRouting m;
  m.dir = dir;
  m.experts = c.num_experts;
  m.top_k = c.num_experts_per_token;
  m.tokens = static_cast<int64_t>(ids.size());
  m.settings = engine.describe();
  const int64_t C = 32;
  // Token at a time (decode-like: each token's read-ahead is its own), recording the routing;
  // the routing is the same for every chunk size (bit-identical rows).
  RoutingRecorder rec;
  std::vector<RoutingRecorder> per_window;
  const k3::ExpertCacheStats s0 = cache.stats();
  for (size_t w0 = 0; w0 < ids.size(); w0 += static_cast<size_t>(window)) {
    k3::Session session(engine, window + 1);
    session.set_prefill_chunk(1);
    per_window.emplace_back();
    k3::PrefillHooks hooks;
    hooks.observer = &per_window.back();
    session.prefill(std::span<const int64_t>(ids).subspan(w0, static_cast<size_t>(window)), hooks);
  }
  const k3::ExpertCacheStats s1 = cache.stats();
  m.prefetch_issued = s1.prefetch_issued - s0.prefetch_issued;
  m.prefetch_used = s1.prefetch_used - s0.prefetch_used;
  const std::vector<k3::ExpertCache::LayerRecall> r1 = cache.recall_by_layer();
  for (size_t w0 = 0; w0 < ids.size(); w0 += static_cast<size_t>(window)) {
    k3::Session session(engine, window + 1);
    session.set_prefill_chunk(C);
    session.prefill(std::span<const int64_t>(ids).subspan(w0, static_cast<size_t>(window)));
  }
  const std::vector<k3::ExpertCache::LayerRecall> r2 = cache.recall_by_layer();
  for (int64_t l = 0; l < static_cast<int64_t>(per_window.front().by_layer.size()); ++l) {
    if (per_window.front().by_layer[static_cast<size_t>(l)].empty()) continue;  // dense layer
    LayerRouting L;
    L.layer = l;
    double reuse = 0, dedup = 0;
    uint64_t pairs = 0, chunks = 0;
    for (const RoutingRecorder& wr : per_window) {
      const std::vector<std::vector<int64_t>>& pos = wr.by_layer[static_cast<size_t>(l)];
      for (size_t t = 1; t < pos.size(); ++t) {
        std::vector<int64_t> both;
        std::set_intersection(pos[t].begin(), pos[t].end(), pos[t - 1].begin(), pos[t - 1].end(),
                              std::back_inserter(both));
        reuse += static_cast<double>(both.size()) / static_cast<double>(m.top_k);
        ++pairs;
      }
      for (size_t t0 = 0; t0 < pos.size(); t0 += static_cast<size_t>(C)) {
        std::vector<int64_t> all;
        size_t picks = 0;
        for (size_t t = t0; t < std::min(pos.size(), t0 + static_cast<size_t>(C)); ++t) {
          all.insert(all.end(), pos[t].begin(), pos[t].end());
          picks += pos[t].size();
        }
        std::sort(all.begin(), all.end());
        all.erase(std::unique(all.begin(), all.end()), all.end());
        dedup += static_cast<double>(picks) / static_cast<double>(all.size());
        ++chunks;
      }
    }
    L.reuse = pairs ? reuse / static_cast<double>(pairs) : std::nan("");
    L.dedup = chunks ? dedup / static_cast<double>(chunks) : std::nan("");
    for (const k3::ExpertCache::LayerRecall& r : r1)
      if (r.layer == l) {
        L.recall_c1 =
            static_cast<double>(r.predicted_hits) / static_cast<double>(r.predicted_total);
        L.selections_c1 = r.predicted_total;
        for (const k3::ExpertCache::LayerRecall& q : r2)
          if (q.layer == l && q.predicted_total > r.predicted_total)
            L.recall_c32 = static_cast<double>(q.predicted_hits - r.predicted_hits) /
                           static_cast<double>(q.predicted_total - r.predicted_total);
      }
    m.layers.push_back(L);
  }
  return m;
}

// Prints one model's table and its RESULT lines; returns the means {reuse, dedup, recall C=1}.
std::array<double, 3> print_routing(const std::string& name, const ModelRouting& m,
                                    int64_t window) {
  const int64_t C = 32;
  std::printf("\n== %s: %s (%lld experts, top-%lld; %s)\n", name.c_str(), m.dir.c_str(),
              static_cast<long long>(m.experts), static_cast<long long>(m.top_k),
              m.settings.c_str());
  std::printf("   %lld held-out tokens in %lld windows of %lld; chance = random routing (k of E)\n",
              static_cast<long long>(m.tokens), static_cast<long long>(m.tokens / window),
              static_cast<long long>(window));
  std::printf("%-7s %8s %8s %10s %8s %12s %12s %8s\n", "layer", "reuse", "chance", "dedup C=32",
              "chance", "recall C=1", "recall C=32", "chance");
  double sums[4] = {0, 0, 0, 0};
  int counts[4] = {0, 0, 0, 0};
  auto pct = [](double v) {
    char b[32];
    if (std::isnan(v))
      std::snprintf(b, sizeof b, "-");
    else
      std::snprintf(b, sizeof b, "%.1f%%", 100 * v);
    return std::string(b);
  };
  const double chance_recall32 = m.chance_distinct(C) / static_cast<double>(m.experts);
  for (const LayerRouting& L : m.layers) {
    std::printf("%-7lld %8s %8s %9.2fx %7.2fx %12s %12s %8s\n", static_cast<long long>(L.layer),
                pct(L.reuse).c_str(), pct(m.chance_reuse()).c_str(), L.dedup, m.chance_dedup(C),
                pct(L.recall_c1).c_str(), pct(L.recall_c32).c_str(), pct(m.chance_reuse()).c_str());
    const double v[4] = {L.reuse, L.dedup, L.recall_c1, L.recall_c32};
    for (int i = 0; i < 4; ++i)
      if (!std::isnan(v[i])) sums[i] += v[i], ++counts[i];
  }
  double mean[4];
  for (int i = 0; i < 4; ++i) mean[i] = counts[i] ? sums[i] / counts[i] : std::nan("");
  std::printf("%-7s %8s %8s %9.2fx %7.2fx %12s %12s %8s\n", "mean", pct(mean[0]).c_str(),
              pct(m.chance_reuse()).c_str(), mean[1], m.chance_dedup(C), pct(mean[2]).c_str(),
              pct(mean[3]).c_str(), pct(m.chance_reuse()).c_str());
  std::printf(
      "   (recall chance: k/E for C=1, %.1f%% for C=32 = expected distinct experts of 32 random "
      "tokens / E; the first MoE layer has no read-ahead: nothing runs before it to predict "
      "from)\n",
      100 * chance_recall32);
  std::printf(
      "   read-ahead, token at a time, 1 cache slot per layer: %llu reads issued, %.1f%% of them "
      "used by their layer (%llu wasted)\n",
      static_cast<unsigned long long>(m.prefetch_issued),
      m.prefetch_issued
          ? 100.0 * static_cast<double>(m.prefetch_used) / static_cast<double>(m.prefetch_issued)
          : 0.0,
      static_cast<unsigned long long>(m.prefetch_issued - m.prefetch_used));
  const std::string n = "routing_" + name;
  add_result(n + "_reuse", mean[0], "fraction", mean[0]);
  add_result(n + "_reuse_chance", m.chance_reuse(), "fraction", m.chance_reuse());
  add_result(n + "_dedup_C32", mean[1], "x", mean[1]);
  add_result(n + "_dedup_C32_chance", m.chance_dedup(C), "x", m.chance_dedup(C));
  add_result(n + "_recall_C1", mean[2], "fraction", mean[2]);
  add_result(n + "_recall_C32", mean[3], "fraction", mean[3]);
  add_result(n + "_prefetch_used",
             m.prefetch_issued
                 ? static_cast<double>(m.prefetch_used) / static_cast<double>(m.prefetch_issued)
                 : std::nan(""),
             "fraction", std::nan(""));
  return {mean[0], mean[1], mean[2]};
}

int run_routing(const RoutingArgs& a) {
  const k3::Isa isa = apply_common_options(a);
  print_machine(isa);
  const ModelRouting trained = measure_routing(a.model_dir, a.ids_path, a.window, a.isa);
  const std::array<double, 3> t = print_routing("trained", trained, a.window);
  std::string contrast = a.contrast_dir;
  if (contrast.empty()) {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    contrast = ec ? "build/demo-model" : (exe.parent_path().parent_path() / "demo-model").string();
  }
  ensure_demo(contrast);
  const ModelRouting random = measure_routing(contrast, a.ids_path, a.window, a.isa);
  const std::array<double, 3> r = print_routing("random", random, a.window);
  std::printf(
      "\nover chance (trained / random-weights): reuse %.2fx / %.2fx, dedup C=32 %.2fx / %.2fx, "
      "recall C=1 %.2fx / %.2fx\n",
      t[0] / trained.chance_reuse(), r[0] / random.chance_reuse(), t[1] / trained.chance_dedup(32),
      r[1] / random.chance_dedup(32), t[2] / trained.chance_reuse(), r[2] / random.chance_reuse());
  print_results();
  return 0;
}

}  // namespace

Subcommand register_routing(CLI::App& app) {
  auto a = std::make_shared<RoutingArgs>();
  Command c(app, "routing",
            "per-layer expert reuse, prefill dedup and read-ahead recall on held-out text");
  c.option("--model", a->model_dir, "the trained checkpoint (e.g. assets/k3-mini)").required();
  c.option("--ids", a->ids_path,
           "held-out token ids, u32 little-endian (e.g. tests/data/k3-mini/heldout_text.u32)")
      .required();
  c.option("--window", a->window, "tokens per independent sequence").show_default();
  c.option("--contrast", a->contrast_dir,
           "the random-weights demo checkpoint, written when missing")
      .default_text("<build>/demo-model");
  add_common_options(c, *a);
  return {c.app(), [a] {
            if (a->window < 2) throw k3::Error("--window must be >= 2");
            return run_routing(*a);
          }};
}

}  // namespace k3bench

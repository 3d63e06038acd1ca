// bench/quality_bench.cpp — `k3_bench quality` (benchmarks, not tests).
//
//   k3_bench quality [--model DIR] [--fixtures DIR] [--write-bounds FILE] [--kda-chunked]
//                    [--isa I] [--threads N]
//       The real-text quality table of a trained checkpoint (default assets/k3-mini with
//       tests/data/k3-mini): held-out perplexity, KL and top-1 agreement against the exact
//       setting, greedy agreement over 64 tokens, KL and top-1 agreement against the training
//       model's float64 forward (oracle.safetensors), the routed picks kept, for every precision
//       setting (tools/quality_lib.h, docs/testing.md §5), as Markdown; --write-bounds writes the
//       gate's bounds file from it (refused when a row is outside its setting's ceiling).
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "engine/engine.h"
#include "quality_lib.h"
#include "util/error.h"

namespace k3bench {
namespace {

// ---------------------------------------------------------------------------------------------
// quality: the real-text quality table (tools/quality_lib.h)

struct QualityArgs : CommonOptions {
  std::string model_dir = std::string(K3_BENCH_SOURCE_DIR) + "/../assets/k3-mini";
  std::string fixtures = std::string(K3_BENCH_SOURCE_DIR) + "/../tests/data/k3-mini";
  std::string write_bounds;  // bounds file to write from the measurement ("" = none)
  bool kda_chunked = false;  // K3_KDA_CHUNKED for every row, the exact reference included
};

int run_quality(const QualityArgs& a) {
  namespace q = k3::quality;
  print_machine(apply_common_options(a));
  const q::Fixtures fixtures = q::Fixtures::load(a.fixtures);
  std::printf(
      "\n== quality of %s on %s (%zu held-out windows of %lld tokens, %zu prompts x %lld "
      "greedy tokens)\n",
      a.model_dir.c_str(), a.fixtures.c_str(), fixtures.windows.size(),
      static_cast<long long>(q::kWindowTokens), fixtures.prompts.size(),
      static_cast<long long>(q::kGreedyTokens));
  k3::LoadOptions base;
  base.isa = a.isa;
  base.experts_in_memory = true;
  base.cache.pin = false;
  base.kda_chunked = a.kda_chunked;
  if (a.kda_chunked)
    std::printf(
        "K3_KDA_CHUNKED=1: every row, the exact reference included, prefills with the "
        "chunk form of the KDA recurrence\n");
  const q::Reference ref(a.model_dir, fixtures, base);
  std::vector<q::Row> rows;
  for (const q::Setting& s : q::settings()) {
    rows.push_back(ref.measure(s));
    const q::Row& r = rows.back();
    std::printf("%s\n", q::summary(r).c_str());
    std::fflush(stdout);
    const std::string n = "quality_" + r.setting;
    add_result(n + "_ppl", r.ppl, "ppl", r.ppl / ref.row().ppl);
    add_result(n + "_kl_mean", r.kl_mean, "nats", std::nan(""));
    add_result(n + "_kl_max", r.kl_max, "nats", std::nan(""));
    add_result(n + "_top1", r.top1, "fraction", r.top1);
    add_result(n + "_greedy64", r.greedy, "fraction", r.greedy);
    add_result(n + "_oracle_kl_mean", r.oracle_kl_mean, "nats", std::nan(""));
    add_result(n + "_oracle_top1", r.oracle_top1, "fraction", r.oracle_top1);
    add_result(n + "_experts_kept", r.experts_kept, "fraction", r.experts_kept);
  }
  q::Bounds bounds;
  if (!a.write_bounds.empty()) {
    q::write_bounds(a.write_bounds, rows, fixtures.oracle.positions);
    bounds = q::read_bounds(a.write_bounds);
    std::printf(
        "\nwrote %s (ppl x 1.01, KL x 1.25 + 1e-6, top-1 - 0.02, greedy - 0.10, KL vs oracle x "
        "1.25 + 1e-9, top-1 vs oracle - 2 of %zu positions)\n",
        a.write_bounds.c_str(), fixtures.oracle.positions);
  }
  std::printf(
      "\n== Markdown (ppl: exp of the mean NLL of %lld held-out tokens; KL(exact || "
      "setting) per position in nats; top-1: argmax equal to exact's; greedy 64: "
      "fraction of 64 greedy tokens equal to exact's, first diff: mean first differing "
      "index; KL vs oracle, top-1 vs oracle: against the training model's float64 forward on "
      "%zu held-out positions; experts kept: routed picks made / top-k; in parentheses: %s)\n\n%s",
      static_cast<long long>(ref.row().positions), fixtures.oracle.positions,
      bounds.empty() ? "the ceiling" : "the bound · the ceiling",
      q::markdown(rows, bounds).c_str());
  print_results();
  return 0;
}

}  // namespace

Subcommand register_quality(CLI::App& app) {
  auto a = std::make_shared<QualityArgs>();
  Command c(app, "quality",
            "held-out perplexity, KL and agreement vs exact for every precision setting");
  c.option("--model", a->model_dir, "trained checkpoint").show_default();
  c.option("--fixtures", a->fixtures, "held-out fixtures (heldout_text.u32, ...)").show_default();
  c.option("--write-bounds", a->write_bounds,
           "write the gate's bounds file (tests/data/k3-mini/quality_bounds.json)");
  c.flag("--kda-chunked", a->kda_chunked,
         "every row with K3_KDA_CHUNKED (the chunk form of the KDA recurrence in prefill)");
  add_common_options(c, *a);
  return {c.app(), [a] { return run_quality(*a); }};
}

}  // namespace k3bench

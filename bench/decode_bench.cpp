// bench/decode_bench.cpp — `k3_bench decode` (benchmarks, not tests).
//
//   k3_bench decode [MODEL_DIR] [--layers N] [--experts E] [--tokens T] [--dir DIR]
//       Decode tokens/s with every expert in memory, with the per-stage breakdown, and prefill
//       tokens/s token at a time (K3_CHUNK=1) vs chunked (32) with the expert dedup factor. Without
//       MODEL_DIR a `k3_synth --preset slice` checkpoint is written once into DIR and reused.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "engine/engine.h"
#include "engine/internal.h"
#include "engine/sampler.h"
#include "experts/expert_cache.h"
#include "io/model_files.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3bench {
namespace {

// What one token costs, from config.json and the files' headers (the engine counts neither).
struct TokenCost {
  uint64_t dense_elements = 0;  // >= 2-D text tensors but the routed experts, embedding, head
  uint64_t head_elements = 0;   // lm_head: once per prefill (the last row), every decode step
  uint64_t expert_elements = 0, expert_bytes = 0;  // one routed expert (bytes: its RAM form)
  int64_t moe_layers = 0;
};

TokenCost token_cost(const std::string& dir, const k3::K3Config& c, int64_t num_layers) {
  TokenCost t;
  const k3::ModelFiles files(dir);
  for (const auto& shard : files.shards())
    for (const k3::TensorInfo& info : shard->tensors()) {
      if (info.shape.size() < 2 || k3::is_padding_tensor(info.name) ||
          k3::is_vision_tensor(info.name) ||
          info.name.find("block_sparse_moe.experts.") != std::string::npos ||
          info.name.ends_with("embed_tokens.weight"))
        continue;
      (info.name.ends_with("lm_head.weight") ? t.head_elements : t.dense_elements) += info.numel();
    }
  const k3::ExpertGeometry g{c.routed_expert_hidden_size, c.moe_intermediate_size};
  t.expert_bytes = g.expert_bytes();
  t.expert_elements = 3 * static_cast<uint64_t>(c.routed_expert_hidden_size) *
                      static_cast<uint64_t>(c.moe_intermediate_size);
  t.moe_layers = num_layers - std::min(num_layers, c.first_k_dense_replace);
  return t;
}

// ---------------------------------------------------------------------------------------------
// decode

struct DecodeArgs : CommonOptions {
  std::string model_dir;  // an existing checkpoint; empty = the cached slice
  int64_t layers = 2;
  int64_t experts = 16;
  int64_t tokens = 8;
  int64_t prefill = 32;  // one full chunk at C = 32
  double dram_gib = 1;   // the DRAM probe's array
  std::string dir;       // cache of the slice checkpoint
};

int run_decode(const DecodeArgs& a) {
  const k3::Isa isa = apply_common_options(a);
  print_machine(isa);
  std::string dir = a.model_dir;
  std::string name;
  if (dir.empty()) {
    dir = a.dir.empty() ? default_slice_dir() : a.dir;
    std::printf("\n== decode on a slice checkpoint (%lld layers, %lld experts)\n",
                static_cast<long long>(a.layers), static_cast<long long>(a.experts));
    ensure_slice(dir, a.layers, a.experts);
    name = "decode_slice_L" + std::to_string(a.layers) + "_E" + std::to_string(a.experts);
  } else {
    std::printf("\n== decode on %s\n", dir.c_str());
    name = "decode_model";
  }
  k3::LoadOptions load;
  load.isa = a.isa;
  load.experts_in_memory = true;
  k3::Engine engine(dir, load);
  std::printf("engine: %s, loaded in %.2f s (experts in memory)\n", engine.describe().c_str(),
              engine.load_seconds());
  const k3::K3Config& c = k3::internal::config(engine);
  std::printf("model: D %lld, %lld layers, vocab %lld\n", static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.vocab_size));

  const int64_t P = std::max<int64_t>(1, a.prefill);
  k3::Session session(engine, P + a.tokens + 2);
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < P; ++i) prompt.push_back(1 + (i * 7919) % (c.vocab_size - 1));
  // Prefill token at a time (C = 1) against chunked (C = 32): speed and routed-expert reads per
  // token (the chunk's dedup factor). Same logits by construction (chunked_prefill_test).
  // The floors: the DRAM probe for decode (every expert in RAM), the FMA peak for the chunked
  // prefill (bench/bench_common.h).
  double dram_cpu = 0;
  const double dram = dram_probe(
      static_cast<size_t>(a.dram_gib * static_cast<double>(size_t{1} << 30)), 5, &dram_cpu);
  const double fma = fma_peak_gflops(isa);
  // With integer dots (K3_IDOT=1, the default) the experts and the int4 / int8 matrices multiply
  // int8 activations by vpdpbusd (or vpmaddubsw): that peak is their roof, not the f32 FMA's.
  const bool idot = k3::internal::model(engine).load_options().idot;
  const double dot = idot ? int8_dot_peak_gops(isa) : 0;
  std::printf(
      "floors: DRAM read probe %.2f GB/s (cpu %.0f%%), FMA peak %.1f GFLOP/s%s (%s, %d threads)\n",
      dram, 100 * dram_cpu, fma,
      dot > 0 ? (", int8 dot peak " + std::to_string(static_cast<int64_t>(dot)) + " GOP/s").c_str()
              : "",
      k3::isa_name(isa), omp_get_max_threads());
  add_result(name + "_dram_probe", dram, "GB/s", 1.0, dram_cpu);
  add_result(name + "_fma_peak", fma, "GFLOP/s", std::nan(""));
  if (dot > 0) add_result(name + "_int8_dot_peak", dot, "GOP/s", std::nan(""));
  const TokenCost cost = token_cost(dir, c, engine.info().num_layers);
  double reads_per_token[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const int64_t chunk = k == 0 ? 1 : 32;
    k3::Session s(engine, P + 2);
    s.set_prefill_chunk(chunk);
    const double p0 = k3::now_seconds();
    s.prefill(prompt);
    const double ps = k3::now_seconds() - p0;
    reads_per_token[k] = static_cast<double>(s.stats().expert_reads) / static_cast<double>(P);
    std::printf("prefill C=%-2lld: %lld tokens in %.3f s = %.2f tok/s, %.1f expert reads/token\n",
                static_cast<long long>(chunk), static_cast<long long>(P), ps,
                static_cast<double>(P) / ps, reads_per_token[k]);
    add_result(name + "_prefill_C" + std::to_string(chunk), static_cast<double>(P) / ps, "tok/s",
               std::nan(""));
    if (chunk == 32) {
      // Multiply-adds of the weights (2 flops each): every prompt row through the dense
      // matrices and its k routed experts, the head once (the last row's logits); attention's
      // own products and the element-wise work are left out, so this is a lower bound.
      const double flops =
          2.0 * (static_cast<double>(P) *
                     (static_cast<double>(cost.dense_elements) +
                      static_cast<double>(c.num_experts_per_token * cost.moe_layers) *
                          static_cast<double>(cost.expert_elements)) +
                 static_cast<double>(cost.head_elements));
      const double gflops = flops / ps / 1e9;
      std::printf(
          "prefill C=32: %.2f GFLOP/s of weight multiply-adds = %.3fx the FMA peak (%lld rows per "
          "chunk%s)\n",
          gflops, gflops / fma, static_cast<long long>(std::min<int64_t>(P, 32)),
          P < 32 ? "; give --prefill >= 32 for full chunks" : "");
      add_result(name + "_prefill_C32_gflops", gflops, "GFLOP/s", gflops / fma);
      if (dot > 0) {
        std::printf(
            "  = %.3fx the int8 dot peak, the roof of the integer kernels it runs (K3_IDOT=1)\n",
            gflops / dot);
        add_result(name + "_prefill_C32_vs_int8_dot_peak", gflops / dot, "x", gflops / dot);
      }
    }
  }
  if (reads_per_token[1] > 0)
    add_result(name + "_prefill_dedup_C32", reads_per_token[0] / reads_per_token[1], "x",
               reads_per_token[0] / reads_per_token[1]);
  double t0 = k3::now_seconds();
  std::vector<float> logits = session.prefill(prompt);
  const double prefill_s = k3::now_seconds() - t0;
  const k3::StageStats before = k3::internal::stage_stats(session);
  const uint64_t reads_before = session.stats().expert_reads;

  std::vector<double> steps;
  const double cpu0 = process_cpu_seconds();
  t0 = k3::now_seconds();
  for (int64_t i = 0; i < a.tokens; ++i) {
    const double s0 = k3::now_seconds();
    logits = session.step(k3::argmax(logits));
    steps.push_back(k3::now_seconds() - s0);
  }
  const double dt = k3::now_seconds() - t0;
  const double cpu_share = (process_cpu_seconds() - cpu0) / (dt * omp_get_max_threads());
  k3::StageStats decode_stats = k3::internal::stage_stats(session);
  for (int i = 0; i < static_cast<int>(k3::Stage::kCount); ++i)
    decode_stats.seconds[i] -= before.seconds[i];
  std::sort(steps.begin(), steps.end());
  const double tps = static_cast<double>(a.tokens) / dt;
  std::printf("prefill: %lld tokens in %.3f s\n", static_cast<long long>(P), prefill_s);
  std::printf(
      "decode:  %lld tokens in %.3f s = %.2f tok/s (step best %.1f ms, median %.1f ms, cpu "
      "%.0f%%)\n",
      static_cast<long long>(a.tokens), dt, tps, steps.empty() ? 0.0 : steps.front() * 1e3,
      steps.empty() ? 0.0 : steps[steps.size() / 2] * 1e3, 100.0 * cpu_share);
  std::printf("decode stages: %s\n", decode_stats.summary().c_str());
  std::printf("peak RSS: %.2f GB\n", static_cast<double>(k3::peak_rss_bytes()) / 1e9);
  add_result(name, tps, "tok/s", std::nan(""));
  // Bytes read from RAM per token: the resident weights but the routed experts (all of them read
  // every step: attention, dense layers, shared experts, head) plus the routed experts the step
  // applied (the engine's expert_reads counter), in their RAM form. KV cache and KDA state reads
  // are left out (small at these lengths).
  {
    const double experts_per_token =
        static_cast<double>(session.stats().expert_reads - reads_before) /
        static_cast<double>(std::max<int64_t>(1, a.tokens));
    const double all_experts = static_cast<double>(cost.expert_bytes) *
                               static_cast<double>(c.num_experts * cost.moe_layers);
    const double dense = static_cast<double>(engine.info().resident_bytes) - all_experts;
    const double bytes = dense + experts_per_token * static_cast<double>(cost.expert_bytes);
    const double floor_tps = dram * 1e9 / bytes;
    std::printf(
        "decode bytes from RAM per token: %.2f MB (resident without routed experts %.2f MB + "
        "%.1f experts x %.2f MB); DRAM floor %.2f tok/s; measured = %.3fx the floor\n",
        bytes / 1e6, dense / 1e6, experts_per_token, static_cast<double>(cost.expert_bytes) / 1e6,
        floor_tps, tps / floor_tps);
    add_result(name + "_ram_bytes_per_token", bytes / 1e6, "MB", std::nan(""));
    add_result(name + "_vs_dram_floor", tps, "tok/s", tps / floor_tps, cpu_share);
  }
  // The check that nothing is sized for small models only (the slice has the released per-layer
  // dimensions; it moved here from tests/ because it writes ~9 GB): the last step's logits are
  // finite and equal the one-shot prefill of every id fed.
  int status = 0;
  if (a.tokens > 0) {
    const std::vector<int64_t> fed = session.tokens();
    k3::Session oneshot(engine, static_cast<int64_t>(fed.size()) + 1);
    const std::vector<float> want = oneshot.prefill(fed);
    double diff2 = 0, ref2 = 0;
    bool finite = logits.size() == want.size();
    for (size_t i = 0; finite && i < want.size(); ++i) {
      finite = std::isfinite(logits[i]);
      diff2 +=
          (static_cast<double>(logits[i]) - want[i]) * (static_cast<double>(logits[i]) - want[i]);
      ref2 += static_cast<double>(want[i]) * want[i];
    }
    const double rel = std::sqrt(diff2) / std::max(std::sqrt(ref2), 1e-30);
    status = finite && rel <= 1e-5 ? 0 : 1;
    std::printf(
        "check: the last decode step vs a one-shot prefill of the %zu ids: rel-L2 %.3g%s -> %s\n",
        fed.size(), rel, finite ? "" : " (non-finite logits)", status == 0 ? "ok" : "FAILED");
  }
  print_results();
  return status;
}

}  // namespace

Subcommand register_decode(CLI::App& app) {
  auto a = std::make_shared<DecodeArgs>();
  Command c(app, "decode", "decode tokens/s with every expert in memory");
  c.option("model_dir", a->model_dir, "an existing checkpoint").default_text("the cached slice");
  c.option("--layers", a->layers, "slice layers").show_default();
  c.option("--experts", a->experts, "slice routed experts").show_default();
  c.option("--tokens", a->tokens, "tokens to decode").show_default();
  c.option("--prefill", a->prefill, "prompt tokens before decoding").show_default();
  c.option("--dir", a->dir, "cache directory of the slice checkpoint")
      .default_text("<build>/bench-slice");
  c.option("--dram-gib", a->dram_gib, "the DRAM probe's array (GiB; well above the LLC)")
      .range(0.01, 64.0)
      .show_default();
  add_common_options(c, *a);
  return {c.app(), [a] {
            if (a->layers < 1 || a->experts < 1 || a->tokens < 1)
              throw k3::Error("--layers, --experts, --tokens must be >= 1");
            return run_decode(*a);
          }};
}

}  // namespace k3bench

// bench/vulkan_bench.cpp — `k3_bench vulkan` (benchmarks, not tests).
//
//   k3_bench vulkan [MODEL_DIR] [--preset tiny|demo|slice] [--layers N] [--experts E]
//                   [--tokens T] [--prefill P] [--dir DIR]
//       The Vulkan expert tier (docs/vulkan.md) on the device COLI_VULKAN would open: upload GB/s
//       and expert-batch ms on the model's expert shape, then prefill tok/s (C = 32) and decode
//       s/token with K3_IDOT=0, without the tier, with it (every expert resident after a warm-up
//       run: the device share), with prompt streaming (COLI_VK_PREFILL=on) and with the prompt's
//       dense matrices on the device (COLI_VK_DENSE=on). Without MODEL_DIR a
//       `k3_synth --preset` checkpoint (default demo: seconds on lavapipe) is written once into
//       DIR. On a CPU device (Mesa's lavapipe) the figures say nothing about a GPU's speed.
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
#include "model/vk_tier.h"
#include "util/error.h"
#include "util/sys.h"
#include "vk/mxfp4_device.h"

namespace k3bench {
namespace {

// ---------------------------------------------------------------------------------------------
// vulkan: the expert tier on the device COLI_VULKAN would open

struct VulkanArgs : CommonOptions {
  std::string model_dir;  // an existing checkpoint; empty = a k3_synth preset
  std::string preset = "demo";
  int64_t layers = -1, experts = -1;  // preset overrides (-1: the preset's)
  int64_t tokens = 8;
  int64_t prefill = 64;
  std::string dir;  // cache of the preset checkpoint
};

int run_vulkan(const VulkanArgs& a) {
  apply_common_options(a);
  print_machine(resolve_isa("auto"));
  std::string dir = a.model_dir;
  if (dir.empty()) {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    dir = !a.dir.empty() ? a.dir
          : ec           ? "build/bench-vulkan-" + a.preset
               : (exe.parent_path().parent_path() / ("bench-vulkan-" + a.preset)).string();
    ensure_preset(dir, a.preset, a.layers, a.experts);
  }
  // The device alone, on the model's expert shape.
  k3::LoadOptions exact = k3::LoadOptions::exact();  // K3_IDOT=0: the tier's numerics
  const std::string state = dir + "/.k3_bench-state";
  fs::create_directories(state);
  exact.cache.state_dir = state;
  k3::K3Config c;
  {
    const k3::Engine probe(dir, exact);
    c = k3::internal::config(probe);
  }
  const uint32_t R = static_cast<uint32_t>(c.routed_expert_hidden_size),
                 I = static_cast<uint32_t>(c.moe_intermediate_size);
  auto dev = k3::vk::Mxfp4Device::open({}, {R, I, static_cast<float>(c.activation_situ_beta),
                                            static_cast<float>(c.activation_situ_linear_beta)});
  std::printf("\n== vulkan: %s (%s, %s uploads), expert %u x %u\n", dev->name().c_str(),
              dev->is_cpu() ? "a CPU device" : "a GPU", dev->staged() ? "staged" : "mapped", R, I);
  if (dev->is_cpu())
    std::printf(
        "NOTE: %s is a CPU implementation of Vulkan (lavapipe): these figures are NOT GPU "
        "speed; they only show that the tier runs.\n",
        dev->name().c_str());
  const size_t mat = size_t{I} * R / 2, groups = size_t{I} * R / 32;
  std::vector<uint8_t> bytes(3 * mat + 3 * groups);
  fill_bytes(bytes.data(), 3 * mat, 1, 0, 255);
  fill_bytes(bytes.data() + 3 * mat, 3 * groups, 2, 120, 131);
  const uint8_t* p = bytes.data();
  const k3::vk::ExpertBytes e{
      p, p + 3 * mat, p + mat, p + 3 * mat + groups, p + 2 * mat, p + 3 * mat + 2 * groups};
  const int n_up = 16;
  std::vector<int32_t> slots;
  double t0 = k3::now_seconds();
  for (int i = 0; i < n_up; ++i) slots.push_back(dev->upload(e));
  const double up_s = k3::now_seconds() - t0;
  const double up_gbs = static_cast<double>(n_up) * static_cast<double>(bytes.size()) / up_s / 1e9;
  std::printf("upload: %d experts in %.3f s = %.2f GB/s (of the RAM form)\n", n_up, up_s, up_gbs);
  add_result("vulkan_upload", up_gbs, "GB/s", std::nan(""));
  for (const uint32_t rows : {1u, 32u}) {
    std::vector<k3::vk::Mxfp4Device::Group> batch;
    for (int32_t s : slots) batch.push_back({s, rows});
    const size_t P = slots.size() * rows;
    std::vector<float> z(P * R), out(P * R);
    fill_floats(z.data(), z.size(), 3);
    double best = 1e30;
    for (int pass = 0; pass < 3; ++pass) {
      t0 = k3::now_seconds();
      dev->issue(batch, z.data());
      if (!dev->join(out.data())) throw k3::Error("the Vulkan device was lost");
      best = std::min(best, k3::now_seconds() - t0);
    }
    std::printf("expert batch: %zu experts x %u rows in %.3f ms (best of 3)\n", slots.size(), rows,
                best * 1e3);
    add_result("vulkan_batch_" + std::to_string(slots.size()) + "x" + std::to_string(rows),
               best * 1e3, "ms", std::nan(""));
  }
  dev.reset();

  // The engine without the tier, with it, with prompt streaming, and with the dense matrices of
  // prompt chunks on the device too (COLI_VK_DENSE=on).
  const int64_t P = std::max<int64_t>(1, a.prefill);
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < P; ++i) prompt.push_back(1 + (i * 7919) % (c.vocab_size - 1));
  struct Config {
    const char* name;
    bool tier;
    const char* prefill;
    const char* dense;
  };
  std::vector<int64_t> cpu_tokens;
  int status = 0;
  for (const Config& cfg :
       {Config{"cpu", false, "off", "off"}, Config{"tier", true, "off", "off"},
        Config{"tier_stream", true, "on", "off"}, Config{"tier_dense", true, "off", "on"}}) {
    fs::remove_all(state);
    fs::create_directories(state);
    k3::LoadOptions load = exact;
    load.vulkan.enabled = cfg.tier;
    load.vulkan.tier_gb = 1e3;  // every expert fits (the device's memory permitting)
    load.vulkan.prefill = cfg.prefill;
    load.vulkan.dense = cfg.dense;
    const k3::Engine engine(dir, load);
    const k3::VkTier* tier = k3::internal::model(engine).vk_tier();
    // Warm-up: fills the tier (and the RAM cache) as a served model's first requests would.
    {
      k3::Session s(engine, P + a.tokens + 1);
      std::vector<float> logits = s.prefill(prompt);
      for (int64_t i = 0; i < a.tokens; ++i) logits = s.step(k3::argmax(logits));
    }
    const k3::VkTierStats before = tier ? tier->stats() : k3::VkTierStats{};
    k3::Session s(engine, P + a.tokens + 1);
    s.set_prefill_chunk(32);
    t0 = k3::now_seconds();
    std::vector<float> logits = s.prefill(prompt);
    const double prefill_s = k3::now_seconds() - t0;
    std::vector<int64_t> tokens;
    t0 = k3::now_seconds();
    for (int64_t i = 0; i < a.tokens; ++i) {
      tokens.push_back(k3::argmax(logits));
      logits = s.step(tokens.back());
    }
    const double per_token = (k3::now_seconds() - t0) / static_cast<double>(a.tokens);
    std::string share;
    if (tier) {
      const k3::VkTierStats st = tier->stats();
      const double served = static_cast<double>(st.pairs_served - before.pairs_served),
                   total = static_cast<double>(st.pairs_total - before.pairs_total);
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    ", device share %.1f%% (%llu residents, %llu streamed pairs, %llu dense "
                    "matmuls)",
                    total > 0 ? 100.0 * served / total : 0.0,
                    static_cast<unsigned long long>(st.residents),
                    static_cast<unsigned long long>(st.streamed_pairs - before.streamed_pairs),
                    static_cast<unsigned long long>(st.dense_matmuls - before.dense_matmuls));
      share = buf;
      add_result(std::string("vulkan_") + cfg.name + "_device_share",
                 total > 0 ? served / total : 0.0, "x", std::nan(""));
    }
    std::printf("%-11s prefill %lld tokens (C=32) %.2f tok/s, decode %.4f s/token%s\n", cfg.name,
                static_cast<long long>(P), static_cast<double>(P) / prefill_s, per_token,
                share.c_str());
    add_result(std::string("vulkan_") + cfg.name + "_prefill", static_cast<double>(P) / prefill_s,
               "tok/s", std::nan(""));
    add_result(std::string("vulkan_") + cfg.name + "_decode", per_token, "s/token", std::nan(""));
    if (!tier) {
      cpu_tokens = tokens;
    } else if (tokens != cpu_tokens) {
      std::printf("check: %s greedy tokens differ from the CPU run's -> FAILED\n", cfg.name);
      status = 1;
    }
  }
  fs::remove_all(state);
  if (status == 0) std::printf("check: the greedy tokens of every run equal the CPU run's -> ok\n");
  print_results();
  return status;
}

}  // namespace

Subcommand register_vulkan(CLI::App& app) {
  auto a = std::make_shared<VulkanArgs>();
  Command c(app, "vulkan",
            "the Vulkan expert tier: upload GB/s, expert-batch ms, prefill and decode with "
            "and without it (lavapipe: not GPU speed)");
  c.option("model_dir", a->model_dir, "an existing checkpoint").default_text("a k3_synth preset");
  c.option("--preset", a->preset, "k3_synth preset written when no MODEL_DIR")
      .one_of({"tiny", "demo", "slice"})
      .show_default();
  c.option("--layers", a->layers, "preset layers (-1: the preset's)").show_default();
  c.option("--experts", a->experts, "preset routed experts (-1: the preset's)").show_default();
  c.option("--tokens", a->tokens, "decode tokens per run").show_default();
  c.option("--prefill", a->prefill, "prompt tokens per run").show_default();
  c.option("--dir", a->dir, "cache directory of the preset checkpoint")
      .default_text("<build>/bench-vulkan-<preset>");
  add_common_options(c, *a, /*with_isa=*/false);  // the tier's numerics: K3_IDOT=0, best ISA
  return {c.app(), [a] {
            if (a->tokens < 1 || a->prefill < 1)
              throw k3::Error("--tokens, --prefill must be >= 1");
            return run_vulkan(*a);
          }};
}

}  // namespace k3bench

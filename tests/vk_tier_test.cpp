// vk_tier_test — the Vulkan expert tier behind the MoE step's seam (model/vk_tier.h,
// docs/vulkan.md §5) on the device VK_ICD_FILENAMES selects (lavapipe, tests/CMakeLists.txt): with
// K3_IDOT=0 and the tier on, k3-tiny matches Moonshot's goldens at the f32 tolerance and gives the
// CPU run's greedy tokens, prefill chunked and decode, with a non-zero count of pairs the device
// served (a silent fallback fails); under a 2-expert budget; after a lost device (the tier turns
// off, the tokens do not change). A machine without the loader or a driver fails: never skips.
#include "model/vk_tier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/internal.h"
#include "engine/sampler.h"
#include "test_util.h"

namespace {

const bool kTierOnLavapipe = (k3::testing::select_lavapipe(), true);

using k3::testing::TempDir;
using k3::testing::Tensors;

using k3::testing::kTinyDir;

struct Outcome {
  std::vector<float> prompt_logits;  // [T][vocab]
  std::vector<float> decode_logits;  // [steps][vocab]
  std::vector<int64_t> tokens;       // greedy
};

// The golden prompt prefilled in chunks of `chunk`, then `steps` greedy tokens.
Outcome run(const k3::Engine& engine, const std::vector<int64_t>& prompt, size_t steps,
            int64_t chunk, const std::function<void(size_t)>& before_step = nullptr) {
  Outcome r;
  k3::Session s(engine, static_cast<int64_t>(prompt.size() + steps));
  s.set_prefill_chunk(chunk);
  k3::PrefillHooks hooks;
  hooks.all_logits = &r.prompt_logits;
  std::vector<float> logits = s.prefill(prompt, hooks);
  for (size_t j = 0; j < steps; ++j) {
    r.decode_logits.insert(r.decode_logits.end(), logits.begin(), logits.end());
    r.tokens.push_back(k3::argmax(logits));
    if (j + 1 < steps) {
      if (before_step) before_step(j);
      logits = s.step(r.tokens.back());
    }
  }
  return r;
}

k3::LoadOptions tier_load(const TempDir& state, double tier_gb) {
  k3::LoadOptions load = k3::LoadOptions::exact();  // K3_IDOT=0: the tier's numerics
  load.cache.state_dir = state.path();              // no routing history from elsewhere
  load.vulkan.enabled = true;
  load.vulkan.tier_gb = tier_gb;
  load.vulkan.validation = true;  // Khronos validation: every test ends with no error from it
  return load;
}

const k3::VkTier& tier_of(const k3::Engine& engine) {
  const k3::VkTier* tier = k3::internal::model(engine).vk_tier();
  EXPECT_NE(tier, nullptr);
  return *tier;
}

class VkTier : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    golden_ = new Tensors(kTinyDir + "/golden.safetensors");
    const TempDir state("vk-tier-cpu");
    k3::LoadOptions load = k3::LoadOptions::exact();
    load.cache.state_dir = state.path();
    const k3::Engine cpu(kTinyDir, load);
    cpu_ = new Outcome(run(cpu, golden_->i64("prompt_ids"), 8, 32));
  }
  static void TearDownTestSuite() {
    delete golden_;
    delete cpu_;
  }
  static Tensors* golden_;
  static Outcome* cpu_;
};
Tensors* VkTier::golden_ = nullptr;
Outcome* VkTier::cpu_ = nullptr;

TEST_F(VkTier, MatchesTheGoldensAndTheCpuTokensWithTheDeviceServing) {
  const TempDir state("vk-tier");
  const k3::Engine engine(kTinyDir, tier_load(state, 1.0));
  const auto prompt = golden_->i64("prompt_ids");
  const auto want_prompt = golden_->f32("logits"), want_decode = golden_->f32("decode_logits");
  // The first run fills the tier as the CPU computes experts; the second finds them resident.
  // Chunks of 5 rows (7 + 5 of the prompt: GEMV route) and of 32 (the whole prompt in one).
  for (int64_t chunk : {int64_t{5}, int64_t{32}}) {
    for (int pass = 0; pass < 2; ++pass) {
      const k3::VkTierStats before = tier_of(engine).stats();
      const Outcome got = run(engine, prompt, 8, chunk);
      const k3::VkTierStats after = tier_of(engine).stats();
      const std::string what = "chunk " + std::to_string(chunk) + " pass " + std::to_string(pass);
      ASSERT_EQ(got.prompt_logits.size(), want_prompt.size()) << what;
      k3::testing::expect_close("logits " + what, got.prompt_logits.data(), want_prompt.data(),
                                want_prompt.size());
      k3::testing::expect_close("decode_logits " + what, got.decode_logits.data(),
                                want_decode.data(), want_decode.size());
      EXPECT_EQ(got.tokens, golden_->i64("decode_ids")) << what;
      EXPECT_EQ(got.tokens, cpu_->tokens) << what;
      if (pass == 1) {
        EXPECT_GT(after.pairs_served, before.pairs_served) << what;
      }
    }
  }
  const k3::VkTierStats s = tier_of(engine).stats();
  std::printf("device %s: %llu of %llu routed pairs served, %llu residents, %llu uploads\n",
              s.device.c_str(), static_cast<unsigned long long>(s.pairs_served),
              static_cast<unsigned long long>(s.pairs_total),
              static_cast<unsigned long long>(s.residents),
              static_cast<unsigned long long>(s.uploads));
  EXPECT_GT(s.pairs_served, 0u);
  EXPECT_FALSE(s.off);
  EXPECT_EQ(s.validation_errors, 0u);
  const std::string line = engine.describe_device();
  const std::string head = "[VK] " + s.device + " | " + std::to_string(s.pairs_served) + " of " +
                           std::to_string(s.pairs_total) + " routed pairs on the device";
  EXPECT_EQ(line.rfind(head, 0), 0u) << line;
}

TEST_F(VkTier, TwoExpertBudgetStagedKeepsTwoAndTheTokens) {
  const TempDir state("vk-tier-2");
  const double expert_bytes = 3 * (64 * 32 / 2) + 3 * (64 * 32 / 32) * 4;  // k3-tiny, f32 scales
  k3::LoadOptions load = tier_load(state, 2.5 * expert_bytes / 1e9);
  load.vulkan.staged = "1";  // uploads through the staging copy, as on a GPU without a BAR window
  load.vulkan.sync = true;
  const k3::Engine engine(kTinyDir, load);
  const auto prompt = golden_->i64("prompt_ids");
  for (int pass = 0; pass < 2; ++pass) {
    const Outcome got = run(engine, prompt, 8, 1);
    EXPECT_EQ(got.tokens, cpu_->tokens);
    k3::testing::expect_close("decode_logits", got.decode_logits.data(), cpu_->decode_logits.data(),
                              cpu_->decode_logits.size());
  }
  const k3::VkTierStats s = tier_of(engine).stats();
  EXPECT_EQ(s.budget, 2u);
  EXPECT_EQ(s.residents, 2u);
  EXPECT_EQ(s.uploads, 2u + s.evictions);
  EXPECT_GT(s.evictions, 0u);  // a hotter expert displaced a resident (sync: every run alike)
  EXPECT_EQ(s.validation_errors, 0u);
  EXPECT_GT(s.pairs_served, 0u);
}

TEST_F(VkTier, WarmStartUploadsTheHistorysHottestExperts) {
  const TempDir state("vk-tier-warm");
  const auto prompt = golden_->i64("prompt_ids");
  std::vector<std::vector<uint64_t>> usage;
  {
    k3::LoadOptions load = k3::LoadOptions::exact();
    load.cache.state_dir = state.path();
    const k3::Engine cpu(kTinyDir, load);
    run(cpu, prompt, 8, 32);
    EXPECT_EQ(cpu.describe_device(), "");  // no tier, no [VK] line
    const k3::Model& model = k3::internal::model(cpu);
    ASSERT_TRUE(model.experts().save_history());
    for (int64_t l = 1; l < model.num_layers(); ++l) usage.push_back(model.experts().usage(l));
  }
  // Budget 2: the two hottest (layer, expert) pairs of the history (the layer's count over its
  // hottest), before any token runs.
  const double expert_bytes = 3 * (64 * 32 / 2) + 3 * (64 * 32 / 32) * 4;
  const k3::Engine engine(kTinyDir, tier_load(state, 2.5 * expert_bytes / 1e9));
  const k3::VkTier& tier = tier_of(engine);
  EXPECT_EQ(tier.stats().uploads, 2u);
  EXPECT_EQ(tier.stats().residents, 2u);
  size_t hottest_held = 0;
  for (size_t l = 0; l < usage.size(); ++l) {
    const uint64_t top = *std::max_element(usage[l].begin(), usage[l].end());
    for (size_t e = 0; e < usage[l].size(); ++e)
      if (tier.holds(static_cast<int64_t>(l + 1), static_cast<int64_t>(e))) {
        EXPECT_EQ(usage[l][e], top) << "layer " << l + 1 << " expert " << e;
        ++hottest_held;
      }
  }
  EXPECT_EQ(hottest_held, 2u);
  const Outcome got = run(engine, prompt, 8, 32);
  EXPECT_EQ(got.tokens, cpu_->tokens);
  EXPECT_GT(tier.stats().pairs_served, 0u);
}

// kimi_k3 with COLI_VULKAN=1 prints the [VK] line, says why a budget holds no expert, and says
// that K3_IDOT=1 and the device's f32 differ.
TEST_F(VkTier, RunSummaryHasTheVkLineAndATooSmallBudgetIsSaid) {
  const TempDir state("vk-tier-cli");
  const std::string kimi = std::string(K3_BINARY_DIR) + "/apps/kimi_k3";
  const std::string env = "K3_STATE_DIR=" + state.path() + " K3_IDOT=0 COLI_VULKAN=1 ";
  const k3::testing::CommandResult served = k3::testing::run_split(
      env + "COLI_VK_TIER_GB=1 " + kimi + " " + kTinyDir + " --ids 5,17,3,99 --ngen 6");
  ASSERT_EQ(served.status, 0) << served.err;
  EXPECT_NE(served.err.find("[VK] "), std::string::npos) << served.err;
  EXPECT_NE(served.err.find(" routed pairs on the device"), std::string::npos) << served.err;
  const k3::testing::CommandResult tiny = k3::testing::run_split(
      env + "COLI_VK_TIER_GB=0.000001 " + kimi + " " + kTinyDir + " --ids 5,17,3,99 --ngen 2");
  ASSERT_EQ(tiny.status, 0) << tiny.err;
  EXPECT_NE(tiny.err.find("no room for one expert"), std::string::npos) << tiny.err;
  EXPECT_NE(tiny.err.find("COLI_VK_TIER_GB"), std::string::npos) << tiny.err;
  EXPECT_EQ(served.err.find("may drift"), std::string::npos) << served.err;
  // With the integer-dot CPU path the run says that the device's f32 numerics differ.
  const k3::testing::CommandResult idot =
      k3::testing::run_split("K3_STATE_DIR=" + state.path() + " COLI_VULKAN=1 COLI_VK_TIER_GB=1 " +
                             kimi + " " + kTinyDir + " --ids 5,17,3,99 --ngen 2");
  ASSERT_EQ(idot.status, 0) << idot.err;
  EXPECT_NE(idot.err.find("tokens may drift from a CPU-only run"), std::string::npos) << idot.err;
}

// The budget's sources in order: COLI_VK_TIER_GB, COLI_VK_DEVICE_CAP_MB, VK_EXT_memory_budget's
// free bytes (not the heap) when offered, else the heap; less the reserve and the staging slots.
TEST(VkTierBudget, SizedByTheFirstSourceThatIsSet) {
  k3::VulkanOptions o;
  o.prefill = "off";
  o.reserve_gb = 1;
  const uint64_t heap = 80'000'000'000, free = 50'000'000'000;
  k3::VkTierBudget b = k3::size_vk_tier_budget(o, 1000, free, heap, false);
  EXPECT_EQ(b.source, "VK_EXT_memory_budget");
  EXPECT_DOUBLE_EQ(b.bytes, 49e9);
  b = k3::size_vk_tier_budget(o, 1000, std::nullopt, heap, false);
  EXPECT_EQ(b.source, "heap");
  EXPECT_DOUBLE_EQ(b.bytes, 79e9);
  b = k3::size_vk_tier_budget(o, 1000, std::nullopt, heap, true);  // CPU device: a quarter
  EXPECT_DOUBLE_EQ(b.bytes, 19e9);
  o.prefill = "auto";
  o.prefill_slots = 64;
  b = k3::size_vk_tier_budget(o, 1'000'000, free, heap, false);
  EXPECT_DOUBLE_EQ(b.bytes, 49e9 - 64e6);  // the staging regions set aside
  o.device_cap_mb = 3;
  b = k3::size_vk_tier_budget(o, 1000, free, heap, false);
  EXPECT_EQ(b.source, "COLI_VK_DEVICE_CAP_MB");
  EXPECT_DOUBLE_EQ(b.bytes, 3.0 * (1 << 20));
  o.tier_gb = 2;
  b = k3::size_vk_tier_budget(o, 1000, free, heap, false);
  EXPECT_EQ(b.source, "COLI_VK_TIER_GB");
  EXPECT_DOUBLE_EQ(b.bytes, 2e9);
}

// One k3-tiny expert's device bytes (f32 scales): budgets in experts.
constexpr double kExpertBytes = 3 * (64 * 32 / 2) + 3 * (64 * 32 / 32) * 4;

// The (layer, expert) pairs resident on the device now.
std::vector<std::pair<int64_t, int64_t>> residents(const k3::Engine& engine) {
  const k3::Model& model = k3::internal::model(engine);
  std::vector<std::pair<int64_t, int64_t>> held;
  for (int64_t l = 0; l < model.num_layers(); ++l)
    for (int64_t e = 0; e < model.config().num_experts; ++e)
      if (tier_of(engine).holds(l, e)) held.emplace_back(l, e);
  return held;
}

// COLI_VK_TIER_RATE: no forward step queues more promotions than the rate; the others are
// counted as skipped, and the tokens stay the CPU's.
TEST_F(VkTier, RateLimitsPromotionsPerTokenAndCountsTheSkipped) {
  const TempDir state("vk-tier-rate");
  k3::LoadOptions load = tier_load(state, 1.0);
  load.vulkan.rate = 1;
  load.vulkan.sync = true;
  const k3::Engine engine(kTinyDir, load);
  const auto prompt = golden_->i64("prompt_ids");
  std::vector<uint64_t> promotions;
  const Outcome got = run(engine, prompt, 8, 1, [&](size_t) {
    promotions.push_back(tier_of(engine).stats().promotions);
  });
  promotions.push_back(tier_of(engine).stats().promotions);
  EXPECT_EQ(got.tokens, cpu_->tokens);
  // One token per forward step: the prompt's 12 steps and 7 decode steps, one promotion each.
  EXPECT_LE(promotions.front(), prompt.size());
  for (size_t j = 1; j < promotions.size(); ++j)
    EXPECT_LE(promotions[j] - promotions[j - 1], 1u) << "decode step " << j;
  const k3::VkTierStats s = tier_of(engine).stats();
  EXPECT_GT(s.skipped, 0u);
  EXPECT_GT(s.promotions, 0u);
  EXPECT_LT(s.residents, s.budget);  // the rate, not the budget, held them back
  EXPECT_EQ(s.validation_errors, 0u);
}

// An upload the device refuses is counted and leaves the budget as it was; later uploads fill it.
TEST_F(VkTier, RefusedUploadsKeepTheBudgetAndLaterUploadsFillIt) {
  const TempDir state("vk-tier-refused");
  k3::LoadOptions load = tier_load(state, 4.5 * kExpertBytes / 1e9);
  load.vulkan.sync = true;
  const k3::Engine engine(kTinyDir, load);
  const_cast<k3::VkTier&>(tier_of(engine)).refuse_uploads(3);
  const auto prompt = golden_->i64("prompt_ids");
  const Outcome got = run(engine, prompt, 8, 1);
  EXPECT_EQ(got.tokens, cpu_->tokens);
  const k3::VkTierStats s = tier_of(engine).stats();
  EXPECT_EQ(s.refused, 3u);
  EXPECT_EQ(s.budget, 4u);
  EXPECT_EQ(s.residents, 4u);
  EXPECT_EQ(s.uploads, 4u + s.evictions);
  EXPECT_GT(s.pairs_served, 0u);
}

// COLI_VK_TIER_SYNC: residency depends only on the routing: two runs, and a third whose uploads
// are slow, hold the same experts after every token.
TEST_F(VkTier, SyncModeGivesTheSameResidencyEveryRun) {
  const auto prompt = golden_->i64("prompt_ids");
  std::vector<std::vector<std::pair<int64_t, int64_t>>> runs[3];
  for (int r = 0; r < 3; ++r) {
    const TempDir state("vk-tier-sync");
    k3::LoadOptions load = tier_load(state, 3.5 * kExpertBytes / 1e9);
    load.vulkan.sync = true;
    load.vulkan.rate = 2;
    const k3::Engine engine(kTinyDir, load);
    if (r == 2) const_cast<k3::VkTier&>(tier_of(engine)).delay_uploads(20);
    const Outcome got =
        run(engine, prompt, 8, 1, [&](size_t) { runs[r].push_back(residents(engine)); });
    EXPECT_EQ(got.tokens, cpu_->tokens);
    EXPECT_EQ(tier_of(engine).stats().residents, 3u);
  }
  ASSERT_FALSE(runs[0].back().empty());
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);  // the slow uploads are waited for
}

// COLI_VK_PREFILL=on: a chunked prompt streams its cold experts through staging regions: the CPU
// f32 run's logits and tokens, pairs streamed, and no expert made resident by the prompt (the
// decode set is not flushed); decode then promotes as before.
TEST_F(VkTier, PromptChunksStreamColdExpertsWithoutPromotingThem) {
  const TempDir state("vk-tier-stream");
  k3::LoadOptions load = tier_load(state, 2.5 * kExpertBytes / 1e9);
  load.vulkan.prefill = "on";
  load.vulkan.sync = true;
  const k3::Engine engine(kTinyDir, load);
  EXPECT_EQ(tier_of(engine).stream_rows(), 1u);
  const auto prompt = golden_->i64("prompt_ids");
  const auto want_prompt = golden_->f32("logits");
  k3::VkTierStats after_prompt;
  std::vector<std::pair<int64_t, int64_t>> held_after_prompt;
  const Outcome got = run(engine, prompt, 8, 5, [&](size_t j) {
    if (j > 0) return;
    after_prompt = tier_of(engine).stats();
    held_after_prompt = residents(engine);
  });
  ASSERT_EQ(got.prompt_logits.size(), want_prompt.size());
  k3::testing::expect_close("logits", got.prompt_logits.data(), want_prompt.data(),
                            want_prompt.size());
  EXPECT_EQ(got.tokens, cpu_->tokens);
  EXPECT_GT(after_prompt.streamed_pairs, 0u);
  EXPECT_EQ(after_prompt.streamed_pairs, after_prompt.pairs_total);  // every prompt pair
  EXPECT_EQ(after_prompt.promotions, 0u);
  EXPECT_TRUE(held_after_prompt.empty());
  const k3::VkTierStats s = tier_of(engine).stats();
  EXPECT_EQ(s.streamed_pairs, after_prompt.streamed_pairs);  // decode rows are not streamed
  EXPECT_EQ(s.residents, 2u);
  EXPECT_EQ(s.validation_errors, 0u);
  // On lavapipe (a CPU device) the automatic choice never streams.
  const TempDir state2("vk-tier-stream-auto");
  const k3::Engine automatic(kTinyDir, tier_load(state2, 1.0));
  EXPECT_EQ(tier_of(automatic).stream_rows(), 0u);
  EXPECT_EQ(tier_of(automatic).stats().budget_source, "COLI_VK_TIER_GB");
  // Sized by nothing but the device: lavapipe lacks VK_EXT_memory_budget, so the heap.
  const TempDir state3("vk-tier-heap");
  const k3::Engine by_heap(kTinyDir, tier_load(state3, 0));
  EXPECT_EQ(tier_of(by_heap).stats().budget_source, "heap");
  EXPECT_NE(engine.describe_device().find("(COLI_VK_TIER_GB)"), std::string::npos);
  EXPECT_NE(by_heap.describe_device().find("(heap)"), std::string::npos);
}

// `k3_bench vulkan` runs the tier on a tiny synthetic model, says that lavapipe's figures are not
// GPU speed, reports the device share, and finds the CPU run's tokens with the tier on.
TEST_F(VkTier, BenchRunsAndSaysLavapipeIsNotGpuSpeed) {
  if (!K3_BUILD_BENCH) return;  // configured without the benchmarks (as tests/cli_test.cpp)
  const TempDir dir("vk-bench");
  const k3::testing::CommandResult r = k3::testing::run_split(
      std::string(K3_BINARY_DIR) + "/bench/k3_bench vulkan --preset tiny --tokens 2 --prefill 8 " +
      "--threads 1 --dir " + dir.path() + "/model");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("these figures are NOT GPU speed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("RESULT vulkan_upload "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("RESULT vulkan_tier_device_share "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("RESULT vulkan_tier_stream_prefill "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("RESULT vulkan_tier_dense_prefill "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("equal the CPU run's -> ok"), std::string::npos) << r.out;
}

// COLI_VK_DENSE=on: the dense matrices (all but the head and the routers) go to the device at
// load, and a prompt chunk of COLI_VK_DENSE_ROWS rows or more computes them there: the goldens at
// the f32 tolerance and the CPU run's tokens, with a non-zero count of device matmuls (a silent
// fallback fails); chunks below the rows and decode steps stay on the CPU; a batched decode step
// never uses them (each row equals its solo step); `auto` leaves lavapipe (no discrete GPU)
// without them; a lost device hands the matrix back to the CPU and keeps the tokens.
TEST_F(VkTier, DenseMatricesOfPromptChunksRunOnTheDevice) {
  const TempDir state("vk-tier-dense");
  k3::LoadOptions load = tier_load(state, 1.0);
  load.vulkan.dense = "on";
  load.vulkan.dense_rows = 4;
  const k3::Engine engine(kTinyDir, load);
  const auto prompt = golden_->i64("prompt_ids");
  const auto want_prompt = golden_->f32("logits"), want_decode = golden_->f32("decode_logits");
  const k3::VkTierStats loaded = tier_of(engine).stats();
  EXPECT_GT(loaded.dense_matrices, 0u);
  EXPECT_GT(loaded.dense_bytes, 0u);
  EXPECT_EQ(loaded.dense_matmuls, 0u);
  for (int64_t chunk : {int64_t{5}, int64_t{32}}) {
    const k3::VkTierStats before = tier_of(engine).stats();
    const Outcome got = run(engine, prompt, 8, chunk);
    const k3::VkTierStats after = tier_of(engine).stats();
    const std::string what = "chunk " + std::to_string(chunk);
    ASSERT_EQ(got.prompt_logits.size(), want_prompt.size()) << what;
    k3::testing::expect_close("logits " + what, got.prompt_logits.data(), want_prompt.data(),
                              want_prompt.size());
    k3::testing::expect_close("decode_logits " + what, got.decode_logits.data(), want_decode.data(),
                              want_decode.size());
    EXPECT_EQ(got.tokens, cpu_->tokens) << what;
    EXPECT_GT(after.dense_matmuls, before.dense_matmuls) << what;
    // 12 prompt rows: chunks of 5 give 5 + 5 (device) + 2 (CPU); one chunk of 12 (device).
    EXPECT_EQ(after.dense_rows - before.dense_rows,
              (after.dense_matmuls - before.dense_matmuls) * (chunk == 5 ? 5u : 12u))
        << what;
  }
  // Chunks of 3 rows (below COLI_VK_DENSE_ROWS) and every decode step: the CPU.
  const k3::VkTierStats before_small = tier_of(engine).stats();
  EXPECT_EQ(run(engine, prompt, 8, 3).tokens, cpu_->tokens);
  EXPECT_EQ(tier_of(engine).stats().dense_matmuls, before_small.dense_matmuls);
  // A batched decode step of 6 sessions (6 >= 4 rows) stays on the CPU: each row equals its solo
  // step (no expert uploads, so residency does not change between the two).
  {
    const TempDir state4("vk-tier-dense-batch");
    k3::LoadOptions fixed = load;
    fixed.cache.state_dir = state4.path();
    fixed.vulkan.rate = 0;
    const k3::Engine still(kTinyDir, fixed);
    std::vector<std::unique_ptr<k3::Session>> sessions;
    std::vector<k3::Session*> ptrs;
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 6; ++i) {
      sessions.push_back(std::make_unique<k3::Session>(still, 8));
      sessions.back()->prefill(std::vector<int64_t>{prompt[static_cast<size_t>(i)]});
      ptrs.push_back(sessions.back().get());
      ids.push_back(prompt[static_cast<size_t>(i) + 1]);
    }
    const k3::VkTierStats before_batch = tier_of(still).stats();
    k3::Batch batch(still);
    batch.step(ptrs, ids);
    EXPECT_EQ(tier_of(still).stats().dense_matmuls, before_batch.dense_matmuls);
    for (int64_t i = 0; i < 6; ++i) {
      k3::Session solo(still, 8);
      solo.prefill(std::vector<int64_t>{prompt[static_cast<size_t>(i)]});
      const std::vector<float> want = solo.step(ids[static_cast<size_t>(i)]);
      const std::vector<float> got = sessions[static_cast<size_t>(i)]->logits();
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
          << "session " << i;
    }
  }
  const k3::VkTierStats s = tier_of(engine).stats();
  EXPECT_EQ(s.validation_errors, 0u);
  EXPECT_FALSE(s.off);
  EXPECT_NE(
      engine.describe_device().find(" | dense " + std::to_string(s.dense_matrices) + " matrices"),
      std::string::npos)
      << engine.describe_device();
  std::printf("dense: %llu matrices, %llu bytes, %llu matmuls, %llu rows\n",
              static_cast<unsigned long long>(s.dense_matrices),
              static_cast<unsigned long long>(s.dense_bytes),
              static_cast<unsigned long long>(s.dense_matmuls),
              static_cast<unsigned long long>(s.dense_rows));
  // auto: lavapipe is no discrete GPU, so no dense matrix goes there.
  const TempDir state2("vk-tier-dense-auto");
  const k3::Engine automatic(kTinyDir, tier_load(state2, 1.0));
  EXPECT_EQ(tier_of(automatic).stats().dense_matrices, 0u);
  EXPECT_EQ(automatic.describe_device().find(" | dense "), std::string::npos);
  // A device lost in a dense matmul: the CPU computes it, the tier turns off, the tokens stay.
  const TempDir state3("vk-tier-dense-lost");
  const k3::Engine lost(kTinyDir, load);
  tier_of(lost).inject_device_loss();
  const Outcome after_loss = run(lost, prompt, 8, 32);
  EXPECT_EQ(after_loss.tokens, cpu_->tokens);
  k3::testing::expect_close("logits after the loss", after_loss.prompt_logits.data(),
                            cpu_->prompt_logits.data(), cpu_->prompt_logits.size());
  EXPECT_TRUE(tier_of(lost).stats().off);
  EXPECT_EQ(tier_of(lost).stats().dense_matmuls, 0u);
}

// The dense matrices' bytes come out of every automatic budget, not out of COLI_VK_TIER_GB's.
TEST(VkTierBudget, DenseBytesComeOutOfTheAutomaticSizes) {
  k3::VulkanOptions o;
  o.prefill = "off";
  o.reserve_gb = 1;
  const uint64_t heap = 80'000'000'000, free = 50'000'000'000, dense = 7'000'000'000;
  EXPECT_DOUBLE_EQ(k3::size_vk_tier_budget(o, 1000, free, heap, false, dense).bytes, 42e9);
  EXPECT_DOUBLE_EQ(k3::size_vk_tier_budget(o, 1000, std::nullopt, heap, false, dense).bytes, 72e9);
  o.device_cap_mb = 8;
  EXPECT_DOUBLE_EQ(k3::size_vk_tier_budget(o, 1000, free, heap, false, 1 << 20).bytes,
                   7.0 * (1 << 20));
  o.tier_gb = 2;
  EXPECT_DOUBLE_EQ(k3::size_vk_tier_budget(o, 1000, free, heap, false, dense).bytes, 2e9);
}

TEST_F(VkTier, LostDeviceTurnsTheTierOffAndKeepsTheTokens) {
  const TempDir state("vk-tier-lost");
  const k3::Engine engine(kTinyDir, tier_load(state, 1.0));
  const auto prompt = golden_->i64("prompt_ids");
  run(engine, prompt, 8, 32);  // fills the tier
  const Outcome got = run(engine, prompt, 8, 32, [&](size_t j) {
    if (j == 3) tier_of(engine).inject_device_loss();
  });
  EXPECT_EQ(got.tokens, cpu_->tokens);
  k3::testing::expect_close("decode_logits", got.decode_logits.data(), cpu_->decode_logits.data(),
                            cpu_->decode_logits.size());
  const k3::VkTierStats s = tier_of(engine).stats();
  EXPECT_TRUE(s.off);
  EXPECT_NE(engine.describe_device().find("(off: the device was lost)"), std::string::npos);
  EXPECT_EQ(s.residents, 0u);
  EXPECT_GT(s.pairs_served, 0u);  // it served before the loss
}

}  // namespace

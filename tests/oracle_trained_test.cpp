// The second oracle (issue 15 item 6): the training model's own forward in float64
// (tools/train/make_fixtures.py, from the exported files) on held-out text, against the engine's
// exact path on the trained tiny K3 (assets/k3-mini). Trained weights exercise what random ones
// hide: saturated gates, real routing, a head whose unused rows share one weight row.
//
// oracle.safetensors: "ids" I64 [T]; "logit_ids" I64 [K] (every id with its own lm_head row,
// then one representative of each of the two groups of ids sharing a row); "logits" F64 (or F32)
// [T, K];
// "shared_count" I64 [2] (the size of each group); "router_margin" F64 [T] (the smallest gap,
// over the MoE layers, between the k-th and (k+1)-th biased router score).
//
// rel-L2 is taken over the full vocabulary: the K-2 own ids weigh 1 each, each representative
// weighs its group's size — valid because every id of a group gets exactly its representative's
// logit, which is checked here for every member (found from the checkpoint's lm_head rows).
// Positions whose router margin is below 1e-5 may pick another expert in f32 than in float64:
// they are printed, not asserted; every other position must be within 1e-6, and at least 60 of the
// 64 positions must be asserted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "engine/engine.h"
#include "io/model_files.h"
#include "model/tensor_names.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using k3::testing::Tensors;

const std::string kModel = std::string(K3_SOURCE_DIR) + "/assets/k3-mini";
const std::string kOracle = std::string(K3_SOURCE_DIR) + "/tests/data/k3-mini/oracle.safetensors";
// rel-L2 of the f32 exact path against float64, measured (overall / worst position): AVX-512
// 7.2e-8 / 1.55e-7, AVX2 6.6e-8 / 1.45e-7, scalar 1.85e-7 / 4.29e-7. A bound of 1e-5 let the MLA
// latent norms run with rms_norm_eps (1e-5) instead of 1e-6 (4.0e-7 / 1.64e-6, the fixture
// README's documented pitfall); 1e-6 is 2.3x the scalar worst.
constexpr double kBound = 1e-6;
constexpr double kMinMargin = 1e-5;
// The fixture's smallest router margins are 1.17e-5, 1.72e-5 and 1.80e-5 (5 below 1e-4, 22 below
// 1e-3): all 64 positions are asserted. The skip must stay the exception (a retrained model may
// put a few positions under 1e-5): at most 4 of 64 may be left out.
constexpr size_t kMinAsserted = 60;

// A F64 tensor (or an F32 one, widened) of the oracle.
std::vector<double> f64(const Tensors& oracle, const std::string& name) {
  const k3::TensorInfo* t = oracle.shard.find(name);
  EXPECT_NE(t, nullptr) << kOracle << ": " << name;
  if (!t) return {};
  if (t->dtype == k3::DType::kF32) {
    const std::vector<float> v = oracle.f32(name);
    return {v.begin(), v.end()};
  }
  EXPECT_EQ(t->dtype, k3::DType::kF64) << kOracle << ": " << name;
  if (t->dtype != k3::DType::kF64) return {};
  std::vector<double> v(t->numel());
  oracle.shard.read(*t, v.data());
  return v;
}

TEST(OracleTrained, ExactPathMatchesTheTrainingModelsFloat64Forward) {
  for (const std::string& path : {kModel + "/config.json", kOracle})
    ASSERT_TRUE(fs::exists(path)) << path
                                  << " is missing: the oracle needs the trained model "
                                     "(assets/k3-mini) and tools/train/make_fixtures.py's output";
  const Tensors oracle(kOracle);
  const std::vector<int64_t> ids = oracle.i64("ids");
  const std::vector<int64_t> logit_ids = oracle.i64("logit_ids");
  const std::vector<double> want = f64(oracle, "logits");
  const std::vector<int64_t> shared_count = oracle.i64("shared_count");
  const std::vector<double> margin = f64(oracle, "router_margin");
  const size_t T = ids.size(), K = logit_ids.size();
  ASSERT_GE(K, 3u);
  ASSERT_EQ(want.size(), T * K) << kOracle << ": logits";
  ASSERT_EQ(margin.size(), T) << kOracle << ": router_margin";
  ASSERT_EQ(shared_count.size(), 2u) << kOracle << ": shared_count";

  k3::LoadOptions load = k3::LoadOptions::exact();
  load.experts_in_memory = true;
  load.cache.pin = false;
  const k3::Engine engine(kModel, load);
  const size_t V = static_cast<size_t>(engine.info().vocab_size);
  k3::Session session(engine, static_cast<int64_t>(T));
  std::vector<float> got;
  k3::PrefillHooks hooks;
  hooks.all_logits = &got;
  session.prefill(ids, hooks);
  ASSERT_EQ(got.size(), T * V);

  // The two groups of ids sharing an lm_head row, from the checkpoint: every id whose row equals
  // its representative's byte for byte.
  const k3::ModelFiles files(kModel);
  const k3::LocatedTensor head = files.find(k3::names::kLmHead);
  ASSERT_NE(head.shard, nullptr) << kModel << ": " << k3::names::kLmHead;
  ASSERT_EQ(head.info->shape.size(), 2u);
  ASSERT_EQ(static_cast<size_t>(head.info->shape[0]), V);
  std::vector<uint8_t> rows(head.info->nbytes);
  k3::ModelFiles::read(head, rows.data());
  const size_t row_bytes = rows.size() / V;
  for (size_t g = 0; g < 2; ++g) {
    const int64_t rep = logit_ids[K - 2 + g];
    std::vector<size_t> members;
    for (size_t id = 0; id < V; ++id)
      if (std::memcmp(rows.data() + id * row_bytes,
                      rows.data() + static_cast<size_t>(rep) * row_bytes, row_bytes) == 0)
        members.push_back(id);
    EXPECT_EQ(static_cast<int64_t>(members.size()), shared_count[g])
        << "ids sharing the lm_head row of " << rep;
    // Each member's engine logit equals its representative's, bit for bit, at every position.
    size_t differ = 0;
    for (size_t t = 0; t < T; ++t)
      for (size_t id : members)
        differ += std::memcmp(&got[t * V + id], &got[t * V + static_cast<size_t>(rep)],
                              sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << "logits of ids sharing the row of " << rep << " that differ from "
                          << rep << "'s (" << members.size() << " ids x " << T << " positions)";
    std::printf("group of %lld: %zu ids share its lm_head row (shared_count %lld), logits equal\n",
                static_cast<long long>(rep), members.size(),
                static_cast<long long>(shared_count[g]));
  }

  double diff_all = 0, ref_all = 0, worst = 0;
  size_t asserted = 0;
  for (size_t t = 0; t < T; ++t) {
    double diff = 0, ref = 0;
    for (size_t k = 0; k < K; ++k) {
      const double w = k + 2 < K ? 1.0 : static_cast<double>(shared_count[k + 2 - K]);
      const double a = got[t * V + static_cast<size_t>(logit_ids[k])], b = want[t * K + k];
      diff += w * (a - b) * (a - b);
      ref += w * b * b;
    }
    const double rel = std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30);
    if (margin[t] < kMinMargin) {
      std::printf("position %zu: router margin %.3g < %.0e, rel-L2 %.3g (not asserted)\n", t,
                  margin[t], kMinMargin, rel);
      continue;
    }
    EXPECT_LE(rel, kBound) << "position " << t << " (router margin " << margin[t] << ")";
    worst = std::max(worst, rel);
    diff_all += diff;
    ref_all += ref;
    ++asserted;
  }
  const double overall = std::sqrt(diff_all) / std::max(std::sqrt(ref_all), 1e-30);
  std::printf(
      "%zu of %zu positions asserted: rel-L2 overall %.3g, worst position %.3g (bound %g)\n",
      asserted, T, overall, worst, kBound);
  EXPECT_LE(overall, kBound);
  EXPECT_GE(asserted, kMinAsserted)
      << T - asserted << " of " << T << " positions have a router margin below " << kMinMargin
      << " and were not asserted";
}

}  // namespace

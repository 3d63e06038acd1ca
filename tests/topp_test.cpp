// K3_TOPP (docs/streaming.md §1.4 step 2): each token keeps the shortest prefix of its routed
// picks, by weight, that reaches cumulative weight p, renormalised; off (0) keeps all top-k.
// Checked on the k3-tiny fixture against the full routing of the same input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "engine/engine.h"
#include "test_util.h"

namespace {

using k3::testing::kTinyDir;

// The routing of every (layer, position), in feeding order.
class RoutingLog : public k3::LayerObserver {
 public:
  void on_tensor(int64_t, Site, const float*) override {}
  struct Copy {
    std::vector<int64_t> ids;
    std::vector<float> weights;
  };
  void on_routing(int64_t layer, const Routing& r) override {
    by_layer[layer].push_back(
        Copy{{r.ids.begin(), r.ids.end()}, {r.weights.begin(), r.weights.end()}});
  }
  std::map<int64_t, std::vector<Copy>> by_layer;
};

struct RoutedRun {
  RoutingLog log;
  std::vector<float> logits;
};

RoutedRun run(double top_p, int64_t chunk) {
  k3::LoadOptions load = k3::LoadOptions::exact();
  load.expert_top_p = top_p;
  const k3::Engine engine(kTinyDir, load);
  k3::Session session(engine, 64);
  session.set_prefill_chunk(chunk);
  std::vector<int64_t> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back((i * 53 + 7) % engine.info().vocab_size);
  RoutedRun r;
  k3::PrefillHooks hooks;
  hooks.observer = &r.log;
  hooks.all_logits = &r.logits;
  session.prefill(prompt, hooks);
  return r;
}

TEST(ExpertTopP, KeepsTheShortestHeavyPrefixRenormalised) {
  const RoutedRun full = run(0.0, 1), cut = run(0.6, 1);
  ASSERT_FALSE(full.log.by_layer.empty());
  // The first MoE layer sees the same inputs in both runs: compare its routing token by token.
  const int64_t first = full.log.by_layer.begin()->first;
  const auto& a = full.log.by_layer.at(first);
  const auto& b = cut.log.by_layer.at(first);
  ASSERT_EQ(a.size(), b.size());
  size_t fewer = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    ASSERT_FALSE(b[t].ids.empty());
    ASSERT_LE(b[t].ids.size(), a[t].ids.size());
    fewer += b[t].ids.size() < a[t].ids.size();
    EXPECT_TRUE(std::is_sorted(b[t].ids.begin(), b[t].ids.end()));
    // The full weights by id; the kept ones must be the heaviest, reaching 0.6 with the last one
    // and not without it.
    std::map<int64_t, float> w;
    for (size_t j = 0; j < a[t].ids.size(); ++j) w[a[t].ids[j]] = a[t].weights[j];
    float kept = 0.0f, lightest = 1e30f, heaviest_dropped = 0.0f;
    for (int64_t id : b[t].ids) {
      ASSERT_TRUE(w.count(id)) << "kept an expert outside the top-k";
      kept += w[id];
      lightest = std::min(lightest, w[id]);
    }
    for (const auto& [id, weight] : w)
      if (std::find(b[t].ids.begin(), b[t].ids.end(), id) == b[t].ids.end())
        heaviest_dropped = std::max(heaviest_dropped, weight);
    EXPECT_GE(kept, 0.6f - 1e-6f);
    EXPECT_LT(kept - lightest, 0.6f);
    EXPECT_LE(heaviest_dropped, lightest);
    float renormalised = 0.0f;
    for (float x : b[t].weights) renormalised += x;
    EXPECT_NEAR(renormalised, 1.0f, 1e-5f);  // routed_scaling_factor 1 in the fixture
  }
  EXPECT_GT(fewer, 0u) << "p = 0.6 never dropped an expert: the test would pass vacuously";
  EXPECT_NE(std::memcmp(full.logits.data(), cut.logits.data(), full.logits.size() * sizeof(float)),
            0);
}

TEST(ExpertTopP, ChunkedPrefillStaysBitIdentical) {
  const RoutedRun one = run(0.6, 1), chunked = run(0.6, 7);
  ASSERT_EQ(one.logits.size(), chunked.logits.size());
  EXPECT_EQ(
      std::memcmp(one.logits.data(), chunked.logits.data(), one.logits.size() * sizeof(float)), 0);
}

TEST(ExpertTopP, OffKeepsEveryPick) {
  const RoutedRun off = run(0.0, 1);
  for (const auto& [layer, rows] : off.log.by_layer)
    for (const auto& r : rows)
      EXPECT_EQ(r.ids.size(), 4u) << "layer " << layer;  // num_experts_per_token
}

}  // namespace

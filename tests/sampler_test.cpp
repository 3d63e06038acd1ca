// The sampler against a brute-force reference: the set of tokens it can return (top-k, min-p,
// top-p over a fully sorted vocabulary) and the frequencies it returns them with (softmax at the
// temperature, renormalised over that set); seeds reproduce.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

namespace k3 {
namespace {

// The tokens the options allow, with their normalised probabilities, from a full sort.
std::map<int64_t, double> reference(const std::vector<float>& logits, const SamplingOptions& o) {
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  const double top = logits[order[0]];
  std::vector<std::pair<int64_t, double>> kept;
  for (int64_t id : order) {
    const double p = std::exp((logits[id] - top) / o.temperature);
    if (p >= o.min_p) kept.push_back({id, p});
  }
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < kept.size()) kept.resize(o.top_k);
  double total = 0;
  for (auto& [id, p] : kept) total += p;
  if (o.top_p < 1.0) {
    double mass = 0;
    size_t cut = kept.size();
    for (size_t i = 0; i < kept.size(); ++i) {
      mass += kept[i].second / total;
      if (mass >= o.top_p) {
        cut = i + 1;
        break;
      }
    }
    kept.resize(cut);
    total = 0;
    for (auto& [id, p] : kept) total += p;
  }
  std::map<int64_t, double> out;
  for (auto& [id, p] : kept) out[id] = p / total;
  return out;
}

std::vector<float> random_logits(size_t n, uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> logits(n);
  for (float& x : logits) x = dist(rng);
  return logits;
}

TEST(Sampler, SupportAndFrequenciesMatchAFullSort) {
  struct Case {
    size_t vocab;
    float spread;
    SamplingOptions o;
  };
  auto opts = [](double t, double p, int64_t k, double m) {
    SamplingOptions o;
    o.temperature = t;
    o.top_p = p;
    o.top_k = k;
    o.min_p = m;
    return o;
  };
  const std::vector<Case> cases = {
      {50, 1.0f, opts(1.0, 1.0, 0, 0.0)},
      {50, 1.0f, opts(0.7, 0.9, 0, 0.0)},
      {50, 2.0f, opts(1.0, 1.0, 5, 0.0)},
      {50, 2.0f, opts(1.3, 1.0, 0, 0.2)},
      {50, 2.0f, opts(1.0, 0.8, 10, 0.05)},
      // A flat head wider than the first sorted window (64): top-p must widen it.
      {5000, 0.05f, opts(1.0, 0.5, 0, 0.0)},
      {163840, 3.0f, opts(0.6, 0.95, 0, 0.0)},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto logits =
        random_logits(cases[c].vocab, 17 + static_cast<uint32_t>(c), cases[c].spread);
    const auto want = reference(logits, cases[c].o);
    Sampler sampler(cases[c].o, 1234 + c);
    const int draws = cases[c].vocab > 1000 ? 2000 : 40000;
    std::map<int64_t, int> got;
    for (int i = 0; i < draws; ++i) {
      const int64_t id = sampler.sample(logits);
      ASSERT_TRUE(want.count(id)) << "case " << c << ": token " << id
                                  << " is outside the allowed set of " << want.size();
      ++got[id];
    }
    // The whole allowed set is reachable (a head cut too early would show as too few tokens).
    EXPECT_GT(got.size() * 3, std::min<size_t>(want.size(), draws)) << "case " << c;
    if (draws < 40000) continue;
    for (const auto& [id, p] :
         want) {  // 4.5 sigma of a binomial: a wrong weight fails, noise does not
      const double expected = p * draws, sigma = std::sqrt(draws * p * (1 - p));
      EXPECT_NEAR(got[id], expected, 4.5 * sigma + 2) << "case " << c << " token " << id;
    }
  }
}

TEST(Sampler, EdgesAndSeeds) {
  const auto logits = random_logits(1000, 5, 2.0f);
  const int64_t best = argmax(logits);
  SamplingOptions greedy;
  EXPECT_EQ(Sampler(greedy, 1).sample(logits), best);
  for (auto mutate : std::vector<void (*)(SamplingOptions&)>{
           [](SamplingOptions& o) { o.top_k = 1; }, [](SamplingOptions& o) { o.top_p = 1e-9; },
           [](SamplingOptions& o) { o.min_p = 1.0; }}) {
    SamplingOptions o;
    o.temperature = 1.5;
    mutate(o);
    Sampler s(o, 99);
    for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(logits), best);
  }
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_p = 0.9;
  Sampler a(o, 42), b(o, 42), c(o, 43);
  std::vector<int64_t> sa, sb, sc;
  for (int i = 0; i < 64; ++i) {
    sa.push_back(a.sample(logits));
    sb.push_back(b.sample(logits));
    sc.push_back(c.sample(logits));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

}  // namespace
}  // namespace k3

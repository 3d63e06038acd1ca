// The sampler against a brute-force reference: the set of tokens it can return (top-k, min-p,
// top-p over a fully sorted vocabulary) and the frequencies it returns them with (softmax at the
// temperature, renormalised over that set); seeds reproduce. The penalties against values worked
// out by hand (docs/serving.md §3.15), and the log-probabilities against a full sort.
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

// Draws `n` tokens and counts them.
std::map<int64_t, int> draw(const std::vector<float>& logits, const SamplingOptions& o, int n,
                            uint64_t seed = 7) {
  Sampler s(o, seed);
  std::map<int64_t, int> got;
  for (int i = 0; i < n; ++i) ++got[s.sample(logits)];
  return got;
}

// Logits whose softmax at temperature 1 is proportional to `relative` (the first is the top).
std::vector<float> logits_of(const std::vector<double>& relative) {
  std::vector<float> out;
  for (double p : relative) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

// The drawn ids are exactly `want` (each reached, none other), each at its weight / the sum of
// the weights, within 4.5 sigma of a binomial.
void expect_draws(const std::map<int64_t, int>& got, const std::map<int64_t, double>& want, int n,
                  const std::string& what) {
  std::set<int64_t> got_ids, want_ids;
  for (const auto& [id, count] : got) got_ids.insert(id);
  double total = 0;
  for (const auto& [id, w] : want) {
    want_ids.insert(id);
    total += w;
  }
  EXPECT_EQ(got_ids, want_ids) << what;
  for (const auto& [id, w] : want) {
    const double p = w / total, expected = p * n, sigma = std::sqrt(n * p * (1 - p));
    const auto it = got.find(id);
    EXPECT_NEAR(it == got.end() ? 0 : it->second, expected, 4.5 * sigma + 2)
        << what << ": token " << id;
  }
}

TEST(Sampler, TopKKeepsExactlyTheKMostLikely) {
  // 300 tokens of similar weight: without top-k a draw of 20000 reaches most of them.
  const auto logits = random_logits(300, 23, 0.3f);
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  for (const int64_t k : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{40}}) {
    SamplingOptions o;
    o.temperature = 1.0;
    o.top_k = k;
    std::map<int64_t, double> want;
    for (int64_t i = 0; i < k; ++i) want[order[i]] = std::exp(logits[order[i]] - logits[order[0]]);
    expect_draws(draw(logits, o, 20000), want, 20000, "top_k " + std::to_string(k));
  }
  // 0 and k >= the vocabulary: no filter.
  for (const int64_t k : {int64_t{0}, int64_t{300}, int64_t{1} << 30}) {
    SamplingOptions o;
    o.temperature = 1.0;
    o.top_k = k;
    EXPECT_GT(draw(logits, o, 20000).size(), 290u) << "top_k " << k;
  }
}

TEST(Sampler, MinPDropsTokensBelowMinPTimesTheTopProbability) {
  // Probabilities relative to the top one; min-p 0.3 keeps 1, 0.6, 0.31 and drops 0.29 and below.
  const std::vector<double> relative = {0.29, 1.0, 0.1, 0.6, 0.05, 0.31, 0.01};
  const auto logits = logits_of(relative);
  SamplingOptions o;
  o.temperature = 1.0;
  o.min_p = 0.3;
  expect_draws(draw(logits, o, 40000), {{1, 1.0}, {3, 0.6}, {5, 0.31}}, 40000, "min_p 0.3");
  // The threshold applies to the probabilities at the temperature: at 2 they are the square
  // roots (0.54, 1, 0.32, 0.77, 0.22, 0.56, 0.1), so 0.29 and 0.1 pass as well.
  o.temperature = 2.0;
  std::map<int64_t, double> want;
  for (int64_t id : {0, 1, 2, 3, 5}) want[id] = std::sqrt(relative[id]);
  expect_draws(draw(logits, o, 40000), want, 40000, "min_p 0.3 at temperature 2");
  // min-p 0 keeps everything; 1 keeps the top token only.
  o.temperature = 1.0;
  o.min_p = 0.0;
  EXPECT_EQ(draw(logits, o, 40000).size(), relative.size());
  o.min_p = 1.0;
  expect_draws(draw(logits, o, 1000), {{1, 1.0}}, 1000, "min_p 1");
}

TEST(Sampler, TopKMinPAndTopPTogetherInTheirOrder) {
  // Relative probabilities 1, .8, .6, .5, .4, .2, .1 (ids shuffled). top-k 5 keeps the first
  // five, min-p 0.45 the first four (total 2.9); top-p 0.75 then needs 2.175 of that mass:
  // 1 + .8 + .6 = 2.4 reaches it, so three tokens are drawn, in proportion 1 : .8 : .6.
  // (Top-p before min-p, as llama.cpp orders them, would measure 0.75 of the top-k set's 3.3
  // and keep four.)
  const auto logits = logits_of({0.2, 0.6, 1.0, 0.1, 0.5, 0.8, 0.4});
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 5;
  o.min_p = 0.45;
  o.top_p = 0.75;
  expect_draws(draw(logits, o, 40000), {{2, 1.0}, {5, 0.8}, {1, 0.6}}, 40000, "combined");
  // Each filter alone, as a check that the case needs all three.
  SamplingOptions k = o, m = o, p = o;
  k.min_p = 0.0;
  k.top_p = 1.0;
  m.top_k = 0;
  m.top_p = 1.0;
  p.top_k = 0;
  p.min_p = 0.0;
  EXPECT_EQ(draw(logits, k, 40000).size(), 5u);
  EXPECT_EQ(draw(logits, m, 40000).size(), 4u);
  EXPECT_EQ(draw(logits, p, 40000).size(), 4u);  // 0.75 of 3.6: 1 + .8 + .6 + .5
}

// Exact values on a small vector: every number is a sum or product of powers of two, so float
// arithmetic gives them exactly.
const std::vector<float> kSmall = {2.0f, -1.0f, 0.5f, 3.0f, -0.5f, 1.0f};

std::vector<float> penalised(const Penalties& p, const std::vector<int64_t>& context,
                             const std::vector<int64_t>& generated) {
  Sampler s(SamplingOptions{}, 1, p);
  s.set_context(context);
  for (int64_t id : generated) s.accept(id);
  std::vector<float> out = kSmall;
  s.apply_penalties(out);
  return out;
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountTheGeneratedTokens) {
  Penalties p;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.25;
  // The prompt does not count for OpenAI's penalties; 3 was generated twice, 0 once.
  const auto got = penalised(p, {1, 1, 2}, {3, 3, 0});
  const std::vector<float> want = {2.0f - 0.5f - 0.25f,     -1.0f, 0.5f,
                                   3.0f - 2 * 0.5f - 0.25f, -0.5f, 1.0f};
  EXPECT_EQ(got, want);
  // Negative values encourage repetition.
  p.frequency_penalty = -1.0;
  p.presence_penalty = -2.0;
  EXPECT_EQ(penalised(p, {}, {5}), (std::vector<float>{2.0f, -1.0f, 0.5f, 3.0f, -0.5f, 4.0f}));
}

TEST(Sampler, RepeatPenaltyCoversTheLastNOfPromptAndReply) {
  Penalties p;
  p.repeat_penalty = 2.0;
  p.repeat_last_n = 3;
  // Context 1 2 4, then 5 and 0 generated: the window is 4 5 0. A positive logit is divided, a
  // negative one multiplied; 1 and 2 slid out of the window.
  EXPECT_EQ(penalised(p, {1, 2, 4}, {5, 0}),
            (std::vector<float>{1.0f, -1.0f, 0.5f, 3.0f, -1.0f, 0.5f}));
  // Once per distinct id, whatever its count in the window.
  EXPECT_EQ(penalised(p, {0, 0, 0}, {}),
            (std::vector<float>{1.0f, -1.0f, 0.5f, 3.0f, -0.5f, 1.0f}));
  // The window reaches into the prompt when the reply is shorter than it.
  EXPECT_EQ(penalised(p, {3, 1}, {2}), (std::vector<float>{2.0f, -2.0f, 0.25f, 1.5f, -0.5f, 1.0f}));
  // -1: the whole context.
  p.repeat_last_n = -1;
  EXPECT_EQ(penalised(p, {0, 1, 2, 3}, {4, 5}),
            (std::vector<float>{1.0f, -2.0f, 0.25f, 1.5f, -1.0f, 0.5f}));
  // 0: off.
  p.repeat_last_n = 0;
  EXPECT_EQ(penalised(p, {0, 1, 2, 3}, {4, 5}), kSmall);
  EXPECT_FALSE(Sampler(SamplingOptions{}, 1, p).penalised());
  // Repeat first, then frequency / presence on the result (llama.cpp's order).
  p.repeat_last_n = 2;
  p.presence_penalty = 0.5;
  EXPECT_EQ(penalised(p, {}, {3, 3}), (std::vector<float>{2.0f, -1.0f, 0.5f, 1.0f, -0.5f, 1.0f}));
}

TEST(Sampler, PenaltiesChangeTheChoice) {
  Penalties p;
  p.presence_penalty = 2.0;
  Sampler greedy(SamplingOptions{}, 1, p);
  EXPECT_EQ(greedy.sample(kSmall), 3);
  greedy.accept(3);
  EXPECT_EQ(greedy.sample(kSmall), 0);  // 3 fell to 1.0, below 0's 2.0
  greedy.accept(0);
  EXPECT_EQ(greedy.sample(kSmall), 3);  // 0 at 0.0; 3 and 5 both at 1.0: ties -> the lower id
}

TEST(Sampler, NeutralPenaltiesChangeNothing) {
  // Zero frequency / presence and repeat 1 (any window): the logits are read as given, and every
  // draw equals that of a sampler without penalties.
  for (const Penalties& p : {Penalties{}, Penalties{0.0, 0.0, 1.0, -1}, Penalties{0.0, 0.0, 1.0, 0},
                             Penalties{0.0, 0.0, 2.0, 0}}) {
    std::vector<float> logits = kSmall;
    Sampler s(SamplingOptions{}, 1, p);
    s.set_context(std::vector<int64_t>{0, 1, 2, 3, 4, 5});
    for (int64_t id = 0; id < 6; ++id) s.accept(id);
    s.apply_penalties(logits);
    EXPECT_EQ(logits, kSmall);
    EXPECT_FALSE(s.penalised());
  }
  const auto logits = random_logits(5000, 11, 2.0f);
  SamplingOptions o;
  o.temperature = 0.9;
  o.top_p = 0.95;
  Sampler plain(o, 77), neutral(o, 77, Penalties{});
  neutral.set_context(std::vector<int64_t>{1, 2, 3});
  for (int i = 0; i < 200; ++i) {
    const int64_t a = plain.sample(logits);
    EXPECT_EQ(a, neutral.sample(logits));
    neutral.accept(a);
  }
}

TEST(Sampler, LogprobsAreTheLogSoftmaxOfTheLogits) {
  for (const size_t vocab : {size_t{6}, size_t{1000}, size_t{163840}}) {
    auto logits =
        vocab == 6 ? kSmall : random_logits(vocab, 3 + static_cast<uint32_t>(vocab), 3.0f);
    if (vocab == 1000) logits[10] = logits[20] = 50.0f;  // a tie at the top: lower id first
    // An independent log-sum-exp (long double, no max shift needed at these magnitudes).
    long double sum = 0;
    for (float x : logits) sum += std::exp(static_cast<long double>(x));
    const double lse = static_cast<double>(std::log(sum));
    EXPECT_NEAR(log_sum_exp(logits), lse, 1e-9 * std::max(1.0, std::fabs(lse)));
    // Probabilities over the full vocabulary sum to 1.
    const double ours = log_sum_exp(logits);
    double total = 0;
    for (float x : logits) total += std::exp(static_cast<double>(x) - ours);
    EXPECT_NEAR(total, 1.0, 1e-9) << vocab;

    const int64_t chosen = static_cast<int64_t>(vocab / 2);
    const int top_n = std::min<int>(20, static_cast<int>(vocab));
    const TokenLogprobs got = token_logprobs(logits, chosen, top_n);
    EXPECT_EQ(got.chosen.id, chosen);
    EXPECT_NEAR(got.chosen.logprob, logits[chosen] - lse, 1e-9);
    // The top list: a full sort's first top_n, most likely first, ties -> lower id.
    std::vector<int64_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
    ASSERT_EQ(got.top.size(), static_cast<size_t>(top_n));
    for (int i = 0; i < top_n; ++i) {
      EXPECT_EQ(got.top[i].id, order[i]) << vocab << " rank " << i;
      EXPECT_NEAR(got.top[i].logprob, logits[order[i]] - lse, 1e-9);
      if (i > 0) {
        EXPECT_GE(got.top[i - 1].logprob, got.top[i].logprob);
      }
    }
    // The greedy choice is the first of the list.
    EXPECT_EQ(Sampler(SamplingOptions{}, 1).sample(logits), got.top[0].id);
    EXPECT_TRUE(token_logprobs(logits, chosen, 0).top.empty());
  }
}

}  // namespace
}  // namespace k3

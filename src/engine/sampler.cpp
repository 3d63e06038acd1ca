#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace k3 {

int64_t argmax(std::span<const float> logits) {
  int64_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int64_t>(i);
  return best;
}

Sampler::Sampler(const SamplingOptions& options, uint64_t seed) : options_(options), state_(seed) {}

double Sampler::next_uniform() {
  // splitmix64
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int64_t Sampler::sample(std::span<const float> logits) {
  if (options_.temperature <= 0.0 || logits.empty()) return argmax(logits);
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  auto by_logit = [&](int64_t a, int64_t b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la != lb ? la > lb : a < b;
  };
  size_t keep = order.size();
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < keep) keep = static_cast<size_t>(options_.top_k);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(), by_logit);
  order.resize(keep);
  const double inv_t = 1.0 / options_.temperature;
  const double top = logits[static_cast<size_t>(order[0])];
  std::vector<double> prob(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    prob[i] = std::exp((logits[static_cast<size_t>(order[i])] - top) * inv_t);
    total += prob[i];
  }
  if (options_.min_p > 0.0) {  // prob[0] is the top token's (unnormalised) probability
    size_t cut = 1;
    while (cut < keep && prob[cut] >= options_.min_p * prob[0]) ++cut;
    prob.resize(cut);
    order.resize(cut);
    keep = cut;
    total = std::accumulate(prob.begin(), prob.end(), 0.0);
  }
  if (options_.top_p < 1.0) {
    double mass = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      mass += prob[i] / total;
      if (mass >= options_.top_p) {
        cut = i + 1;
        break;
      }
    }
    prob.resize(cut);
    order.resize(cut);
    total = std::accumulate(prob.begin(), prob.end(), 0.0);
  }
  double r = next_uniform() * total;
  for (size_t i = 0; i < prob.size(); ++i) {
    r -= prob[i];
    if (r < 0.0) return order[i];
  }
  return order.back();
}

}  // namespace k3

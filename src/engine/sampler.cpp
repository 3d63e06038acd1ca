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
  // Probabilities relative to the most likely token (1.0), in one pass; min-p is a threshold on
  // them; top-k and top-p select their set in linear time. Nothing is sorted: the draw walks
  // the kept set in the (deterministic) order selection left it, so a seed reproduces.
  const double inv_t = 1.0 / options_.temperature;
  const float top = logits[static_cast<size_t>(argmax(logits))];
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    const double p = std::exp((static_cast<double>(logits[i]) - top) * inv_t);
    if (p >= options_.min_p) candidates_.push_back({static_cast<int64_t>(i), logits[i], p});
  }
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  };
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < candidates_.size()) {
    std::nth_element(candidates_.begin(), candidates_.begin() + options_.top_k, candidates_.end(),
                     by_logit);
    candidates_.resize(static_cast<size_t>(options_.top_k));
  }
  double total = 0.0;
  for (const Candidate& c : candidates_) total += c.prob;
  if (options_.top_p < 1.0) {
    // Quickselect by mass: the smallest set of most likely tokens whose mass reaches top_p,
    // in expected linear time (a flat distribution keeps most of the vocabulary).
    const double needed = options_.top_p * total;
    size_t lo = 0, hi = candidates_.size(), cut = candidates_.size();
    double above = 0.0;  // mass of [0, lo): tokens known to be in the set
    while (lo < hi) {
      const Candidate pivot = candidates_[lo + (hi - lo) / 2];
      auto first = candidates_.begin() + static_cast<std::ptrdiff_t>(lo);
      auto last = candidates_.begin() + static_cast<std::ptrdiff_t>(hi);
      auto split =
          std::partition(first, last, [&](const Candidate& c) { return by_logit(c, pivot); });
      std::iter_swap(
          split, std::find_if(split, last, [&](const Candidate& c) { return c.id == pivot.id; }));
      const size_t mid = static_cast<size_t>(split - candidates_.begin());
      double higher = 0.0;
      for (size_t i = lo; i < mid; ++i) higher += candidates_[i].prob;
      if (above + higher >= needed) {
        hi = mid;  // the cut lies among the more likely ones
        cut = mid;
      } else {
        above += higher + candidates_[mid].prob;
        if (above >= needed) {
          cut = mid + 1;
          break;
        }
        lo = mid + 1;
      }
    }
    candidates_.resize(std::max<size_t>(cut, 1));
    total = 0.0;
    for (const Candidate& c : candidates_) total += c.prob;
  }
  double r = next_uniform() * total;
  for (const Candidate& c : candidates_) {
    r -= c.prob;
    if (r < 0.0) return c.id;
  }
  return candidates_.back().id;
}

}  // namespace k3

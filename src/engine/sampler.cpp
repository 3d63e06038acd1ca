#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "engine/constraint.h"

namespace k3 {

int64_t argmax(std::span<const float> logits) {
  int64_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int64_t>(i);
  return best;
}

double log_sum_exp(std::span<const float> logits) {
  if (logits.empty()) return 0.0;
  const double top = logits[static_cast<size_t>(argmax(logits))];
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - top);
  return top + std::log(sum);
}

TokenLogprobs token_logprobs(std::span<const float> logits, int64_t chosen, int top) {
  TokenLogprobs out;
  const double lse = log_sum_exp(logits);
  out.chosen = {chosen, static_cast<double>(logits[static_cast<size_t>(chosen)]) - lse};
  const size_t n = std::min(static_cast<size_t>(std::max(top, 0)), logits.size());
  if (n == 0) return out;
  // One pass keeping the n best (n <= 20 in the API): sorted, most likely first, ties -> lower id.
  std::vector<int64_t> best;
  best.reserve(n + 1);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (best.size() == n && !(logits[i] > logits[static_cast<size_t>(best.back())])) continue;
    size_t at = best.size();
    while (at > 0 && logits[i] > logits[static_cast<size_t>(best[at - 1])]) --at;
    best.insert(best.begin() + static_cast<std::ptrdiff_t>(at), static_cast<int64_t>(i));
    if (best.size() > n) best.pop_back();
  }
  for (int64_t id : best)
    out.top.push_back({id, static_cast<double>(logits[static_cast<size_t>(id)]) - lse});
  return out;
}

namespace {
bool repeat_on(const Penalties& p) {
  return p.repeat_penalty != 1.0 && p.repeat_last_n != 0;
}
}  // namespace

Sampler::Sampler(const SamplingOptions& options, uint64_t seed, const Penalties& penalties)
    : options_(options),
      penalties_(penalties),
      state_(seed),
      penalised_(penalties.frequency_penalty != 0.0 || penalties.presence_penalty != 0.0 ||
                 repeat_on(penalties)) {}

void Sampler::set_context(std::span<const int64_t> ids) {
  if (!repeat_on(penalties_)) return;
  const size_t keep = penalties_.repeat_last_n < 0
                          ? ids.size()
                          : std::min(ids.size(), static_cast<size_t>(penalties_.repeat_last_n));
  recent_.assign(ids.end() - static_cast<std::ptrdiff_t>(keep), ids.end());
}

void Sampler::accept(int64_t id) {
  if (constraint_) constraint_->accept(id);
  if (!penalised_) return;
  if (penalties_.frequency_penalty != 0.0 || penalties_.presence_penalty != 0.0) ++generated_[id];
  if (repeat_on(penalties_)) {
    recent_.push_back(id);
    if (penalties_.repeat_last_n > 0 &&
        recent_.size() > static_cast<size_t>(penalties_.repeat_last_n))
      recent_.erase(recent_.begin());
  }
}

void Sampler::apply_penalties(std::span<float> logits) const {
  const auto in_range = [&](int64_t id) {
    return id >= 0 && static_cast<size_t>(id) < logits.size();
  };
  if (repeat_on(penalties_)) {
    // llama.cpp: once per distinct id of the window, whatever its count.
    std::vector<int64_t> ids = recent_;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    const float penalty = static_cast<float>(penalties_.repeat_penalty);
    for (int64_t id : ids) {
      if (!in_range(id)) continue;
      float& l = logits[static_cast<size_t>(id)];
      l = l <= 0.0f ? l * penalty : l / penalty;
    }
  }
  const float frequency = static_cast<float>(penalties_.frequency_penalty);
  const float presence = static_cast<float>(penalties_.presence_penalty);
  for (const auto& [id, count] : generated_)
    if (in_range(id))
      logits[static_cast<size_t>(id)] -= static_cast<float>(count) * frequency + presence;
}

double Sampler::next_uniform() {
  // splitmix64
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int64_t Sampler::sample(std::span<const float> logits) {
  if (!penalised_ && !constraint_) return sample_from(logits);
  penalised_logits_.assign(logits.begin(), logits.end());
  if (penalised_) apply_penalties(penalised_logits_);
  if (constraint_) constraint_->mask(penalised_logits_);
  return sample_from(penalised_logits_);
}

int64_t Sampler::sample_from(std::span<const float> logits) {
  if (options_.temperature <= 0.0 || logits.empty()) return argmax(logits);
  // Probabilities relative to the most likely token (1.0), in one pass; min-p is a threshold on
  // them; top-k and top-p select their set in linear time. Nothing is sorted: the draw walks
  // the kept set in the (deterministic) order selection left it, so a seed reproduces.
  const double inv_t = 1.0 / options_.temperature;
  const float top = logits[static_cast<size_t>(argmax(logits))];
  candidates_.clear();
  // Room for the whole vocabulary at once: grown by doubling, the first sampled token held the
  // old and the new array together (k3-mini's chat run peaked 9 MB higher with top-p on).
  candidates_.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    // An id a grammar masked (-infinity) is never a candidate (its p would be 0): no exp for it,
    // which under a grammar is most of the vocabulary.
    if (logits[i] == -std::numeric_limits<float>::infinity()) continue;
    const double p = std::exp((static_cast<double>(logits[i]) - top) * inv_t);
    if (p > 0 && p >= options_.min_p)
      candidates_.push_back({p, logits[i], static_cast<int32_t>(i)});
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

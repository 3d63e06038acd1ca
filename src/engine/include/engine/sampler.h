// engine/sampler.h — next-token choice: greedy (ties -> lowest id) or temperature sampling with
// optional top-k, min-p and top-p (in that order), reproducible from a seed on every platform (own
// PRNG, no implementation-defined std distributions).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "options/options.h"

namespace k3 {

class Sampler {
 public:
  Sampler(const SamplingOptions& options, uint64_t seed);
  int64_t sample(std::span<const float> logits);

 private:
  double next_uniform();  // [0, 1)
  struct Candidate {
    int64_t id;
    float logit;
    double prob;  // relative to the most likely token
  };
  SamplingOptions options_;
  uint64_t state_;
  std::vector<Candidate> candidates_;  // [vocab] at most; reused between calls
};

// Index of the largest logit; ties -> lowest index.
int64_t argmax(std::span<const float> logits);

}  // namespace k3

// engine/sampler.h — next-token choice: greedy (ties -> lowest id) or temperature sampling with
// optional min-p, top-k and top-p, reproducible from a seed on every platform (own PRNG, no
// implementation-defined std distributions). Before either, the penalties (frequency / presence
// over the generated tokens, OpenAI; repeat over the last repeat_last_n tokens of prompt +
// generated, llama.cpp) adjust a copy of the logits; with every penalty off the logits are read
// as given (docs/serving.md §3.15). Also the log-probabilities the API reports (token_logprobs).
// Not thread-safe: one Sampler per generation.
//
// The order of the filters (vLLM's; docs/serving.md §3.15.3): the logits are divided by the
// temperature first; min-p keeps the tokens whose probability at that temperature is at least
// min_p x the most likely one's; top-k keeps the k most likely (both keep a most-likely prefix,
// so they commute); top-p then keeps the smallest most-likely set whose probability reaches top_p
// of what min-p and top-k kept, renormalised over it; the draw is over that set. llama.cpp's
// default chain differs: top-k, top-p, then min-p on the logits as they are, the temperature
// last.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "options/options.h"

namespace k3 {

// Penalties (docs/serving.md §3.15), applied to the logits before temperature and the filters.
// The defaults are off, and then the logits are used untouched.
struct Penalties {
  double frequency_penalty = 0.0;  // OpenAI: minus count x this, over the generated tokens
  double presence_penalty = 0.0;   // OpenAI: minus this once a token was generated
  double repeat_penalty = 1.0;     // llama.cpp: logit / this (logit > 0) or x this (<= 0) for ...
  int64_t repeat_last_n = 64;      // ... the ids among the last n of prompt + generated (-1 all)
};

class OutputConstraint;

class Sampler {
 public:
  Sampler(const SamplingOptions& options, uint64_t seed, const Penalties& penalties = {});
  // The ids already in the context before the first generated one (the whole prompt): the
  // repeat penalty's window reaches into them. Call before the first sample().
  void set_context(std::span<const int64_t> ids);
  // The token the generation went on with (sampled or not): counted by the penalties.
  void accept(int64_t id);
  int64_t sample(std::span<const float> logits);
  // Ids `constraint` does not allow are never drawn, and accept() advances it (not owned;
  // nullptr = none). engine/constraint.h.
  void set_constraint(OutputConstraint* constraint) { constraint_ = constraint; }
  OutputConstraint* constraint() const { return constraint_; }
  // True when a penalty is on (the logits sample() sees are then a penalised copy).
  bool penalised() const { return penalised_; }
  // The penalties applied to `logits` in place (what sample() does to its copy).
  void apply_penalties(std::span<float> logits) const;

 private:
  int64_t sample_from(std::span<const float> logits);
  double next_uniform();  // [0, 1)
  // 16 bytes: a whole vocabulary of them (163,840) is 2.6 MB.
  struct Candidate {
    double prob;  // relative to the most likely token
    float logit;
    int32_t id;  // vocabularies are far below 2^31 ids
  };
  SamplingOptions options_;
  Penalties penalties_;
  uint64_t state_;
  bool penalised_ = false;
  std::vector<Candidate> candidates_;    // [vocab] reserved once, reused between calls
  std::vector<float> penalised_logits_;  // [vocab]; reused between calls
  std::vector<int64_t> recent_;          // the last repeat_last_n ids of the context, oldest first
  std::unordered_map<int64_t, int64_t> generated_;  // id -> times generated
  OutputConstraint* constraint_ = nullptr;
};

// Index of the largest logit; ties -> lowest index.
int64_t argmax(std::span<const float> logits);

// log-softmax of the logits at temperature 1, before penalties and filters (what OpenAI reports):
// the chosen token's log-probability and the `top` most likely tokens, most likely first (ties
// -> lower id). Computed in double; `top` <= the vocabulary.
struct TokenLogprob {
  int64_t id = 0;
  double logprob = 0;
};
struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
};
TokenLogprobs token_logprobs(std::span<const float> logits, int64_t chosen, int top);
// log(sum(exp(logits))), computed stably in double.
double log_sum_exp(std::span<const float> logits);

}  // namespace k3

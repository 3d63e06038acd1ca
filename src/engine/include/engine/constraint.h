// engine/constraint.h — a grammar the answer must match, enforced while sampling
// (docs/structured_output.md §5).
//
// The grammar (GBNF, start rule `root`) covers the answer channel: the constraint starts when the
// answer does (at once when the prompt opened it, else after the model writes
// `<|open|>response<|sep|>`; until then the think channel is free but the message may not end),
// and after `root` it requires the message's close (`<|close|>response<|sep|><|close|>message
// <|sep|><|end_of_msg|>`), so the reply ends only where the grammar accepts. With `tool` set, the
// answer is instead one call of one of them whose arguments (a `json` block) match its rule.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "util/status.h"

namespace k3 {

struct ConstraintSpec {
  // The answer's grammar (start rule root); with `tools`, the rules tool-0, tool-1, ... of each
  // tool's arguments instead.
  std::string gbnf;
  bool answer_open = false;        // the prompt ends inside the answer channel (thinking off)
  std::vector<std::string> tools;  // non-empty: the answer is one call of one of these tools
  bool raw = false;                // plain completion: root alone, no chat channels
};

class OutputConstraint {
 public:
  // Compiles `spec` for `engine`'s vocabulary. invalid_argument names a malformed grammar's line
  // and column.
  static Result<std::unique_ptr<OutputConstraint>> create(const Engine& engine,
                                                          const ConstraintSpec& spec);
  ~OutputConstraint();
  OutputConstraint(const OutputConstraint&) = delete;
  OutputConstraint& operator=(const OutputConstraint&) = delete;

  // Sets the logits of the ids not allowed next to -infinity.
  void mask(std::span<float> logits);
  // The ids mask() will allow next (bit id % 64 of word id / 64), for
  // Session::restrict_next_logits; nullptr while the constraint is not active (the think channel
  // is free) or broken. Valid until the next accept().
  const std::vector<uint64_t>* allowed_next();
  // The id the generation went on with.
  void accept(int64_t id);
  bool active() const;    // the constrained part has begun
  bool complete() const;  // the grammar matched to its end (the message is closed)
  // An id outside the mask was accepted (a scripted token): the constraint stopped.
  bool broken() const;
  uint64_t masks() const;       // mask() calls while active
  double mask_seconds() const;  // their total time
  size_t states() const;        // the matcher's DFA states

 private:
  struct Impl;
  explicit OutputConstraint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3

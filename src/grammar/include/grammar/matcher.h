// grammar/matcher.h — a grammar matched while sampling (docs/structured_output.md §3).
//
// The matcher is a pushdown automaton over bytes: its state is a set of stacks of grammar
// positions (each stack's top a byte range or a token terminal; the empty stack means the
// grammar may end here). Every state met is interned and its transitions on each byte are
// computed once, which makes a lazily built DFA over stack sets. The tokens allowed in a state
// are found by walking the vocabulary's byte trie through those transitions (a subtree whose
// prefix is refused is skipped whole) and kept with the state, so a state met again (inside a
// JSON string, after a comma) costs one copy of its mask.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace k3::grammar {

// The vocabulary as a byte trie (built once per tokenizer).
class Vocabulary {
 public:
  // bytes[id]: the token's bytes; special[id]: matched only by a `<[id]>` terminal (never by
  // its text).
  Vocabulary(std::vector<std::string> bytes, std::vector<bool> special);
  size_t size() const { return bytes_.size(); }
  const std::string& bytes(size_t id) const { return bytes_[id]; }
  bool special(size_t id) const { return special_[id]; }

 private:
  friend class Matcher;
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  // The trie in preorder; node 0 is the root (no byte).
  std::vector<uint8_t> label_;
  std::vector<uint16_t> depth_;
  std::vector<uint32_t> end_;       // the first node after this node's subtree
  std::vector<uint32_t> token_at_;  // [nodes + 1]: CSR offsets into tokens_
  std::vector<int32_t> tokens_;     // ids ending at each node
  uint16_t max_depth_ = 0;
};

class Matcher {
 public:
  Matcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocabulary);
  ~Matcher();
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;

  // The tokens allowed now: bit (id % 64) of word id / 64.
  const std::vector<uint64_t>& allowed();
  // Sets the logits of tokens not allowed now to -infinity.
  void mask(std::span<float> logits);
  // Advances by one token; false (the state unchanged) when it is not allowed.
  bool accept_token(int32_t id);
  // Advances by bytes (tests, forced text); false (the state unchanged) when refused.
  bool accept_bytes(std::string_view bytes);
  // True when the grammar may end here.
  bool accepting() const;
  // True when nothing more can be matched (only the end is left).
  bool finished() const;
  size_t state_count() const;  // the DFA states built so far

 private:
  struct State;
  int32_t next(int32_t state, uint8_t byte);
  int32_t next_token(int32_t state, int32_t id);
  int32_t intern(std::vector<std::vector<uint32_t>> stacks);
  void expand(std::vector<uint32_t> stack, std::vector<std::vector<uint32_t>>& out, int depth);
  void compute_mask(int32_t state);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::vector<std::unique_ptr<State>> states_;
  std::vector<int32_t> path_;  // [trie depth + 1] the state at each depth of the walk
  int32_t current_ = 0;
  struct Index;
  std::unique_ptr<Index> index_;  // stack-set key -> state
};

}  // namespace k3::grammar

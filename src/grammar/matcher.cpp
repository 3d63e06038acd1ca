// The grammar matcher and the vocabulary trie (grammar/matcher.h).
#include "grammar/matcher.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace k3::grammar {

namespace {

constexpr int32_t kUnknown = -2;
constexpr int32_t kDead = -1;
constexpr size_t kMostStacks = 4096;  // per state: beyond this a grammar is too ambiguous
constexpr int kMostExpansionDepth = 10000;

struct KeyHash {
  size_t operator()(const std::vector<uint32_t>& k) const {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t v : k) h = (h ^ v) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> bytes, std::vector<bool> special)
    : bytes_(std::move(bytes)), special_(std::move(special)) {
  special_.resize(bytes_.size(), false);
  std::vector<int32_t> order;
  for (size_t id = 0; id < bytes_.size(); ++id)
    if (!special_[id] && !bytes_[id].empty()) order.push_back(static_cast<int32_t>(id));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  label_.push_back(0);
  depth_.push_back(0);
  end_.push_back(0);
  token_at_.push_back(0);
  std::vector<uint32_t> open = {0};  // the node at each depth of the current path
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& t = bytes_[id];
    size_t common = 0;
    if (prev)
      while (common < prev->size() && common < t.size() && (*prev)[common] == t[common]) ++common;
    // Nodes deeper than the common prefix end here.
    while (open.size() > common + 1) {
      end_[open.back()] = static_cast<uint32_t>(label_.size());
      open.pop_back();
    }
    for (size_t d = common; d < t.size(); ++d) {
      token_at_.push_back(static_cast<uint32_t>(tokens_.size()));
      label_.push_back(static_cast<uint8_t>(t[d]));
      depth_.push_back(static_cast<uint16_t>(d + 1));
      end_.push_back(0);
      open.push_back(static_cast<uint32_t>(label_.size() - 1));
    }
    tokens_.push_back(id);  // at the newest node (the sort puts a prefix before its extensions)
    max_depth_ = std::max<uint16_t>(max_depth_, static_cast<uint16_t>(t.size()));
    prev = &t;
  }
  for (uint32_t n : open) end_[n] = static_cast<uint32_t>(label_.size());
  token_at_.push_back(static_cast<uint32_t>(tokens_.size()));
}

struct Matcher::State {
  std::vector<std::vector<uint32_t>> stacks;
  int32_t next[256];
  std::vector<std::pair<int32_t, int32_t>> tokens;  // token terminal id -> state (kUnknown)
  bool accepting = false;
  std::vector<uint64_t> mask;  // empty until asked
};

struct Matcher::Index {
  std::unordered_map<std::vector<uint32_t>, int32_t, KeyHash> ids;
};

Matcher::Matcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), index_(std::make_unique<Index>()) {
  std::vector<std::vector<uint32_t>> start;
  for (uint32_t alt : grammar_->alternatives(grammar_->root())) {
    expand({alt}, start, 0);
  }
  current_ = intern(std::move(start));
  path_.resize(static_cast<size_t>(vocab_->max_depth_) + 1);
}

Matcher::~Matcher() = default;
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;

// Follows rule references and ends of alternatives until the top is a terminal (or the stack is
// empty: the grammar may end), adding each such stack to `out`.
void Matcher::expand(std::vector<uint32_t> stack, std::vector<std::vector<uint32_t>>& out,
                     int depth) {
  if (depth > kMostExpansionDepth)
    throw GrammarError(0, 0,
                       "the grammar nests deeper than " + std::to_string(kMostExpansionDepth) +
                           " rules at one point");
  const std::vector<Element>& el = grammar_->elements();
  for (;;) {
    if (stack.empty()) {
      out.push_back(std::move(stack));
      return;
    }
    const uint32_t pos = stack.back();
    const Element& e = el[pos];
    if (e.kind == Element::Kind::end) {
      stack.pop_back();
      continue;
    }
    if (e.kind != Element::Kind::rule) {
      out.push_back(std::move(stack));
      return;
    }
    stack.pop_back();
    // The continuation, unless it is the end of this alternative (a tail call).
    if (el[pos + 1].kind != Element::Kind::end) stack.push_back(pos + 1);
    const std::vector<uint32_t>& alts = grammar_->alternatives(e.value);
    for (size_t i = 0; i < alts.size(); ++i) {
      std::vector<uint32_t> branch = stack;
      branch.push_back(alts[i]);
      expand(std::move(branch), out, depth + 1);
    }
    return;
  }
}

int32_t Matcher::intern(std::vector<std::vector<uint32_t>> stacks) {
  if (stacks.empty()) return kDead;
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.size() > kMostStacks)
    throw GrammarError(0, 0,
                       "the grammar is too ambiguous: over " + std::to_string(kMostStacks) +
                           " ways to read the text so far");
  std::vector<uint32_t> key;
  for (const auto& s : stacks) {
    key.insert(key.end(), s.begin(), s.end());
    key.push_back(std::numeric_limits<uint32_t>::max());
  }
  auto [it, fresh] = index_->ids.try_emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (!fresh) return it->second;
  auto st = std::make_unique<State>();
  std::fill(std::begin(st->next), std::end(st->next), kUnknown);
  const std::vector<Element>& el = grammar_->elements();
  for (const auto& s : stacks) {
    if (s.empty()) {
      st->accepting = true;
    } else if (el[s.back()].kind == Element::Kind::token) {
      const auto id = static_cast<int32_t>(el[s.back()].value);
      if (std::none_of(st->tokens.begin(), st->tokens.end(),
                       [&](const auto& t) { return t.first == id; }))
        st->tokens.push_back({id, kUnknown});
    }
  }
  st->stacks = std::move(stacks);
  states_.push_back(std::move(st));
  return it->second;
}

int32_t Matcher::next(int32_t state, uint8_t byte) {
  int32_t& slot = states_[state]->next[byte];
  if (slot != kUnknown) return slot;
  const std::vector<Element>& el = grammar_->elements();
  std::vector<std::vector<uint32_t>> out;
  for (const auto& s : states_[state]->stacks) {
    if (s.empty()) continue;
    const Element& e = el[s.back()];
    if (e.kind != Element::Kind::bytes || byte < e.lo || byte > e.hi) continue;
    std::vector<uint32_t> moved = s;
    moved.back() += 1;
    expand(std::move(moved), out, 0);
  }
  const int32_t n = intern(std::move(out));
  states_[state]->next[byte] = n;  // states_ may have grown: index again
  return n;
}

int32_t Matcher::next_token(int32_t state, int32_t id) {
  State& st = *states_[state];
  auto it = std::find_if(st.tokens.begin(), st.tokens.end(),
                         [&](const auto& t) { return t.first == id; });
  if (it == st.tokens.end()) return kDead;
  if (it->second != kUnknown) return it->second;
  const std::vector<Element>& el = grammar_->elements();
  std::vector<std::vector<uint32_t>> out;
  for (const auto& s : st.stacks) {
    if (s.empty() || el[s.back()].kind != Element::Kind::token ||
        static_cast<int32_t>(el[s.back()].value) != id)
      continue;
    std::vector<uint32_t> moved = s;
    moved.back() += 1;
    expand(std::move(moved), out, 0);
  }
  const int32_t n = intern(std::move(out));
  State& again = *states_[state];
  for (auto& t : again.tokens)
    if (t.first == id) t.second = n;
  return n;
}

void Matcher::compute_mask(int32_t state) {
  const Vocabulary& v = *vocab_;
  std::vector<uint64_t> mask((v.size() + 63) / 64, 0);
  path_[0] = state;
  const uint32_t nodes = static_cast<uint32_t>(v.label_.size());
  for (uint32_t i = 1; i < nodes;) {
    const uint16_t d = v.depth_[i];
    const int32_t from = path_[d - 1];
    int32_t s = states_[static_cast<size_t>(from)]->next[v.label_[i]];
    if (s == kUnknown) s = next(from, v.label_[i]);
    if (s < 0) {
      i = v.end_[i];
      continue;
    }
    path_[d] = s;
    for (uint32_t k = v.token_at_[i]; k < v.token_at_[i + 1]; ++k) {
      const auto id = static_cast<uint32_t>(v.tokens_[k]);
      mask[id / 64] |= 1ull << (id % 64);
    }
    ++i;
  }
  for (const auto& [id, next_state] : states_[state]->tokens)
    if (id >= 0 && static_cast<size_t>(id) < v.size())
      mask[static_cast<size_t>(id) / 64] |= 1ull << (id % 64);
  states_[state]->mask = std::move(mask);
}

const std::vector<uint64_t>& Matcher::allowed() {
  if (states_[current_]->mask.empty()) compute_mask(current_);
  return states_[current_]->mask;
}

void Matcher::mask(std::span<float> logits) {
  const std::vector<uint64_t>& m = allowed();
  const float off = -std::numeric_limits<float>::infinity();
  const size_t words = (logits.size() + 63) / 64;
  float* out = logits.data();
  for (size_t w = 0; w < words; ++w) {
    uint64_t refused = ~(w < m.size() ? m[w] : 0);
    if (w == words - 1 && logits.size() % 64) refused &= (1ull << (logits.size() % 64)) - 1;
    if (refused == ~0ull) {
      std::fill_n(out + w * 64, 64, off);
      continue;
    }
    while (refused) {
      out[w * 64 + static_cast<size_t>(__builtin_ctzll(refused))] = off;
      refused &= refused - 1;
    }
  }
}

bool Matcher::accept_token(int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= vocab_->size()) return false;
  if (vocab_->special(static_cast<size_t>(id))) {
    const int32_t n = next_token(current_, id);
    if (n < 0) return false;
    current_ = n;
    return true;
  }
  const std::string& b = vocab_->bytes(static_cast<size_t>(id));
  if (b.empty()) return false;
  return accept_bytes(b);
}

bool Matcher::accept_bytes(std::string_view bytes) {
  int32_t s = current_;
  for (char c : bytes) {
    s = next(s, static_cast<uint8_t>(c));
    if (s < 0) return false;
  }
  current_ = s;
  return true;
}

bool Matcher::accepting() const {
  return states_[current_]->accepting;
}

bool Matcher::finished() const {
  const State& st = *states_[current_];
  return st.accepting && st.stacks.size() == 1;
}

size_t Matcher::state_count() const {
  return states_.size();
}

}  // namespace k3::grammar

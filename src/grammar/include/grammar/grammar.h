// grammar/grammar.h — a context-free grammar over bytes (docs/structured_output.md §2).
//
// Source: GBNF, llama.cpp's grammar syntax (rules `name ::= alternatives`, "literals" with
// \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH escapes, [character classes] with ranges and ^, `.`,
// ( groups ), postfix * + ? {m} {m,} {m,n}, # comments), plus `<[id]>` for one token id (the
// engine's structural tokens). Character classes are over code points and are compiled to
// their UTF-8 byte sequences, so matching is byte by byte and a token may end inside a
// character.
//
// Compiled form: each rule is a list of alternatives; an alternative is a run of elements in
// one flat array ending with an `end` element. Repetitions become right-recursive rules
// (`r ::= x r | ε`); left recursion is refused at compile time (a pushdown matcher would loop).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace k3::grammar {

// A malformed grammar: where (1-based line and column of the source) and what.
class GrammarError : public std::runtime_error {
 public:
  GrammarError(int line, int column, const std::string& what);
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  int line_, column_;
};

struct Element {
  enum class Kind : uint8_t { bytes, rule, token, end };
  Kind kind = Kind::end;
  uint8_t lo = 0, hi = 0;  // bytes: the byte range [lo, hi]
  uint32_t value = 0;      // rule: its index; token: the id
};

class Grammar {
 public:
  // Parses and compiles `source`; the start rule is `root`. Throws GrammarError.
  static Grammar parse(std::string_view source, std::string_view root = "root");

  const std::vector<Element>& elements() const { return elements_; }
  // The first element of each alternative of `rule`.
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return rules_[rule]; }
  uint32_t root() const { return root_; }
  size_t rule_count() const { return rules_.size(); }
  const std::string& rule_name(uint32_t rule) const { return names_[rule]; }

 private:
  friend class Compiler;
  std::vector<Element> elements_;
  std::vector<std::vector<uint32_t>> rules_;
  std::vector<std::string> names_;
  uint32_t root_ = 0;
};

}  // namespace k3::grammar

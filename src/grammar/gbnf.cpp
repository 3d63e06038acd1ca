// The GBNF parser and compiler (grammar/grammar.h).
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "grammar/grammar.h"
#include "utf8_ranges.h"

namespace k3::grammar {

GrammarError::GrammarError(int line, int column, const std::string& what)
    : std::runtime_error("grammar line " + std::to_string(line) + ", column " +
                         std::to_string(column) + ": " + what),
      line_(line),
      column_(column) {}

namespace {

constexpr int kUnbounded = -1;
constexpr int kMostRepeats = 10000;  // {m,n} bounds above this are refused (the rule set grows)

struct Node {
  enum class Kind { alt, seq, literal, cls, ref, repeat, token };
  Kind kind = Kind::seq;
  std::vector<Node> kids;  // alt: sequences; seq: items; repeat: the repeated item
  std::string bytes;       // literal: UTF-8
  CodeRanges ranges;       // cls: code point ranges (after ^ and `.`)
  std::string name;        // ref
  size_t at = 0;           // ref: source offset (errors)
  int min = 0, max = 0;    // repeat
  uint32_t id = 0;         // token
};

struct RuleDef {
  std::string name;
  size_t at;
  Node body;  // alt
};

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  std::vector<RuleDef> parse() {
    std::vector<RuleDef> rules;
    for (;;) {
      skip(true);
      if (pos_ >= s_.size()) break;
      const size_t at = pos_;
      std::string name = parse_name();
      if (name.empty()) fail(at, "expected a rule name");
      skip(false);
      if (s_.substr(pos_, 3) != "::=")
        fail(pos_, "expected ::= after the rule name '" + name + "'");
      pos_ += 3;
      skip(true);
      rules.push_back({std::move(name), at, parse_alternates(false)});
      skip(false);
      if (pos_ < s_.size() && s_[pos_] != '\n' && s_[pos_] != '\r')
        fail(pos_, std::string("unexpected '") + s_[pos_] + "'");
    }
    return rules;
  }

  [[noreturn]] void fail(size_t at, const std::string& what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else if ((static_cast<unsigned char>(s_[i]) & 0xC0) != 0x80) {
        ++col;
      }
    }
    throw GrammarError(line, col, what);
  }

 private:
  // Blanks and comments; newlines too when `newlines`.
  void skip(bool newlines) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (pos_ < s_.size() && name_char(s_[pos_])) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  Node parse_alternates(bool nested) {
    Node alt;
    alt.kind = Node::Kind::alt;
    for (;;) {
      alt.kids.push_back(parse_sequence(nested));
      // An alternative continues after `|`, also on the next line at the top level.
      const size_t save = pos_;
      skip(true);
      if (pos_ < s_.size() && s_[pos_] == '|') {
        ++pos_;
        skip(true);
        continue;
      }
      pos_ = save;
      return alt;
    }
  }

  Node parse_sequence(bool nested) {
    Node seq;
    seq.kind = Node::Kind::seq;
    for (;;) {
      skip(nested);
      if (pos_ >= s_.size()) return seq;
      const char c = s_[pos_];
      if (c == '|' || c == ')' || c == '\n' || c == '\r') return seq;
      Node item = parse_primary(nested);
      for (;;) {
        // Postfix operators bind to the item just before them, without blanks between.
        if (pos_ >= s_.size()) break;
        const char p = s_[pos_];
        int lo, hi;
        if (p == '*') {
          lo = 0, hi = kUnbounded, ++pos_;
        } else if (p == '+') {
          lo = 1, hi = kUnbounded, ++pos_;
        } else if (p == '?') {
          lo = 0, hi = 1, ++pos_;
        } else if (p == '{') {
          parse_braces(lo, hi);
        } else {
          break;
        }
        Node rep;
        rep.kind = Node::Kind::repeat;
        rep.min = lo;
        rep.max = hi;
        rep.kids.push_back(std::move(item));
        item = std::move(rep);
      }
      seq.kids.push_back(std::move(item));
    }
  }

  void parse_braces(int& lo, int& hi) {
    const size_t at = pos_++;
    skip(false);
    auto number = [&]() -> std::optional<int> {
      const size_t start = pos_;
      long v = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        v = v * 10 + (s_[pos_++] - '0');
        if (v > kMostRepeats) fail(start, "repetition bound over " + std::to_string(kMostRepeats));
      }
      if (pos_ == start) return std::nullopt;
      return static_cast<int>(v);
    };
    const auto m = number();
    if (!m) fail(pos_, "expected a number after {");
    skip(false);
    lo = *m;
    hi = *m;
    if (pos_ < s_.size() && s_[pos_] == ',') {
      ++pos_;
      skip(false);
      const auto n = number();
      hi = n ? *n : kUnbounded;
      skip(false);
    }
    if (pos_ >= s_.size() || s_[pos_] != '}') fail(at, "unterminated {m,n} repetition");
    ++pos_;
    if (hi != kUnbounded && hi < lo) fail(at, "repetition {m,n} with n < m");
  }

  Node parse_primary(bool) {
    const size_t at = pos_;
    const char c = s_[pos_];
    Node n;
    if (c == '"') {
      ++pos_;
      n.kind = Node::Kind::literal;
      for (;;) {
        if (pos_ >= s_.size() || s_[pos_] == '\n') fail(at, "unterminated string literal");
        if (s_[pos_] == '"') {
          ++pos_;
          break;
        }
        append_utf8(n.bytes, parse_char());
      }
      return n;
    }
    if (c == '[') {
      ++pos_;
      n.kind = Node::Kind::cls;
      bool negated = false;
      if (pos_ < s_.size() && s_[pos_] == '^') negated = true, ++pos_;
      CodeRanges ranges;
      for (;;) {
        if (pos_ >= s_.size() || s_[pos_] == '\n') fail(at, "unterminated character class");
        if (s_[pos_] == ']') {
          ++pos_;
          break;
        }
        const size_t char_at = pos_;
        const uint32_t lo = parse_char();
        uint32_t hi = lo;
        if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
          ++pos_;
          hi = parse_char();
          if (hi < lo) fail(char_at, "character range with its end before its start");
        }
        ranges.push_back({lo, hi});
      }
      n.ranges = negated ? complement(ranges) : normalise(ranges);
      return n;
    }
    if (c == '.') {
      ++pos_;
      n.kind = Node::Kind::cls;
      n.ranges = complement({});
      return n;
    }
    if (c == '(') {
      ++pos_;
      skip(true);
      Node alt = parse_alternates(true);
      skip(true);
      if (pos_ >= s_.size() || s_[pos_] != ')') fail(at, "unmatched (");
      ++pos_;
      return alt;
    }
    if (c == '<' && s_.substr(pos_, 2) == "<[") {
      pos_ += 2;
      uint64_t id = 0;
      const size_t start = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9' && id < (1u << 30))
        id = id * 10 + static_cast<uint64_t>(s_[pos_++] - '0');
      if (pos_ == start || s_.substr(pos_, 2) != "]>") fail(at, "expected <[token id]>");
      pos_ += 2;
      n.kind = Node::Kind::token;
      n.id = static_cast<uint32_t>(id);
      return n;
    }
    if (name_char(c)) {
      n.kind = Node::Kind::ref;
      n.at = pos_;
      n.name = parse_name();
      return n;
    }
    fail(at, std::string("unexpected '") + c + "'");
  }

  // One code point of a literal or class: an escape, or one UTF-8 character of the source.
  uint32_t parse_char() {
    const size_t at = pos_;
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c == '\\') {
      if (++pos_ >= s_.size()) fail(at, "a \\ at the end");
      const char e = s_[pos_++];
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case '0':
          return 0;
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
        case '.':
          return static_cast<unsigned char>(e);
        case 'x':
          return hex(2, at);
        case 'u':
          return hex(4, at);
        case 'U':
          return hex(8, at);
        default:
          fail(at, std::string("unknown escape \\") + e);
      }
    }
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > s_.size()) fail(at, "invalid UTF-8 in the grammar");
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t i = 1; i < len; ++i) {
      const unsigned char k = static_cast<unsigned char>(s_[pos_ + i]);
      if ((k & 0xC0) != 0x80) fail(at, "invalid UTF-8 in the grammar");
      cp = (cp << 6) | (k & 0x3F);
    }
    pos_ += len;
    return cp;
  }

  uint32_t hex(int digits, size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= s_.size()) fail(at, "short hex escape");
      const char h = s_[pos_++];
      const int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
      if (d < 0) fail(at, "bad hex digit in an escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    if (v > 0x10FFFF) fail(at, "code point above U+10FFFF");
    return v;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

// Lowers the parsed rules to the flat element form (a friend of Grammar).
class Compiler {
 public:
  Compiler(const Parser& parser, std::vector<RuleDef> defs)
      : parser_(parser), defs_(std::move(defs)) {}

  Grammar compile(std::string_view root) {
    for (const RuleDef& d : defs_) {
      if (ids_.count(d.name)) parser_.fail(d.at, "rule '" + d.name + "' is defined twice");
      ids_[d.name] = new_rule(d.name, d.at);
    }
    const auto r = ids_.find(std::string(root));
    if (r == ids_.end()) parser_.fail(0, "no rule named '" + std::string(root) + "'");
    for (const RuleDef& d : defs_) {
      owner_ = ids_[d.name];
      Alts alts;  // not into pending_ directly: lowering adds rules (pending_ may move)
      alternatives(d.body, alts);
      pending_[owner_] = std::move(alts);
    }
    check_left_recursion();
    Grammar g;
    g.root_ = r->second;
    g.names_ = names_;
    g.rules_.resize(pending_.size());
    for (size_t rule = 0; rule < pending_.size(); ++rule)
      for (const std::vector<Element>& alt : pending_[rule]) {
        g.rules_[rule].push_back(static_cast<uint32_t>(g.elements_.size()));
        g.elements_.insert(g.elements_.end(), alt.begin(), alt.end());
        g.elements_.push_back(Element{});  // end
      }
    return g;
  }

 private:
  using Alts = std::vector<std::vector<Element>>;

  uint32_t new_rule(const std::string& name, size_t at) {
    const auto id = static_cast<uint32_t>(pending_.size());
    names_.push_back(name);
    defined_at_.push_back(at);
    owner_of_.push_back(id);
    pending_.emplace_back();
    return id;
  }
  // A rule made for a group, class or repetition inside the user's rule owner_.
  uint32_t synthetic(const std::string& kind) {
    const uint32_t id = new_rule(names_[owner_] + "/" + kind, defined_at_[owner_]);
    owner_of_[id] = owner_;
    return id;
  }

  static Element rule_element(uint32_t rule) {
    Element e;
    e.kind = Element::Kind::rule;
    e.value = rule;
    return e;
  }

  void alternatives(const Node& alt, Alts& out) {
    for (const Node& seq : alt.kids) {
      std::vector<Element> elements;
      sequence(seq, elements);
      out.push_back(std::move(elements));
    }
  }

  void sequence(const Node& seq, std::vector<Element>& out) {
    for (const Node& item : seq.kids) lower(item, out);
  }

  // Appends the elements that match `n` at this point of a sequence.
  void lower(const Node& n, std::vector<Element>& out) {
    switch (n.kind) {
      case Node::Kind::literal:
        for (char c : n.bytes) {
          Element e;
          e.kind = Element::Kind::bytes;
          e.lo = e.hi = static_cast<uint8_t>(c);
          out.push_back(e);
        }
        return;
      case Node::Kind::cls: {
        const std::vector<ByteSequence> seqs = utf8_sequences(n.ranges);
        if (seqs.size() == 1) {
          for (const auto& [lo, hi] : seqs[0]) {
            Element e;
            e.kind = Element::Kind::bytes;
            e.lo = lo;
            e.hi = hi;
            out.push_back(e);
          }
          return;
        }
        if (seqs.empty()) {
          // An empty class matches nothing: a rule without alternatives.
          out.push_back(rule_element(synthetic("empty-class")));
          return;
        }
        const uint32_t r = synthetic("class");
        for (const ByteSequence& s : seqs) {
          std::vector<Element> alt;
          for (const auto& [lo, hi] : s) {
            Element e;
            e.kind = Element::Kind::bytes;
            e.lo = lo;
            e.hi = hi;
            alt.push_back(e);
          }
          pending_[r].push_back(std::move(alt));
        }
        out.push_back(rule_element(r));
        return;
      }
      case Node::Kind::ref: {
        const auto it = ids_.find(n.name);
        if (it == ids_.end()) parser_.fail(n.at, "undefined rule '" + n.name + "'");
        out.push_back(rule_element(it->second));
        return;
      }
      case Node::Kind::token: {
        Element e;
        e.kind = Element::Kind::token;
        e.value = n.id;
        out.push_back(e);
        return;
      }
      case Node::Kind::alt: {
        if (n.kids.size() == 1) {
          sequence(n.kids[0], out);
          return;
        }
        const uint32_t r = synthetic("group");
        Alts alts;
        alternatives(n, alts);
        pending_[r] = std::move(alts);
        out.push_back(rule_element(r));
        return;
      }
      case Node::Kind::seq:
        sequence(n, out);
        return;
      case Node::Kind::repeat: {
        std::vector<Element> x;
        lower(n.kids[0], x);
        for (int i = 0; i < n.min; ++i) out.insert(out.end(), x.begin(), x.end());
        if (n.max == kUnbounded) {
          // star ::= x star | ε
          const uint32_t r = synthetic("star");
          std::vector<Element> more = x;
          more.push_back(rule_element(r));
          pending_[r].push_back(std::move(more));
          pending_[r].emplace_back();
          out.push_back(rule_element(r));
        } else if (n.max > n.min) {
          // opt_k ::= x opt_{k-1} | ε, opt_1 ::= x | ε
          uint32_t inner = 0;
          for (int k = 1; k <= n.max - n.min; ++k) {
            const uint32_t r = synthetic("opt");
            std::vector<Element> more = x;
            if (k > 1) more.push_back(rule_element(inner));
            pending_[r].push_back(std::move(more));
            pending_[r].emplace_back();
            inner = r;
          }
          out.push_back(rule_element(inner));
        }
        return;
      }
    }
  }

  // A rule that can reach itself before matching a byte or token would make the matcher loop.
  void check_left_recursion() {
    const size_t n = pending_.size();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& alt : pending_[r]) {
          bool all = true;
          for (const Element& e : alt)
            if (e.kind != Element::Kind::rule || !nullable[e.value]) {
              all = false;
              break;
            }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<uint32_t>> left(n);  // rules reachable at the left edge
    for (size_t r = 0; r < n; ++r)
      for (const auto& alt : pending_[r])
        for (const Element& e : alt) {
          if (e.kind != Element::Kind::rule) break;
          left[r].push_back(e.value);
          if (!nullable[e.value]) break;
        }
    std::vector<int> mark(n, 0);  // 0 new, 1 on the path, 2 done
    std::function<void(uint32_t)> visit = [&](uint32_t r) {
      mark[r] = 1;
      for (uint32_t next : left[r]) {
        if (mark[next] == 1) {
          const uint32_t named = owner_of_[next];  // the user's rule it belongs to
          parser_.fail(defined_at_[named],
                       "rule '" + names_[named] + "' is left-recursive (it can reach itself " +
                           "before matching anything); rewrite it with repetition");
        }
        if (mark[next] == 0) visit(next);
      }
      mark[r] = 2;
    };
    for (size_t r = 0; r < n; ++r)
      if (mark[r] == 0) visit(static_cast<uint32_t>(r));
  }

  const Parser& parser_;
  std::vector<RuleDef> defs_;
  std::map<std::string, uint32_t> ids_;
  std::vector<std::string> names_;
  std::vector<size_t> defined_at_;
  std::vector<uint32_t> owner_of_;
  uint32_t owner_ = 0;
  std::vector<Alts> pending_;
};

Grammar Grammar::parse(std::string_view source, std::string_view root) {
  Parser parser(source);
  std::vector<RuleDef> defs = parser.parse();
  if (defs.empty()) throw GrammarError(1, 1, "the grammar has no rule");
  return Compiler(parser, std::move(defs)).compile(root);
}

}  // namespace k3::grammar

// The grammar module (grammar/grammar.h, grammar/matcher.h, grammar/json_schema.h): GBNF errors
// with their line and column, the matcher against PCRE2 (an independent recursive-pattern
// matcher) on random strings, token masks against a brute-force walk, and JSON Schema grammars
// on valid and invalid instances.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "grammar/grammar.h"

#include <gtest/gtest.h>
#include <pcre2.h>

#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"

namespace {

using k3::grammar::Grammar;
using k3::grammar::GrammarError;
using k3::grammar::Matcher;
using k3::grammar::SchemaError;
using k3::grammar::Vocabulary;

// Every single byte as a token (ids 0..255), plus `extra` tokens after them.
std::shared_ptr<const Vocabulary> byte_vocab(std::vector<std::string> extra = {},
                                             std::vector<bool> special = {}) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  std::vector<bool> sp(256, false);
  for (size_t i = 0; i < extra.size(); ++i) {
    bytes.push_back(extra[i]);
    sp.push_back(i < special.size() && special[i]);
  }
  return std::make_shared<Vocabulary>(std::move(bytes), std::move(sp));
}

bool full_match(const std::shared_ptr<const Grammar>& g, const std::string& s) {
  static const auto vocab = byte_vocab();
  Matcher m(g, vocab);
  return m.accept_bytes(s) && m.accepting();
}

std::shared_ptr<const Grammar> compile(const std::string& gbnf) {
  return std::make_shared<const Grammar>(Grammar::parse(gbnf));
}

class Pcre {
 public:
  explicit Pcre(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_DOTALL, &error, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(error, msg, sizeof msg);
      ADD_FAILURE() << "PCRE2: " << reinterpret_cast<const char*>(msg) << " at " << offset << " in "
                    << pattern;
    }
    data_ = pcre2_match_data_create(4, nullptr);
  }
  ~Pcre() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  bool full_match(const std::string& s) const {
    if (!code_) return false;
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0,
                               PCRE2_ANCHORED | PCRE2_ENDANCHORED, data_, nullptr);
    return rc >= 0;
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
};

TEST(Gbnf, ErrorsGiveTheLineAndColumn) {
  struct Case {
    std::string gbnf;
    int line, column;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"root ::= \"a\" b\n", 1, 14, "undefined rule 'b'"},
      {"root ::= \"abc\n", 1, 10, "unterminated string literal"},
      {"root ::= a\na ::= [b-a]\n", 2, 8, "end before its start"},
      {"# c\nroot ::= (\"a\" | \"b\"\n", 2, 10, "unmatched ("},
      {"root ::= x\nx ::= x \"a\" | \"b\"\n", 2, 1, "left-recursive"},
      {"root ::= y\ny ::= z? y \"a\"\nz ::= \"q\"\n", 2, 1, "left-recursive"},
      {"root ::= \"a\"{3,2}\n", 1, 13, "n < m"},
      {"root ::= \"a\" \\q\n", 1, 14, "unexpected '\\'"},
      {"root = \"a\"\n", 1, 6, "expected ::="},
      {"start ::= \"a\"\n", 1, 1, "no rule named 'root'"},
      {"root ::= \"a\"\nroot ::= \"b\"\n", 2, 1, "defined twice"},
      {"root ::= \"\\z\"\n", 1, 11, "unknown escape"},
  };
  for (const Case& c : cases) {
    try {
      Grammar::parse(c.gbnf);
      ADD_FAILURE() << "accepted: " << c.gbnf;
    } catch (const GrammarError& e) {
      EXPECT_EQ(e.line(), c.line) << c.gbnf << " -> " << e.what();
      EXPECT_EQ(e.column(), c.column) << c.gbnf << " -> " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
    }
  }
}

// Each grammar beside an equivalent PCRE2 pattern written by hand, and the alphabet random
// strings are drawn from: on every string both agree.
TEST(Gbnf, AgreesWithPcre2OnRandomStrings) {
  struct Pair {
    std::string gbnf, pcre;
    std::vector<std::string> alphabet;
  };
  const std::vector<Pair> pairs = {
      {"root ::= \"(\" root* \")\"", R"((?<r>\((?&r)*\)))", {"(", ")"}},
      {"root ::= expr\nexpr ::= term (\"+\" term)*\nterm ::= [0-9]+ | \"(\" expr \")\"",
       R"((?<e>(?<t>[0-9]+|\((?&e)\))(\+(?&t))*))",
       {"1", "2", "+", "(", ")"}},
      {"root ::= \"a\"{2,4} \"b\"? [c-e]{0,2}", "a{2,4}b?[c-e]{0,2}", {"a", "b", "c", "e", "f"}},
      {"root ::= [^a-c\\x00-\\x1F]* \"z\"",
       "[^a-c\\x00-\\x1F]*z",
       {"a", "d", "z", "é", "€", "😀", "\x01"}},
      {"root ::= (\"ab\" | \"a\") (\"bc\" | \"c\")", "(ab|a)(bc|c)", {"a", "b", "c"}},
      {"root ::= . . \"!\"", "..!", {"x", "é", "😀", "!", "\n"}},
      {"root ::= x y\nx ::= \"é\"* \ny ::= [α-ω]+ | \"\"", "é*[α-ω]*", {"é", "α", "ω", "a", "β"}},
      {"root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= root | \"0\"",
       R"((?<r>\[((?<i>(?&r)|0)(,(?&i))*)?\]))",
       {"[", "]", ",", "0"}},
      {"root ::= \"\\\"\" ([^\"\\\\] | \"\\\\\" [\"\\\\n])* \"\\\"\"",
       R"("([^"\\]|\\["\\n])*")",
       {"\"", "\\", "n", "a"}},
      {"root ::= [a-z]{3} | [0-9]{1,} \".\" [0-9]{2}",
       "[a-z]{3}|[0-9]+\\.[0-9]{2}",
       {"a", "q", "1", ".", "9"}},
  };
  std::mt19937_64 rng(20261203);
  for (const Pair& p : pairs) {
    const auto g = compile(p.gbnf);
    const Pcre re(p.pcre);
    int accepted = 0;
    for (int n = 0; n < 4000; ++n) {
      std::string s;
      const size_t len = rng() % 11;
      for (size_t i = 0; i < len; ++i) s += p.alphabet[rng() % p.alphabet.size()];
      const bool ours = full_match(g, s), theirs = re.full_match(s);
      ASSERT_EQ(ours, theirs) << "grammar:\n"
                              << p.gbnf << "\npattern: " << p.pcre << "\ntext: " << s;
      accepted += ours;
    }
    EXPECT_GT(accepted, 20) << p.gbnf << ": too few random strings match to compare";
  }
}

// A token is allowed exactly when its bytes can be matched from the state; a `<[id]>` terminal
// allows that special id and no text spelling it.
TEST(Matcher, TokenMaskEqualsABruteForceWalk) {
  const std::vector<std::string> extra = {"ab",      "abc", "\"ab", "ba",   "a\"",   "{\"", "\":",
                                          "<|end|>", "xyz", "é",    "\xC3", "\xA9z", "}",   "},"};
  std::vector<bool> special(extra.size(), false);
  special[7] = true;  // "<|end|>" is id 263
  const auto vocab = byte_vocab(extra, special);
  const auto g = compile("root ::= \"{\" (\"\\\"\" [a-c]* \"\\\"\" \":\" [a-z]+)? \"}\" <[263]>\n");
  Matcher m(g, vocab);
  std::mt19937_64 rng(7);
  std::string history;  // the bytes accepted so far (the special is last when it comes)
  for (int step = 0; step < 40; ++step) {
    const std::vector<uint64_t> mask = m.allowed();
    std::vector<int32_t> allowed;
    for (size_t id = 0; id < vocab->size(); ++id) {
      const bool bit = mask[id / 64] >> (id % 64) & 1;
      // Brute force: a fresh matcher fed the same bytes, then this token.
      Matcher probe(g, vocab);
      ASSERT_TRUE(probe.accept_bytes(history));
      const bool ok = probe.accept_token(static_cast<int32_t>(id));
      EXPECT_EQ(bit, ok) << "token " << id << " after \"" << history << "\"";
      if (bit) allowed.push_back(static_cast<int32_t>(id));
    }
    ASSERT_FALSE(allowed.empty()) << "no token allowed after \"" << history << "\"";
    const int32_t pick = allowed[rng() % allowed.size()];
    ASSERT_TRUE(m.accept_token(pick));
    if (pick == 263) {
      EXPECT_TRUE(m.accepting());
      EXPECT_TRUE(m.finished());
      return;
    }
    history += vocab->bytes(static_cast<size_t>(pick));
  }
}

std::shared_ptr<const Grammar> schema(const std::string& json_schema) {
  return compile(k3::grammar::json_schema_to_gbnf(json_schema));
}

// Instances written compactly, as the grammar writes them.
TEST(JsonSchema, AcceptsValidAndRefusesInvalidInstances) {
  struct Case {
    std::string schema;
    std::vector<std::string> good, bad;
  };
  const std::vector<Case> cases = {
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a"],"additionalProperties":false})",
       {R"({"a":1})", R"({"a":-20,"b":"x"})", R"({"a":0,"b":""})"},
       {R"({})", R"({"b":"x"})", R"({"b":"x","a":1})", R"({"a":1,"c":2})", R"({"a":01})",
        R"({ "a":1})"}},
      {R"({"type":"array","items":{"enum":["x",1,null]},"minItems":1,"maxItems":3})",
       {R"(["x"])", R"([1,null,"x"])"},
       {R"([])", R"(["y"])", R"([1,1,1,1])"}},
      {R"({"type":"array","prefixItems":[{"type":"boolean"},{"const":"k"}],"items":false})",
       {R"([])", R"([true])", R"([false,"k"])"},
       {R"([true,"k",1])", R"(["k"])"}},
      {R"({"type":"string","minLength":2,"maxLength":3})",
       {R"("ab")", R"("a\"c")", R"("é😀")"},
       {R"("a")", R"("abcd")", R"("\ud800x")"}},
      {R"({"type":"integer","minimum":-5,"exclusiveMaximum":120})",
       {"-5", "0", "7", "99", "119"},
       {"-6", "120", "1000", "-0", "05"}},
      {R"({"type":"integer","minimum":100,"maximum":215})",
       {"100", "150", "199", "200", "211", "215"},
       {"99", "216", "300", "1000", "-100"}},
      {R"({"type":"integer","minimum":17})",
       {"17", "99", "100", "123456"},
       {"16", "9", "-17", "0"}},
      {R"({"type":"number","minimum":0,"maximum":10})",
       {"0", "3.25", "9.999", "10", "10.00"},
       {"-1", "10.5", "11", "1e3"}},
      {R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})",
       {R"("AB-123")"},
       {R"("AB-12")", R"("ab-123")", R"("AB-1234")"}},
      {R"({"type":"string","pattern":"b+"})", {R"("b")", R"("abbc")"}, {R"("ac")"}},
      {R"({"type":"string","format":"date"})",
       {R"("2026-12-03")", R"("2024-02-28")"},
       {R"("2026-13-01")", R"("2026-04-31")", R"("26-12-03")"}},
      {R"({"type":"string","format":"uuid"})",
       {R"("123e4567-e89b-12d3-a456-426614174000")"},
       {R"("123e4567e89b12d3a456426614174000")"}},
      {R"({"anyOf":[{"type":"null"},{"type":"array","items":{"$ref":"#"},"maxItems":2}]})",
       {"null", "[]", "[null,[]]", "[[null]]"},
       {"[null,null,null]", "1"}},
      {R"({"$defs":{"p":{"type":"object","properties":{"x":{"type":"number"}},"required":["x"]}},"allOf":[{"$ref":"#/$defs/p"},{"properties":{"y":{"type":"boolean"}}}]})",
       {R"({"x":1.5})", R"({"x":-2e5,"y":true})"},
       {R"({"y":true})"}},
      {R"({"type":"object","properties":{"name":{"type":"string"}},"additionalProperties":{"type":"integer"}})",
       {R"({})", R"({"name":"q"})", R"({"name":"q","nam":1,"names":2})", R"({"other":3})"},
       {R"({"name":1})", R"({"name":"q","name":2})", R"({"other":"x"})"}},
      {R"({"type":["string","null"]})", {R"("x")", "null"}, {"1", "true"}},
      {R"({})", {"1", R"({"a":[true,null]})", R"("s")"}, {"tru", "{a:1}"}},
  };
  for (const Case& c : cases) {
    std::shared_ptr<const Grammar> g;
    try {
      g = schema(c.schema);
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.schema << ": " << e.what();
      continue;
    }
    for (const std::string& v : c.good)
      EXPECT_TRUE(full_match(g, v)) << c.schema << " should accept " << v;
    for (const std::string& v : c.bad)
      EXPECT_FALSE(full_match(g, v)) << c.schema << " should refuse " << v;
  }
}

TEST(JsonSchema, RefusesWhatItCannotEnforceNamingTheKeyword) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"string","not":{"const":"a"}})", "not"},
      {R"({"type":"array","uniqueItems":true})", "uniqueItems"},
      {R"({"type":"number","multipleOf":3})", "multipleOf"},
      {R"({"type":"object","patternProperties":{"^x":{}}})", "patternProperties"},
      {R"({"$ref":"https://example.com/s.json"})", "$ref"},
      {R"({"$ref":"#/$defs/missing"})", "$ref"},
      {R"({"type":"string","format":"ipv6"})", "format"},
      {R"j({"type":"string","pattern":"(a)\\1"})j", "pattern"},
      {R"j({"type":"string","pattern":"a(?=b)"})j", "pattern"},
      {R"({"type":"number","minimum":0.5})", "minimum"},
      {R"({"type":"strange"})", "type"},
      {R"({"type":"string","minLength":-1})", "minLength"},
  };
  for (const auto& [s, keyword] : cases) {
    try {
      k3::grammar::json_schema_to_gbnf(s);
      ADD_FAILURE() << "accepted: " << s;
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.keyword(), keyword) << s << " -> " << e.what();
    }
  }
  EXPECT_THROW(k3::grammar::json_schema_to_gbnf("{not json"), SchemaError);
  EXPECT_THROW(k3::grammar::json_schema_to_gbnf("false"), SchemaError);
}

}  // namespace

// pretokenizer_test — the Unicode 16 property tables (text/unicode.h) against the lists of
// docs/tokenizer.md §2.3/§2.5, the Kimi pre-tokenizer scanner (text/pretokenizer.h) on every
// piece example of the spec, the release's 400,000/25,000 pre-chunking, and the scanner against
// a brute-force backtracking matcher written straight from the regex on random strings.
#include "text/pretokenizer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/unicode.h"

namespace {

using k3::text::chunk_text;
using k3::text::Piece;
using k3::text::pretokenize;
using k3::text::unicode_flags;
using Strings = std::vector<std::string>;

// UTF-8 encoding of code points (a local helper so the test depends on nothing but the unit).
std::string encode(std::u32string_view cps) {
  std::string out;
  for (char32_t cp : cps) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

// True when `pieces` are non-empty, in order and cover [0, size) without gaps.
bool tiles(const std::vector<Piece>& pieces, size_t size) {
  size_t at = 0;
  for (const Piece& p : pieces) {
    if (p.begin != at || p.end <= p.begin) return false;
    at = p.end;
  }
  return at == size;
}

// The pre-tokenizer pieces of `text` as strings (checking that they tile it).
Strings pieces_of(std::string_view text) {
  std::vector<Piece> pieces;
  pretokenize(text, pieces);
  EXPECT_TRUE(tiles(pieces, text.size())) << text;
  Strings out;
  for (const Piece& p : pieces) out.emplace_back(text.substr(p.begin, p.end - p.begin));
  return out;
}

// Expects the pre-tokenizer to cut `text` into exactly `expected` (which must concatenate to it).
void expect_pieces(const std::string& text, const Strings& expected) {
  std::string joined;
  for (const std::string& piece : expected) joined += piece;
  ASSERT_EQ(joined, text) << "the expected pieces do not spell the text";
  EXPECT_EQ(pieces_of(text), expected) << "text: " << text;
}

// ---------------------------------------------------------------------------------------------
// Unicode tables

using Ranges = std::vector<std::pair<char32_t, char32_t>>;  // inclusive ranges

bool in_ranges(const Ranges& ranges, char32_t cp) {
  for (const auto& [first, last] : ranges) {
    if (cp >= first && cp <= last) return true;
  }
  return false;
}

// Expects `flag` set exactly on `ranges` over all code points.
void expect_flag_exactly_on(uint16_t flag, const Ranges& ranges, const char* name) {
  size_t wrong = 0;
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    const bool has = unicode_flags(cp) & flag;
    if (has != in_ranges(ranges, cp) && ++wrong <= 10) {
      ADD_FAILURE() << name << " wrong at U+" << std::hex << uint32_t(cp) << ": table says " << has;
    }
  }
  EXPECT_EQ(wrong, 0u) << name;
}

TEST(UnicodeTables, HanIsExactlyTheScriptHanRangesOfTheSpec) {
  // docs/tokenizer.md §2.3 (regex-syntax's Unicode 16 Script=Han table).
  const Ranges han = {
      {0x2E80, 0x2E99},   {0x2E9B, 0x2EF3},   {0x2F00, 0x2FD5},   {0x3005, 0x3005},
      {0x3007, 0x3007},   {0x3021, 0x3029},   {0x3038, 0x303B},   {0x3400, 0x4DBF},
      {0x4E00, 0x9FFF},   {0xF900, 0xFA6D},   {0xFA70, 0xFAD9},   {0x16FE2, 0x16FE3},
      {0x16FF0, 0x16FF1}, {0x20000, 0x2A6DF}, {0x2A700, 0x2B739}, {0x2B740, 0x2B81D},
      {0x2B820, 0x2CEA1}, {0x2CEB0, 0x2EBE0}, {0x2EBF0, 0x2EE5D}, {0x2F800, 0x2FA1D},
      {0x30000, 0x3134A}, {0x31350, 0x323AF}};
  expect_flag_exactly_on(k3::text::kHan, han, "Han");
}

TEST(UnicodeTables, WhiteSpaceIsExactlyTheListOfTheSpec) {
  const Ranges white_space = {
      {0x09, 0x0D},     {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},     {0x1680, 0x1680},
      {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}};
  expect_flag_exactly_on(k3::text::kWhiteSpace, white_space, "White_Space");
}

TEST(UnicodeTables, PySpaceIsPythonIsspace) {
  // §2.5: Python str.isspace() = White_Space plus U+001C..U+001F.
  const Ranges py_space = {{0x09, 0x0D},     {0x1C, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},
                           {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                           {0x205F, 0x205F}, {0x3000, 0x3000}};
  expect_flag_exactly_on(k3::text::kPySpace, py_space, "isspace");
}

TEST(UnicodeTables, CategoriesAreExclusive) {
  const uint16_t categories[] = {k3::text::kLu, k3::text::kLl,   k3::text::kLt,    k3::text::kLm,
                                 k3::text::kLo, k3::text::kMark, k3::text::kNumber};
  size_t letters = 0;
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    const uint16_t f = unicode_flags(cp);
    int count = 0;
    for (uint16_t c : categories) count += (f & c) != 0;
    ASSERT_LE(count, 1) << std::hex << uint32_t(cp);
    letters += (f & k3::text::kLetter) != 0;
  }
  // Unicode 16.0 has 141,028 letters (L = Lu+Ll+Lt+Lm+Lo per DerivedGeneralCategory.txt).
  EXPECT_EQ(letters, 141028u);
}

TEST(UnicodeTables, SpotChecks) {
  using namespace k3::text;
  EXPECT_EQ(unicode_flags(U'A'), kLu);
  EXPECT_EQ(unicode_flags(U'a'), kLl);
  EXPECT_EQ(unicode_flags(U'0'), kNumber);
  EXPECT_EQ(unicode_flags(U' '), kWhiteSpace | kPySpace);
  EXPECT_EQ(unicode_flags(U'!'), 0);
  EXPECT_EQ(unicode_flags(0x01C5), kLt);             // ǅ
  EXPECT_EQ(unicode_flags(0x02B0), kLm);             // ʰ
  EXPECT_EQ(unicode_flags(0x3005), kHan | kLm);      // 々
  EXPECT_EQ(unicode_flags(0x3007), kHan | kNumber);  // 〇 (Nl)
  EXPECT_EQ(unicode_flags(0x2E80), kHan);            // ⺀ (So)
  EXPECT_EQ(unicode_flags(0x16FE2), kHan);           // Po
  EXPECT_EQ(unicode_flags(0x16FF0), kHan | kMark);   // Mc
  EXPECT_EQ(unicode_flags(0x4E2D), kHan | kLo);      // 中
  EXPECT_EQ(unicode_flags(0x3001), 0);               // 、 is not Han (Script=Common)
  EXPECT_EQ(unicode_flags(0x30FC), kLm);             // ー (Script=Common)
  EXPECT_EQ(unicode_flags(0x30AB), kLo);             // カ
  EXPECT_EQ(unicode_flags(0xD55C), kLo);             // 한
  EXPECT_EQ(unicode_flags(0x0301), kMark);           // Mn
  EXPECT_EQ(unicode_flags(0x0903), kMark);           // Mc
  EXPECT_EQ(unicode_flags(0x20DD), kMark);           // Me
  EXPECT_EQ(unicode_flags(0x0660), kNumber);         // Nd
  EXPECT_EQ(unicode_flags(0x00BD), kNumber);         // ½ No
  EXPECT_EQ(unicode_flags(0x216B), kNumber);         // Ⅻ Nl
  EXPECT_EQ(unicode_flags(0x017F), kLl);             // ſ
  EXPECT_EQ(unicode_flags(0x0295), kLl);             // ʕ is Ll in Unicode 16
  EXPECT_EQ(unicode_flags(0x200B), 0);               // ZERO WIDTH SPACE is not a space
  EXPECT_EQ(unicode_flags(0xFEFF), 0);
  EXPECT_EQ(unicode_flags(0x0085), kWhiteSpace | kPySpace);
  EXPECT_EQ(unicode_flags(0x001F), kPySpace);
  EXPECT_EQ(unicode_flags(0x1F600), 0);  // 😀 So
  EXPECT_EQ(unicode_flags(0xE000), 0);   // private use
  EXPECT_EQ(unicode_flags(0xD800), 0);   // surrogate
  EXPECT_EQ(unicode_flags(0x10FFFF), 0);
  EXPECT_EQ(unicode_flags(0x110000), 0);
  EXPECT_EQ(unicode_flags(0xFFFFFFFF), 0);
}

// ---------------------------------------------------------------------------------------------
// Pieces: the examples of docs/tokenizer.md

TEST(Pretokenize, EmptyTextHasNoPieces) {
  std::vector<Piece> pieces;
  pretokenize("", pieces);
  EXPECT_TRUE(pieces.empty());
}

TEST(Pretokenize, KimiVersusO200kTable) {  // §2.2
  expect_pieces("中文abc", {"中文", "abc"});
  expect_pieces("日本語のテキスト", {"日本語", "のテキスト"});
  expect_pieces("a々b", {"a", "々", "b"});
  expect_pieces("〇1", {"〇", "1"});
  expect_pieces("x;\n// c", {"x", ";\n", "//", " c"});
}

TEST(Pretokenize, EighteenCaseCorpus) {  // §7.1, the pieces column
  expect_pieces("Hello, world! The quick brown fox jumps over 12345 lazy dogs.",
                {"Hello", ",", " world", "!", " The", " quick", " brown", " fox", " jumps", " over",
                 " ", "123", "45", " lazy", " dogs", "."});
  expect_pieces("def main():\n    return {'a': 1}\n",
                {"def", " main", "():\n", "   ", " return", " {'", "a", "':", " ", "1", "}\n"});
  expect_pieces("Kimi K3 是一个开源模型。它支持中文和English mixed text!",
                {"Kimi", " K", "3", " ", "是一个开源模型", "。", "它支持中文和", "English",
                 " mixed", " text", "!"});
  expect_pieces("  indented\n\n\nnewlines\t\ttabs   ",
                {" ", " indented", "\n\n\n", "newlines", "\t", "\ttabs", "   "});
  expect_pieces(
      "I'll say we've DONE it. HTTPResponse XMLHttpRequest",
      {"I'll", " say", " we've", " DONE", " it", ".", " HTTPResponse", " XMLHttp", "Request"});
  expect_pieces("今天天气怎么样？我们去公园散步吧。",
                {"今天天气怎么样", "？", "我们去公园散步吧", "。"});
  expect_pieces("日本語のテキストです。カタカナとひらがな、漢字も。",
                {"日本語", "のテキストです", "。カタカナとひらがな", "、", "漢字", "も", "。"});
  expect_pieces("한국어 텍스트도 있습니다.", {"한국어", " 텍스트도", " 있습니다", "."});
  expect_pieces("naïve café résumé ÜBER Straße mañana",
                {"naïve", " café", " résumé", " ÜBER", " Straße", " mañana"});
  expect_pieces("don't CAN'T it's I'M we'RE you'll",
                {"don't", " CAN'T", " it's", " I'M", " we'RE", " you'll"});
  expect_pieces("1 12 123 1234 12345 3.14159 -42",
                {"1", " ", "12", " ", "123", " ", "123", "4", " ", "123", "45", " ", "3", ".",
                 "141", "59", " -", "42"});
  expect_pieces("!!! ??? ... --- /// ***bold*** `code`",
                {"!!!", " ???", " ...", " ---", " ///", " ***", "bold", "***", " `", "code", "`"});
  expect_pieces("  a\n\n\nb\t\t  c   \n d  ",
                {" ", " a", "\n\n\n", "b", "\t\t ", " c", "   \n", " d", "  "});
  expect_pieces("🚀 emoji test 🎉 ½ ² € §",
                {"🚀", " emoji", " test", " 🎉", " ", "½", " ", "²", " €", " §"});
  expect_pieces("iPhone macOS HTTPResponse XMLHttpRequest camelCase snake_case",
                {"i", "Phone", " mac", "OS", " HTTPResponse", " XMLHttp", "Request", " camel",
                 "Case", " snake", "_case"});
  expect_pieces("々 〇 一二三 中中中English中文",
                {"々", " ", "〇", " ", "一二三", " ", "中中中", "English", "中文"});
  expect_pieces("\r\nwindows\r\nline\r\nendings\r\n",
                {"\r\n", "windows", "\r\n", "line", "\r\n", "endings", "\r\n"});
  expect_pieces("mixed 中文with no space英文boundaries测试",
                {"mixed", " ", "中文", "with", " no", " space", "英文", "boundaries", "测试"});
}

TEST(Pretokenize, RuleAIsTriedWholeBeforeRuleB) {  // §2.4 notes
  expect_pieces("\u0301A", {"\u0301", "A"});       // A without prefix takes the mark alone
  expect_pieces("\u0301a", {"\u0301a"});           // the mark as prefix
  expect_pieces("ǅa ǅ", {"ǅa", " ǅ"});             // Lt is upper-ish only
}

TEST(Pretokenize, RuleATakesTheLargestLowerishPosition) {
  // S1* gives back characters until one that is also in S2 (Lm, Lo, M) is found.
  expect_pieces("ABʰCd", {"ABʰCd"});
  expect_pieces("ABʰC1", {"ABʰ", "C", "1"});
  expect_pieces("ʰA", {"ʰ", "A"});
  expect_pieces("AB\u0301CD's", {"AB\u0301", "CD's"});
  expect_pieces(" ABカD", {" ABカ", "D"});
  expect_pieces("HTTPResponse", {"HTTPResponse"});
}

TEST(Pretokenize, HanNonLettersAreAbsorbedWhenNotLeading) {
  expect_pieces("!⺀", {"!⺀"});                  // So radical joins punctuation
  expect_pieces("1〇2", {"1〇2"});                // Nl Han numeral joins digits
  expect_pieces("123〇", {"123", "〇"});          // at most three
  expect_pieces("x𖿰y", {"x", "𖿰", "y"});    // Han Mc never joins letters
  expect_pieces("!\U00016FF0", {"!\U00016FF0"});  // ... but is punctuation for rule D
  expect_pieces("⺀!", {"⺀", "!"});              // a leading Han code point is rule H
  expect_pieces("a\u3005\u3005b", {"a", "\u3005\u3005", "b"});
}

TEST(Pretokenize, PrefixOnlyAtThePieceStart) {
  expect_pieces(" (moonshot).", {" (", "moonshot", ")."});
  expect_pieces("(moonshot)", {"(moonshot", ")"});
  expect_pieces("。カタカナ", {"。カタカナ"});
  expect_pieces("\tword", {"\tword"});
  expect_pieces("a\u0085b", {"a", "\u0085b"});  // White_Space may be the prefix
  expect_pieces("a\u200Bb", {"a", "\u200Bb"});
  expect_pieces(
      "a\x1f"
      "b",
      {"a",
       "\x1f"
       "b"});
  expect_pieces("1a", {"1", "a"});  // digits are never a prefix
  expect_pieces(
      "\n"
      "a",
      {"\n", "a"});  // nor CR/LF
}

TEST(Pretokenize, PunctuationRule) {
  expect_pieces("\t!", {"\t", "!"});  // only U+0020 joins punctuation
  expect_pieces("a\t(b)", {"a", "\t", "(b", ")"});
  expect_pieces("a !", {"a", " !"});
  expect_pieces("a  !", {"a", " ", " !"});
  expect_pieces("a\u00A0!", {"a", "\u00A0", "!"});
  expect_pieces("a ?!\n\r\nb", {"a", " ?!\n\r\n", "b"});
  expect_pieces(";\n\t", {";\n", "\t"});  // the tail is CR/LF only
  expect_pieces(";\u2028", {";", "\u2028"});
  expect_pieces(
      "a\x1f\x1f"
      "b",
      {"a", "\x1f\x1f", "b"});  // U+001F is not \s: punctuation
  expect_pieces("😀🎉", {"😀🎉"});
}

TEST(Pretokenize, WhitespaceRules) {
  expect_pieces("a \n b", {"a", " \n", " b"});
  expect_pieces(" \n \n  x", {" \n \n", " ", " x"});  // up to the last newline
  expect_pieces("a   ", {"a", "   "});                // F at the end of the text
  expect_pieces("a \u00A0b", {"a", " ", "\u00A0b"});
  expect_pieces("a\u0085\u0085b", {"a", "\u0085", "\u0085b"});
  expect_pieces("a\u2028\u2028b", {"a", "\u2028", "\u2028b"});      // U+2028 is \s, not a newline
  expect_pieces("a\u3000\u30001", {"a", "\u3000", "\u3000", "1"});  // F, then G
  expect_pieces("a  1", {"a", " ", " ", "1"});
  expect_pieces("\r", {"\r"});
  expect_pieces("\r\r\n \t", {"\r\r\n", " \t"});
  expect_pieces(" ", {" "});
}

TEST(Pretokenize, Contractions) {
  expect_pieces("don'ſ", {"don'ſ"});  // U+017F folds to s
  expect_pieces("HE'S", {"HE'S"});
  expect_pieces("WE'LL", {"WE'LL"});
  expect_pieces("we'Re", {"we'Re"});
  expect_pieces("I'Ve I'd I'M", {"I'Ve", " I'd", " I'M"});
  expect_pieces("it'sx", {"it's", "x"});
  expect_pieces("don'", {"don", "'"});
  expect_pieces("we'r", {"we", "'r"});
  expect_pieces("don’t", {"don", "’t"});  // U+2019 is not an apostrophe
  expect_pieces("'s", {"'s"});            // a prefix, not a contraction
  expect_pieces("1's", {"1", "'s"});
}

// ---------------------------------------------------------------------------------------------
// A brute-force backtracking matcher for the pattern, written from the regex text (not from the
// scanner): each alternative is a list of items matched with Perl-style backtracking.

namespace brute {

using CharSet = bool (*)(char32_t);

// The character classes of the pattern, each from its spelling in the regex.
bool has(char32_t cp, uint16_t flags) {
  return (unicode_flags(cp) & flags) != 0;
}
bool han(char32_t cp) {
  return has(cp, k3::text::kHan);
}
bool letter(char32_t cp) {
  return has(cp, k3::text::kLetter);
}
bool number(char32_t cp) {
  return has(cp, k3::text::kNumber);
}
bool white_space(char32_t cp) {
  return has(cp, k3::text::kWhiteSpace);
}
bool cr_lf(char32_t cp) {
  return cp == '\r' || cp == '\n';
}
// [^\r\n\p{L}\p{N}]
bool not_newline_letter_number(char32_t cp) {
  return !cr_lf(cp) && !letter(cp) && !number(cp);
}
// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
bool upper_set(char32_t cp) {
  using namespace k3::text;
  return has(cp, kLu | kLt | kLm | kLo | kMark) && !han(cp);
}
// [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
bool lower_set(char32_t cp) {
  using namespace k3::text;
  return has(cp, kLl | kLm | kLo | kMark) && !han(cp);
}
bool space_char(char32_t cp) {
  return cp == ' ';
}
// [^\s\p{L}\p{N}]
bool not_space_letter_number(char32_t cp) {
  return !white_space(cp) && !letter(cp) && !number(cp);
}

// Simple case folding (CaseFolding.txt, status C+S) for the letters the pattern can meet:
// A-Z, U+017F ſ -> s, U+212A KELVIN SIGN -> k, U+212B ANGSTROM SIGN -> å.
char32_t fold(char32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp == 0x017F) return 's';
  if (cp == 0x212A) return 'k';
  if (cp == 0x212B) return 0xE5;
  return cp;
}

enum class Kind { kSet, kContraction, kNotFollowedByNonSpace };
constexpr size_t kUnbounded = SIZE_MAX;

struct Item {
  Kind kind;
  CharSet set = nullptr;
  size_t min = 0;
  size_t max = 0;
};

Item optional(CharSet s) {
  return {Kind::kSet, s, 0, 1};
}
Item star(CharSet s) {
  return {Kind::kSet, s, 0, kUnbounded};
}
Item plus(CharSet s) {
  return {Kind::kSet, s, 1, kUnbounded};
}

// The eight alternatives, in order.
const std::vector<std::vector<Item>>& alternatives() {
  static const std::vector<std::vector<Item>> kAlternatives = {
      {plus(han)},  // [\p{Han}]+
      {optional(not_newline_letter_number), star(upper_set), plus(lower_set), {Kind::kContraction}},
      {optional(not_newline_letter_number), plus(upper_set), star(lower_set), {Kind::kContraction}},
      {{Kind::kSet, number, 1, 3}},  // \p{N}{1,3}
      {optional(space_char), plus(not_space_letter_number),
       star(cr_lf)},                                        //  ?[^\s\p{L}\p{N}]+[\r\n]*
      {star(white_space), plus(cr_lf)},                     // \s*[\r\n]+
      {plus(white_space), {Kind::kNotFollowedByNonSpace}},  // \s+(?!\S)
      {plus(white_space)},                                  // \s+
  };
  return kAlternatives;
}

// Matches items[index..] at `pos`; on success sets `end`. Greedy with backtracking.
bool match_items(const std::vector<Item>& items, size_t index, const std::u32string& text,
                 size_t pos, size_t& end) {
  if (index == items.size()) {
    end = pos;
    return true;
  }
  const Item& item = items[index];
  switch (item.kind) {
    case Kind::kSet: {
      size_t count = 0;
      while (count < item.max && pos + count < text.size() && item.set(text[pos + count])) ++count;
      for (size_t c = count + 1; c-- > item.min;) {
        if (match_items(items, index + 1, text, pos + c, end)) return true;
      }
      return false;
    }
    case Kind::kContraction: {  // (?i:'s|'t|'re|'ve|'m|'ll|'d)?  — greedy: the group first
      for (std::u32string_view word : {U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"}) {
        bool matches = pos + word.size() <= text.size();
        for (size_t k = 0; matches && k < word.size(); ++k)
          matches = fold(text[pos + k]) == fold(word[k]);
        if (matches && match_items(items, index + 1, text, pos + word.size(), end)) return true;
      }
      return match_items(items, index + 1, text, pos, end);
    }
    case Kind::kNotFollowedByNonSpace:  // (?!\S)
      if (pos < text.size() && !white_space(text[pos])) return false;
      return match_items(items, index + 1, text, pos, end);
  }
  return false;
}

// find_iter: leftmost-first matches, searching on from the end of the previous one.
Strings pieces(const std::u32string& text) {
  Strings out;
  size_t pos = 0;
  while (pos < text.size()) {
    bool found = false;
    for (size_t start = pos; start < text.size() && !found; ++start) {
      for (const auto& alternative : alternatives()) {
        size_t end = 0;
        if (match_items(alternative, 0, text, start, end) && end > start) {
          if (start > pos) out.push_back("<gap:" + encode(text.substr(pos, start - pos)) + ">");
          out.push_back(encode(text.substr(start, end - start)));
          pos = end;
          found = true;
          break;
        }
      }
    }
    if (!found) {
      out.push_back("<unmatched:" + encode(text.substr(pos)) + ">");
      break;
    }
  }
  return out;
}

}  // namespace brute

// Code points to draw random texts from: ASCII letters, digits, punctuation, whitespace,
// apostrophes and the contraction letters, Han (letters, 々, 〇, a radical, Mc, Po), kana,
// Hangul, marks, Lt, Lm, No, Nl, emoji, non-ASCII spaces and the near-spaces.
const std::u32string kRandomPool =
    U"abcxyzABCXYZ0189.,;!?-_/(){}\"#*`@"
    U"      \t\t\r\r\n\n\v\f"
    U"''''sStTrReEvVmMlLdDſ"
    U"中文々〇\u3021\u2E80\u2F00\U00016FF0\U00016FE2\U00020000"
    U"あカー。、한국\u0301\u0903\u20DD\u01C5\u02B0½²\u216B\u0660"
    U"😀🎉\u200D\u00A0\u3000\u2028\u2029\u0085\u001F\u001C\u200B\uFEFF\u212A";

TEST(Pretokenize, MatchesBruteForceRegexOnRandomStrings) {
  std::mt19937 rng(20250613);
  size_t mismatches = 0;
  for (int iteration = 0; iteration < 20000; ++iteration) {
    std::u32string cps(rng() % 25, U' ');
    for (char32_t& cp : cps) cp = kRandomPool[rng() % kRandomPool.size()];
    const Strings want = brute::pieces(cps);
    const Strings got = pieces_of(encode(cps));
    if (got != want && ++mismatches <= 10) {
      std::string got_text, want_text;
      for (const auto& p : got) got_text += "[" + p + "]";
      for (const auto& p : want) want_text += "[" + p + "]";
      ADD_FAILURE() << "text: " << encode(cps) << "\n  scanner: " << got_text
                    << "\n  regex:   " << want_text;
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(Pretokenize, BruteForceAgreesWithTheSpecExamples) {  // the oracle itself is sound
  EXPECT_EQ(brute::pieces(U"\u0301A"), (Strings{"\u0301", "A"}));
  EXPECT_EQ(brute::pieces(U" (moonshot)."), (Strings{" (", "moonshot", ")."}));
  EXPECT_EQ(brute::pieces(U"  a\n\n\nb\t\t  c   \n d  "),
            (Strings{" ", " a", "\n\n\n", "b", "\t\t ", " c", "   \n", " d", "  "}));
  EXPECT_EQ(brute::pieces(U"don'ſ CAN'T"), (Strings{"don'ſ", " CAN'T"}));
}

TEST(Pretokenize, PiecesTileRandomText) {
  std::mt19937 rng(7);
  for (int iteration = 0; iteration < 2000; ++iteration) {
    std::u32string cps(rng() % 300, U' ');
    for (char32_t& cp : cps) cp = kRandomPool[rng() % kRandomPool.size()];
    const std::string text = encode(cps);
    std::vector<Piece> pieces;
    pretokenize(text, pieces);
    ASSERT_TRUE(tiles(pieces, text.size())) << text;
  }
}

TEST(Pretokenize, AppendsToTheOutput) {
  std::vector<Piece> pieces = {{7, 9}};
  pretokenize("a b", pieces);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[1].begin, 0u);
  EXPECT_EQ(pieces[2].end, 3u);
}

// ---------------------------------------------------------------------------------------------
// chunk_text (§2.5)

// The chunk boundaries of `text` as byte ranges.
std::vector<std::pair<size_t, size_t>> chunks_of(std::string_view text) {
  std::vector<Piece> pieces;
  chunk_text(text, pieces);
  EXPECT_TRUE(tiles(pieces, text.size()));
  std::vector<std::pair<size_t, size_t>> out;
  for (const Piece& p : pieces) out.emplace_back(p.begin, p.end);
  return out;
}

using Ranges64 = std::vector<std::pair<size_t, size_t>>;

TEST(ChunkText, EmptyAndShortTexts) {
  EXPECT_TRUE(chunks_of("").empty());
  EXPECT_EQ(chunks_of("hello world"), (Ranges64{{0, 11}}));
}

TEST(ChunkText, SpaceRunIsCutAt25000) {
  const std::string text = std::string(30000, ' ') + "end";
  EXPECT_EQ(chunks_of(text), (Ranges64{{0, 25000}, {25000, 30003}}));
}

TEST(ChunkText, RunOfExactly25000IsNotCut) {
  EXPECT_EQ(chunks_of(std::string(25000, 'a')), (Ranges64{{0, 25000}}));
  EXPECT_EQ(chunks_of(std::string(25000, ' ') + "x" + std::string(25000, ' ')),
            (Ranges64{{0, 50001}}));
}

TEST(ChunkText, NonSpaceRunOf25001IsCut) {
  EXPECT_EQ(chunks_of(std::string(25001, 'a')), (Ranges64{{0, 25000}, {25000, 25001}}));
  EXPECT_EQ(chunks_of(std::string(50001, '7')),
            (Ranges64{{0, 25000}, {25000, 50000}, {50000, 50001}}));
}

TEST(ChunkText, IsspaceNotWhiteSpaceBreaksTheRun) {
  // U+001F is isspace() (not White_Space): it ends the digit run, so nothing is cut.
  const std::string digits = std::string(15000, '1') + "\x1f" + std::string(15001, '1');
  EXPECT_EQ(chunks_of(digits), (Ranges64{{0, 30002}}));
  // U+200B is neither: the run is 30,002 code points long and is cut after 25,000 code points,
  // which is byte 25,002 (U+200B takes three bytes).
  const std::string zero_width = std::string(15000, '1') + "\u200B" + std::string(15001, '1');
  EXPECT_EQ(chunks_of(zero_width), (Ranges64{{0, 25002}, {25002, 30004}}));
}

TEST(ChunkText, MultiByteRunsCountCodePoints) {
  std::string han;
  for (int i = 0; i < 25001; ++i) han += "中";
  EXPECT_EQ(chunks_of(han), (Ranges64{{0, 75000}, {75000, 75003}}));
  std::string ideographic_spaces;
  for (int i = 0; i < 25001; ++i) ideographic_spaces += "\u3000";
  EXPECT_EQ(chunks_of(ideographic_spaces), (Ranges64{{0, 75000}, {75000, 75003}}));
}

TEST(ChunkText, SliceAt400000CodePoints) {
  // "héllo " is 6 code points and 7 bytes; 66,687 of them plus "x" are 400,123 code points.
  // Code point 400,000 is the 'o' of the 66,667th word (mid-word), at byte 66,666*7 + 5.
  std::string text;
  for (int i = 0; i < 66687; ++i) text += "h\u00E9llo ";
  text += "x";
  const size_t cut = 66666 * 7 + 5;
  EXPECT_EQ(chunks_of(text), (Ranges64{{0, cut}, {cut, text.size()}}));
}

TEST(ChunkText, RunLengthsRestartInEverySlice) {
  // A 30,000-character run from code point 390,000 to 420,000: the slice cut at 400,000 restarts
  // its length, so the 20,000 characters after it are not cut again (a length carried over from
  // the first slice would cut at 415,000).
  std::string text;
  for (int i = 0; i < 130000; ++i) text += "ab ";
  text += std::string(30000, 'x');
  EXPECT_EQ(chunks_of(text), (Ranges64{{0, 400000}, {400000, 420000}}));
  // A run cut and the slice cut at the same character make one cut.
  EXPECT_EQ(chunks_of(std::string(410000, 'x')).size(), 17u);
}

TEST(ChunkText, WordRepeatCrossingTheSlice) {
  // simply's long golden: "word " * 100000 is 500,000 code points: one cut, at 400,000.
  std::string text;
  for (int i = 0; i < 100000; ++i) text += "word ";
  EXPECT_EQ(chunks_of(text), (Ranges64{{0, 400000}, {400000, 500000}}));
}

}  // namespace

// tests/tokenizer_test.cpp — the K3 tokenizer against Moonshot's release: every case of
// tests/data/text/tokenizer_cases.jsonl in both encode modes, decoding, the BPE variants against
// each other, the streaming UTF-8 decoder, and malformed vocabulary files.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/file.h"
#include "test_util.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"
#include "text_fixtures.h"

namespace k3::text {
namespace {

using k3::testing::kReleaseDir;
using k3::testing::release_tokenizer;

using k3::testing::error_of;

struct TextCase {
  std::string name, text;
  std::vector<int32_t> ids, ids_allow_special;
};

const std::vector<TextCase>& text_cases() {
  static const std::vector<TextCase> cases = [] {
    std::vector<TextCase> out;
    std::ifstream in("tests/data/text/tokenizer_cases.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      out.push_back({j["name"], j["text"], j["ids"].get<std::vector<int32_t>>(),
                     j["ids_allow_special"].get<std::vector<int32_t>>()});
    }
    return out;
  }();
  return cases;
}

std::string with_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) s += std::to_string(ids[i]) + " ";
  return ids.size() > 40 ? s + "..." : s;
}

TEST(Tokenizer, ReleaseVocabulary) {
  const Tokenizer& t = release_tokenizer();
  EXPECT_EQ(t.base_vocab_size(), 163584);
  EXPECT_EQ(t.vocab_size(), 163840);
  EXPECT_EQ(t.special_id("[BOS]"), 163584);
  EXPECT_EQ(t.special_id("<|end_of_msg|>"), 163586);
  EXPECT_EQ(t.special_id("<|open|>"), 163587);
  EXPECT_EQ(t.special_id("<|close|>"), 163588);
  EXPECT_EQ(t.special_id("<|sep|>"), 163589);
  EXPECT_EQ(t.special_id("<|reserved_token_163592|>"), 163592);
  EXPECT_EQ(t.special_id("[PAD]"), 163839);
  EXPECT_EQ(t.special_id("<|reserved_token_163586|>"), std::nullopt);  // 163586 has a name
  EXPECT_EQ(t.token_bytes(0), "!");
  EXPECT_EQ(t.token_bytes(188), std::string(1, '\0'));
  EXPECT_EQ(t.token_bytes(220), " ");
  EXPECT_EQ(t.token_bytes(256), "  ");
  EXPECT_EQ(t.token_bytes(163587), "<|open|>");
  EXPECT_EQ(t.token_bytes(163840), "");
  EXPECT_TRUE(t.is_special(163584));
  EXPECT_FALSE(t.is_special(163583));
}

TEST(Tokenizer, EveryGoldenCaseInBothModes) {
  ASSERT_EQ(text_cases().size(), 262u);
  int failures = 0;
  for (const TextCase& c : text_cases()) {
    const auto ids = release_tokenizer().encode(c.text, false);
    const auto special = release_tokenizer().encode(c.text, true);
    if (ids != c.ids) ++failures;
    if (special != c.ids_allow_special) ++failures;
    EXPECT_EQ(ids, c.ids) << c.name << " (ordinary)\n got  " << with_ids(ids) << "\n want "
                          << with_ids(c.ids);
    EXPECT_EQ(special, c.ids_allow_special)
        << c.name << " (allow_special)\n got  " << with_ids(special) << "\n want "
        << with_ids(c.ids_allow_special);
  }
  EXPECT_EQ(failures, 0);
}

TEST(Tokenizer, DecodeGivesTheTextBackAtEveryCut) {
  for (const TextCase& c : text_cases()) {
    EXPECT_EQ(release_tokenizer().decode_bytes(c.ids), c.text) << c.name;
    EXPECT_EQ(release_tokenizer().decode(c.ids_allow_special), c.text) << c.name;
    if (c.ids.size() > 64) continue;
    for (size_t k = 0; k <= c.ids.size(); ++k) {
      const std::span<const int32_t> all(c.ids);
      EXPECT_EQ(release_tokenizer().decode_bytes(all.first(k)) +
                    release_tokenizer().decode_bytes(all.subspan(k)),
                c.text)
          << c.name;
    }
  }
  EXPECT_THROW(release_tokenizer().decode_bytes(std::vector<int32_t>{163840}), Error);
  EXPECT_THROW(release_tokenizer().decode_bytes(std::vector<int32_t>{-1}), Error);
}

TEST(Tokenizer, UserTextNeverBecomesControlTokens) {
  // docs/tokenizer.md §3.2: " <|open|>" typed by a user.
  EXPECT_EQ(release_tokenizer().encode(" <|open|>", false),
            (std::vector<int32_t>{22652, 4454, 91, 29}));
  EXPECT_EQ(release_tokenizer().encode("<|open|>", true), (std::vector<int32_t>{163587}));
  EXPECT_EQ(release_tokenizer().encode("a<|reserved_token_163592|>b", true),
            (std::vector<int32_t>{64, 163592, 65}));
  EXPECT_EQ(release_tokenizer().encode("", true), std::vector<int32_t>{});
}

TEST(Tokenizer, HeapAndVectorScanBpeAgree) {
  // Every piece of every golden case, plus long random pieces built from token fragments.
  std::vector<Piece> pieces;
  std::vector<int32_t> a, b;
  for (const TextCase& c : text_cases()) {
    pieces.clear();
    pretokenize(c.text.substr(0, 20000), pieces);
    for (const Piece& p : pieces) {
      const std::string_view piece = std::string_view(c.text).substr(p.begin, p.end - p.begin);
      a.clear();
      b.clear();
      release_tokenizer().bpe_piece(piece, Tokenizer::BpeAlgorithm::vector_scan, a);
      release_tokenizer().bpe_piece(piece, Tokenizer::BpeAlgorithm::heap, b);
      ASSERT_EQ(a, b) << c.name;
    }
  }
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string piece;
    const size_t length = 2 + rng() % 400;
    while (piece.size() < length) {
      const auto bytes = release_tokenizer().token_bytes(static_cast<int32_t>(rng() % 163584));
      piece.append(bytes.substr(0, 1 + rng() % 3));
    }
    a.clear();
    b.clear();
    release_tokenizer().bpe_piece(piece, Tokenizer::BpeAlgorithm::vector_scan, a);
    release_tokenizer().bpe_piece(piece, Tokenizer::BpeAlgorithm::heap, b);
    ASSERT_EQ(a, b) << "round " << round;
    EXPECT_EQ(release_tokenizer().decode_bytes(a), piece);
  }
}

TEST(Tokenizer, LongPiecesStayNearLinear) {
  // One 25,000-letter piece (no whitespace, no digits): the heap BPE handles it; a quadratic
  // scan would take seconds here. Not a timing assertion: ctest's timeout is the guard.
  std::mt19937 rng(3);
  std::string word;
  for (int i = 0; i < 25000; ++i) word.push_back(static_cast<char>('a' + rng() % 26));
  const auto ids = release_tokenizer().encode(word, false);
  EXPECT_EQ(release_tokenizer().decode_bytes(ids), word);
  EXPECT_GT(ids.size(), 3000u);
}

TEST(Tokenizer, InvalidUtf8IsReplacedAndCounted) {
  const std::string bad =
      std::string("ab\xFF") + "c\xE4\xBD" + "d";  // stray byte, truncated 3-byte
  size_t replaced = 0;
  std::vector<int32_t> ids;
  release_tokenizer().encode(bad, false, ids, &replaced);
  EXPECT_EQ(replaced, 2u);
  EXPECT_EQ(ids, release_tokenizer().encode("ab\xEF\xBF\xBD"
                                            "c\xEF\xBF\xBD"
                                            "d",
                                            false));
}

TEST(Utf8, RepairUsesMaximalSubparts) {
  size_t n = 0;
  EXPECT_EQ(repair_utf8("abc", &n), "abc");
  EXPECT_EQ(n, 0u);
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(repair_utf8("\xC0\xAF"), fffd + fffd);                        // overlong: two subparts
  EXPECT_EQ(repair_utf8("\xED\xA0\x80"), fffd + fffd + fffd);             // surrogate
  EXPECT_EQ(repair_utf8("\xE4\xBD"), fffd);                               // truncated: one subpart
  EXPECT_EQ(repair_utf8("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // above U+10FFFF
  EXPECT_EQ(repair_utf8("\xF0\x9F\x98x"), fffd + "x");
  EXPECT_EQ(repair_utf8(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_FALSE(is_valid_utf8("\x80"));
  EXPECT_TRUE(is_valid_utf8("\xF0\x9F\x98\x80"));
}

TEST(Utf8, StreamDecoderNeverSplitsACharacter) {
  // ` 👋🏽` = [130732, 233, 92949, 121]: both emoji straddle token boundaries.
  const std::vector<int32_t> ids = {130732, 233, 92949, 121};
  Utf8StreamDecoder decoder;
  std::vector<std::string> shown;
  for (int32_t id : ids) shown.push_back(decoder.push(release_tokenizer().token_bytes(id)));
  shown.push_back(decoder.finish());
  EXPECT_EQ(shown, (std::vector<std::string>{" ", "\xF0\x9F\x91\x8B", "", "\xF0\x9F\x8F\xBD", ""}));
  EXPECT_EQ(decoder.pending(), 0u);

  // Random byte streams in random slices: the concatenation always equals the one-shot repair,
  // and every emitted piece is valid UTF-8.
  std::mt19937 rng(11);
  const std::string alphabet[] = {"a",    "\xC3\xA9", "\xE4\xBD\xA0", "\xF0\x9F\x91\x8B", "\x80",
                                  "\xFF", "\xE4",     "\xF0\x9F",     "\xED\xA0\x80",     "\xC0"};
  for (int round = 0; round < 2000; ++round) {
    std::string all;
    for (int k = 0; k < 12; ++k) all += alphabet[rng() % 10];
    Utf8StreamDecoder d;
    std::string out;
    size_t i = 0;
    while (i < all.size()) {
      const size_t take = std::min<size_t>(1 + rng() % 4, all.size() - i);
      const std::string piece = d.push(std::string_view(all).substr(i, take));
      EXPECT_TRUE(is_valid_utf8(piece));
      out += piece;
      i += take;
    }
    out += d.finish();
    ASSERT_EQ(out, repair_utf8(all)) << "round " << round;
  }
}

Tokenizer tokenizer_from(const std::string& model,
                         const std::string& config = R"({"added_tokens_decoder": {}})") {
  // A vocabulary of the 256 single bytes plus what `model` adds.
  std::string text;
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int b = 0; b < 256; ++b) {
    const uint32_t bits = static_cast<uint32_t>(b) << 16;
    text += std::string{kAlphabet[(bits >> 18) & 63], kAlphabet[(bits >> 12) & 63], '=', '='} +
            " " + std::to_string(b) + "\n";
  }
  return Tokenizer::from_text(text + model, config, "test");
}

TEST(Tokenizer, LinesAndFieldsAreSplitLikeTheReferenceLoader) {
  // bytes.splitlines() (LF, CRLF, CR) and bytes.split() (runs of ASCII whitespace).
  EXPECT_EQ(tokenizer_from("YWI=\t 256\r\r\n  YmM=  257 \r").encode("abbc", false),
            (std::vector<int32_t>{256, 257}));
  EXPECT_NE(error_of([] { tokenizer_from("YWI= 256 7\n"); }).find("expected"), std::string::npos);
}

TEST(Tokenizer, MalformedFilesAreClearErrors) {
  EXPECT_EQ(tokenizer_from("").vocab_size(), 256 + 256);
  EXPECT_EQ(tokenizer_from("YWI= 256\n").encode("ab", false), std::vector<int32_t>{256});
  EXPECT_EQ(tokenizer_from("YWI= 256\n").special_id("<|reserved_token_257|>"), 257);
  EXPECT_NE(error_of([] { tokenizer_from("YW!= 256\n"); }).find("bad base64"), std::string::npos);
  EXPECT_NE(
      error_of([] { tokenizer_from("YWI 256\n"); }).find("test/tiktoken.model:257: bad base64"),
      std::string::npos);
  EXPECT_NE(error_of([] { tokenizer_from("YWI= 255\n"); }).find("duplicate rank 255"),
            std::string::npos);
  EXPECT_NE(error_of([] { tokenizer_from("YWI= 300\n"); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([] { tokenizer_from("YQ== 256\n"); }).find("duplicate token bytes"),
            std::string::npos);
  EXPECT_NE(error_of([] { tokenizer_from("YWI= x\n"); }).find("bad rank"), std::string::npos);
  EXPECT_NE(error_of([] { tokenizer_from("YWI=256\n"); }).find("expected"), std::string::npos);
  EXPECT_NE(
      error_of([] { Tokenizer::from_text("YQ== 0\n", "{}", "t"); }).find("byte 0 has no token"),
      std::string::npos);
  EXPECT_NE(error_of([] { tokenizer_from("", "{"); }).find("malformed JSON"), std::string::npos);
  EXPECT_NE(error_of([] { tokenizer_from("", "[]"); }).find("expected a JSON object"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              tokenizer_from("", R"({"added_tokens_decoder": {"x": {"content": "a"}}})");
            }).find("not a token id"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              tokenizer_from("", R"({"added_tokens_decoder": {"256": {}}})");
            }).find("no string"),
            std::string::npos);
  EXPECT_NE(
      error_of([] {
        tokenizer_from(
            "",
            R"({"added_tokens_decoder": {"256": {"content": "<|x|>"}, "257": {"content": "<|x|>"}}})");
      }).find("used twice"),
      std::string::npos);
  EXPECT_NE(
      error_of([] { Tokenizer::load("tests/data/no-such-dir"); }).find("tiktoken.model: missing"),
      std::string::npos);
  EXPECT_FALSE(Tokenizer::available("tests/data/k3-tiny"));
  EXPECT_TRUE(Tokenizer::available(kReleaseDir));
}

}  // namespace
}  // namespace k3::text

// tests/text_review_test.cpp — review of the text front end: cases that expose bugs (marked
// BUG) and cases that pin reference behaviour someone might otherwise "fix" (marked PIN).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "text/output_parser.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include "text_fixtures.h"

namespace k3::text {
namespace {

using k3::testing::release_tokenizer;

std::string base64(std::string_view bytes) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) |
                       (uint32_t(uint8_t(bytes[i + 1])) << 8) | uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  if (bytes.size() - i == 1) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (bytes.size() - i == 2) {
    const uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// A tiny vocabulary: the 256 single bytes (rank = byte value) plus `merged` (ranks 256...).
std::vector<std::pair<std::string, int>> tiny_entries(const std::vector<std::string>& merged) {
  std::vector<std::pair<std::string, int>> entries;
  for (int b = 0; b < 256; ++b) entries.emplace_back(std::string(1, static_cast<char>(b)), b);
  for (size_t k = 0; k < merged.size(); ++k)
    entries.emplace_back(merged[k], 256 + static_cast<int>(k));
  return entries;
}

std::string model_text(const std::vector<std::pair<std::string, int>>& entries,
                       const char* eol = "\n") {
  std::string text;
  for (const auto& [bytes, rank] : entries)
    text += base64(bytes) + " " + std::to_string(rank) + eol;
  return text;
}

// BUG (tokenizer.cpp:360,386). With specials allowed, the special scan tries the distinct name
// lengths in ascending order and takes the first hit, so when one special name is a prefix of
// another (possible with a custom tokenizer_config), the longer special can never be produced.
// The expected result is the longest match (what colibri's tok.h does; tiktoken's own order
// among overlapping specials is hash-map order, i.e. unspecified).
TEST(TextReview, SpecialNameThatPrefixesAnotherIsStillReachable) {
  const std::string config = R"({"added_tokens_decoder": {
      "256": {"content": "<|x|>"}, "257": {"content": "<|x|>y"}}})";
  const Tokenizer t = Tokenizer::from_text(model_text(tiny_entries({})), config, "tiny");
  ASSERT_EQ(t.special_id("<|x|>"), 256);
  ASSERT_EQ(t.special_id("<|x|>y"), 257);
  EXPECT_EQ(t.encode("<|x|>y", true), (std::vector<int32_t>{257}));  // actual: {256, 'y'}
}

// PIN: CRLF line ends and ranks listed out of order load to the same vocabulary as sorted LF.
TEST(TextReview, CrlfAndUnsortedRanksLoadLikeSortedLf) {
  auto entries = tiny_entries({"ab", "abc", "  "});
  const Tokenizer sorted = Tokenizer::from_text(model_text(entries), "{}", "sorted");
  std::mt19937 rng(1);
  std::shuffle(entries.begin(), entries.end(), rng);
  const Tokenizer shuffled = Tokenizer::from_text(model_text(entries, "\r\n"), "{}", "crlf");
  for (int32_t id = 0; id < sorted.vocab_size(); ++id)
    ASSERT_EQ(sorted.token_bytes(id), shuffled.token_bytes(id));
  EXPECT_EQ(shuffled.encode("abc ab  ", false), sorted.encode("abc ab  ", false));
  EXPECT_EQ(shuffled.encode("abc", false), (std::vector<int32_t>{257}));
}

// PIN: ids in added_tokens_decoder outside [base, base+256) are ignored, as tokenization_kimi.py
// does (it only looks up ids of the special range).
TEST(TextReview, ConfigIdsOutsideTheSpecialRangeAreIgnored) {
  const std::string config = R"({"added_tokens_decoder": {
      "5": {"content": "<|low|>"}, "600": {"content": "<|high|>"}, "258": {"content": "<|in|>"}}})";
  const Tokenizer t = Tokenizer::from_text(model_text(tiny_entries({})), config, "tiny");
  EXPECT_EQ(t.special_id("<|low|>"), std::nullopt);
  EXPECT_EQ(t.special_id("<|high|>"), std::nullopt);
  EXPECT_EQ(t.special_id("<|in|>"), 258);
  EXPECT_EQ(t.special_id("<|reserved_token_256|>"), 256);
  EXPECT_EQ(t.token_bytes(5), std::string(1, '\x05'));
}

// PIN: Moonshot's encode() chunks first (400k / 25k) and only then lets tiktoken look for
// specials inside each chunk, so a special spelling cut by the 25,000-run limit is ordinary text.
TEST(TextReview, SpecialSpellingCutByThe25kRunIsOrdinaryText) {
  const int32_t open = release_tokenizer().special_id("<|open|>").value();
  std::string text(24996, 'a');
  text += "<|open|>";  // "<|op" ends the 25,000 run, "en|>" starts the next chunk
  const auto ids = release_tokenizer().encode(text, true);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), open), 0);
  EXPECT_EQ(release_tokenizer().decode_bytes(ids), text);
  // Moved by 8 it is whole inside the first chunk and becomes the control id.
  const std::string whole = std::string(24988, 'a') + "<|open|>";
  const auto ids2 = release_tokenizer().encode(whole, true);
  EXPECT_EQ(ids2.back(), open);
}

// PIN: the BPE threshold (pieces of 128 bytes and up use the heap) is invisible: automatic,
// vector scan and heap agree on pieces of 127, 128 and 129 bytes.
TEST(TextReview, BpeAgreesAroundTheHeapThreshold) {
  std::mt19937 rng(11);
  for (size_t length : {1u, 2u, 127u, 128u, 129u}) {
    for (int round = 0; round < 50; ++round) {
      std::string piece;
      while (piece.size() < length) {
        const auto bytes = release_tokenizer().token_bytes(static_cast<int32_t>(rng() % 163584));
        piece.append(bytes.substr(0, 1 + rng() % 3));
      }
      piece.resize(length);
      std::vector<int32_t> a, b, c;
      release_tokenizer().bpe_piece(piece, Tokenizer::BpeAlgorithm::automatic, a);
      release_tokenizer().bpe_piece(piece, Tokenizer::BpeAlgorithm::vector_scan, b);
      release_tokenizer().bpe_piece(piece, Tokenizer::BpeAlgorithm::heap, c);
      ASSERT_EQ(a, b) << length;
      ASSERT_EQ(a, c) << length;
      ASSERT_EQ(release_tokenizer().decode_bytes(a), piece);
    }
  }
}

// BUG (output_parser.cpp:154, argument_json): nlohmann's lexer skips a leading UTF-8 BOM, so
// json::accept("\xEF\xBB\xBF" "1") is true and the value is embedded verbatim, BOM included:
// arguments_json becomes {"n":<BOM>1}, which no strict JSON parser (Python json.loads, RFC 8259)
// accepts. Expected per output_parser.h: not valid JSON → kept as a JSON string.
TEST(TextReview, BomBeforeATypedArgumentKeepsArgumentsValidJson) {
  const std::string text =
      "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"n\" type=\"number\"<|sep|>\xEF\xBB\xBF"
      "1<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
      "<|close|>message<|sep|><|end_of_msg|>";
  const ParsedOutput out =
      parse_output(release_tokenizer(), release_tokenizer().encode(text, true), false);
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments_json,
            "{\"n\":\"\xEF\xBB\xBF"
            "1\"}");  // actual: {"n":<BOM>1}
}

// PIN: streaming decode of every token split equals whole decode (no bytes lost or doubled by
// the stream decoder, including the held-back tail flushed at finish).
TEST(TextReview, StreamDecoderConcatenationEqualsRepair) {
  std::mt19937 rng(5);
  for (int round = 0; round < 2000; ++round) {
    std::string bytes;
    const size_t n = rng() % 12;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t r = rng() % 6;
      bytes.push_back(static_cast<char>(r == 0  ? rng() % 0x80
                                        : r < 3 ? 0x80 + rng() % 0x40
                                                : 0xC0 + rng() % 0x40));
    }
    Utf8StreamDecoder d;
    std::string streamed;
    for (size_t i = 0; i < bytes.size();) {
      const size_t k = 1 + rng() % 3;
      streamed += d.push(std::string_view(bytes).substr(i, k));
      i += k;
    }
    streamed += d.finish();
    ASSERT_EQ(streamed, repair_utf8(bytes)) << round;
  }
}

// PIN: the Tokenizer is shared by threads (future server): its scratch buffers are thread_local,
// so concurrent encodes of different texts give the single-threaded ids.
TEST(TextReview, ConcurrentEncodesAgreeWithSerial) {
  std::vector<std::string> texts;
  std::mt19937 rng(9);
  for (int k = 0; k < 8; ++k) {
    std::string s;
    const size_t n = 200 + rng() % 3000;
    while (s.size() < n) {
      const auto bytes = release_tokenizer().token_bytes(static_cast<int32_t>(rng() % 163584));
      s.append(bytes);
      if (rng() % 7 == 0) s += "<|open|>";
    }
    texts.push_back(repair_utf8(s));
  }
  std::vector<std::vector<int32_t>> serial;
  for (size_t k = 0; k < texts.size(); ++k)
    serial.push_back(release_tokenizer().encode(texts[k], k % 2 == 0));
  std::vector<int> failures(texts.size(), 0);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < texts.size(); ++k) {
    threads.emplace_back([&, k] {
      for (int round = 0; round < 50; ++round)
        if (release_tokenizer().encode(texts[k], k % 2 == 0) != serial[k]) ++failures[k];
    });
  }
  for (auto& th : threads) th.join();
  for (size_t k = 0; k < texts.size(); ++k) EXPECT_EQ(failures[k], 0) << k;
}

}  // namespace
}  // namespace k3::text

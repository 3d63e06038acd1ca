// tests/text_robustness_test.cpp — bad input never crashes the text front end (run under
// ASan/UBSan by `make test`): mutated JSON lines through parse_pyjson and the chat renderer,
// mutated vocabulary files through the tokenizer loader, random bytes through encode/decode.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "io/file.h"
#include "text/chat.h"
#include "text/prompt.h"
#include "text/pyjson.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include "text_fixtures.h"
#include "util/error.h"

namespace {

using k3::testing::kReleaseDir;

using k3::text::PyValue;

std::vector<std::string> chat_lines() {
  std::vector<std::string> lines;
  std::ifstream in("tests/data/text/chat_cases.jsonl");
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// One random edit: flip a byte, cut, duplicate a slice, or splice in JSON punctuation.
std::string mutate(std::string s, std::mt19937& rng) {
  if (s.empty()) return "{";
  const size_t at = rng() % s.size();
  switch (rng() % 5) {
    case 0:
      s[at] = static_cast<char>(rng() & 0xFF);
      break;
    case 1:
      s.resize(at);
      break;
    case 2: {
      const std::string slice = s.substr(at, rng() % 16);
      s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), slice.begin(), slice.end());
      break;
    }
    case 3:
      s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), "{}[],:\"\\0-e.tfn"[rng() % 15]);
      break;
    default:
      s.erase(at, 1 + rng() % 8);
      break;
  }
  return s;
}

TEST(TextRobustness, MutatedJsonLinesNeverCrashTheRenderer) {
  const auto lines = chat_lines();
  ASSERT_FALSE(lines.empty());
  std::mt19937 rng(1234);
  int parsed = 0, rendered = 0;
  for (int round = 0; round < 6000; ++round) {
    std::string line = lines[rng() % lines.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) line = mutate(line, rng);
    const auto value = k3::text::parse_pyjson(line);
    if (!value.ok()) {
      EXPECT_FALSE(value.status().message().empty());
      continue;
    }
    ++parsed;
    // What parses must print and re-parse to the same value.
    const std::string printed = k3::text::dumps(*value, k3::text::DumpStyle::kCompact);
    const auto again = k3::text::parse_pyjson(printed);
    ASSERT_TRUE(again.ok()) << printed;
    EXPECT_EQ(k3::text::dumps(*again, k3::text::DumpStyle::kCompact), printed);
    const auto segments = k3::text::render_request(*value);
    if (segments.ok()) ++rendered;
  }
  EXPECT_GT(parsed, 100);  // the mutations must reach the renderer, not only the parser
  EXPECT_GT(rendered, 50);
}

TEST(TextRobustness, WrongTypesInEveryFieldAreStatusesNotCrashes) {
  // Replace each value of a real request, at every depth, by values of other kinds.
  const auto lines = chat_lines();
  const PyValue replacements[] = {PyValue(),
                                  PyValue::boolean(true),
                                  PyValue::integer(-3),
                                  PyValue::floating(1e300),
                                  PyValue::string(""),
                                  PyValue::string("x\"&<|open|>"),
                                  PyValue::array(),
                                  PyValue::object()};
  int checked = 0;
  for (size_t i = 0; i < lines.size(); i += 7) {
    const auto request = k3::text::parse_pyjson(lines[i]);
    ASSERT_TRUE(request.ok());
    // Walk every path to a value and swap it.
    std::vector<std::vector<size_t>> paths;
    std::function<void(const PyValue&, std::vector<size_t>&)> collect =
        [&](const PyValue& v, std::vector<size_t>& path) {
          paths.push_back(path);
          const size_t n = v.is_array()    ? v.as_array().size()
                           : v.is_object() ? v.as_object().size()
                                           : 0;
          for (size_t k = 0; k < n; ++k) {
            path.push_back(k);
            collect(v.is_array() ? v.as_array()[k] : v.as_object()[k].value, path);
            path.pop_back();
          }
        };
    std::vector<size_t> path;
    collect(*request, path);
    // One working copy per request: each replacement goes in, the request is rendered, and the
    // original value goes back (a whole copy per replacement was most of the test's time).
    PyValue work = *request;
    for (const auto& p : paths) {
      if (p.empty()) continue;
      PyValue* node = &work;
      for (size_t k : p)
        node = node->is_array() ? &node->as_array()[k] : &node->as_object()[k].value;
      PyValue original = std::move(*node);
      for (const PyValue& replacement : replacements) {
        *node = replacement;
        (void)k3::text::render_request(work);  // ok or a Status; never a crash or a throw
        ++checked;
      }
      *node = std::move(original);
    }
    EXPECT_EQ(work, *request) << "line " << i << ": the working copy was not restored";
  }
  EXPECT_GT(checked, 1000);
}

TEST(TextRobustness, MutatedVocabularyFilesAreErrorsNotCrashes) {
  const std::string model = k3::read_text_file(kReleaseDir + "/tiktoken.model").substr(0, 40000);
  const std::string config = k3::read_text_file(kReleaseDir + "/tokenizer_config.json");
  std::mt19937 rng(99);
  int loaded = 0, refused = 0;
  for (int round = 0; round < 300; ++round) {
    const bool mutate_model = rng() % 2;
    const std::string m = mutate_model ? mutate(model, rng) : model;
    const std::string c = mutate_model ? config : mutate(config, rng);
    try {
      const auto tokenizer = k3::text::Tokenizer::from_text(m, c, "mutated");
      ++loaded;
      (void)tokenizer.encode("Hello, <|open|> 世界", true);
    } catch (const k3::Error& e) {
      ++refused;
      EXPECT_NE(std::string(e.what()).find("mutated/"), std::string::npos)
          << e.what();  // names the file
    }
  }
  EXPECT_GT(refused, 50);
}

TEST(TextRobustness, RandomBytesEncodeAndDecodeBack) {
  const auto tokenizer = k3::text::Tokenizer::load(kReleaseDir);
  std::mt19937 rng(5);
  for (int round = 0; round < 3000; ++round) {
    std::string bytes(rng() % 64, '\0');
    for (char& b : bytes)
      b = static_cast<char>(rng() % 4 == 0 ? 0x80 + rng() % 0x80 : rng() & 0xFF);
    for (const bool allow_special : {false, true}) {
      const auto ids = tokenizer.encode(bytes, allow_special);
      ASSERT_EQ(tokenizer.decode_bytes(ids), k3::text::repair_utf8(bytes));
    }
  }
}

}  // namespace

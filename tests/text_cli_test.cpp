// tests/text_cli_test.cpp — the text front end as users and checkers run it:
//   coli tokenize / coli render over the golden files (every case, id for id), bad lines,
//   kimi_k3 "prompt" and kimi_k3 --chat on a demo checkpoint (real tokenizer, random weights):
//   the prompt ids equal coli render's, the streamed text equals the decoded --ids run.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/file.h"
#include "test_util.h"
#include "text/tokenizer.h"
#include "text_fixtures.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
const std::string kColi = std::string(K3_BINARY_DIR) + "/apps/coli";
const std::string kKimi = std::string(K3_BINARY_DIR) + "/apps/kimi_k3";
using k3::testing::kReleaseDir;
using k3::testing::kTinyDir;
const std::string kCases = std::string(K3_SOURCE_DIR) + "/tests/data/text/";

using Result = k3::testing::CommandResult;

// Runs `command` with a clean environment, stdin from `input_path` (or /dev/null).
Result run(const std::string& command, const std::string& input_path = "") {
  return k3::testing::run_split("env -i " + command, input_path);
}

std::vector<json> lines_of(const std::string& text) {
  std::vector<json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

std::vector<json> read_jsonl(const std::string& path) {
  return lines_of(k3::read_text_file(path));
}

TEST(ColiTokenize, EveryGoldenCaseInBothModes) {
  const auto cases = read_jsonl(kCases + "tokenizer_cases.jsonl");
  for (const bool allow_special : {false, true}) {
    const Result r =
        run(kColi + " tokenize " + kReleaseDir + (allow_special ? " --allow-special" : ""),
            kCases + "tokenizer_cases.jsonl");
    ASSERT_EQ(r.status, 0) << r.err;
    const auto got = lines_of(r.out);
    ASSERT_EQ(got.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(got[i]["name"], cases[i]["name"]);  // other keys are copied through
      EXPECT_EQ(got[i]["ids"], cases[i][allow_special ? "ids_allow_special" : "ids"])
          << cases[i]["name"];
      EXPECT_FALSE(got[i].contains("text"));
    }
  }
}

TEST(ColiRender, EveryGoldenConversation) {
  const auto cases = read_jsonl(kCases + "chat_cases.jsonl");
  const Result r = run(kColi + " render " + kReleaseDir, kCases + "chat_cases.jsonl");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto got = lines_of(r.out);
  ASSERT_EQ(got.size(), cases.size());
  int errors = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(got[i]["name"], cases[i]["name"]);
    if (cases[i].value("error", false)) {
      ++errors;
      EXPECT_TRUE(got[i].contains("error")) << cases[i]["name"];
      continue;
    }
    EXPECT_EQ(got[i]["ids"], cases[i]["ids"]) << cases[i]["name"];
    EXPECT_EQ(got[i]["text"], cases[i]["text"]) << cases[i]["name"];
  }
  EXPECT_EQ(errors, 5);
}

TEST(ColiTokenize, BadLinesAreReportedAndTheRestIsRead) {
  k3::testing::TempDir dir("coli-bad");
  const std::string input = dir.file("in.jsonl");
  std::ofstream(input) << "{\"text\": \"a\"}\n"
                       << "not json\n"
                       << "\n"
                       << "{\"text\": 3, \"name\": \"n\"}\n"
                       << "[1, 2]\n"
                       << "{\"text\": \"b\\u00e9\", \"id\": 12345678901234567890123}\n"
                       << "{\"text\": \"x\xff\"}\n";
  const Result r = run(kColi + " tokenize " + kReleaseDir, input);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto got = lines_of(r.out);
  // One answer per input line, the blank one included (issue 16, defect 11).
  ASSERT_EQ(got.size(), 7u);
  EXPECT_EQ(got[0]["ids"], json::array({64}));
  EXPECT_TRUE(got[1].contains("error"));
  EXPECT_EQ(got[1]["line"], 2);
  EXPECT_TRUE(got[2].contains("error"));
  EXPECT_EQ(got[2]["line"], 3);
  EXPECT_TRUE(got[3].contains("error"));
  EXPECT_EQ(got[3]["name"], "n");
  EXPECT_TRUE(got[4].contains("error"));
  EXPECT_TRUE(got[5].contains("ids"));
  EXPECT_NE(r.out.find("\"id\":12345678901234567890123"), std::string::npos);  // copied exactly
  // Invalid UTF-8 becomes U+FFFD before tokenizing.
  EXPECT_EQ(got[6]["ids"].get<std::vector<int32_t>>(),
            k3::testing::release_tokenizer().encode("x\xEF\xBF\xBD", false));
}

// Issue 16, defect 11: answers line up with inputs (blank lines included) and every output line is
// strict JSON, even when a copied number is one JSON cannot carry (1e999 is read as infinity; it
// is written back as null, which every reader accepts).
TEST(ColiTokenize, OneStrictJsonLinePerInputLine) {
  k3::testing::TempDir dir("coli-lines");
  const std::string input = dir.file("in.jsonl");
  std::ofstream(input) << "{\"text\": \"a\"}\n"
                       << "\n"
                       << "   \n"
                       << "{\"text\": \"b\", \"big\": 1e999, \"small\": -1e999, \"n\": NaN}\n"
                       << "\n";
  const Result r = run(kColi + " tokenize " + kReleaseDir, input);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.find("Infinity"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("NaN"), std::string::npos) << r.out;
  const auto got = lines_of(r.out);  // nlohmann refuses NaN / Infinity: every line must parse
  ASSERT_EQ(got.size(), 5u) << r.out;
  EXPECT_EQ(got[0]["ids"], json::array({64}));
  for (size_t i : {1, 2, 4}) {
    EXPECT_TRUE(got[i].contains("error")) << got[i];
    EXPECT_EQ(got[i]["line"], i + 1);
  }
  ASSERT_TRUE(got[3].contains("ids")) << got[3];
  for (const char* key : {"big", "small", "n"}) EXPECT_TRUE(got[3][key].is_null()) << got[3];
}

// Issue 16, defect 6: coli tokenize refuses damaged tokenizer files by name, like the engine.
TEST(ColiTokenize, DamagedTokenizerFilesAreRefusedByName) {
  k3::testing::TempDir dir("coli-damaged");
  const std::string model = k3::read_text_file(kReleaseDir + "/tiktoken.model");
  const std::string config = k3::read_text_file(kReleaseDir + "/tokenizer_config.json");
  fs::copy_file(kReleaseDir + "/config.json", dir.file("config.json"));
  const std::string input = dir.file("in.jsonl");
  std::ofstream(input) << "{\"text\": \"a\"}\n";
  // Cut at a line boundary: every remaining line is well formed.
  size_t cut = 0;
  for (int i = 0; i < 163000; ++i) cut = model.find('\n', cut) + 1;
  std::ofstream(dir.file("tiktoken.model"), std::ios::binary) << model.substr(0, cut);
  std::ofstream(dir.file("tokenizer_config.json"), std::ios::binary) << config;
  const Result cut_run = run(kColi + " tokenize " + dir.path(), input);
  EXPECT_EQ(cut_run.status, 1) << cut_run.out;
  EXPECT_NE(cut_run.err.find("tiktoken.model"), std::string::npos) << cut_run.err;
  EXPECT_NE(cut_run.err.find("163840"), std::string::npos) << cut_run.err;
  EXPECT_EQ(cut_run.out, "");
  std::ofstream(dir.file("tiktoken.model"), std::ios::binary) << model;
  std::ofstream(dir.file("tokenizer_config.json"), std::ios::binary) << "{}";
  const Result empty = run(kColi + " tokenize " + dir.path(), input);
  EXPECT_EQ(empty.status, 1) << empty.out;
  EXPECT_NE(empty.err.find("tokenizer_config.json"), std::string::npos) << empty.err;
  EXPECT_NE(empty.err.find("<|open|>"), std::string::npos) << empty.err;
  const Result render = run(kColi + " render " + dir.path(), input);
  EXPECT_EQ(render.status, 1);
  EXPECT_NE(render.err.find("tokenizer_config.json"), std::string::npos) << render.err;
}

TEST(ColiRender, ErrorsAreLinesAndUsageIsChecked) {
  k3::testing::TempDir dir("coli-render");
  const std::string input = dir.file("in.jsonl");
  std::ofstream(input)
      << R"({"messages": [{"role": "user", "content": "hi"}], "options": {"thinking_effort": "medium"}})"
      << "\n"
      << R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})"
      << "\n"
      << R"({"messages": [{"role": "user", "content": "hi"}]})"
      << "\n";
  const Result r = run(kColi + " render " + kReleaseDir, input);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto got = lines_of(r.out);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[0].contains("error"));
  // An image part renders as the reference's placeholder (encoded as ordinary text).
  EXPECT_EQ(got[1]["text"],
            "<|open|>message role=\"user\"<|sep|><|kimi_image_placeholder|><|close|>message<|sep|>"
            "<|end_of_msg|><|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>");
  // Defaults: build_chat_segments, thinking on, generation prompt, no effort message.
  EXPECT_EQ(got[2]["text"],
            "<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>");

  const Result missing = run(kColi + " tokenize /nonexistent");
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.err.find("/nonexistent: no such directory"), std::string::npos) << missing.err;
  const Result unknown = run(kColi + " frobnicate " + kReleaseDir);
  EXPECT_EQ(unknown.status, 2);
  EXPECT_NE(unknown.err.find("unknown command"), std::string::npos);
  const Result via_env = run("COLI_MODEL=" + kReleaseDir + " " + kColi + " tokenize", input);
  EXPECT_EQ(via_env.status, 0) << via_env.err;
}

std::vector<int64_t> prompt_ids_of(const std::string& err) {
  const size_t at = err.find("prompt ids:");
  EXPECT_NE(at, std::string::npos) << err;
  std::vector<int64_t> ids;
  if (at == std::string::npos) return ids;
  std::istringstream in(err.substr(at + 11, err.find('\n', at) - at - 11));
  int64_t id;
  while (in >> id) ids.push_back(id);
  return ids;
}

TEST(KimiText, ChatPromptIsTheRenderedConversation) {
  const std::string demo = k3::testing::kDemoDir;
  k3::testing::TempDir dir("kimi-chat");
  const std::string request = dir.file("req.jsonl");
  std::ofstream(request)
      << R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}], "options": {"entry": "apply_chat_template"}})"
      << "\n"
      << R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}], "options": {"entry": "apply_chat_template", "thinking": false}})"
      << "\n"
      << R"({"messages": [{"role": "user", "content": "What is 2+2?"}], "options": {"thinking_effort": "low"}})"
      << "\n";
  const auto rendered = lines_of(run(kColi + " render " + demo, request).out);
  ASSERT_EQ(rendered.size(), 3u);

  const Result think =
      run(kKimi + " " + demo + " --chat 'What is 2+2?' --system 'Be brief.' --ngen 3 --prompt-ids");
  ASSERT_EQ(think.status, 0) << think.err;
  EXPECT_EQ(prompt_ids_of(think.err), rendered[0]["ids"].get<std::vector<int64_t>>());
  EXPECT_NE(think.err.find("decode 2 tok"), std::string::npos) << think.err;

  const Result direct = run("K3_THINK=0 " + kKimi + " " + demo +
                            " --chat 'What is 2+2?' --system 'Be brief.' --ngen 3 --prompt-ids");
  ASSERT_EQ(direct.status, 0) << direct.err;
  EXPECT_EQ(prompt_ids_of(direct.err), rendered[1]["ids"].get<std::vector<int64_t>>());
  const Result no_think = run(
      kKimi + " " + demo + " --system 'Be brief.' 'What is 2+2?' --no-think --ngen 1 --prompt-ids");
  EXPECT_EQ(prompt_ids_of(no_think.err),
            rendered[1]["ids"].get<std::vector<int64_t>>());  // --system implies chat

  const Result low =
      run(kKimi + " " + demo + " --chat 'What is 2+2?' --effort low --ngen 1 --prompt-ids");
  EXPECT_EQ(prompt_ids_of(low.err), rendered[2]["ids"].get<std::vector<int64_t>>());
  const Result bos =
      run(kKimi + " " + demo + " --chat 'What is 2+2?' --effort low --bos --ngen 1 --prompt-ids");
  auto with_bos = rendered[2]["ids"].get<std::vector<int64_t>>();
  with_bos.insert(with_bos.begin(), 163584);
  EXPECT_EQ(prompt_ids_of(bos.err), with_bos);

  const Result medium = run(kKimi + " " + demo + " --chat 'q' --effort medium --ngen 1");
  EXPECT_EQ(medium.status, 1);
  EXPECT_NE(medium.err.find("--effort"), std::string::npos) << medium.err;
}

TEST(KimiText, PlainCompletionStreamsTheDecodedIds) {
  const std::string demo = k3::testing::kDemoDir;
  const k3::text::Tokenizer tokenizer = k3::text::Tokenizer::load(demo);
  const std::string prompt = "Once upon a time, <|open|> 東京";
  const auto prompt_ids = tokenizer.encode(prompt, false);
  std::string id_list;
  for (int32_t id : prompt_ids) {
    if (!id_list.empty()) id_list.push_back(',');
    id_list.append(std::to_string(id));
  }

  const Result ids = run(kKimi + " " + demo + " --ids " + id_list + " --ngen 12");
  ASSERT_EQ(ids.status, 0) << ids.err;
  std::vector<int32_t> generated;
  std::istringstream in(ids.out);
  for (int32_t id; in >> id;) generated.push_back(id);
  ASSERT_FALSE(generated.empty());

  const Result text = run(kKimi + " " + demo + " '" + prompt + "' --ngen 12 --prompt-ids");
  ASSERT_EQ(text.status, 0) << text.err;
  const auto fed = prompt_ids_of(text.err);
  EXPECT_EQ(fed,
            std::vector<int64_t>(prompt_ids.begin(), prompt_ids.end()));  // <|open|> stays text
  // The streamed text is the decoded ids (a stop id is not printed), then a newline.
  std::vector<int32_t> shown = generated;
  if (!shown.empty() && (shown.back() == 163586)) shown.pop_back();
  EXPECT_EQ(text.out, tokenizer.decode(shown) + "\n");

  const Result special =
      run(kKimi + " " + demo + " '" + prompt + "' --allow-special --ngen 1 --prompt-ids");
  EXPECT_EQ(prompt_ids_of(special.err), std::vector<int64_t>([&] {
              auto v = tokenizer.encode(prompt, true);
              return std::vector<int64_t>(v.begin(), v.end());
            }()));
}

TEST(KimiText, ChatReplyIsDemultiplexed) {
  const std::string demo = k3::testing::kDemoDir;
  const Result r = run(kKimi + " " + demo + " --chat 'Hi' --labels --ngen 6 --temp 1 --seed 5");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind("[think] ", 0), 0u) << r.out;  // thinking on: the reply starts in think
  EXPECT_EQ(r.out.back(), '\n');
  EXPECT_EQ(r.out.find("\x1b["), std::string::npos);  // no colour off a terminal
  const Result hidden =
      run(kKimi + " " + demo + " --chat 'Hi' --labels --hide-think --ngen 6 --temp 1 --seed 5");
  ASSERT_EQ(hidden.status, 0) << hidden.err;
  EXPECT_EQ(hidden.out.find("[think]"), std::string::npos) << hidden.out;
}

TEST(KimiText, JsonlOutputIsOneEventPerLine) {
  const std::string demo = k3::testing::kDemoDir;
  const Result r = run(kKimi + " " + demo + " --chat 'Hi' --ngen 6 --output jsonl --prompt-ids");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto events = lines_of(r.out);  // every line parses as JSON
  ASSERT_FALSE(events.empty());
  std::vector<int64_t> ids;
  for (const auto& e : events)
    if (e["event"] != "done" && e["id"].get<int64_t>() >= 0 &&
        (ids.empty() || ids.back() != e["id"].get<int64_t>()))
      ids.push_back(e["id"].get<int64_t>());
  const json& done = events.back();
  EXPECT_EQ(done["event"], "done");
  EXPECT_EQ(done["completion_tokens"], 6);
  EXPECT_EQ(done["finish_reason"], "length");
  // The same tokens as an --ids run on the same prompt (greedy).
  std::string id_list;
  for (int64_t id : prompt_ids_of(r.err)) {
    if (!id_list.empty()) id_list.push_back(',');
    id_list.append(std::to_string(id));
  }
  const Result plain = run(kKimi + " " + demo + " --ids " + id_list + " --ngen 6");
  std::vector<int64_t> want;
  std::istringstream in(plain.out);
  for (int64_t id; in >> id;) want.push_back(id);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(events.front()["channel"], "reasoning");  // thinking on: the reply starts in think
}

TEST(KimiText, CtrlCStopsGenerationKeepsTheReplyAndExits130) {
  const std::string demo = k3::testing::kDemoDir;
  // A long run, interrupted once: it stops between tokens, prints what it has and the summary.
  // (Greedy on the demo weights, this prompt's first 3,000 tokens hold no stop id, so the run is
  // still generating when the signal comes.)
  // The signal is sent once text has reached stdout: a Ctrl-C during the load stops the load
  // instead (tests/stop_during_load_test.cpp), so a fixed sleep would race a slow load.
  const k3::testing::TempDir dir("kimi-ctrl-c");
  const std::string out = dir.file("out");
  const Result r = run("sh -c '" + kKimi + " " + demo + " \"Once upon a time\" --ngen 100000 > " +
                       out + " & pid=$!; i=0; while [ ! -s " + out +
                       " ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; kill -INT $pid; "
                       "wait $pid'");
  EXPECT_EQ(r.status, 130) << r.err;
  EXPECT_NE(r.err.find("| cancelled |"), std::string::npos) << r.err;
  const std::string text = k3::read_text_file(out);
  EXPECT_FALSE(text.empty());
  if (!text.empty()) {
    EXPECT_EQ(text.back(), '\n');
  }
}

TEST(KimiText, SnapshotWithoutTokenizerRunsOnIdsOnly) {
  const Result r = run(kKimi + " " + kTinyDir + " 'hello' --ngen 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("has no tiktoken.model"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--ids"), std::string::npos) << r.err;
  const Result both = run(kKimi + " " + kTinyDir + " 'hello' --chat 'q' --ngen 1");
  EXPECT_EQ(both.status, 1);
  EXPECT_NE(both.err.find("not both"), std::string::npos) << both.err;
}

}  // namespace

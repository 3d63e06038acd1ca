// load_checks_test — what the engine checks before it reads a weight, and how a load is stopped
// (issue 16, defects 4 and 6; docs/tokenizer.md §1.4). A damaged tokenizer, a missing one where
// text is needed, or a context that cannot fit is refused with the file or setting named before
// any layer loads (on_progress never runs); a load whose cancel flag is raised returns
// Status::Code::cancelled between tensors instead of running to the end.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/engine.h"
#include "io/file.h"
#include "test_util.h"
#include "util/error.h"

namespace k3 {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

// A snapshot that shares the demo's files (symbolic links) except the tokenizer files, which the
// test writes itself (empty `model` / `config`: that file is left out).
struct Variant {
  testing::TempDir dir;
  explicit Variant(const std::string& tag, const std::string& model, const std::string& config)
      : dir(tag) {
    for (const auto& e : fs::directory_iterator(testing::kDemoDir)) {
      const std::string name = e.path().filename().string();
      if (name == "tiktoken.model" || name == "tokenizer_config.json") continue;
      fs::create_symlink(e.path(), fs::path(dir.path()) / name);
    }
    if (!model.empty()) std::ofstream(dir.file("tiktoken.model"), std::ios::binary) << model;
    if (!config.empty())
      std::ofstream(dir.file("tokenizer_config.json"), std::ios::binary) << config;
  }
};

std::string demo_file(const std::string& name) {
  return read_text_file(testing::kDemoDir + "/" + name);
}

// Engine options that count the load's progress reports (one per tensor read, or more).
EngineOptions counting(const std::string& dir, int& reports) {
  EngineOptions o;
  o.model_dir = dir;
  o.on_progress = [&reports](double) { ++reports; };
  return o;
}

TEST(LoadChecks, TokenizerCutAtALineBoundaryIsRefusedBeforeTheWeights) {
  const std::string model = demo_file("tiktoken.model");
  size_t cut = 0;
  for (int i = 0; i < 160000; ++i) cut = model.find('\n', cut) + 1;
  const Variant v("load-checks-cut", model.substr(0, cut), demo_file("tokenizer_config.json"));
  int layers = 0;
  const std::string msg = error_of([&] { Engine e(counting(v.dir.path(), layers)); });
  EXPECT_HAS(msg, v.dir.path() + "/tiktoken.model");
  EXPECT_HAS(msg, "160000 ranks");
  EXPECT_HAS(msg, "vocab_size is 163840");
  EXPECT_EQ(layers, 0) << "the tokenizer must be checked before any weight is read";
}

TEST(LoadChecks, TokenizerConfigWithoutTheChatSpecialsIsRefused) {
  int layers = 0;
  {
    const Variant v("load-checks-empty", demo_file("tiktoken.model"), "{}");
    const std::string msg = error_of([&] { Engine e(counting(v.dir.path(), layers)); });
    EXPECT_HAS(msg, v.dir.path() + "/tokenizer_config.json");
    EXPECT_HAS(msg, "<|open|>");
  }
  // Each of the four, and the stop token <|end_of_msg|> among them, is needed by name.
  for (const char* name : {"<|close|>", "<|sep|>", "<|end_of_msg|>"}) {
    nlohmann::json config = nlohmann::json::parse(demo_file("tokenizer_config.json"));
    auto& decoder = config["added_tokens_decoder"];
    for (auto it = decoder.begin(); it != decoder.end(); ++it)
      if (it.value()["content"] == name) {
        decoder.erase(it);
        break;
      }
    const Variant v("load-checks-special", demo_file("tiktoken.model"), config.dump());
    const std::string msg = error_of([&] { Engine e(counting(v.dir.path(), layers)); });
    EXPECT_HAS(msg, "tokenizer_config.json");
    EXPECT_HAS(msg, name);
  }
  EXPECT_EQ(layers, 0);
}

TEST(LoadChecks, MissingTokenizerIsRefusedBeforeTheWeightsWhenTextIsNeeded) {
  const Variant v("load-checks-missing", "", "");
  int layers = 0;
  EngineOptions o = counting(v.dir.path(), layers);
  o.require_tokenizer = true;
  const std::string msg = error_of([&] { Engine e(o); });
  EXPECT_HAS(msg, "has no tiktoken.model");
  EXPECT_EQ(layers, 0);
}

TEST(LoadChecks, ContextThatCannotFitIsRefusedBeforeTheWeights) {
  int layers = 0;
  EngineOptions o = counting(testing::kDemoDir, layers);
  o.context = int64_t{1} << 40;  // petabytes of MLA rows
  const std::string msg = error_of([&] { Engine e(o); });
  EXPECT_HAS(msg, "--ctx / K3_MAXT=1099511627776");
  EXPECT_HAS(msg, "memory available");
  EXPECT_EQ(layers, 0);
  // before_weights sees the tokenizer and can refuse too (kimi_k3: the prompt must fit).
  EngineOptions p = counting(testing::kDemoDir, layers);
  bool saw_tokenizer = false;
  p.before_weights = [&](const EngineInfo& info, const text::Tokenizer* tokenizer) {
    saw_tokenizer = tokenizer != nullptr && info.vocab_size == 163840;
    throw Error("--ctx / K3_MAXT=4 cannot hold the prompt");
  };
  EXPECT_HAS(error_of([&] { Engine e(p); }), "cannot hold the prompt");
  EXPECT_TRUE(saw_tokenizer);
  EXPECT_EQ(layers, 0);
}

TEST(LoadChecks, CancelledLoadStopsBetweenTensorsAndReturnsAStatus) {
  std::atomic<bool> stop{false};
  int layers = 0;
  EngineOptions o = counting(testing::kDemoDir, layers);
  o.cancel = &stop;
  o.on_progress = [&](double) {
    if (++layers == 2) stop.store(true);  // a signal arriving while the second tensor loads
  };
  Result<std::unique_ptr<Engine>> r = Engine::load(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::cancelled);
  EXPECT_HAS(r.status().message(), "cancelled");
  EXPECT_EQ(layers, 2) << "no tensor may load after the flag was raised";
  // Raised before the call: the checks still run (a bad tokenizer is reported, not hidden), then
  // nothing loads.
  layers = 0;
  o.on_progress = [&](double) { ++layers; };
  Result<std::unique_ptr<Engine>> early = Engine::load(o);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), Status::Code::cancelled);
  EXPECT_EQ(layers, 0);
  // Unraised, the same options load the model.
  stop.store(false);
  double last = 0;
  o.on_progress = [&](double f) {
    ++layers;
    last = f;
  };
  Result<std::unique_ptr<Engine>> full = Engine::load(o);
  ASSERT_TRUE(full.ok()) << full.status().message();
  EXPECT_EQ((*full)->info().num_layers, 6);
  EXPECT_GT(layers, 7) << "reports by bytes, more than one per layer";
  EXPECT_EQ(last, 1.0);
}

}  // namespace
}  // namespace k3

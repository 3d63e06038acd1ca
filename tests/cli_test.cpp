// The kimi_k3 binary as a user runs it: stdout is exactly one line of ids, the summary goes to
// stderr, the validation hooks write their files, bad settings stop with a named message.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/file.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
const std::string kBinary = std::string(K3_BINARY_DIR) + "/apps/kimi_k3";
const std::string kFixture = std::string(K3_SOURCE_DIR) + "/tests/data/k3-tiny";
const std::string kPrompt = "768,399,86,450,308,688,16,162,288,540,404,506";
const std::string kGoldenDecode = "144 392 575 751 157 575 392 193";
// The settings the goldens are matched at (the defaults quantise).
const std::string kExact = "K3_BITS=32 K3_MLA_BITS=32 K3_HEAD_BITS=32 K3_IDOT=0";

using Result = k3::testing::CommandResult;

// Runs `env_prefix kimi_k3 args` with a clean environment, capturing stdout and stderr apart.
Result run(const std::string& env_prefix, const std::string& args) {
  return k3::testing::run_split("env -i " + env_prefix + " " + kBinary + " " + args);
}

TEST(Cli, IdsModePrintsExactlyTheGeneratedIds) {
  const Result r = run(kExact, kFixture + " --ids " + kPrompt + " --ngen 8");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, kGoldenDecode + "\n");
  EXPECT_NE(r.err.find("load "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("prefill 12 tok"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("decode 7 tok"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("peak RSS"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(Cli, ModelFromEnvironmentAndSpaceSeparatedIds) {
  const Result r = run(kExact + " COLI_MODEL=" + kFixture,
                       "--ids '768 399 86 450 308 688 16 162 288 540 404 506' --ngen 3");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "144 392 575\n");
}

TEST(Cli, SamplingIsReproducibleFromTheSeed) {
  const std::string args =
      kFixture + " --ids " + kPrompt + " --ngen 8 --temp 1.5 --top-k 50 --top-p 0.95 --seed 7";
  const Result a = run("", args), b = run("", args);
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  const Result c = run("", kFixture + " --ids " + kPrompt + " --ngen 8 --temp 1.5 --seed 8");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_NE(a.out, c.out) << "different seeds should give different samples at temperature 1.5";
}

TEST(Cli, LogitsAndTraceFilesAreWritten) {
  const fs::path dir = fs::temp_directory_path() / ("k3_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string logits = (dir / "logits.f32").string(),
                    trace = (dir / "trace.safetensors").string();
  const Result r = run(kExact + " K3_LOGITS=" + logits + " K3_TRACE=" + trace,
                       kFixture + " --ids " + kPrompt + " --ngen 8");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, kGoldenDecode + "\n") << "writing traces must not change any value";
  // The file holds the prefill logits [12][1024] (raw f32): at exact settings they are the
  // golden's, within the fixture README's acceptance (rel-L2 <= 1e-4, max abs <= 1e-3 x max|x|).
  ASSERT_EQ(fs::file_size(logits), 12u * 1024u * 4u);
  const std::string bytes = k3::read_text_file(logits);
  std::vector<float> got(bytes.size() / 4);
  std::memcpy(got.data(), bytes.data(), bytes.size());
  const std::vector<float> want =
      k3::testing::Tensors(kFixture + "/golden.safetensors").f32("logits");
  ASSERT_EQ(got.size(), want.size());
  const double rel = k3::testing::expect_close("K3_LOGITS", got.data(), want.data(), want.size());
  std::printf("K3_LOGITS against the golden logits: rel-L2 %.3g\n", rel);
  k3::SafetensorsShard shard(k3::open_posix_file(trace));
  ASSERT_NE(shard.find("logits"), nullptr);
  EXPECT_EQ(shard.find("logits")->shape, (std::vector<int64_t>{12, 1024}));
  ASSERT_NE(shard.find("layer.7.topk_ids"), nullptr);
  EXPECT_EQ(shard.find("layer.7.topk_ids")->dtype, k3::DType::kI64);
  ASSERT_NE(shard.find("final_hidden"), nullptr);
  fs::remove_all(dir);
}

TEST(Cli, X0RowsPastTheTableAreAnError) {
  const fs::path x0 = fs::temp_directory_path() / ("k3_x0_" + std::to_string(::getpid()));
  {
    std::ofstream out(x0, std::ios::binary);
    const std::vector<float> rows(2 * 64, 0.01f);
    out.write(reinterpret_cast<const char*>(rows.data()),
              static_cast<std::streamsize>(rows.size() * 4));
  }
  const Result ok = run("K3_X0=" + x0.string(), kFixture + " --ids 1,2 --ngen 1");
  EXPECT_EQ(ok.status, 0) << ok.err;
  const Result past = run("K3_X0=" + x0.string(), kFixture + " --ids 1,2,3 --ngen 1");
  EXPECT_NE(past.status, 0);
  EXPECT_NE(past.err.find("K3_X0"), std::string::npos) << past.err;
  fs::remove(x0);
}

TEST(Cli, RefusesUnsupportedAndUnknownSettings) {
  struct Case {
    std::string env, args, needle;
  };
  const Case cases[] = {
      {"K3_BITS=5", "--ids 1 --ngen 1", "K3_BITS"},
      {"K3_MLA_BITS=16", "--ids 1 --ngen 1", "K3_MLA_BITS"},
      {"K3_HEAD_BITS=2", "--ids 1 --ngen 1", "K3_HEAD_BITS"},
      {"K3_IDOT=maybe", "--ids 1 --ngen 1", "K3_IDOT"},
      {"K3_ISA=neon", "--ids 1 --ngen 1", "K3_ISA"},
      {"K3_TYPO=1", "--ids 1 --ngen 1", "K3_TYPO"},
      {"", "--ids 1 --ngen abc", "--ngen"},
      {"K3_MAXT=3", "--ids 1,2 --ngen 4", "K3_MAXT"},
      {"", "--ids 1,99999 --ngen 1", "99999"},
      {"K3_LAYERS=9", "--ids 1 --ngen 1", "K3_LAYERS"},
  };
  for (const Case& c : cases) {
    const Result r = run(c.env, kFixture + " " + c.args);
    EXPECT_NE(r.status, 0) << c.env << " " << c.args;
    EXPECT_TRUE(r.out.empty()) << c.env << " " << c.args;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.env << " " << c.args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  }
  const Result missing = run("", "/nonexistent/model --ids 1");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.err.find("/nonexistent/model"), std::string::npos) << missing.err;
}

TEST(Cli, StatsShowTheSettingsAndTheStages) {
  const Result defaults = run("", kFixture + " --ids " + kPrompt + " --ngen 2 --stats");
  ASSERT_EQ(defaults.status, 0) << defaults.err;
  EXPECT_NE(defaults.err.find("bits 4/8/8 | idot 1"), std::string::npos) << defaults.err;
  for (const char* stage : {"kda", "mla", "router", "experts", "shared", "dense", "head"})
    EXPECT_NE(defaults.err.find(stage), std::string::npos) << stage << ": " << defaults.err;
  const Result scalar =
      run(kExact + " K3_ISA=scalar K3_STATS=1", kFixture + " --ids " + kPrompt + " --ngen 8");
  ASSERT_EQ(scalar.status, 0) << scalar.err;
  EXPECT_EQ(scalar.out, kGoldenDecode + "\n");
  EXPECT_NE(scalar.err.find("isa scalar | bits 32/32/32 | idot 0"), std::string::npos)
      << scalar.err;
}

TEST(Cli, HelpListsTheEnvironmentVariables) {
  const Result r = run("", "--help");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* name :
       {"K3_BITS", "K3_MLA_BITS", "K3_HEAD_BITS", "K3_IDOT", "K3_ISA", "K3_STATS", "K3_MAXT",
        "K3_TRACE", "K3_LOGITS", "K3_X0", "K3_LAYERS", "COLI_TEMP", "COLI_MODEL"})
    EXPECT_NE(r.out.find(name), std::string::npos) << name;
}

}  // namespace

// README.md's option table: OptionsReadme.TableIsCurrent (tests/options_test.cpp).

// The kimi_k3 binary as a user runs it: stdout is exactly one line of ids, the summary goes to
// stderr, the validation hooks write their files, bad settings stop with a named message. And
// every program's first contact (issue 27): "did you mean" for unknown flags and commands,
// llama-cli's short flags, what a first argument that is not a model directory is, help that
// speaks of its own program, the tools' grouped help, k3_synth's size line and disk check.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "io/file.h"
#include "io/safetensors.h"
#include "synth_lib.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
const std::string kBinary = std::string(K3_BINARY_DIR) + "/apps/kimi_k3";
using k3::testing::kTinyDir;
const std::string kPrompt = "768,399,86,450,308,688,16,162,288,540,404,506";
const std::string kGoldenDecode = "144 392 575 751 157 575 392 193";
// The settings the goldens are matched at (the defaults quantise).
const std::string kExact = "K3_BITS=32 K3_MLA_BITS=32 K3_HEAD_BITS=32 K3_IDOT=0";

using Result = k3::testing::CommandResult;
using k3::testing::error_of;

// Runs `env_prefix kimi_k3 args` with a clean environment, capturing stdout and stderr apart.
Result run_kimi_k3(const std::string& env_prefix, const std::string& args) {
  return k3::testing::run_split("env -i " + env_prefix + " " + kBinary + " " + args);
}

TEST(Cli, IdsModePrintsExactlyTheGeneratedIds) {
  const Result r = run_kimi_k3(kExact, kTinyDir + " --ids " + kPrompt + " --ngen 8");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, kGoldenDecode + "\n");
  EXPECT_NE(r.err.find("load "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("prefill 12 tok"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("decode 7 tok"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("peak RSS"), std::string::npos) << r.err;
  // The resident memory split by use (Engine::memory()).
  for (const char* part : {"(dense ", ", experts ", " slots), KDA ", ", MLA ", ", activations ",
                           ", I/O ", "; anon ", ", file-backed "})
    EXPECT_NE(r.err.find(part), std::string::npos) << part << " in: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(Cli, ModelFromEnvironmentAndSpaceSeparatedIds) {
  const Result r = run_kimi_k3(kExact + " COLI_MODEL=" + kTinyDir,
                               "--ids '768 399 86 450 308 688 16 162 288 540 404 506' --ngen 3");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "144 392 575\n");
}

TEST(Cli, SamplingIsReproducibleFromTheSeed) {
  const std::string args =
      kTinyDir + " --ids " + kPrompt + " --ngen 8 --temp 1.5 --top-k 50 --top-p 0.95 --seed 7";
  const Result a = run_kimi_k3("", args), b = run_kimi_k3("", args);
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  const Result c =
      run_kimi_k3("", kTinyDir + " --ids " + kPrompt + " --ngen 8 --temp 1.5 --seed 8");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_NE(a.out, c.out) << "different seeds should give different samples at temperature 1.5";
}

TEST(Cli, LogitsAndTraceFilesAreWritten) {
  const fs::path dir = fs::temp_directory_path() / ("k3_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string logits = (dir / "logits.f32").string(),
                    trace = (dir / "trace.safetensors").string();
  const Result r = run_kimi_k3(kExact + " K3_LOGITS=" + logits + " K3_TRACE=" + trace,
                               kTinyDir + " --ids " + kPrompt + " --ngen 8");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, kGoldenDecode + "\n") << "writing traces must not change any value";
  // The file holds the prefill logits [12][1024] (raw f32): at exact settings they are the
  // golden's, within the fixture README's acceptance (rel-L2 <= 1e-4, max abs <= 1e-3 x max|x|).
  ASSERT_EQ(fs::file_size(logits), 12u * 1024u * 4u);
  const std::string bytes = k3::read_text_file(logits);
  std::vector<float> got(bytes.size() / 4);
  std::memcpy(got.data(), bytes.data(), bytes.size());
  const std::vector<float> want =
      k3::testing::Tensors(kTinyDir + "/golden.safetensors").f32("logits");
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
  const Result ok = run_kimi_k3("K3_X0=" + x0.string(), kTinyDir + " --ids 1,2 --ngen 1");
  EXPECT_EQ(ok.status, 0) << ok.err;
  const Result past = run_kimi_k3("K3_X0=" + x0.string(), kTinyDir + " --ids 1,2,3 --ngen 1");
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
      {"K3_MAXT=3", "--ids 1,2 --ngen 4", "raise --ctx to 6"},
      {"COLI_CTX=3", "--ids 1,2 --ngen 4", "COLI_CTX"},
      {"", "--ids 1,99999 --ngen 1", "99999"},
      {"K3_LAYERS=9", "--ids 1 --ngen 1", "K3_LAYERS"},
  };
  for (const Case& c : cases) {
    const Result r = run_kimi_k3(c.env, kTinyDir + " " + c.args);
    EXPECT_NE(r.status, 0) << c.env << " " << c.args;
    EXPECT_TRUE(r.out.empty()) << c.env << " " << c.args;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.env << " " << c.args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  }
  const Result missing = run_kimi_k3("", "/nonexistent/model --ids 1");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.err.find("/nonexistent/model"), std::string::npos) << missing.err;
}

TEST(Cli, StatsShowTheSettingsAndTheStages) {
  const Result defaults = run_kimi_k3("", kTinyDir + " --ids " + kPrompt + " --ngen 2 --stats");
  ASSERT_EQ(defaults.status, 0) << defaults.err;
  EXPECT_NE(defaults.err.find("bits 4/8/8 | idot 1"), std::string::npos) << defaults.err;
  for (const char* stage : {"kda", "mla", "router", "experts", "shared", "dense", "head"})
    EXPECT_NE(defaults.err.find(stage), std::string::npos) << stage << ": " << defaults.err;
  const Result scalar = run_kimi_k3(kExact + " K3_ISA=scalar K3_STATS=1",
                                    kTinyDir + " --ids " + kPrompt + " --ngen 8");
  ASSERT_EQ(scalar.status, 0) << scalar.err;
  EXPECT_EQ(scalar.out, kGoldenDecode + "\n");
  EXPECT_NE(scalar.err.find("isa scalar | bits 32/32/32 | idot 0"), std::string::npos)
      << scalar.err;
}

TEST(Cli, HelpListsTheEnvironmentVariables) {
  const Result r = run_kimi_k3("", "--help");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* name :
       {"K3_BITS", "K3_MLA_BITS", "K3_HEAD_BITS", "K3_IDOT", "K3_ISA", "K3_STATS", "COLI_CTX",
        "K3_TRACE", "K3_LOGITS", "K3_X0", "K3_LAYERS", "COLI_TEMP", "COLI_MODEL"})
    EXPECT_NE(r.out.find(name), std::string::npos) << name;
}

// ---- issue 27, first contact --------------------------------------------------------------

const std::string kBin = K3_BINARY_DIR;
const std::string kColiBinary = kBin + "/apps/coli";
const std::string kSynth = kBin + "/tools/k3_synth";
const std::string kRepack = kBin + "/tools/k3_repack";
const std::string kBench = kBin + "/bench/k3_bench";
const std::string kMini = std::string(K3_SOURCE_DIR) + "/assets/k3-mini";

Result sh(const std::string& command) {
  return k3::testing::run_split("env -i " + command);
}

// One line on stderr, exit status 2 (1 for kimi_k3, whose every error is 1), nothing on stdout.
void expect_usage_error(const std::string& command, const std::string& message, int status = 2) {
  const Result r = sh(command);
  EXPECT_EQ(r.status, status) << command << ": " << r.err;
  EXPECT_EQ(r.out, "") << command;
  EXPECT_HAS(r.err, message);
  EXPECT_EQ(r.err.find("usage:"), std::string::npos) << "no usage dump: " << r.err;
}

TEST(FirstContact, UnknownFlagsAndCommandsNameTheNearestOne) {
  expect_usage_error(kBinary + " m --chta x",
                     "kimi_k3: unknown option --chta (did you mean --chat?)\n", 1);
  expect_usage_error(kBinary + " m x --temperature 0.5",
                     "kimi_k3: unknown option --temperature (did you mean --temp?)\n", 1);
  expect_usage_error(kBinary + " m x --ngen", "kimi_k3: --ngen needs a value", 1);
  // coli: the command, then each command's flags.
  const Result serv = sh(kColiBinary + " serv");
  EXPECT_EQ(serv.status, 2);
  EXPECT_EQ(serv.err,
            "coli: unknown command 'serv' (did you mean 'serve'?)\n"
            "commands: serve, web, chat, tokenize, render (`coli --help` says what each does)\n");
  expect_usage_error(kColiBinary + " tokenise m",
                     "coli: unknown command 'tokenise' (did you mean 'tokenize'?)");
  expect_usage_error(kColiBinary + " --prot 80", "coli: unknown option --prot");
  expect_usage_error(kColiBinary + " serve m --prot 80",
                     "coli serve: unknown option --prot (did you mean --port?)");
  expect_usage_error(kColiBinary + " web m --prot 80",
                     "coli web: unknown option --prot (did you mean --port?)");
  expect_usage_error(kColiBinary + " chat m --tmep 1",
                     "coli chat: unknown option --tmep (did you mean --temp?)");
  expect_usage_error(
      kColiBinary + " tokenize m --allow-specal",
      "coli tokenize: unknown option --allow-specal (did you mean --allow-special?)");
  expect_usage_error(kColiBinary + " render m --modle x",
                     "coli render: unknown option --modle (did you mean --model?)");
  // The tools.
  expect_usage_error(kSynth + " --preset tiny --ot x",
                     "k3_synth: unknown option --ot (did you mean --out?)\n");
  expect_usage_error(kSynth + " -preset tiny",
                     "k3_synth: unknown option -preset (did you mean --preset?)\n");
  expect_usage_error(kSynth + " --preset tiny", "k3_synth: missing --out <dir>");
  expect_usage_error(kSynth + " --preset tiny --out", "k3_synth: --out needs a value");
  expect_usage_error(kRepack + " a b --bist 4",
                     "k3_repack: unknown option --bist (did you mean --bits?)\n");
  expect_usage_error(kRepack + " a", "k3_repack: missing <dest>");
  expect_usage_error(kRepack + " a b c", "k3_repack: unexpected argument \"c\"");
  if (K3_BUILD_BENCH) {
    const Result decod = sh(kBench + " decod");
    EXPECT_EQ(decod.status, 2);
    EXPECT_EQ(
        decod.err.rfind("k3_bench: unknown command 'decod' (did you mean 'decode'?)\ncommands: "
                        "kernels, decode, stream, quality, routing, container, grammar, serve, "
                        "vulkan, ep",
                        0),
        0u)
        << decod.err;
    expect_usage_error(kBench + " decode --lyers 3",
                       "k3_bench decode: unknown option --lyers (did you mean --layers?)\n");
    expect_usage_error(kBench + " kernels --sceonds 1",
                       "k3_bench kernels: unknown option --sceonds (did you mean --seconds?)\n");
    expect_usage_error(kBench + " routing --model m", "k3_bench routing: missing --ids");
    expect_usage_error(kBench, "k3_bench: a command is required");
  }
}

// llama-cli's habits: -m DIR -p TEXT -n N (and -c -t -s), with --chat too.
TEST(FirstContact, LlamaCliShortFlagsRun) {
  const Result ids =
      run_kimi_k3(kExact, "-m " + kTinyDir + " --ids " + kPrompt + " -n 8 -c 32 -t 1 -s 3");
  ASSERT_EQ(ids.status, 0) << ids.err;
  EXPECT_EQ(ids.out, kGoldenDecode + "\n");
  for (const std::string& args :
       {"-m " + kMini + " -p 'The man' -n 2", "-m " + kMini + " 'The man' -n 2",
        kMini + " -p 'The man' -n 2", "-m " + kMini + " --chat hi -n 2"}) {
    const Result r = run_kimi_k3("", args);
    EXPECT_EQ(r.status, 0) << args << ": " << r.err;
    EXPECT_HAS(r.err, "decode 1 tok");
  }
}

// What the first argument is, when it is not a model directory.
TEST(FirstContact, FirstArgumentThatIsNotAModelDirectory) {
  k3::testing::TempDir tmp("first-arg");
  std::filesystem::create_directories(tmp.file("k3-mini"));
  std::filesystem::create_directories(tmp.file("no-config"));
  std::ofstream(tmp.file("k3-mini/config.json")) << "{}";
  const std::string shard = kMini + "/model-00001-of-000009.safetensors";
  ASSERT_TRUE(std::filesystem::exists(shard));
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"'Hello there'",
       "kimi_k3: \"Hello there\" is not a model directory; it looks like a prompt. "
       "The model directory comes first: kimi_k3 <model_dir> \"Hello there\", or "
       "kimi_k3 -m <model_dir> -p \"Hello there\"\n"},
      {tmp.file("k3-mni") + " hi", "kimi_k3: " + tmp.file("k3-mni") +
                                       ": no such directory (did you mean " + tmp.file("k3-mini") +
                                       "?)\n"},
      {kMini + "/config.json hi", "kimi_k3: " + kMini +
                                      "/config.json is a file of the model directory " + kMini +
                                      ": pass the directory itself (kimi_k3 " + kMini + " ...)\n"},
      {shard + " hi", "kimi_k3: " + shard + " is a file of the model directory " + kMini +
                          ": pass the directory itself (kimi_k3 " + kMini + " ...)\n"},
      {tmp.file("no-config") + " hi",
       "kimi_k3: " + tmp.file("no-config") + " has no config.json: not a model directory"},
      {tmp.file("k3-mini") + " hi",
       "kimi_k3: " + tmp.file("k3-mini") + " has config.json but no weights"},
  };
  for (const Case& c : cases) {
    const Result r = run_kimi_k3("", c.args);
    EXPECT_EQ(r.status, 1) << c.args;
    EXPECT_EQ(r.out, "");
    EXPECT_HAS(r.err, c.message);
    EXPECT_EQ(r.err.find("no prompt"), std::string::npos) << r.err;
  }
  expect_usage_error(kColiBinary + " serve " + tmp.file("k3-mni"),
                     "coli serve: " + tmp.file("k3-mni") + ": no such directory (did you mean " +
                         tmp.file("k3-mini") + "?)");
  expect_usage_error(
      kColiBinary + " chat " + kMini + "/config.json",
      "coli chat: " + kMini + "/config.json is a file of the model directory " + kMini);
}

std::string help_of(const std::string& command) {
  const Result r = sh(command + " --help");
  EXPECT_EQ(r.status, 0) << command << ": " << r.err;
  return r.out;
}

// Each program's help speaks of that program only; coli's lists every endpoint.
TEST(FirstContact, HelpSpeaksOfItsOwnProgram) {
  const std::string kimi = help_of(kBinary);
  EXPECT_EQ(kimi.find("coli"), std::string::npos) << kimi;
  EXPECT_HAS(kimi, "  -m, --model <text>");
  EXPECT_HAS(kimi, "  -n, --ngen <0..>");
  for (const char* command : {"serve", "web", "chat", "tokenize", "render"}) {
    std::string help = help_of(kColiBinary + " " + command);
    for (size_t at; (at = help.find("/kimi_k3")) != std::string::npos;) help.erase(at, 8);
    EXPECT_EQ(help.find("kimi_k3"), std::string::npos) << command << ":\n" << help;
  }
  for (const std::string& help : {help_of(kColiBinary), help_of(kColiBinary + " serve")})
    for (const char* endpoint :
         {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/models",
          "/health", "/metrics", "/tokenize", "/detokenize", "/slots"})
      EXPECT_HAS(help, endpoint);
}

// The tools' help: the usage line, one paragraph, groups, a default (or [required]) on every
// option, like the option table's programs.
TEST(FirstContact, ToolsHaveGroupedHelpWithDefaults) {
  std::vector<std::pair<std::string, std::vector<std::string>>> tools = {
      {kSynth,
       {"usage: k3_synth --preset <tiny|demo|slice> --out <dir> [options]\n", "\ncheckpoint:\n",
        "\noutput:\n", "[default the preset's]", "[default 1]", "[required]", "--dry-run"}},
      {kRepack,
       {"usage: k3_repack <source> <dest> [options]\n", "\narguments:\n", "\nwidths:\n",
        "\nlayout:\n", "[default 8]", "[default aligned]", "[default max(bits, 8)]"}}};
  if (K3_BUILD_BENCH) {
    tools.push_back({kBench, {"usage: k3_bench <command> [command options]\n", "\ncommands:\n"}});
    tools.push_back({kBench + " decode",
                     {"usage: k3_bench decode [<model_dir>] [options]\n", "[default 2]",
                      "[default <build>/bench-slice]"}});
  }
  for (const auto& [command, needles] : tools) {
    const std::string help = help_of(command);
    for (const std::string& n : needles) EXPECT_HAS(help, n) << command;
    EXPECT_HAS(help, "\nother:\n  -h, --help");
    EXPECT_EQ(help.find("--kill-at-byte"), std::string::npos) << "testing hooks stay hidden";
    EXPECT_EQ(help.find("--assume-free-bytes"), std::string::npos) << "testing hooks stay hidden";
    // Every option line ends its help with [default ...] or [required].
    std::istringstream lines(help);
    std::string line, entry;
    auto check = [&] {
      if (entry.rfind("  -", 0) == 0) {
        EXPECT_TRUE(entry.find("[default ") != std::string::npos ||
                    entry.find("[required]") != std::string::npos ||
                    entry.find("-h, --help") != std::string::npos ||
                    entry.find("--version") != std::string::npos)
            << command << ": " << entry;
      }
      entry.clear();
    };
    while (std::getline(lines, line)) {
      if (line.rfind("    ", 0) != 0) check();
      entry += line;
    }
    check();
  }
}

// k3_synth says what it will write before writing, and refuses a filesystem without room.
TEST(FirstContact, SynthSaysTheSizeAndChecksTheFreeSpace) {
  k3::testing::TempDir tmp("synth-size");
  const Result slice = sh(kSynth + " --preset slice --out " + tmp.file("slice") + " --dry-run");
  ASSERT_EQ(slice.status, 0) << slice.err;
  EXPECT_HAS(slice.out, "k3_synth: would write 8.6 GB to " + tmp.file("slice") +
                            " (slice preset: 2 layers, 16 experts");
  EXPECT_FALSE(std::filesystem::exists(tmp.file("slice"))) << "--dry-run writes nothing";

  const Result full =
      sh(kSynth + " --preset tiny --out " + tmp.file("full") + " --assume-free-bytes 1000");
  EXPECT_EQ(full.status, 1);
  const k3::synth::WritePlan plan =
      k3::synth::plan_write(k3::synth::preset_spec("tiny"), tmp.file("full"));
  EXPECT_HAS(full.err, tmp.file("full") + ": the checkpoint needs " +
                           std::to_string(plan.needed_bytes) +
                           " bytes (0.002 GB) and its filesystem has 1000 bytes (0.000 GB) free");
  EXPECT_FALSE(std::filesystem::exists(tmp.file("full"))) << "nothing written";

  const Result tiny = sh(kSynth + " --preset tiny --out " + tmp.file("tiny"));
  ASSERT_EQ(tiny.status, 0) << tiny.err;
  EXPECT_EQ(
      tiny.out.rfind("k3_synth: writing 0.002 GB to " + tmp.file("tiny") + " (tiny preset", 0), 0u)
      << tiny.out;
  EXPECT_HAS(tiny.out, "\nk3_synth: wrote 10 shards");
  // The size said is the size written, byte for byte.
  uint64_t written = 0;
  int64_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp.file("tiny")))
    written += e.file_size(), ++files;
  EXPECT_EQ(written, plan.bytes);
  EXPECT_EQ(files, plan.files);
  // Writing it again replaces each file in turn: the most it adds is the largest file.
  const k3::synth::WritePlan again =
      k3::synth::plan_write(k3::synth::preset_spec("tiny"), tmp.file("tiny"));
  EXPECT_EQ(again.bytes, plan.bytes);
  EXPECT_LT(again.needed_bytes, plan.needed_bytes);
  EXPECT_NO_THROW(k3::synth::check_free_space(plan, plan.needed_bytes, "d"));
  EXPECT_HAS(error_of([&] { k3::synth::check_free_space(plan, plan.needed_bytes - 1, "d"); }),
             "d: the checkpoint needs");
}

}  // namespace

// docs/options.md's option table: OptionsReadme.TableIsCurrent (tests/options_test.cpp).

// options_test — run-time options (options/options.h): defaults, flag > environment > default,
// refusals naming the flag or variable, every boolean form, unknown flags and K3_* / COLI_*
// variables with the nearest known name, llama-cli's short flags, COLI_CTX and its old name
// K3_MAXT, what a first argument that is not a model directory is, "was it given?", per-program
// defaults and help (each program's speaks of itself only), --version, and docs/options.md's copy
// of the option table.
#include "options/options.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "io/file.h"
#include "test_util.h"
#include "util/error.h"

namespace {

using k3::testing::error_of;

using Args = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

std::string parse_error(const Args& args, const Env& env = {}) {
  return error_of([&] { k3::parse_kimi_k3_options(args, env); });
}

TEST(OptionsDefaults, AllFields) {
  const k3::Options o = k3::parse_kimi_k3_options({"models/k3"}, {});
  EXPECT_EQ(o.model_dir, "models/k3");
  EXPECT_EQ(o.prompt, "");
  EXPECT_TRUE(o.ids.empty());
  EXPECT_FALSE(o.given("ids"));
  EXPECT_EQ(o.ngen, 16);
  // The release defaults of the spec's environment table.
  EXPECT_EQ(o.load.bits, 4);
  EXPECT_EQ(o.load.mla_bits, 8);
  EXPECT_EQ(o.load.head_bits, 8);
  EXPECT_TRUE(o.load.idot);
  EXPECT_EQ(o.load.isa, "auto");
  EXPECT_FALSE(o.debug.stats);
  EXPECT_EQ(o.load.layers, 0);
  EXPECT_EQ(o.runtime.max_tokens, 0);
  EXPECT_EQ(o.runtime.threads, 0);
  EXPECT_EQ(o.sampling.temperature, 0.0);
  EXPECT_EQ(o.sampling.top_p, 1.0);
  EXPECT_EQ(o.sampling.top_k, 0);
  EXPECT_FALSE(o.given("seed"));
  EXPECT_TRUE(o.debug.trace_path.empty());
  EXPECT_TRUE(o.debug.logits_path.empty());
  EXPECT_TRUE(o.debug.x0_path.empty());
  EXPECT_FALSE(o.show_help);
  // The banner lines list the effective values.
  auto has_line = [&](const std::string& line) {
    return std::find(o.effective.begin(), o.effective.end(), line) != o.effective.end();
  };
  EXPECT_TRUE(has_line("K3_NGEN=16"));
  EXPECT_TRUE(has_line("K3_BITS=4"));
  EXPECT_TRUE(has_line("K3_IDOT=1"));
  EXPECT_TRUE(has_line("COLI_TEMP=0"));
}

TEST(OptionsDefaults, PositionalPrompt) {
  const k3::Options o = k3::parse_kimi_k3_options({"m", "hello world"}, {});
  EXPECT_EQ(o.model_dir, "m");
  EXPECT_EQ(o.prompt, "hello world");
}

TEST(OptionsPrecedence, FlagBeatsEnvBeatsDefault) {
  const Env env = {{"COLI_TEMP", "0.7"}};
  EXPECT_DOUBLE_EQ(k3::parse_kimi_k3_options({"m", "--temp", "0.5"}, env).sampling.temperature,
                   0.5);
  EXPECT_DOUBLE_EQ(k3::parse_kimi_k3_options({"m"}, env).sampling.temperature, 0.7);
  EXPECT_DOUBLE_EQ(k3::parse_kimi_k3_options({"m"}, {}).sampling.temperature, 0.0);
  EXPECT_DOUBLE_EQ(k3::parse_kimi_k3_options({"--temp=0.25", "m"}, env).sampling.temperature, 0.25);

  EXPECT_EQ(k3::parse_kimi_k3_options({"m", "--ngen", "3"}, {{"K3_NGEN", "9"}}).ngen, 3);
  EXPECT_EQ(k3::parse_kimi_k3_options({"m"}, {{"K3_NGEN", "9"}}).ngen, 9);
  // An invalid environment value does not matter when the flag is given.
  EXPECT_EQ(k3::parse_kimi_k3_options({"m", "--ngen", "3"}, {{"K3_NGEN", "abc"}}).ngen, 3);
}

TEST(OptionsPrecedence, ModelFromFlagOrEnv) {
  EXPECT_EQ(k3::parse_kimi_k3_options({}, {{"COLI_MODEL", "/env/dir"}}).model_dir, "/env/dir");
  EXPECT_EQ(
      k3::parse_kimi_k3_options({"--model", "/flag/dir"}, {{"COLI_MODEL", "/env/dir"}}).model_dir,
      "/flag/dir");
  EXPECT_EQ(k3::parse_kimi_k3_options({"/pos/dir"}, {{"COLI_MODEL", "/env/dir"}}).model_dir,
            "/pos/dir");
}

TEST(OptionsPrecedence, EveryOptionReachable) {
  const Env env = {{"COLI_TOP_P", "0.9"},  {"COLI_TOP_K", "40"}, {"COLI_SEED", "42"},
                   {"K3_MAXT", "4096"},    {"K3_LAYERS", "2"},   {"K3_TRACE", "t.safetensors"},
                   {"K3_LOGITS", "l.bin"}, {"K3_X0", "x0.bin"}};
  const k3::Options o = k3::parse_kimi_k3_options({"m", "--threads", "3"}, env);
  EXPECT_DOUBLE_EQ(o.sampling.top_p, 0.9);
  EXPECT_EQ(o.sampling.top_k, 40);
  EXPECT_EQ(o.sampling.seed, 42u);
  EXPECT_TRUE(o.given("seed"));
  EXPECT_EQ(o.source("seed"), k3::OptionSource::kEnvironment);
  EXPECT_EQ(o.runtime.max_tokens, 4096);
  EXPECT_EQ(o.runtime.threads, 3);
  EXPECT_EQ(o.load.layers, 2);
  EXPECT_EQ(o.debug.trace_path, "t.safetensors");
  EXPECT_EQ(o.debug.logits_path, "l.bin");
  EXPECT_EQ(o.debug.x0_path, "x0.bin");

  const k3::Options f = k3::parse_kimi_k3_options(
      {"m", "--top-p", "0.5", "--top-k", "7", "--seed", "0", "--maxt", "10", "--layers", "1",
       "--trace", "a", "--logits", "b", "--x0", "c"},
      {});
  EXPECT_DOUBLE_EQ(f.sampling.top_p, 0.5);
  EXPECT_EQ(f.sampling.top_k, 7);
  EXPECT_EQ(f.sampling.seed, 0u);
  EXPECT_TRUE(f.given("seed"));
  EXPECT_EQ(f.source("seed"), k3::OptionSource::kFlag);
  EXPECT_EQ(f.runtime.max_tokens, 10);
  EXPECT_EQ(f.load.layers, 1);
  EXPECT_EQ(f.debug.trace_path, "a");
  EXPECT_EQ(f.debug.logits_path, "b");
  EXPECT_EQ(f.debug.x0_path, "c");
}

TEST(OptionsReject, UnknownK3Variable) {
  const std::string msg = parse_error({"m"}, {{"K3_FOO", "1"}});
  EXPECT_HAS(msg, "K3_FOO");
  // Other variables are none of our business.
  EXPECT_NO_THROW(k3::parse_kimi_k3_options(
      {"m"}, {{"HOME", "/root"}, {"PATH", "/bin"}, {"OMP_NUM_THREADS", "2"}}));
}

TEST(OptionsReject, UnknownFlag) {
  EXPECT_HAS(parse_error({"m", "--bogus", "1"}), "--bogus");
}

TEST(OptionsReject, BadValuesNameTheSource) {
  EXPECT_HAS(parse_error({"m", "--ngen", "abc"}), "--ngen");
  EXPECT_HAS(parse_error({"m", "--ngen", "12x"}), "--ngen");
  EXPECT_HAS(parse_error({"m", "--ngen", "-1"}), "--ngen");
  EXPECT_HAS(parse_error({"m"}, {{"K3_NGEN", "abc"}}), "K3_NGEN");
  EXPECT_HAS(parse_error({"m"}, {{"K3_NGEN", ""}}), "K3_NGEN");
  EXPECT_HAS(parse_error({"m"}, {{"COLI_TOP_P", "0"}}), "COLI_TOP_P");
  EXPECT_HAS(parse_error({"m"}, {{"COLI_TOP_P", "1.5"}}), "COLI_TOP_P");
  EXPECT_HAS(parse_error({"m"}, {{"COLI_TOP_P", "0.5x"}}), "COLI_TOP_P");
  EXPECT_HAS(parse_error({"m", "--top-p", "0"}), "--top-p");
  EXPECT_HAS(parse_error({"m"}, {{"COLI_TEMP", "-1"}}), "COLI_TEMP");
  EXPECT_HAS(parse_error({"m"}, {{"COLI_TEMP", "hot"}}), "COLI_TEMP");
  EXPECT_HAS(parse_error({"m"}, {{"COLI_TOP_K", "-3"}}), "COLI_TOP_K");
  EXPECT_HAS(parse_error({"m"}, {{"COLI_SEED", "seed"}}), "COLI_SEED");
  EXPECT_HAS(parse_error({"m"}, {{"K3_IDOT", "maybe"}}), "K3_IDOT");
  EXPECT_HAS(parse_error({"m", "--threads", "many"}), "--threads");
  EXPECT_HAS(parse_error({"m"}, {{"K3_LAYERS", "1.5"}}), "K3_LAYERS");
}

TEST(OptionsReject, UnsupportedQuantisationSettings) {
  const std::string bits = parse_error({"m"}, {{"K3_BITS", "6"}});
  EXPECT_HAS(bits, "K3_BITS");
  EXPECT_HAS(bits, "6");
  EXPECT_HAS(parse_error({"m"}, {{"K3_MLA_BITS", "16"}}), "K3_MLA_BITS");
  EXPECT_HAS(parse_error({"m"}, {{"K3_HEAD_BITS", "2"}}), "K3_HEAD_BITS");
  EXPECT_HAS(parse_error({"m", "--bits", "3"}), "--bits");
  EXPECT_HAS(parse_error({"m"}, {{"K3_IDOT", "2"}}), "K3_IDOT");
  EXPECT_HAS(parse_error({"m", "--idot=yes please"}), "--idot");
  EXPECT_HAS(parse_error({"m"}, {{"K3_ISA", "neon"}}), "K3_ISA");

  for (const char* b : {"4", "8", "32"}) {
    const k3::Options o =
        k3::parse_kimi_k3_options({"m"}, {{"K3_BITS", b}, {"K3_MLA_BITS", b}, {"K3_HEAD_BITS", b}});
    EXPECT_EQ(o.load.bits, std::stoi(b));
    EXPECT_EQ(o.load.mla_bits, std::stoi(b));
    EXPECT_EQ(o.load.head_bits, std::stoi(b));
  }
  const k3::Options exact =
      k3::parse_kimi_k3_options({"m", "--idot=0", "--isa", "scalar", "--stats"}, {});
  EXPECT_FALSE(exact.load.idot);
  EXPECT_EQ(exact.load.isa, "scalar");
  EXPECT_TRUE(exact.debug.stats);
}

TEST(OptionsIds, ParsedFromFlag) {
  const k3::Options o = k3::parse_kimi_k3_options({"m", "--ids", "1,2, 3"}, {});
  EXPECT_TRUE(o.given("ids"));
  EXPECT_EQ(o.ids, (std::vector<int64_t>{1, 2, 3}));
  const std::string msg = parse_error({"m", "--ids", "1,x"});
  EXPECT_HAS(msg, "--ids");
  EXPECT_HAS(msg, "x");
}

TEST(OptionsIds, ParseIdList) {
  EXPECT_EQ(k3::parse_id_list("1,2, 3"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(k3::parse_id_list("7"), (std::vector<int64_t>{7}));
  EXPECT_EQ(k3::parse_id_list(" 4 5\t6\n"), (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(k3::parse_id_list("163584,0"), (std::vector<int64_t>{163584, 0}));
  EXPECT_HAS(error_of([] { k3::parse_id_list("1,x"); }), "x");
  EXPECT_HAS(error_of([] { k3::parse_id_list("1,-2"); }), "-2");
  EXPECT_HAS(error_of([] { k3::parse_id_list("1.5"); }), "1.5");
  EXPECT_HAS(error_of([] { k3::parse_id_list("99999999999"); }), "99999999999");
  error_of([] { k3::parse_id_list(""); });
  error_of([] { k3::parse_id_list(" , "); });
}

TEST(OptionsModel, MissingModelDirIsAnError) {
  const std::string msg = parse_error({});
  EXPECT_HAS(msg, "model");
  EXPECT_HAS(parse_error({"--ngen", "4"}), "model");
}

TEST(OptionsHelp, WorksWithoutModelDir) {
  for (const char* flag : {"--help", "-h"}) {
    const k3::Options o = k3::parse_kimi_k3_options({flag}, {});
    EXPECT_TRUE(o.show_help);
    EXPECT_HAS(o.help_text, "--ngen");
    EXPECT_HAS(o.help_text, "K3_BITS");
    EXPECT_HAS(o.help_text, "COLI_TEMP");
  }
  const std::string table = k3::options_table_markdown();
  EXPECT_HAS(table, "| `-n, --ngen` | `K3_NGEN` | 16 (coli: up to --max-tokens) |");
  EXPECT_HAS(table, "| `--temp` | `COLI_TEMP` | 0 (coli: 0.6) |");
  EXPECT_HAS(table, "`K3_IDOT`");
}

k3::Options parse(const std::string& program, const Args& args, const Env& env = {}) {
  return k3::parse_options(program, args, env);
}

// Every boolean flag: --x, --no-x, --x=0/1/true/false (and the variable's 0/1), whatever the
// default.
TEST(OptionsBool, EveryForm) {
  auto think = [](const Args& a, const Env& e = {}) {
    return k3::parse_kimi_k3_options(a, e).text.think;
  };
  EXPECT_TRUE(think({"m"}));
  EXPECT_TRUE(think({"m", "--think"}));
  EXPECT_FALSE(think({"m", "--no-think"}));
  EXPECT_FALSE(think({"m", "--think=0"}));
  EXPECT_FALSE(think({"m", "--think=false"}));
  EXPECT_FALSE(think({"m", "--think=off"}));
  EXPECT_TRUE(think({"m", "--think=1"}));
  EXPECT_TRUE(think({"m", "--think=true"}));
  EXPECT_TRUE(think({"m", "--no-think=false"}));
  EXPECT_FALSE(think({"m"}, {{"K3_THINK", "0"}}));
  EXPECT_TRUE(think({"m", "--think"}, {{"K3_THINK", "0"}}));  // the flag beats the variable
  EXPECT_FALSE(think({"m", "--think=0"}, {{"K3_THINK", "1"}}));

  auto stats = [](const Args& a) { return k3::parse_kimi_k3_options(a, {}).debug.stats; };
  EXPECT_FALSE(stats({"m"}));
  EXPECT_TRUE(stats({"m", "--stats"}));
  EXPECT_TRUE(stats({"m", "--stats=1"}));
  EXPECT_TRUE(stats({"m", "--stats=true"}));
  EXPECT_FALSE(stats({"m", "--stats=0"}));
  EXPECT_FALSE(stats({"m", "--stats=false"}));
  EXPECT_FALSE(stats({"m", "--no-stats"}));

  // Every boolean row, on and off, through the flag and (where there is one) the variable.
  struct Row {
    const char* name;
    const char* env;
    std::function<bool(const k3::Options&)> get;
  };
  const std::vector<Row> rows = {
      {"idot", "K3_IDOT", [](const k3::Options& o) { return o.load.idot; }},
      {"direct", "K3_DIRECT", [](const k3::Options& o) { return o.load.cache.direct; }},
      {"pin", "K3_PIN", [](const k3::Options& o) { return o.load.cache.pin; }},
      {"pipe", "K3_PIPE", [](const k3::Options& o) { return o.load.cache.pipe; }},
      {"prefetch", "K3_PREFETCH", [](const k3::Options& o) { return o.load.cache.prefetch; }},
      {"experts-in-memory", nullptr, [](const k3::Options& o) { return o.load.experts_in_memory; }},
      {"show-think", "COLI_SHOW_THINK", [](const k3::Options& o) { return o.text.show_think; }},
      {"labels", nullptr, [](const k3::Options& o) { return o.text.labels; }},
      {"allow-special", nullptr, [](const k3::Options& o) { return o.text.allow_special; }},
      {"bos", nullptr, [](const k3::Options& o) { return o.text.bos; }},
      {"prompt-ids", "K3_CHAT_IDS", [](const k3::Options& o) { return o.debug.prompt_ids; }},
      {"raw", nullptr, [](const k3::Options& o) { return o.serve.raw; }},
      {"strict-model", nullptr, [](const k3::Options& o) { return o.serve.strict_model; }},
      {"insecure-bind", "COLI_ALLOW_INSECURE_BIND",
       [](const k3::Options& o) { return o.serve.insecure_bind; }},
      {"log-prompts", nullptr, [](const k3::Options& o) { return o.serve.log_prompts; }},
      {"webui", nullptr, [](const k3::Options& o) { return o.serve.web_ui; }},
      {"ckpt-keep", nullptr, [](const k3::Options& o) { return o.serve.ckpt_keep; }},
      {"prefix-log", "K3_PREFIX_LOG", [](const k3::Options& o) { return o.serve.prefix_log; }},
  };
  for (const Row& r : rows) {
    const std::string flag = std::string("--") + r.name, no = std::string("--no-") + r.name;
    SCOPED_TRACE(flag);
    EXPECT_TRUE(r.get(parse("coli serve", {"m", flag})));
    EXPECT_FALSE(r.get(parse("coli serve", {"m", no})));
    for (const char* on : {"1", "true", "on", "yes"})
      EXPECT_TRUE(r.get(parse("coli serve", {"m", flag + "=" + on})));
    for (const char* off : {"0", "false", "off", "no"})
      EXPECT_FALSE(r.get(parse("coli serve", {"m", flag + "=" + off})));
    EXPECT_HAS(error_of([&] { parse("coli serve", {"m", flag + "=maybe"}); }), flag);
    if (r.env) {
      EXPECT_TRUE(r.get(parse("coli serve", {"m"}, {{r.env, "1"}})));
      EXPECT_FALSE(r.get(parse("coli serve", {"m"}, {{r.env, "0"}})));
      EXPECT_HAS(error_of([&] { parse("coli serve", {"m"}, {{r.env, "maybe"}}); }), r.env);
    }
  }
  // The old spellings stay.
  EXPECT_FALSE(k3::parse_kimi_k3_options({"m", "--hide-think"}, {}).text.show_think);
  EXPECT_FALSE(parse("coli serve", {"m", "--no-webui"}).serve.web_ui);
  // --accept-any-model (before --strict-model, any name was refused unless it was given) is the
  // default now: it stays accepted and means "not strict".
  EXPECT_FALSE(parse("coli serve", {"m"}).serve.strict_model);
  EXPECT_FALSE(parse("coli serve", {"m", "--accept-any-model"}).serve.strict_model);
}

TEST(OptionsBool, ValueAfterASpaceIsRefused) {
  // "--idot 0" would make 0 the prompt: refused, naming the '=' form.
  const std::string msg = parse_error({"m", "--idot", "0"});
  EXPECT_HAS(msg, "--idot=0");
  EXPECT_HAS(parse_error({"--no-think", "false", "m"}), "--think=false");
  // A real prompt after a flag is fine.
  EXPECT_EQ(k3::parse_kimi_k3_options({"m", "--no-think", "hello"}, {}).prompt, "hello");
}

TEST(OptionsReject, UnknownVariablesNameTheNearestKnownOne) {
  EXPECT_EQ(parse_error({"m"}, {{"COLI_TMEP", "1"}}),
            "unknown environment variable COLI_TMEP (did you mean COLI_TEMP?)");
  EXPECT_EQ(parse_error({"m"}, {{"K3_BTIS", "4"}}),
            "unknown environment variable K3_BTIS (did you mean K3_BITS?)");
  EXPECT_HAS(parse_error({"m"}, {{"K3_NGNE", "4"}}), "did you mean K3_NGEN?");
  EXPECT_HAS(parse_error({"m"}, {{"COLI_API_KEYS", "k"}}), "did you mean COLI_API_KEY?");
  EXPECT_HAS(error_of([] {
               parse("coli serve", {"m"}, {{"COLI_PROT", "80"}});
             }),
             "did you mean COLI_PORT?");
  EXPECT_HAS(error_of([] { parse("coli tokenize", {"m"}, {{"COLI_TMEP", "1"}}); }), "COLI_TMEP");
  // Every variable the table knows, and those the test suites and scripts set, are accepted.
  const Env known = {{"COLI_MODEL", "m"},
                     {"COLI_API_KEY", "k"},
                     {"COLI_API_KEY_FILE", ""},
                     {"COLI_ALLOW_INSECURE_BIND", "0"},
                     {"COLI_ALLOWED_HOSTS", "a"},
                     {"COLI_CORS_ORIGINS", "b"},
                     {"COLI_HOST", "127.0.0.1"},
                     {"COLI_PORT", "0"},
                     {"COLI_MODEL_ID", "x"},
                     {"COLI_MAX_QUEUE", "1"},
                     {"COLI_QUEUE_TIMEOUT", "5"},
                     {"COLI_MAX_TOKENS", "9"},
                     {"COLI_MAX_BODY_MB", "1"},
                     {"COLI_SSE_PING", "0"},
                     {"COLI_MAX_CONNECTIONS", "9"},
                     {"COLI_READ_DEADLINE", "5"},
                     {"COLI_REASONING", "off"},
                     {"COLI_K3_CKPT", "2"},
                     {"COLI_K3_CKPT_DIR", ""},
                     {"COLI_TOKEN_DELAY_MS", "0"},
                     {"COLI_USAGE_DECAY", "0.5"},
                     {"COLI_SHOW_THINK", "0"},
                     {"COLI_TEMP", "0.1"},
                     {"COLI_TOP_P", "0.5"},
                     {"COLI_TOP_K", "3"},
                     {"COLI_MIN_P", "0"},
                     {"COLI_SEED", "1"},
                     {"K3_PREFIX_LOG", "1"},
                     {"K3_ISA", "scalar"}};
  EXPECT_NO_THROW(parse("coli serve", {}, known));
  EXPECT_NO_THROW(k3::check_environment({{"COLIN", "x"}, {"K3", "y"}, {"MY_K3_THING", "z"}}));
}

TEST(OptionsPrecedence, GivenIsAnsweredByTheParser) {
  const k3::Options none = k3::parse_kimi_k3_options({"m"}, {});
  EXPECT_FALSE(none.given("ngen"));
  EXPECT_FALSE(none.given("temp"));
  EXPECT_EQ(none.source("temp"), k3::OptionSource::kDefault);
  for (const Args& args : {Args{"m", "--ngen", "5"}, Args{"m", "--ngen=5"}}) {
    const k3::Options o = k3::parse_kimi_k3_options(args, {});
    EXPECT_TRUE(o.given("ngen"));
    EXPECT_EQ(o.source("ngen"), k3::OptionSource::kFlag);
    EXPECT_EQ(o.ngen, 5);
  }
  const k3::Options env = k3::parse_kimi_k3_options({"m"}, {{"K3_NGEN", "7"}});
  EXPECT_EQ(env.source("ngen"), k3::OptionSource::kEnvironment);
  // Aliases answer to the row's first name.
  EXPECT_TRUE(k3::parse_kimi_k3_options({"m", "--maxt=64"}, {}).given("ctx"));
  EXPECT_EQ(k3::parse_kimi_k3_options({"m", "--maxt=64"}, {}).runtime.max_tokens, 64);
  EXPECT_EQ(parse("coli serve", {"m", "--api-key=k"}).source("api-key"), k3::OptionSource::kFlag);
  EXPECT_EQ(parse("coli serve", {"m"}, {{"COLI_API_KEY", "k"}}).source("api-key"),
            k3::OptionSource::kEnvironment);
}

// coli serve / web / chat given no model run the built-in trained tiny K3 (assets/k3-mini of the
// source tree) and say so; a model from the command line or COLI_MODEL wins; kimi_k3 and the
// JSON-lines commands still need one; a missing built-in model is an error naming its path.
TEST(OptionsPrograms, ColiRunsTheBuiltInModelWhenNoneIsGiven) {
  const std::string builtin = std::string(K3_SOURCE_DIR) + "/assets/k3-mini";
  EXPECT_EQ(k3::builtin_model_dir(), builtin);
  for (const char* program : {"coli serve", "coli web", "coli chat"}) {
    SCOPED_TRACE(program);
    const k3::Options none = parse(program, {});
    EXPECT_EQ(none.model_dir, builtin);
    EXPECT_TRUE(none.builtin_model);
    EXPECT_FALSE(none.given("model"));
    EXPECT_EQ(k3::model_note(none), " (built-in trained tiny K3, no --model given)");
    for (const k3::Options& given : {parse(program, {"m"}), parse(program, {"--model", "m"}),
                                     parse(program, {}, {{"COLI_MODEL", "m"}})}) {
      EXPECT_EQ(given.model_dir, "m");
      EXPECT_FALSE(given.builtin_model);
      EXPECT_EQ(k3::model_note(given), "");
    }
  }
  for (const char* program : {"kimi_k3", "coli tokenize", "coli render"})
    EXPECT_HAS(error_of([&] { parse(program, {}); }), "no model directory") << program;
  EXPECT_EQ(k3::require_builtin_model(builtin), builtin);
  const std::string missing = ::testing::TempDir() + "k3-no-such-model";
  const std::string e = error_of([&] { k3::require_builtin_model(missing); });
  EXPECT_HAS(e, "the built-in model is missing: " + missing + "/config.json not found");
  EXPECT_HAS(e, "--model DIR");
}

// coli serve / web / chat sample at the model card's settings unless told otherwise; every
// spelling of --temp counts (`--temp=0.25` used to be ignored by coli serve).
TEST(OptionsPrograms, ColiDefaultsAndFlagBeatsEnvBeatsDefault) {
  for (const char* program : {"coli serve", "coli web", "coli chat"}) {
    SCOPED_TRACE(program);
    const k3::Options d = parse(program, {"m"});
    EXPECT_DOUBLE_EQ(d.sampling.temperature, 0.6);
    EXPECT_DOUBLE_EQ(d.sampling.top_p, 0.95);
    EXPECT_EQ(d.runtime.max_tokens, 8192);
    EXPECT_FALSE(d.given("temp"));
    EXPECT_DOUBLE_EQ(parse(program, {"m", "--temp=0.25"}).sampling.temperature, 0.25);
    EXPECT_DOUBLE_EQ(parse(program, {"m", "--temp", "0.25"}).sampling.temperature, 0.25);
    EXPECT_DOUBLE_EQ(parse(program, {"m"}, {{"COLI_TEMP", "0.7"}}).sampling.temperature, 0.7);
    EXPECT_DOUBLE_EQ(
        parse(program, {"m", "--temp=0.25"}, {{"COLI_TEMP", "0.7"}}).sampling.temperature, 0.25);
    EXPECT_DOUBLE_EQ(parse(program, {"m", "--top-p=0.5"}).sampling.top_p, 0.5);
    EXPECT_DOUBLE_EQ(parse(program, {"m", "--temp=0"}).sampling.temperature, 0.0);
  }
  for (const char* program : {"kimi_k3", "coli tokenize", "coli render"}) {
    EXPECT_DOUBLE_EQ(parse(program, {"m"}).sampling.temperature, 0.0) << program;
    EXPECT_EQ(parse(program, {"m"}).runtime.max_tokens, 0) << program;
  }
  // The defaults live in the member initialisers: kimi_k3's parse of nothing equals Options{}.
  const k3::Options o = parse("kimi_k3", {"m"}), fresh;
  EXPECT_EQ(o.load.bits, fresh.load.bits);
  EXPECT_EQ(o.load.cache.expert_gb, fresh.load.cache.expert_gb);
  EXPECT_EQ(o.serve.port, fresh.serve.port);
  EXPECT_EQ(o.ngen, fresh.ngen);
  EXPECT_HAS(error_of([] { parse("coli nonsense", {"m"}); }), "coli nonsense");
  // Only kimi_k3 takes a prompt; elsewhere a stray argument is an error, not ignored.
  EXPECT_HAS(error_of([] { parse("coli serve", {"m", "extra"}); }), "extra");
}

// The lines of `help` that list options ("  --flag ..."), by flag.
bool lists(const std::string& help, const std::string& flag) {
  for (const char* after : {" ", ",", "\n"}) {
    if (help.find("\n  " + flag + after) != std::string::npos) return true;
    // After a short name: "  -n, --ngen".
    for (size_t at = help.find(", " + flag + after); at != std::string::npos;
         at = help.find(", " + flag + after, at + 1))
      if (at >= 5 && help.compare(at - 5, 3, "\n  ") == 0 && help[at - 2] == '-') return true;
  }
  return false;
}

TEST(OptionsHelp, PerProgramGroupedWithDefaultsAndVariables) {
  const std::string kimi = parse("kimi_k3", {"--help"}).help_text;
  const std::string serve = parse("coli serve", {"--help"}).help_text;
  const std::string chat = parse("coli chat", {"-h"}).help_text;
  const std::string tokenize = parse("coli tokenize", {"--help"}).help_text;
  EXPECT_EQ(kimi.rfind("usage: kimi_k3 ", 0), 0u) << kimi;
  EXPECT_EQ(serve.rfind("usage: coli serve ", 0), 0u) << serve;
  EXPECT_EQ(chat.rfind("usage: coli chat ", 0), 0u) << chat;
  EXPECT_EQ(tokenize.rfind("usage: coli tokenize ", 0), 0u) << tokenize;
  // Groups, in order.
  size_t at = 0;
  for (const char* group : {"\nmodel:\n", "\nquantization:\n", "\nexperts & I/O:\n",
                            "\nsampling:\n", "\nserver:\n", "\nsecurity:\n", "\nvalidation:\n"}) {
    const size_t found = serve.find(group, at);
    EXPECT_NE(found, std::string::npos) << group;
    at = found == std::string::npos ? at : found;
  }
  EXPECT_HAS(kimi, "\nchat:\n");
  EXPECT_EQ(kimi.find("\nserver:\n"), std::string::npos);
  EXPECT_EQ(kimi.find("\nsecurity:\n"), std::string::npos);
  // Engine-only and debug flags are not listed by coli serve; server flags not by kimi_k3.
  for (const char* flag : {"--ids", "--trace", "--x0", "--logits", "--layers", "--stats", "--chat",
                           "--seed", "--ngen"})
    EXPECT_FALSE(lists(serve, flag)) << flag;
  for (const char* flag :
       {"--host", "--port", "--api-key", "--max-queue", "--reasoning", "--ckpt", "--max-tokens"}) {
    EXPECT_TRUE(lists(serve, flag)) << flag;
    EXPECT_FALSE(lists(kimi, flag)) << flag;
  }
  for (const char* flag : {"--ids", "--trace", "--x0", "--ngen", "--chat", "--seed"})
    EXPECT_TRUE(lists(kimi, flag)) << flag;
  EXPECT_TRUE(lists(tokenize, "--[no-]allow-special"));
  EXPECT_FALSE(lists(tokenize, "--temp"));
  // Each line says its default (the program's own) and its variable.
  EXPECT_HAS(serve, "[default 0.6, env COLI_TEMP]");
  EXPECT_HAS(serve, "[default 8000, env COLI_PORT]");
  EXPECT_HAS(kimi, "[default 0, env COLI_TEMP]");
  EXPECT_HAS(kimi, "[default 16, env K3_NGEN]");
  EXPECT_HAS(kimi, "--[no-]think");
  EXPECT_HAS(kimi, "[default on, env K3_THINK]");
  EXPECT_HAS(chat, "[default up to --max-tokens, env K3_NGEN]");
  for (const std::string* help : {&kimi, &serve, &chat, &tokenize}) EXPECT_HAS(*help, "--version");
}

TEST(OptionsHelp, Version) {
  for (const char* program : {"kimi_k3", "coli serve", "coli tokenize"}) {
    const k3::Options o = parse(program, {"--version"});
    EXPECT_TRUE(o.show_version);
    EXPECT_FALSE(o.show_help);
    EXPECT_EQ(o.help_text.rfind(std::string(program) + " ", 0), 0u) << o.help_text;
    EXPECT_HAS(o.help_text, "git ");
    EXPECT_HAS(o.help_text, " build");
    EXPECT_HAS(o.help_text, "this CPU runs ");
  }
}

// ---- issue 27, first contact --------------------------------------------------------------

const char* const kPrograms[] = {"kimi_k3",   "coli serve",    "coli web",
                                 "coli chat", "coli tokenize", "coli render"};

TEST(OptionsSuggest, NearestNameIsASlipOrAPrefix) {
  const std::vector<std::string> flags = {"--chat", "--ctx", "--temp", "--top-p", "--out", "-m"};
  EXPECT_EQ(k3::nearest_name("--chta", flags), "--chat");  // two neighbours swapped: one edit
  EXPECT_EQ(k3::nearest_name("--chatt", flags), "--chat");
  EXPECT_EQ(k3::nearest_name("--temperature", flags), "--temp");  // llama-cli's spelling
  EXPECT_EQ(k3::nearest_name("--ctx-size", flags), "--ctx");
  EXPECT_EQ(k3::nearest_name("--ot", flags), "--out");
  EXPECT_EQ(k3::nearest_name("-x", flags), "");  // one letter: nothing is near
  EXPECT_EQ(k3::nearest_name("--frobnicate", flags), "");
  EXPECT_EQ(k3::nearest_name("serv", {"serve", "web", "chat", "tokenize", "render"}), "serve");
  EXPECT_EQ(k3::nearest_name("k3-mni", {"k3-mini", "k3-release"}), "k3-mini");
  EXPECT_EQ(k3::unknown_argument_message("--chta=1", flags),
            "unknown option --chta (did you mean --chat?)");
  EXPECT_EQ(k3::unknown_argument_message("--zzz", flags), "unknown option --zzz");
  EXPECT_EQ(k3::unknown_argument_message("x", flags), "unexpected argument \"x\"");
}

// Every program names an unknown flag with the nearest one it takes; a missing value, a value
// for a boolean flag, a one-dash long name and a stray argument each get their own message.
TEST(OptionsReject, UnknownFlagsNameTheNearestKnownOne) {
  EXPECT_EQ(parse_error({"m", "--chta", "x"}), "unknown option --chta (did you mean --chat?)");
  EXPECT_EQ(parse_error({"m", "x", "--temperature=0.5"}),
            "unknown option --temperature (did you mean --temp?)");
  EXPECT_EQ(parse_error({"m", "x", "--ctx-size", "64"}),
            "unknown option --ctx-size (did you mean --ctx?)");
  EXPECT_EQ(parse_error({"m", "--bogus", "1"}), "unknown option --bogus");
  const std::pair<const char*, const char*> typos[] = {
      {"--prot", "--port"}, {"--modle", "--model"},
      {"--tmep", "--temp"}, {"--allow-specal", "--allow-special"},
      {"--ngne", "--ngen"}, {"--hlep", "--help"}};
  for (const char* program : kPrograms)
    for (const auto& [typo, near] : typos)
      EXPECT_EQ(error_of([&] {
                  parse(program, {"m", typo});
                }),
                std::string("unknown option ") + typo + " (did you mean " + near + "?)")
          << program;
  EXPECT_EQ(parse_error({"m", "-ngen", "3"}), "unknown option -ngen (did you mean --ngen?)");
  EXPECT_EQ(parse_error({"m", "--ngen"}), "--ngen needs a value (--ngen VALUE or --ngen=VALUE)");
  EXPECT_HAS(parse_error({"m", "--stats=maybe"}), "--stats");
  EXPECT_HAS(parse_error({"m", "--idot", "0"}), "--idot=0");
  EXPECT_HAS(parse_error({"m", "hello", "world"}), "unexpected argument \"world\"");
  EXPECT_HAS(parse_error({"m", "hello", "world"}), "quote a prompt");
  EXPECT_EQ(error_of([] {
              parse("coli serve", {"m", "extra"});
            }),
            "unexpected argument \"extra\" (coli serve takes one model directory)");
  // A value that starts like a flag's name is still a value.
  EXPECT_EQ(k3::parse_kimi_k3_options({"m", "--chat", "-ngen"}, {}).text.chat, "-ngen");
}

// llama-cli's short flags where they mean the same: -m -p -n -c -t -s (-h stays help).
TEST(OptionsShortFlags, LlamaCliSpellings) {
  const k3::Options o = k3::parse_kimi_k3_options(
      {"-m", "dir", "-p", "Once upon", "-n", "5", "-c", "64", "-t", "2", "-s", "7"}, {});
  EXPECT_EQ(o.model_dir, "dir");
  EXPECT_EQ(o.prompt, "Once upon");
  EXPECT_EQ(o.ngen, 5);
  EXPECT_EQ(o.runtime.max_tokens, 64);
  EXPECT_EQ(o.runtime.threads, 2);
  EXPECT_EQ(o.sampling.seed, 7u);
  EXPECT_TRUE(o.given("seed"));
  EXPECT_EQ(o.source("model"), k3::OptionSource::kFlag);
  // With -m the positional is the prompt; with -p it is the model directory.
  const k3::Options m = k3::parse_kimi_k3_options({"-m", "dir", "hello there", "-n", "2"}, {});
  EXPECT_EQ(m.model_dir, "dir");
  EXPECT_EQ(m.prompt, "hello there");
  const k3::Options p = k3::parse_kimi_k3_options({"dir", "-p", "hi", "--chat", "q"}, {});
  EXPECT_EQ(p.model_dir, "dir");
  EXPECT_EQ(p.prompt, "hi");
  EXPECT_EQ(p.text.chat, "q");
  EXPECT_HAS(parse_error({"dir", "hello", "-p", "hi"}), "the prompt is given twice");
  EXPECT_HAS(parse_error({"-m", "dir", "-p", "hi", "extra"}), "unexpected argument \"extra\"");
  EXPECT_HAS(parse_error({"-m", "dir", "a", "b"}), "the model directory is given twice");
  EXPECT_HAS(error_of([] {
               parse("coli serve", {"-m", "dir", "other"});
             }),
             "the model directory is given twice");
  EXPECT_EQ(parse("coli serve", {"-m", "dir", "-c", "128", "-t", "3"}).runtime.max_tokens, 128);
  EXPECT_HAS(parse_error({"-m", "dir", "-p", "x", "--ids", "1"}), "not both");
  // -h is still help, and every short name belongs to one row (CLI11 refuses a second one).
  for (const char* program : kPrograms) {
    EXPECT_TRUE(parse(program, {"-h"}).show_help) << program;
    EXPECT_NO_THROW(parse(program, {"m"})) << program;
  }
  const std::string kimi = parse("kimi_k3", {"--help"}).help_text;
  for (const char* shown :
       {"-m, --model <text>", "-p, --prompt <text>", "-n, --ngen <0..>", "-c, --ctx, --maxt <0..>",
        "-t, --threads <0..1024>", "-s, --seed <0..>", "kimi_k3 -m <model_dir> -p \"prompt\""})
    EXPECT_HAS(kimi, shown);
}

// --ctx's variable is COLI_CTX; K3_MAXT, its old name, is still read.
TEST(OptionsEnvironment, ColiCtxAndItsOldNameK3Maxt) {
  EXPECT_EQ(parse("kimi_k3", {"m"}, {{"COLI_CTX", "64"}}).runtime.max_tokens, 64);
  EXPECT_EQ(parse("kimi_k3", {"m"}, {{"K3_MAXT", "32"}}).runtime.max_tokens, 32);
  EXPECT_EQ(parse("coli serve", {"m"}, {{"K3_MAXT", "32"}}).runtime.max_tokens, 32);
  EXPECT_EQ(parse("kimi_k3", {"m"}, {{"COLI_CTX", "64"}, {"K3_MAXT", "64"}}).runtime.max_tokens,
            64);
  EXPECT_EQ(parse("kimi_k3", {"m", "-c", "8"}, {{"COLI_CTX", "64"}}).runtime.max_tokens, 8);
  EXPECT_EQ(parse("kimi_k3", {"m"}, {{"COLI_CTX", "64"}}).source("ctx"),
            k3::OptionSource::kEnvironment);
  EXPECT_HAS(parse_error({"m"}, {{"COLI_CTX", "64"}, {"K3_MAXT", "32"}}),
             "COLI_CTX=64 and K3_MAXT=32 disagree");
  EXPECT_HAS(parse_error({"m"}, {{"K3_MAXT", "x"}}), "K3_MAXT");
  EXPECT_HAS(parse_error({"m"}, {{"COLI_CTX", "x"}}), "COLI_CTX");
  EXPECT_NO_THROW(k3::check_environment({{"COLI_CTX", "1"}, {"K3_MAXT", "1"}}));
  EXPECT_EQ(parse_error({"m"}, {{"COLI_CXT", "1"}}),
            "unknown environment variable COLI_CXT (did you mean COLI_CTX?)");
  EXPECT_HAS(parse("kimi_k3", {"--help"}).help_text, "env COLI_CTX or K3_MAXT]");
  EXPECT_HAS(k3::options_table_markdown(), "| `-c, --ctx, --maxt` | `COLI_CTX` | 0 (coli: 8192) |");
}

// A first argument that is not a model directory is said to be what it is.
class OptionsModelDir : public ::testing::Test {
 protected:
  void SetUp() override {
    namespace fs = std::filesystem;
    root_ = fs::path(::testing::TempDir()) / ("k3-model-dir-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "k3-mini");
    write(root_ / "k3-mini" / "config.json", "{}");
    write(root_ / "k3-mini" / "model-00001-of-000002.safetensors", "x");
    fs::create_directories(root_ / "empty");
    fs::create_directories(root_ / "config-only");
    write(root_ / "config-only" / "config.json", "{}");
    fs::create_directories(root_ / "hf-cache" / "snapshots" / "abc123");
    write(root_ / "hf-cache" / "snapshots" / "abc123" / "config.json", "{}");
    fs::create_directories(root_ / "shards-elsewhere");
    write(root_ / "shards-elsewhere" / "model-00002-of-000002.safetensors", "x");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  static void write(const std::filesystem::path& p, const std::string& text) {
    std::ofstream(p) << text;
  }
  std::string path(const std::string& name) const { return (root_ / name).string(); }
  // The error check_model_dir throws, or "" when it accepts the directory.
  std::string error(const std::string& program, const Args& args,
                    k3::ModelNeeds needs = k3::ModelNeeds::kWeights) const {
    try {
      k3::check_model_dir(program, parse(program, args), needs);
    } catch (const k3::Error& e) {
      return e.what();
    }
    return "";
  }
  std::filesystem::path root_;
};

TEST_F(OptionsModelDir, SaysWhatTheFirstArgumentIs) {
  EXPECT_EQ(error("kimi_k3", {path("k3-mni"), "hi"}),
            path("k3-mni") + ": no such directory (did you mean " + path("k3-mini") + "?)");
  EXPECT_EQ(error("coli serve", {path("k3-mni")}),
            path("k3-mni") + ": no such directory (did you mean " + path("k3-mini") + "?)");
  EXPECT_EQ(error("kimi_k3", {path("nothing-like-it")}),
            path("nothing-like-it") + ": no such directory");
  EXPECT_EQ(error("kimi_k3", {path("k3-mini/config.json"), "hi"}),
            path("k3-mini/config.json") + " is a file of the model directory " + path("k3-mini") +
                ": pass the directory itself (kimi_k3 " + path("k3-mini") + " ...)");
  EXPECT_HAS(error("coli chat", {path("k3-mini/model-00001-of-000002.safetensors")}),
             "is a file of the model directory " + path("k3-mini") +
                 ": pass the directory itself (coli chat " + path("k3-mini") + " ...)");
  EXPECT_HAS(error("kimi_k3", {path("shards-elsewhere/model-00002-of-000002.safetensors")}),
             "is a file, not a model directory");
  // Text that reads as a prompt: the model directory comes first.
  const std::string prompt = error("kimi_k3", {"Hello there"});
  EXPECT_HAS(prompt, "\"Hello there\" is not a model directory; it looks like a prompt");
  EXPECT_HAS(prompt, "kimi_k3 <model_dir> \"Hello there\"");
  EXPECT_HAS(prompt, "-m <model_dir> -p \"Hello there\"");
  EXPECT_HAS(error("kimi_k3", {"hello"}),
             "if \"hello\" is the prompt, the model directory comes first");
  EXPECT_EQ(error("coli serve", {"Hello there"}), "Hello there: no such directory");
  // Directories: what is missing.
  EXPECT_HAS(error("kimi_k3", {path("empty")}),
             path("empty") + " has no config.json: not a model directory");
  EXPECT_HAS(error("kimi_k3", {path("hf-cache")}),
             "did you mean " + path("hf-cache/snapshots/abc123") + "?");
  EXPECT_HAS(error("kimi_k3", {path("config-only")}),
             path("config-only") +
                 " has config.json but no weights: no model.safetensors.index.json and no "
                 "*.safetensors file");
  EXPECT_HAS(error("kimi_k3", {path("config-only"), "--dirs", path("empty")}), "(nor in --dirs)");
  EXPECT_EQ(error("kimi_k3", {path("config-only"), "--dirs", path("shards-elsewhere")}), "");
  EXPECT_EQ(error("kimi_k3", {path("k3-mini")}), "");
  EXPECT_EQ(error("kimi_k3", {k3::testing::kTinyDir}), "");
  // coli tokenize / render read only the tokenizer files.
  EXPECT_EQ(error("coli tokenize", {path("empty")}, k3::ModelNeeds::kTokenizer), "");
  EXPECT_HAS(error("coli render", {path("k3-mni")}, k3::ModelNeeds::kTokenizer),
             "did you mean " + path("k3-mini") + "?");
  // The built-in model is coli's own: not judged again.
  EXPECT_EQ(error("coli chat", {}), "");
}

// Each program's help speaks of that program only; coli serve's lists every endpoint the server
// routes (src/server/routes.cpp).
TEST(OptionsHelp, EachProgramSpeaksOfItselfAndServeListsEveryEndpoint) {
  const std::string kimi = parse("kimi_k3", {"--help"}).help_text;
  EXPECT_EQ(kimi.find("coli"), std::string::npos) << kimi;
  for (const char* program :
       {"coli serve", "coli web", "coli chat", "coli tokenize", "coli render"}) {
    std::string help = parse(program, {"--help"}).help_text;
    // The state directory's path ($XDG_CACHE_HOME/kimi_k3) is a path, not the program.
    for (size_t at; (at = help.find("/kimi_k3")) != std::string::npos;) help.erase(at, 8);
    EXPECT_EQ(help.find("kimi_k3"), std::string::npos) << program << ":\n" << help;
  }
  const std::string serve = parse("coli serve", {"--help"}).help_text;
  const std::string routes =
      k3::read_text_file(std::string(K3_SOURCE_DIR) + "/src/server/routes.cpp");
  int endpoints = 0;
  for (size_t at = 0; (at = routes.find("route(\"", at)) != std::string::npos; ++at) {
    const size_t path_begin = routes.find("\"/", at);
    const std::string path =
        routes.substr(path_begin + 1, routes.find('"', path_begin + 1) - path_begin - 1);
    const std::string method = routes.substr(at + 7, routes.find('"', at + 7) - at - 7);
    if (method != "GET" && method != "POST") continue;
    if (path.find_first_of("*{") != std::string::npos || path == "/v1/health" || path == "/slots/0")
      continue;  // wildcards, ids, the /health alias and /slots' per-slot form
    ++endpoints;
    bool listed = false;  // the path as a word: not the start of a longer one
    for (size_t p = serve.find(path); p != std::string::npos && !listed;
         p = serve.find(path, p + 1)) {
      const char next = p + path.size() < serve.size() ? serve[p + path.size()] : '\n';
      listed = next == ',' || next == ';' || next == '.' || next == ' ' || next == '\n';
    }
    EXPECT_TRUE(listed) << path << " missing from:\n" << serve;
  }
  EXPECT_GE(endpoints, 13);
}

// docs/options.md's option table is the generated one (regenerate: build/apps/k3_options_md
// --write docs/options.md).
TEST(OptionsReadme, TableIsCurrent) {
  const std::string readme = k3::read_text_file(std::string(K3_SOURCE_DIR) + "/docs/options.md");
  const std::string open = "<!-- options-table -->\n", close = "<!-- /options-table -->";
  const size_t begin = readme.find(open), end = readme.find(close);
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(readme.substr(begin + open.size(), end - begin - open.size()),
            k3::options_table_markdown())
      << "docs/options.md's option table is stale: run build/apps/k3_options_md --write "
         "docs/options.md";
}

}  // namespace

namespace {

// Every binary answers --version (program, version, git hash, build type, ISA) and exits 0; every
// program's --help starts with a usage line naming it.
TEST(OptionsBinaries, VersionAndHelpOnEveryBinary) {
  const std::string bin = K3_BINARY_DIR;
  const std::vector<std::pair<std::string, std::string>> binaries = {
      {bin + "/apps/kimi_k3", "kimi_k3"},
      {bin + "/apps/coli", "coli"},
      {bin + "/apps/coli serve", "coli serve"},
      {bin + "/apps/coli chat", "coli chat"},
      {bin + "/apps/k3_options_md", "k3_options_md"},
      {bin + "/tools/k3_synth", "k3_synth"},
      {bin + "/bench/k3_bench", "k3_bench"},
      {bin + "/bench/k3_tokenizer_bench", "k3_tokenizer_bench"}};
  for (const auto& [command, name] : binaries) {
    // The benchmarks exist exactly when the build has them (the sanitizer build does not).
    if (!K3_BUILD_BENCH && command.find("/bench/") != std::string::npos) continue;
    const k3::testing::CommandResult r = k3::testing::run_split("env -i " + command + " --version");
    EXPECT_EQ(r.status, 0) << command << ": " << r.err;
    EXPECT_EQ(r.out.rfind(name + " ", 0), 0u) << r.out;
    EXPECT_HAS(r.out, "(git ");
    EXPECT_HAS(r.out, "this CPU runs ");
  }
  for (const char* program :
       {"kimi_k3", "coli serve", "coli web", "coli chat", "coli tokenize", "coli render"}) {
    std::string command = bin + "/apps/" + program;
    const k3::testing::CommandResult r = k3::testing::run_split("env -i " + command + " --help");
    EXPECT_EQ(r.status, 0) << program << ": " << r.err;
    EXPECT_EQ(r.out.rfind(std::string("usage: ") + program + " ", 0), 0u) << r.out;
  }
  // A mistyped COLI_* variable stops a program before it does anything.
  const k3::testing::CommandResult typo =
      k3::testing::run_split("env -i COLI_TMEP=1 " + bin + "/apps/coli serve m");
  EXPECT_EQ(typo.status, 2);
  EXPECT_HAS(typo.err, "unknown environment variable COLI_TMEP (did you mean COLI_TEMP?)");
}

}  // namespace

namespace {

// The Vulkan tier's switches (docs/vulkan.md §3): COLI_VULKAN and the seed's old names K3_VK,
// K3_VK_GB and K3_VK_UP; off unless asked.
TEST(OptionsEnvironment, VulkanSwitchesAndTheirOldNames) {
  EXPECT_FALSE(parse("kimi_k3", {"m"}).load.vulkan.enabled);
  EXPECT_TRUE(parse("kimi_k3", {"m"}, {{"COLI_VULKAN", "1"}}).load.vulkan.enabled);
  EXPECT_TRUE(parse("coli serve", {"m"}, {{"K3_VK", "1"}}).load.vulkan.enabled);
  EXPECT_FALSE(parse("kimi_k3", {"m"}, {{"K3_VK", "0"}}).load.vulkan.enabled);
  EXPECT_TRUE(parse("kimi_k3", {"m", "--vulkan"}).load.vulkan.enabled);
  EXPECT_EQ(parse("kimi_k3", {"m"}, {{"K3_VK_GB", "2.5"}}).load.vulkan.tier_gb, 2.5);
  EXPECT_EQ(parse("kimi_k3", {"m"}, {{"COLI_VK_TIER_GB", "3"}}).load.vulkan.tier_gb, 3.0);
  EXPECT_EQ(parse("kimi_k3", {"m"}, {{"K3_VK_UP", "4"}}).load.vulkan.rate, 4);
  EXPECT_EQ(parse("kimi_k3", {"m"}).load.vulkan.rate, 16);
  EXPECT_EQ(parse("kimi_k3", {"m"}).load.vulkan.gemm_rows, 16);
  EXPECT_EQ(parse("kimi_k3", {"m"}, {{"COLI_VK_TIER_GEMM_ROWS", "8"}}).load.vulkan.gemm_rows, 8);
  EXPECT_EQ(parse("kimi_k3", {"m"}, {{"COLI_VK_DEVICE_CAP_MB", "64"}}).load.vulkan.device_cap_mb,
            64);
  EXPECT_HAS(parse_error({"m"}, {{"COLI_VULKAN", "1"}, {"K3_VK", "0"}}), "disagree");
  EXPECT_HAS(parse_error({"m"}, {{"COLI_VK_TIER_GEMM_ROWS", "0"}}), "COLI_VK_TIER_GEMM_ROWS");
}

}  // namespace

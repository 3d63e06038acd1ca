// options_test — run-time options (options/options.h): defaults, flag > environment > default,
// refusals naming the flag or variable, --ids, --help without a model directory.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "options/options.h"
#include "util/error.h"
#include "test_util.h"

namespace {

using k3::testing::error_of;

#define EXPECT_HAS(msg, sub)                                                            \
  EXPECT_NE(std::string(msg).find(sub), std::string::npos)                              \
      << "message: " << (msg) << "\nexpected it to contain: " << (sub)

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
  EXPECT_FALSE(o.ids_given);
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
  EXPECT_FALSE(o.sampling.seed_set);
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
  EXPECT_DOUBLE_EQ(k3::parse_kimi_k3_options({"m", "--temp", "0.5"}, env).sampling.temperature, 0.5);
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
  EXPECT_EQ(k3::parse_kimi_k3_options({"--model", "/flag/dir"}, {{"COLI_MODEL", "/env/dir"}}).model_dir,
            "/flag/dir");
  EXPECT_EQ(k3::parse_kimi_k3_options({"/pos/dir"}, {{"COLI_MODEL", "/env/dir"}}).model_dir, "/pos/dir");
}

TEST(OptionsPrecedence, EveryOptionReachable) {
  const Env env = {{"COLI_TOP_P", "0.9"}, {"COLI_TOP_K", "40"}, {"COLI_SEED", "42"},
                   {"K3_MAXT", "4096"},  {"K3_LAYERS", "2"},  {"K3_TRACE", "t.safetensors"},
                   {"K3_LOGITS", "l.bin"}, {"K3_X0", "x0.bin"}};
  const k3::Options o = k3::parse_kimi_k3_options({"m", "--threads", "3"}, env);
  EXPECT_DOUBLE_EQ(o.sampling.top_p, 0.9);
  EXPECT_EQ(o.sampling.top_k, 40);
  EXPECT_EQ(o.sampling.seed, 42u);
  EXPECT_TRUE(o.sampling.seed_set);
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
  EXPECT_TRUE(f.sampling.seed_set);
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
  EXPECT_NO_THROW(k3::parse_kimi_k3_options({"m"}, {{"HOME", "/root"}, {"PATH", "/bin"}, {"OMP_NUM_THREADS", "2"}}));
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
  EXPECT_HAS(parse_error({"m", "--idot", "yes please"}), "--idot");
  EXPECT_HAS(parse_error({"m"}, {{"K3_ISA", "neon"}}), "K3_ISA");

  for (const char* b : {"4", "8", "32"}) {
    const k3::Options o = k3::parse_kimi_k3_options({"m"}, {{"K3_BITS", b}, {"K3_MLA_BITS", b}, {"K3_HEAD_BITS", b}});
    EXPECT_EQ(o.load.bits, std::stoi(b));
    EXPECT_EQ(o.load.mla_bits, std::stoi(b));
    EXPECT_EQ(o.load.head_bits, std::stoi(b));
  }
  const k3::Options exact = k3::parse_kimi_k3_options({"m", "--idot", "0", "--isa", "scalar", "--stats"}, {});
  EXPECT_FALSE(exact.load.idot);
  EXPECT_EQ(exact.load.isa, "scalar");
  EXPECT_TRUE(exact.debug.stats);
}

TEST(OptionsIds, ParsedFromFlag) {
  const k3::Options o = k3::parse_kimi_k3_options({"m", "--ids", "1,2, 3"}, {});
  EXPECT_TRUE(o.ids_given);
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
  EXPECT_HAS(table, "| `K3_NGEN` | `--ngen` | 16 |");
  EXPECT_HAS(table, "`K3_IDOT`");
}

}  // namespace

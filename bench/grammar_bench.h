// bench/grammar_bench.h — `k3_bench grammar`: the structured-output mask's per-token cost
// (docs/structured_output.md §6), beside a decode step of the same model.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

struct GrammarBenchArgs {
  std::string model_dir = "assets/k3-mini";  // its tokenizer, and its decode step for scale
  int64_t tokens = 300;                      // masks per schema at most
  uint64_t seed = 1;
};

CLI::App* add_grammar_bench(CLI::App& app, GrammarBenchArgs& args);
int run_grammar_bench(const GrammarBenchArgs& args);

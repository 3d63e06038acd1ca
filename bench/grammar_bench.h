// bench/grammar_bench.h — `k3_bench grammar`: the structured-output mask's per-token cost
// (docs/structured_output.md §6), beside a decode step of the same model.
#pragma once

#include "bench_common.h"

namespace k3bench {

Subcommand register_grammar(CLI::App& app);

}  // namespace k3bench

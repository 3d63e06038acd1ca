// bench/k3_bench.cpp — benchmarks (not tests; timings are never assertions): main() and the
// table of subcommands. Each lives in bench/<name>_bench.cpp; what they share (RESULT lines, the
// machine line, probes, --isa/--threads) in bench/bench_common.h.
//
//   k3_bench kernels [--isa auto|scalar|avx2|avx512] [--threads N] [--seconds S]
//       Machine facts, a DRAM read-bandwidth probe, then GB/s of weight bytes (and the ratio to
//       the probe) for the MXFP4 expert (idot and exact; 1/4/16/64 rows), int8 and int4-g64 on
//       12288x7168 / 7168x12288 (1 and 64 rows; both also on int8 activations, int8_idot and
//       int4_idot), and ggml's MXFP4 dot product as a peer when the npm package
//       @node-llama-cpp/linux-x64 is installed under bench/node_modules.
//   k3_bench decode [MODEL_DIR] [--layers N] [--experts E] [--tokens T] [--prefill P]
//                   [--dram-gib G] [--dir DIR]
//       Decode tokens/s with every expert in memory, with the per-stage breakdown, against the
//       DRAM floor (bytes read from RAM per token), and prefill tokens/s token at a time
//       (K3_CHUNK=1) vs chunked (32) with the expert dedup factor and the chunked FLOP/s against
//       the FMA and int8 dot-product peaks. Without MODEL_DIR a `k3_synth --preset slice`
//       checkpoint is written once into DIR and reused.
//   k3_bench stream [MODEL_DIR] [--layers N] [--experts E] [--tokens T] [--dir DIR]
//                   [--chunks C1,C2,...] [--chunk-prompt P]
//       Decode with routed experts streamed from disk, against the drive's O_DIRECT rate and the
//       drive floor, with and without the pipe and the read-ahead (K3_PREFETCH) and its recall;
//       with --chunks, one prompt's disk bytes and time per token at each chunk size.
//   k3_bench serve [MODEL_DIR] [--tokens T] [--prompt P] [--concurrency 1,2,4,8]
//       The engine service with N sessions (coli serve --parallel): aggregate generated tok/s at
//       each number of concurrent streams (ratio to the first), routed-expert MB read per token
//       and the mean decode batch, then the time to first token of a new request while three
//       others decode against alone. Without MODEL_DIR the demo checkpoint (k3_synth --preset
//       demo, with the tokenizer) is written once beside the build.
//   k3_bench routing --model DIR --ids FILE [--window W] [--contrast DIR]
//       What the routers do on real text: held-out token ids (u32 little-endian, windows of W)
//       through the model, per MoE layer: expert reuse between neighbouring tokens, the prefill
//       dedup factor at C = 32, and the recall of the read-ahead (token at a time and C = 32);
//       then the same on the random-weights demo checkpoint (written once into --contrast), each
//       figure beside what random routing gives.
//   k3_bench quality [--model DIR] [--fixtures DIR] [--write-bounds FILE] [--kda-chunked]
//                    [--isa I] [--threads N]
//       The real-text quality table of a trained checkpoint (default assets/k3-mini with
//       tests/data/k3-mini): held-out perplexity, KL and top-1 agreement against the exact
//       setting, greedy agreement over 64 tokens, KL and top-1 agreement against the training
//       model's float64 forward (oracle.safetensors), the routed picks kept, for every precision
//       setting (tools/quality_lib.h, docs/testing.md §5), as Markdown; --write-bounds writes the
//       gate's bounds file from it (refused when a row is outside its setting's ceiling).
//   k3_bench container [--layers N] [--experts E] [--bits 4|8] [--tokens T] [--dir DIR]
//       The repacked container against its snapshot on a slice: drive rates, repack GB/s, cold
//       and warm load of each layout, bytes per streamed expert read (docs/container.md §7).
//   k3_bench grammar [--model DIR] [--tokens T] [--seed S] [--isa I] [--threads N]
//       The structured-output mask's per-token cost beside a decode step (bench/grammar_bench.h).
//   k3_bench ep [--delay D] [--rate R]
//       --expert-parallel over 1, 2 and 3 ranks in network namespaces (root; bench/ep_netns.sh).
//   k3_bench load [MODEL_DIR] [--peer 'COMMAND'] [--peer-dir DIR] [--cold] [--runs N]
//                 [--probe-gb G] [--kimi PATH]
//       kimi_k3's load of MODEL_DIR in a child (wait4: its own user/sys seconds, page faults, peak
//       RSS): load s, GB/s of the resident weights, the drive's O_DIRECT rate over the files, and
//       `RESULT load <s> s ratio=R` with R = max(bytes / drive, quantization work / cores) / load
//       s;
//       --peer runs another command the same way (bench/load_bench.cpp).
//   k3_bench vulkan [MODEL_DIR] [--preset tiny|demo|slice] [--layers N] [--experts E]
//                   [--tokens T] [--prefill P] [--dir DIR]
//       The Vulkan expert tier (docs/vulkan.md) on the device COLI_VULKAN would open: upload GB/s
//       and expert-batch ms on the model's expert shape, then prefill tok/s (C = 32) and decode
//       s/token with K3_IDOT=0, without the tier, with it (every expert resident after a warm-up
//       run: the device share), with prompt streaming (COLI_VK_PREFILL=on) and with the prompt's
//       dense matrices on the device (COLI_VK_DENSE=on). Without MODEL_DIR a
//       `k3_synth --preset` checkpoint (default demo: seconds on lavapipe) is written once into
//       DIR. On a CPU device (Mesa's lavapipe) the figures say nothing about a GPU's speed.
//   k3_bench kda [--config FILE] [--rows 32,128,512,2048] [--layer-rows N] [--seconds S]
//       The KDA recurrence of the model's geometry token by token against the chunk (WY/UT) form
//       (K3_KDA_CHUNKED) with sub-chunks of 16/32/64 rows: ms per token per layer and the ratio,
//       then one whole KDA layer with the option off and on and its projections alone (the
//       recurrence's share of the layer's prefill time) (bench/kda_bench.cpp).
//
// Every figure is also printed as one machine-readable line:
//   RESULT <name> <value> <unit> ratio=<r>
// ratio is GB/s / DRAM probe for bandwidth figures, the figure itself for "x" figures, the figure
// against its floor where one is named, and nan where there is no reference (tok/s, s/token).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <vector>

#include "bench_common.h"
#include "grammar_bench.h"
#include "options/options.h"
#include "options/tool_cli.h"

namespace k3bench {
Subcommand register_kernels(CLI::App& app);
Subcommand register_decode(CLI::App& app);
Subcommand register_stream(CLI::App& app);
Subcommand register_quality(CLI::App& app);
Subcommand register_routing(CLI::App& app);
Subcommand register_container(CLI::App& app);
Subcommand register_serve(CLI::App& app);
Subcommand register_vulkan(CLI::App& app);
Subcommand register_ep(CLI::App& app);
Subcommand register_load(CLI::App& app);
Subcommand register_kda(CLI::App& app);
}  // namespace k3bench

int main(int argc, char** argv) {
  CLI::App app{
      "Benchmarks (not tests): kernel bandwidth, decode speed in memory and streamed from disk, "
      "the repacked container, expert routing, and the real-text quality of every precision "
      "setting. Figures go to stdout with a Markdown summary.",
      "k3_bench"};
  app.set_version_flag("--version", k3::version_text("k3_bench"));
  app.require_subcommand(1);

  // The order of `k3_bench --help` and of the "commands:" line of a mistyped command.
  const k3bench::RegisterFn table[] = {
      k3bench::register_kernels, k3bench::register_decode,  k3bench::register_stream,
      k3bench::register_quality, k3bench::register_routing, k3bench::register_container,
      k3bench::register_grammar, k3bench::register_serve,   k3bench::register_vulkan,
      k3bench::register_ep,      k3bench::register_load,    k3bench::register_kda};
  std::vector<k3bench::Subcommand> commands;
  for (const k3bench::RegisterFn add : table) commands.push_back(add(app));

  const k3::ToolArgs parsed = k3::parse_tool_args(app, {argv + 1, argv + argc});
  if (parsed.status >= 0) return parsed.finish();
  try {
    for (const k3bench::Subcommand& c : commands)
      if (c.app->parsed()) return c.run();
    return 2;  // unreachable: require_subcommand(1)
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3_bench: %s\n", e.what());
    return 1;
  }
}

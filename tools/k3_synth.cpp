// k3_synth — writes a synthetic Kimi K3 checkpoint in the released snapshot's exact layout.
//   k3_synth --preset tiny|demo|slice --out DIR [--layers N] [--experts E] [--seed S]
//            [--assets DIR] [--dry-run]
// It says how many bytes it will write before writing them, and refuses when the destination's
// filesystem has less free (synth_lib.h plan_write / check_free_space).
#include <sys/statvfs.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "apps/stop_signals.h"
#include "options/options.h"
#include "options/tool_cli.h"
#include "synth_lib.h"
#include "util/error.h"
#include "util/sys.h"

namespace {

// Free bytes (for an unprivileged writer) of the filesystem `dir` will be on: its own, or its
// nearest existing parent's when it does not exist yet.
uint64_t free_bytes(const std::string& dir) {
  std::filesystem::path p = std::filesystem::absolute(dir);
  std::error_code ec;
  while (!std::filesystem::exists(p, ec) && p.has_parent_path() && p != p.parent_path())
    p = p.parent_path();
  struct statvfs st {};
  if (::statvfs(p.c_str(), &st) != 0) throw k3::Error(p.string() + ": cannot read its free space");
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Writes a synthetic Kimi K3 checkpoint: the released snapshot's layout (wrapper "
      "config.json, one shard per decoder layer plus globals and vision, MXFP4 routed experts, the "
      "index) with random weights, the same bytes for the same seed. It prints the bytes it will "
      "write first and refuses a destination whose filesystem has less free.",
      "k3_synth"};
  app.set_version_flag("--version", k3::version_text("k3_synth"));
  std::string preset;
  std::string out;
  int64_t layers = -1;
  int64_t experts = -1;
  uint64_t seed = 1;
  std::string assets;
  bool dry_run = false;
  uint64_t assume_free = 0;
  app.add_option(
         "--preset", preset,
         "tiny: the k3-tiny fixture's dims; demo: small model with the real vocabulary and "
         "tokenizer; slice: the released per-layer dims (GBs per layer: --dry-run prints the size)")
      ->required()
      ->check(CLI::IsMember({"tiny", "demo", "slice"}))
      ->group("checkpoint");
  app.add_option("--layers", layers, "number of decoder layers")
      ->default_str("the preset's")
      ->group("checkpoint");
  app.add_option("--experts", experts, "routed experts per MoE layer")
      ->default_str("the preset's")
      ->group("checkpoint");
  app.add_option("--seed", seed, "random seed (same seed, same bytes)")
      ->capture_default_str()
      ->group("checkpoint");
  app.add_option("--assets", assets,
                 "directory holding tiktoken.model and tokenizer_config.json (demo preset)")
      ->type_name("DIR")
      ->default_str("the source tree's assets/k3-release")
      ->group("checkpoint");
  app.add_option("--out", out, "output directory (created when missing)")
      ->required()
      ->type_name("DIR")
      ->group("output");
  app.add_flag("--dry-run", dry_run,
               "print the bytes it would write and the free space; write nothing")
      ->group("output");
  app.add_option("--assume-free-bytes", assume_free,
                 "testing: take this as the free space of --out's filesystem")
      ->group("");
  const k3::ToolArgs parsed = k3::parse_tool_args(app, {argv + 1, argv + argc});
  if (parsed.status >= 0) return parsed.finish();

  // SIGINT / SIGTERM: exit 130 / 143 at once (apps/stop_signals.h); a rerun writes the model again.
  k3::apps::install_stop_handlers(k3::apps::StopMode::at_once);
  try {
    k3::synth::SynthSpec spec = k3::synth::preset_spec(preset);
    if (app.count("--layers") && layers < 1)
      throw k3::Error("--layers must be >= 1 (got " + std::to_string(layers) + ")");
    if (app.count("--experts") && experts < 1)
      throw k3::Error("--experts must be >= 1 (got " + std::to_string(experts) + ")");
    k3::synth::apply_overrides(&spec, layers, experts);
    spec.seed = seed;
    if (!assets.empty()) {
      if (preset != "demo") throw k3::Error("--assets only applies to the demo preset");
      spec.tokenizer_dir = assets;
    }
    k3::synth::validate(spec);
    const k3::synth::WritePlan plan = k3::synth::plan_write(spec, out);
    const uint64_t available = app.count("--assume-free-bytes") ? assume_free : free_bytes(out);
    std::printf(
        "k3_synth: %s %s to %s (%s preset: %lld layers, %lld experts, top-%lld, D=%lld, V=%lld; "
        "%lld files; %s free there)\n",
        dry_run ? "would write" : "writing", k3::synth::gb_text(plan.bytes).c_str(), out.c_str(),
        preset.c_str(), static_cast<long long>(spec.num_hidden_layers),
        static_cast<long long>(spec.num_experts),
        static_cast<long long>(spec.num_experts_per_token),
        static_cast<long long>(spec.hidden_size), static_cast<long long>(spec.vocab_size),
        static_cast<long long>(plan.files), k3::synth::gb_text(available).c_str());
    std::fflush(stdout);
    k3::synth::check_free_space(plan, available, out);
    if (dry_run) return 0;
    const double t0 = k3::now_seconds();
    k3::synth::write_checkpoint(spec, out);
    std::printf("k3_synth: wrote %lld shards, %.3f GB of tensors in %.1f s\n",
                static_cast<long long>(spec.num_hidden_layers + 2),
                static_cast<double>(k3::synth::total_tensor_bytes(spec)) / 1e9,
                k3::now_seconds() - t0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3_synth: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

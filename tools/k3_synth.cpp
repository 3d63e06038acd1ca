// k3_synth — writes a synthetic Kimi K3 checkpoint in the released snapshot's exact layout.
//   k3_synth --preset tiny|demo|slice --out DIR [--layers N] [--experts E] [--seed S]
//            [--assets DIR]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "options/options.h"
#include "synth_lib.h"
#include "util/error.h"
#include "util/sys.h"

int main(int argc, char** argv) {
  CLI::App app{"Write a synthetic Kimi K3 checkpoint (real layout, random weights)", "k3_synth"};
  app.set_version_flag("--version", k3::version_text("k3_synth"));
  std::string preset;
  std::string out;
  int64_t layers = -1;
  int64_t experts = -1;
  uint64_t seed = 1;
  std::string assets;
  app.add_option("--preset", preset,
                 "tiny: the k3-tiny fixture's dims; demo: small model with the real vocabulary and "
                 "tokenizer; slice: the released per-layer dims")
      ->required()
      ->check(CLI::IsMember({"tiny", "demo", "slice"}));
  app.add_option("--out", out, "output directory (created when missing)")->required();
  app.add_option("--layers", layers, "number of decoder layers (default: the preset's)");
  app.add_option("--experts", experts, "routed experts per MoE layer (default: the preset's)");
  app.add_option("--seed", seed, "random seed (same seed, same bytes)")->capture_default_str();
  app.add_option(
      "--assets", assets,
      "directory holding tiktoken.model and tokenizer_config.json (demo preset; default: "
      "the source tree's assets/k3-release)");
  CLI11_PARSE(app, argc, argv);

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
    const double t0 = k3::now_seconds();
    k3::synth::write_checkpoint(spec, out);
    const double bytes = static_cast<double>(k3::synth::total_tensor_bytes(spec));
    std::printf(
        "k3_synth: wrote %s preset (%lld layers, %lld experts, top-%lld, D=%lld, V=%lld) to %s: "
        "%lld shards, %.3f GB of tensors in %.1f s\n",
        preset.c_str(), static_cast<long long>(spec.num_hidden_layers),
        static_cast<long long>(spec.num_experts),
        static_cast<long long>(spec.num_experts_per_token),
        static_cast<long long>(spec.hidden_size), static_cast<long long>(spec.vocab_size),
        out.c_str(), static_cast<long long>(spec.num_hidden_layers + 2), bytes / 1e9,
        k3::now_seconds() - t0);
  } catch (const k3::Error& e) {
    std::fprintf(stderr, "k3_synth: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3_synth: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

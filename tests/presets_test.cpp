// Every small k3_synth preset writes a checkpoint that loads and runs: greedy decode through the
// cache equals the one-shot prefill of the same ids. The slice preset (the released per-layer
// dimensions, D 7168, V 163840: the check that nothing is sized for small models only) writes
// about 9 GB, so `make bench` runs it (`k3_bench decode` checks the same equality on it).
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "synth_lib.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

void load_and_run(const std::string& preset, int64_t layers, int64_t experts) {
  k3::synth::SynthSpec spec = k3::synth::preset_spec(preset);
  k3::synth::apply_overrides(&spec, layers, experts);
  spec.progress = false;
  const fs::path dir =
      fs::temp_directory_path() / ("k3_preset_" + preset + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  k3::synth::write_checkpoint(spec, dir.string());

  k3::Engine engine(dir.string(), k3::LoadOptions::exact());
  EXPECT_EQ(engine.info().hidden_size, spec.hidden_size);
  EXPECT_EQ(engine.info().vocab_size, spec.vocab_size);
  EXPECT_EQ(engine.info().tensor_prefix, "language_model.");
  const std::vector<int64_t> prompt = {spec.bos_token_id, 1, 2, 3, 4};
  const size_t V = static_cast<size_t>(spec.vocab_size);

  k3::Session incremental(engine, 8);
  std::vector<float> logits = incremental.prefill(prompt);
  ASSERT_EQ(logits.size(), V);
  std::vector<int64_t> all = prompt;
  std::vector<std::vector<float>> steps = {logits};
  for (int i = 0; i < 2; ++i) {
    const int64_t id = k3::argmax(logits);
    all.push_back(id);
    logits = incremental.step(id);
    steps.push_back(logits);
  }
  for (float x : steps.back()) ASSERT_TRUE(std::isfinite(x));

  k3::Session oneshot(engine, 8);
  std::vector<float> every;
  k3::PrefillHooks hooks;
  hooks.all_logits = &every;
  oneshot.prefill(all, hooks);
  for (size_t j = 0; j < steps.size(); ++j) {
    const size_t row = prompt.size() - 1 + j;
    const auto c = k3::testing::closeness(steps[j].data(), every.data() + row * V, V);
    EXPECT_LE(c.rel_l2, 1e-5) << preset << " row " << row;
  }
  fs::remove_all(dir);
}

TEST(Presets, TinyLoadsAndRuns) {
  load_and_run("tiny", -1, -1);
}
TEST(Presets, DemoLoadsAndRuns) {
  load_and_run("demo", -1, -1);
}

}  // namespace

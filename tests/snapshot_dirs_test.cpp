// K3_DIRS: a model whose shards are split over several directories (drives) loads and computes
// exactly as the unsplit one; a shard is looked up in the model directory first, then in each
// extra directory in order; a missing shard or a missing directory is an error naming it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "engine/engine.h"
#include "io/model_files.h"
#include "synth_lib.h"
#include "test_util.h"
#include "util/error.h"

namespace {

namespace fs = std::filesystem;

std::vector<float> prompt_logits(const std::string& dir, const std::vector<std::string>& extra) {
  k3::LoadOptions load = k3::LoadOptions::exact();
  load.extra_dirs = extra;
  const k3::Engine engine(dir, load);
  k3::Session session(engine, 32);
  std::vector<int64_t> prompt;
  for (int i = 0; i < 10; ++i) prompt.push_back((i * 31 + 5) % engine.info().vocab_size);
  return session.prefill(prompt);
}

TEST(SnapshotDirs, ASplitModelComputesLikeTheWholeOne) {
  const k3::testing::TempDir root("snapshot-dirs");
  const std::string whole = root.path() + "/whole", main = root.path() + "/main",
                    second = root.path() + "/second", third = root.path() + "/third";
  k3::synth::SynthSpec spec = k3::synth::preset_spec("tiny");
  spec.progress = false;
  k3::synth::write_checkpoint(spec, whole);
  fs::copy(whole, main);
  fs::create_directories(second);
  fs::create_directories(third);
  // Every other shard moves to another "drive"; config, index and tokenizer stay in main.
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(main))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path().filename().string());
  std::sort(shards.begin(), shards.end());
  ASSERT_GE(shards.size(), 3u);
  for (size_t i = 0; i < shards.size(); ++i)
    if (i % 2 == 1)
      fs::rename(fs::path(main) / shards[i], fs::path(i % 4 == 1 ? second : third) / shards[i]);

  const std::vector<float> expected = prompt_logits(whole, {});
  const std::vector<float> split = prompt_logits(main, {second, third});
  ASSERT_EQ(expected.size(), split.size());
  EXPECT_EQ(std::memcmp(expected.data(), split.data(), expected.size() * sizeof(float)), 0);

  // Without the extra directories the first moved shard is missing, and the error names it.
  try {
    prompt_logits(main, {});
    FAIL() << "a split model loaded without K3_DIRS";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find(shards[1]), std::string::npos) << e.what();
  }
  EXPECT_THROW(prompt_logits(main, {second, root.path() + "/no-such-drive"}), k3::Error);

  // A shard present in two places is read from the first (the model directory wins).
  fs::copy_file(fs::path(second) / shards[1], fs::path(main) / shards[1]);
  const k3::ModelFiles snapshot(main, {second, third});
  bool from_main = false;
  for (const auto& shard : snapshot.shards())
    if (fs::path(shard->path()).filename() == shards[1])
      from_main = fs::path(shard->path()).parent_path() == fs::path(main);
  EXPECT_TRUE(from_main);
}

}  // namespace

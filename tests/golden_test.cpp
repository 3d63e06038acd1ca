// The f32 engine against Moonshot's reference (tests/data/k3-tiny/golden.safetensors): every
// traced tensor, the routing, the greedy decode through the incremental path, and incremental
// decode against a one-shot prefill.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/trace.h"
#include "io/safetensors.h"
#include "kernels/isa.h"
#include "test_util.h"
#include "util/error.h"

namespace {

// The SIMD variants twin_isas() leaves out, as skipped tests (tests/test_util.h).
K3_TWIN_ISA_TESTS(Golden)

using k3::testing::kTinyDir;

double g_worst_rel = 0;  // measured, printed by the trace test
std::string g_worst_name;

void expect_close(const std::string& name, const float* got, const float* want, size_t n) {
  const double rel = k3::testing::expect_close(name, got, want, n);
  if (rel > g_worst_rel) {
    g_worst_rel = rel;
    g_worst_name = name;
  }
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  return k3::testing::closeness(a.data(), b.data(), a.size()).rel_l2;
}

using k3::testing::Tensors;

class GoldenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    golden_ = new Tensors(kTinyDir + "/golden.safetensors");
    engine_ = new k3::Engine(kTinyDir, k3::LoadOptions::exact());
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete golden_;
  }
  static Tensors* golden_;
  static k3::Engine* engine_;
};
Tensors* GoldenTest::golden_ = nullptr;
k3::Engine* GoldenTest::engine_ = nullptr;

TEST_F(GoldenTest, TraceMatchesEveryTensor) {
  const auto prompt = golden_->i64("prompt_ids");
  const k3::EngineInfo& c = engine_->info();
  k3::Session session(*engine_, static_cast<int64_t>(prompt.size()));
  k3::TraceRecorder recorder(c.hidden_size, c.num_experts_per_token);
  std::vector<float> logits;
  k3::PrefillHooks hooks;
  hooks.observer = &recorder;
  hooks.all_logits = &logits;
  session.prefill(prompt, hooks);
  const std::string path =
      (std::filesystem::temp_directory_path() / "k3_golden_trace.safetensors").string();
  recorder.write(path, prompt, logits, c.vocab_size);
  const Tensors trace(path);

  size_t compared = 0;
  for (const k3::TensorInfo& g : golden_->shard.tensors()) {
    if (g.name == "decode_ids" || g.name == "decode_logits") continue;
    ASSERT_TRUE(trace.has(g.name)) << "trace lacks " << g.name;
    const k3::TensorInfo* t = trace.shard.find(g.name);
    EXPECT_EQ(t->shape, g.shape) << g.name;
    EXPECT_EQ(t->dtype, g.dtype) << g.name;
    if (g.name.ends_with("topk_ids")) {
      const std::string w_name = g.name.substr(0, g.name.size() - 3) + "weights";
      const auto gi = golden_->i64(g.name), ti = trace.i64(g.name);
      const auto gw = golden_->f32(w_name), tw = trace.f32(w_name);
      const size_t k = static_cast<size_t>(g.shape[1]);
      for (size_t row = 0; row < gi.size() / k; ++row) {
        std::map<int64_t, float> want, got;
        for (size_t j = 0; j < k; ++j) {
          want[gi[row * k + j]] = gw[row * k + j];
          got[ti[row * k + j]] = tw[row * k + j];
        }
        ASSERT_EQ(want.size(), got.size());
        for (const auto& [id, w] : want) {
          ASSERT_TRUE(got.count(id)) << g.name << " row " << row << " misses expert " << id;
          EXPECT_NEAR(got[id], w, 1e-5) << g.name << " row " << row << " expert " << id;
        }
      }
    } else if (g.name.ends_with("topk_weights")) {
      continue;  // compared with the ids above
    } else if (g.dtype == k3::DType::kI64) {
      EXPECT_EQ(trace.i64(g.name), golden_->i64(g.name)) << g.name;
    } else {
      const auto want = golden_->f32(g.name), got = trace.f32(g.name);
      ASSERT_EQ(want.size(), got.size()) << g.name;
      expect_close(g.name, got.data(), want.data(), want.size());
    }
    ++compared;
  }
  // logits, final_hidden, prompt_ids, 8 layers x 5 tensors, 7 MoE layers x topk ids.
  EXPECT_EQ(compared, 3u + 8u * 5u + 7u);
  std::printf("worst rel-L2 against the golden: %.3g (%s)\n", g_worst_rel, g_worst_name.c_str());
  std::filesystem::remove(path);
}

TEST_F(GoldenTest, GreedyDecodeThroughTheCache) {
  const auto prompt = golden_->i64("prompt_ids");
  const auto decode_ids = golden_->i64("decode_ids");
  const auto decode_logits = golden_->f32("decode_logits");
  const size_t V = static_cast<size_t>(engine_->info().vocab_size);
  k3::Session session(*engine_, static_cast<int64_t>(prompt.size() + decode_ids.size()));
  std::vector<float> logits = session.prefill(prompt);
  for (size_t j = 0; j < decode_ids.size(); ++j) {
    ASSERT_EQ(logits.size(), V);
    expect_close("decode_logits[" + std::to_string(j) + "]", logits.data(),
                 decode_logits.data() + j * V, V);
    const int64_t id = k3::argmax(logits);
    ASSERT_EQ(id, decode_ids[j]) << "step " << j;
    if (j + 1 < decode_ids.size()) logits = session.step(id);
  }
}

TEST_F(GoldenTest, IncrementalDecodeEqualsOneShotPrefill) {
  const auto prompt = golden_->i64("prompt_ids");
  const auto decode_ids = golden_->i64("decode_ids");
  const size_t V = static_cast<size_t>(engine_->info().vocab_size);
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), decode_ids.begin(), decode_ids.end() - 1);

  k3::Session incremental(*engine_, static_cast<int64_t>(all.size()));
  std::vector<std::vector<float>> steps = {incremental.prefill(prompt)};
  for (size_t j = 0; j + 1 < decode_ids.size(); ++j)
    steps.push_back(incremental.step(decode_ids[j]));

  k3::Session oneshot(*engine_, static_cast<int64_t>(all.size()));
  std::vector<float> every;
  k3::PrefillHooks hooks;
  hooks.all_logits = &every;
  oneshot.prefill(all, hooks);
  ASSERT_EQ(every.size(), all.size() * V);
  for (size_t j = 0; j < steps.size(); ++j) {
    const size_t row = prompt.size() - 1 + j;
    const std::vector<float> want(every.begin() + static_cast<std::ptrdiff_t>(row * V),
                                  every.begin() + static_cast<std::ptrdiff_t>((row + 1) * V));
    EXPECT_LE(rel_l2(steps[j], want), 1e-5) << "row " << row;
  }
}

TEST_F(GoldenTest, EveryKernelVariantMatchesTheGolden) {
  const auto prompt = golden_->i64("prompt_ids");
  const auto decode_ids = golden_->i64("decode_ids");
  const auto want = golden_->f32("logits");
  for (k3::Isa isa : k3::testing::twin_isas()) {
    k3::LoadOptions load = k3::LoadOptions::exact();
    load.isa = k3::isa_name(isa);
    k3::Engine engine(kTinyDir, load);
    k3::Session session(engine, static_cast<int64_t>(prompt.size() + decode_ids.size()));
    std::vector<float> every;
    k3::PrefillHooks hooks;
    hooks.all_logits = &every;
    std::vector<float> logits = session.prefill(prompt, hooks);
    expect_close(std::string("logits on ") + k3::isa_name(isa), every.data(), want.data(),
                 want.size());
    for (size_t j = 0; j < decode_ids.size(); ++j) {
      ASSERT_EQ(k3::argmax(logits), decode_ids[j]) << k3::isa_name(isa) << " step " << j;
      if (j + 1 < decode_ids.size()) logits = session.step(decode_ids[j]);
    }
  }
}

TEST_F(GoldenTest, ExpertsInMemoryGiveIdenticalLogits) {
  const auto prompt = golden_->i64("prompt_ids");
  k3::LoadOptions load = k3::LoadOptions::exact();
  load.experts_in_memory = true;
  k3::Engine resident(kTinyDir, load);
  EXPECT_GT(resident.info().resident_bytes, engine_->info().resident_bytes);
  k3::Session a(resident, static_cast<int64_t>(prompt.size())),
      b(*engine_, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(a.prefill(prompt), b.prefill(prompt));
}

TEST_F(GoldenTest, ContextCapacityIsEnforced) {
  const auto prompt = golden_->i64("prompt_ids");
  k3::Session session(*engine_, 4);
  EXPECT_THROW(session.prefill(prompt), k3::Error);
  k3::Session fits(*engine_, static_cast<int64_t>(prompt.size()));
  fits.prefill(prompt);
  try {
    fits.step(1);
    FAIL() << "a full context must refuse another token";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("K3_MAXT"), std::string::npos) << e.what();
  }
}

TEST_F(GoldenTest, ResetGivesTheSameLogits) {
  const auto prompt = golden_->i64("prompt_ids");
  k3::Session session(*engine_, static_cast<int64_t>(prompt.size()));
  const auto first = session.prefill(prompt);
  session.reset();
  EXPECT_EQ(session.position(), 0);
  const auto second = session.prefill(prompt);
  EXPECT_EQ(first, second);
}

TEST_F(GoldenTest, TruncatedStackRunsFewerLayers) {
  k3::LoadOptions load = k3::LoadOptions::exact();
  load.layers = 3;
  k3::Engine partial(kTinyDir, load);
  EXPECT_EQ(partial.info().num_layers, 3);
  const auto prompt = golden_->i64("prompt_ids");
  k3::Session session(partial, static_cast<int64_t>(prompt.size()));
  k3::TraceRecorder recorder(partial.info().hidden_size, partial.info().num_experts_per_token);
  k3::PrefillHooks hooks;
  hooks.observer = &recorder;
  session.prefill(prompt, hooks);
  const std::string path =
      (std::filesystem::temp_directory_path() / "k3_partial_trace.safetensors").string();
  recorder.write(path, prompt, {}, partial.info().vocab_size);
  const Tensors trace(path);
  EXPECT_FALSE(trace.has("layer.3.attn_in"));
  const auto want = golden_->f32("layer.2.layer_out"), got = trace.f32("layer.2.layer_out");
  expect_close("layer.2.layer_out", got.data(), want.data(), want.size());
  std::filesystem::remove(path);
}

TEST_F(GoldenTest, InjectedInputRowsReplaceTheEmbedding) {
  // Feeding the golden embedding rows (layer.0.attn_in) through set_input_rows must reproduce
  // the logits; a position past the table is an error.
  const auto prompt = golden_->i64("prompt_ids");
  const auto x0 = golden_->f32("layer.0.attn_in");
  const auto want = golden_->f32("logits");
  const size_t V = static_cast<size_t>(engine_->info().vocab_size);
  k3::Session session(*engine_, static_cast<int64_t>(prompt.size() + 1));
  session.set_input_rows(x0);
  std::vector<int64_t> zeros(prompt.size(), 0);
  std::vector<float> every;
  k3::PrefillHooks hooks;
  hooks.all_logits = &every;
  session.prefill(zeros, hooks);
  expect_close("logits via x0", every.data(), want.data(), want.size());
  EXPECT_EQ(every.size(), prompt.size() * V);
  EXPECT_THROW(session.step(0), k3::Error);
}

}  // namespace

// chunked_prefill_test — layer-major chunked prefill (Model::forward over n rows, K3_CHUNK) against
// token-at-a-time: logits, every per-layer trace tensor and the routing bit for bit (memcmp) on
// the k3-tiny fixture and on a synthetic checkpoint with many experts, for several chunk sizes
// and prompt lengths that are not multiples of them, at the default precision (bits 4, idot 1)
// and at exact; the per-row stability of the kernels the chunk path batches; interrupts.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "io/file.h"
#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "model/compute.h"
#include "model/config.h"
#include "model/state.h"
#include "test_util.h"
#include "util/error.h"

namespace {

// The SIMD variants twin_isas() leaves out, as skipped tests (tests/test_util.h).
K3_TWIN_ISA_TESTS(ChunkedPrefill)

using k3::testing::TempDir;

using k3::testing::kTinyDir;

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Kernels: what the chunk path batches must give every row the bits of the one-row call.

// Two f32 sums of the same 320 products in different orders differ by a random walk of rounding
// errors, ~2^-24 sqrt(320) = 1.1e-6 of an output (the worst-case bound, 320 x 2^-24 of the sum of
// |products|, is far looser and never reached). Measured worst row: 1.8e-7 (AVX2 and AVX-512 int4,
// and AVX-512 MXFP4 exact before its tiles summed alike). One product dropped or doubled moves a
// row by ~1 / sqrt(320) = 6%.
constexpr double kOrderOnly = 1e-5;

TEST(ChunkKernels, BatchedRowsEqualOneRowCallsWhereClaimed) {
  const size_t rows = 96, cols = 320;
  const size_t counts[] = {2, 3, 4, 5, 7, 8, 9, 16, 17, 32, 33, 64, 65, 100};
  for (k3::Isa isa : k3::testing::twin_isas()) {
    const k3::KernelTable& kt = k3::kernel_table(isa);
    k3::Compute compute;
    compute.kernels = &kt;
    // f32, int8, int4 (f32 activations), int4 (q8 activations), MXFP4 exact, MXFP4 idot.
    for (int fmt = 0; fmt < 6; ++fmt) {
      k3::WeightMatrix W;
      W.rows = rows;
      W.cols = cols;
      const std::vector<float> w = randn(rows * cols, 7);
      W.f32.assign(w.begin(), w.end());
      if (fmt == 1) k3::quantize_matrix(W, 8, k3::kernel_table(k3::best_isa()));
      if (fmt == 2 || fmt == 3) k3::quantize_matrix(W, 4, k3::kernel_table(k3::best_isa()));
      W.int8_activations = fmt == 3;
      std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 32);
      std::mt19937 rng(3);
      for (auto& b : packed) b = static_cast<uint8_t>(rng());
      for (auto& b : scales) b = static_cast<uint8_t>(120 + rng() % 10);
      const k3::Mxfp4Matrix M{packed.data(), scales.data(), rows, cols};
      const bool claimed = fmt < 4 ? k3::row_stable(kt, W) : true;
      for (size_t n : counts) {
        const std::vector<float> X = randn(n * cols, static_cast<uint32_t>(11 + n));
        std::vector<int8_t> q(n * cols);
        std::vector<float> d(n * cols / 32);
        k3::quantize_q8_32(kt, X.data(), n, cols, q.data(), d.data());
        // The chunk form (what the model calls) and the one-row call per row.
        auto run = [&](size_t t0, size_t m, float* y) {
          const float* x = X.data() + t0 * cols;
          if (fmt < 4)
            k3::matmul_chunk(compute, W, x, m, y);
          else if (fmt == 4)
            k3::matmul_mxfp4_exact(kt, M, x, m, y);
          else
            k3::matmul_mxfp4_idot(kt, M, q.data() + t0 * cols, d.data() + t0 * cols / 32, m, y);
        };
        std::vector<float> Y(n * rows), Y1(rows);
        run(0, n, Y.data());
        size_t differ = 0;
        for (size_t t = 0; t < n; ++t) {
          run(t, 1, Y1.data());
          if (std::memcmp(Y1.data(), Y.data() + t * rows, rows * sizeof(float)) != 0) ++differ;
        }
        EXPECT_EQ(differ, 0u) << k3::isa_name(isa) << " format " << fmt << " n " << n
                              << " (claimed " << claimed << ")";
      }
      // The many-row kernel itself, where it is not claimed stable (int4 on f32 activations):
      // its rows may differ from the one-row calls in the order of the f32 sums only. Each row of
      // 96 outputs must be within a relative L2 of kOrderOnly of the one-row call's.
      if (!claimed) {
        const size_t n = 33;
        const std::vector<float> X = randn(n * cols, 5);
        std::vector<float> Y(n * rows), Y1(rows);
        k3::matmul(kt, W, X.data(), n, Y.data());
        size_t differ = 0;
        double worst = 0;
        for (size_t t = 0; t < n; ++t) {
          k3::matmul(kt, W, X.data() + t * cols, 1, Y1.data());
          if (std::memcmp(Y1.data(), Y.data() + t * rows, rows * sizeof(float)) != 0) ++differ;
          const double rel = k3::testing::closeness(Y.data() + t * rows, Y1.data(), rows).rel_l2;
          EXPECT_LE(rel, kOrderOnly) << k3::isa_name(isa) << " format " << fmt << " row " << t;
          worst = std::max(worst, rel);
        }
        std::printf(
            "%s format %d: the %zu-row kernel differs from one-row calls on %zu rows (summation "
            "order), worst row rel-L2 %.3g\n",
            k3::isa_name(isa), fmt, n, differ, worst);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The stack: chunked against token-at-a-time.

// Everything a prefill shows: per (layer, site) rows in position order, routing, logits.
class Recorder : public k3::LayerObserver {
 public:
  explicit Recorder(int64_t hidden) : hidden_(static_cast<size_t>(hidden)) {}
  void on_tensor(int64_t layer, Site site, const float* data) override {
    auto& v = rows[std::to_string(layer) + "." + std::to_string(static_cast<int>(site))];
    v.insert(v.end(), data, data + hidden_);
  }
  void on_routing(int64_t layer, const Routing& r) override {
    auto& ids = routing_ids[layer];
    ids.insert(ids.end(), r.ids.begin(), r.ids.end());
    auto& w = routing_weights[layer];
    w.insert(w.end(), r.weights.begin(), r.weights.end());
  }
  std::map<std::string, std::vector<float>> rows;
  std::map<int64_t, std::vector<int64_t>> routing_ids;
  std::map<int64_t, std::vector<float>> routing_weights;
  std::vector<float> logits;  // [T][vocab]

 private:
  size_t hidden_;
};

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct PrefillRun {
  Recorder rec;
  std::vector<float> last;     // logits of the last prompt token (prefill without hooks)
  std::vector<float> decoded;  // logits of 3 decode steps after the prompt
  uint64_t expert_reads = 0;   // of the plain prefill
};

PrefillRun run_prefill(const k3::Engine& engine, const std::vector<int64_t>& prompt,
                       int64_t chunk) {
  const k3::EngineInfo& c = engine.info();
  PrefillRun out{Recorder(c.hidden_size), {}, {}, 0};
  {
    k3::Session s(engine, static_cast<int64_t>(prompt.size()) + 4);
    s.set_prefill_chunk(chunk);
    k3::PrefillHooks hooks;
    hooks.observer = &out.rec;
    hooks.all_logits = &out.rec.logits;
    s.prefill(prompt, hooks);
  }
  k3::Session s(engine, static_cast<int64_t>(prompt.size()) + 4);
  s.set_prefill_chunk(chunk);
  out.last = s.prefill(prompt);
  out.expert_reads = s.stats().expert_reads;
  for (int64_t id : {3, 1, 4}) {
    const std::vector<float>& l = s.step(id);
    out.decoded.insert(out.decoded.end(), l.begin(), l.end());
  }
  return out;
}

void expect_identical(const PrefillRun& want, const PrefillRun& got, const std::string& what) {
  EXPECT_FALSE(want.rec.logits.empty()) << what;
  EXPECT_TRUE(same_bits(want.rec.logits, got.rec.logits)) << what << ": all logits";
  EXPECT_TRUE(same_bits(want.last, got.last)) << what << ": last logits";
  EXPECT_TRUE(same_bits(want.decoded, got.decoded)) << what << ": decode after the prefill";
  ASSERT_EQ(want.rec.rows.size(), got.rec.rows.size()) << what;
  size_t compared = 0;
  for (const auto& [name, rows] : want.rec.rows) {
    auto it = got.rec.rows.find(name);
    ASSERT_NE(it, got.rec.rows.end()) << what << ": " << name;
    EXPECT_TRUE(same_bits(rows, it->second)) << what << ": trace " << name;
    ++compared;
  }
  EXPECT_GT(compared, 0u);
  EXPECT_EQ(want.rec.routing_ids, got.rec.routing_ids) << what << ": routing ids";
  for (const auto& [layer, w] : want.rec.routing_weights)
    EXPECT_TRUE(same_bits(w, got.rec.routing_weights.at(layer)))
        << what << ": routing weights of layer " << layer;
}

std::vector<int64_t> prompt_of(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> ids(n);
  for (auto& id : ids) id = static_cast<int64_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

void check_model(const std::string& dir, const k3::LoadOptions& load,
                 const std::vector<size_t>& lengths, const std::string& label) {
  const k3::Engine engine(dir, load);
  for (size_t T : lengths) {
    const std::vector<int64_t> prompt =
        prompt_of(T, engine.info().vocab_size, static_cast<uint32_t>(T));
    const PrefillRun ref = run_prefill(engine, prompt, 1);
    for (int64_t C : {1, 7, 32, 4096}) {  // 4096: the largest K3_CHUNK, the whole prompt at once
      const PrefillRun got = run_prefill(engine, prompt, C);
      expect_identical(ref, got, label + " T=" + std::to_string(T) + " C=" + std::to_string(C));
    }
  }
}

k3::LoadOptions default_load() {
  return k3::LoadOptions{};
}

TEST(ChunkedPrefill, FixtureExact) {
  check_model(kTinyDir, k3::LoadOptions::exact(), {12, 45}, "k3-tiny exact");
}
TEST(ChunkedPrefill, FixtureDefaultPrecision) {
  check_model(kTinyDir, default_load(), {12, 45}, "k3-tiny bits 4 idot 1");
}

TEST(ChunkedPrefill, FixtureGoldenPromptTrace) {
  // The fixture's own prompt (12 ids) at C = 7: 7 + 5.
  const k3::testing::Tensors golden(kTinyDir + "/golden.safetensors");
  const auto prompt = golden.i64("prompt_ids");
  const k3::Engine engine(kTinyDir, k3::LoadOptions::exact());
  expect_identical(run_prefill(engine, prompt, 1), run_prefill(engine, prompt, 7),
                   "golden prompt C=7");
}

// A synthetic checkpoint with many experts (tiny preset, 64 experts top-4): chunks share some
// experts and not others.
class ChunkedSynth : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("chunk-synth");
    k3::testing::write_tiny_synth(dir_->path(), 64, 5);
  }
  static void TearDownTestSuite() { delete dir_; }
  static TempDir* dir_;
};
TempDir* ChunkedSynth::dir_ = nullptr;

TEST_F(ChunkedSynth, Exact) {
  check_model(dir_->path(), k3::LoadOptions::exact(), {1, 33, 70}, "synth exact");
}
TEST_F(ChunkedSynth, DefaultPrecision) {
  check_model(dir_->path(), default_load(), {1, 33, 70}, "synth bits 4 idot 1");
}
TEST_F(ChunkedSynth, Int4FloatActivations) {
  // bits 4 with idot 0: the int4 kernel whose many-row form sums differently (looped rows).
  k3::LoadOptions load;
  load.idot = false;
  check_model(dir_->path(), load, {33}, "synth bits 4 idot 0");
}

TEST_F(ChunkedSynth, EachDistinctExpertReadOncePerChunk) {
  const k3::Engine engine(dir_->path(), default_load());
  const k3::EngineInfo& c = engine.info();
  const std::vector<int64_t> prompt = prompt_of(64, c.vocab_size, 9);
  const PrefillRun one = run_prefill(engine, prompt, 1);
  const PrefillRun chunked = run_prefill(engine, prompt, 32);
  const int64_t moe_layers = static_cast<int64_t>(one.rec.routing_ids.size());
  EXPECT_EQ(one.expert_reads, static_cast<uint64_t>(64 * moe_layers * c.num_experts_per_token));
  // Per chunk and layer: the number of distinct experts the chunk's rows chose.
  uint64_t want = 0;
  for (const auto& entry : one.rec.routing_ids)
    for (size_t t0 = 0; t0 < 64; t0 += 32) {
      std::vector<bool> seen(static_cast<size_t>(c.num_experts), false);
      for (size_t i = t0 * static_cast<size_t>(c.num_experts_per_token);
           i < (t0 + 32) * static_cast<size_t>(c.num_experts_per_token); ++i)
        if (!seen[static_cast<size_t>(entry.second[i])]) {
          seen[static_cast<size_t>(entry.second[i])] = true;
          ++want;
        }
    }
  EXPECT_EQ(chunked.expert_reads, want);
  EXPECT_LT(chunked.expert_reads, one.expert_reads);
}

// Raises the flag when layer `at` reports its attention input, counts what it sees after.
class InterruptAt : public k3::LayerObserver {
 public:
  InterruptAt(std::atomic<bool>& flag, int64_t at) : flag_(flag), at_(at) {}
  void on_tensor(int64_t layer, Site site, const float*) override {
    if (layer == at_ && site == Site::kAttnIn) flag_ = true;
    if (layer > at_) ++seen_after;
  }
  void on_routing(int64_t, const Routing&) override {}
  int64_t seen_after = 0;

 private:
  std::atomic<bool>& flag_;
  int64_t at_;
};

TEST(ChunkedPrefill, InterruptMidChunkStopsBetweenLayers) {
  const k3::Engine engine(kTinyDir, default_load());
  const std::vector<int64_t> prompt = prompt_of(20, engine.info().vocab_size, 2);
  std::atomic<bool> flag{false};
  k3::Session s(engine, 64);
  s.set_prefill_chunk(32);
  s.set_interrupt(&flag);
  InterruptAt obs(flag, 2);
  k3::PrefillHooks hooks;
  hooks.observer = &obs;
  EXPECT_THROW(s.prefill(prompt, hooks), k3::Interrupted);
  EXPECT_EQ(obs.seen_after, 0) << "layers after the interrupt ran";
  // The caller resets; the session then computes what a fresh one does.
  flag = false;
  s.reset();
  const std::vector<float> again = s.prefill(prompt);
  k3::Session fresh(engine, 64);
  fresh.set_prefill_chunk(1);
  EXPECT_TRUE(same_bits(again, fresh.prefill(prompt)));
}

TEST(ChunkedPrefill, ChunkOptionDefaultsToAutoAndFlowsToSessions) {
  EXPECT_EQ(k3::LoadOptions{}.chunk, -1);  // K3_CHUNK=auto
  k3::LoadOptions load = default_load();
  load.chunk = 5;
  const k3::Engine engine(kTinyDir, load);
  k3::Session s(engine, 8);
  EXPECT_EQ(s.prefill_chunk(), 5);
  // auto resolves at load to a power of two in [32, 4096].
  const k3::Engine automatic(kTinyDir, default_load());
  const int64_t chunk = k3::Session(automatic, 8).prefill_chunk();
  EXPECT_GE(chunk, 32);
  EXPECT_LE(chunk, 4096);
  EXPECT_EQ(chunk & (chunk - 1), 0) << chunk;
}

// K3_CHUNK=auto: the largest power of two in [32, 4096] whose per-row buffers take at most a
// sixteenth of the free memory; the release's rows are about a megabyte each.
TEST(ChunkedPrefill, AutoChunkFollowsTheFreeMemory) {
  const k3::K3Config release = k3::parse_k3_config(
      nlohmann::json::parse(
          k3::read_text_file(std::string(K3_SOURCE_DIR) + "/assets/k3-release/config.json")),
      "config.json");
  // 755,456 bytes: the attention and feed-forward scratch share one arena (1,231,744 when each
  // buffer had its own; model/state.h).
  const uint64_t row = k3::Workspace::row_bytes(release);
  EXPECT_GT(row, 600'000u);
  EXPECT_LT(row, 900'000u);
  EXPECT_EQ(k3::auto_prefill_chunk(release, 0), 32);  // unknown memory
  EXPECT_EQ(k3::auto_prefill_chunk(release, 16 * row * 512), 512);
  EXPECT_EQ(k3::auto_prefill_chunk(release, 16 * row * 512 - 1), 256);
  EXPECT_EQ(k3::auto_prefill_chunk(release, uint64_t{1} << 50), 4096);
  EXPECT_EQ(k3::auto_prefill_chunk(release, 16 * row * 8), 32);  // never below 32
}

}  // namespace

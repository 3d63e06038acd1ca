// The faster settings against Moonshot's golden (tests/data/k3-tiny): load-time int8 / int4
// dense matrices and the integer-dot MXFP4 path. They cannot meet the f32 tolerances; the
// bounds below are the figures measured on this fixture with a stated margin, routing and greedy
// agreement included. Every ISA variant measures the same digits (the integer dots are
// bit-identical, the float kernels differ in summation order only), so no bound depends on which
// variant computed a token.
//
// Why the bounds on logits are loose: the fixture's router scores sit close together (combine
// weights ~0.25 each), so a perturbation of ~1% in a layer's input flips an expert choice in
// some rows from layer 2 on, and a flipped expert moves that row's output by tens of percent.
// Layer 0 (KDA + dense MLP, no routing) and the first MoE layer measure the formats themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/trace.h"
#include "kernels/isa.h"
#include "test_util.h"

namespace {

using k3::testing::kTinyDir;

// The SIMD variants twin_isas() leaves out, as skipped tests (tests/test_util.h).
K3_TWIN_ISA_TESTS(GoldenQuant)

using k3::testing::Tensors;

struct Setting {
  std::string name;
  int bits, mla_bits, head_bits;
  bool idot;
  double layer0_bound;  // worst rel-L2 over layer 0's tensors
  double layer1_bound;  // layer.1.mlp_out (first MoE layer; routing agrees there)
  double logits_bound;  // rel-L2 of all prefill logits (with their norm within 0.8x .. 1.25x the
                        // golden's)
  size_t routing_min;   // MoE rows (layers 1..7 x 12 positions) whose expert set is the golden's
  int greedy_min;       // teacher-forced decode steps whose argmax is the golden's id (of 8)
};

double rel(const std::vector<float>& got, const std::vector<float>& want) {
  return k3::testing::closeness(got.data(), want.data(), want.size()).rel_l2;
}

double l2(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += static_cast<double>(x) * x;
  return std::sqrt(sum);
}

class QuantGolden : public ::testing::TestWithParam<Setting> {};

void check(const Setting& s, k3::Isa isa) {
  const Tensors golden(kTinyDir + "/golden.safetensors");
  k3::LoadOptions load = k3::LoadOptions::exact();
  load.isa = k3::isa_name(isa);
  load.bits = s.bits;
  load.mla_bits = s.mla_bits;
  load.head_bits = s.head_bits;
  load.idot = s.idot;
  k3::Engine engine(kTinyDir, load);
  const auto prompt = golden.i64("prompt_ids");
  const auto decode_ids = golden.i64("decode_ids");
  const size_t V = static_cast<size_t>(engine.info().vocab_size);

  k3::Session session(engine, static_cast<int64_t>(prompt.size() + decode_ids.size()));
  k3::TraceRecorder recorder(engine.info().hidden_size, engine.info().num_experts_per_token);
  std::vector<float> logits;
  k3::PrefillHooks hooks;
  hooks.observer = &recorder;
  hooks.all_logits = &logits;
  std::vector<float> last = session.prefill(prompt, hooks);
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("k3_quant_" + s.name + "_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  recorder.write(path, prompt, logits, engine.info().vocab_size);
  const Tensors trace(path);

  double layer0 = 0;
  for (const char* site : {"attn_out", "mlp_out", "layer_out"}) {
    const std::string name = std::string("layer.0.") + site;
    layer0 = std::max(layer0, rel(trace.f32(name), golden.f32(name)));
  }
  const double layer1 = rel(trace.f32("layer.1.mlp_out"), golden.f32("layer.1.mlp_out"));
  const double logits_rel = rel(trace.f32("logits"), golden.f32("logits"));
  // All-zero logits measure rel-L2 1.0: the norm ratio tells them (and a lost scale) apart.
  const double norm_ratio = l2(trace.f32("logits")) / l2(golden.f32("logits"));

  // Routing agreement: rows whose expert set equals the golden's, over all MoE layers.
  size_t rows = 0, same = 0;
  for (int64_t l = 1; l < engine.info().num_hidden_layers; ++l) {
    const std::string name = "layer." + std::to_string(l) + ".topk_ids";
    const auto got = trace.i64(name), want = golden.i64(name);
    const size_t k = static_cast<size_t>(engine.info().num_experts_per_token);
    for (size_t r = 0; r < want.size() / k; ++r, ++rows)
      same += std::set<int64_t>(got.begin() + static_cast<std::ptrdiff_t>(r * k),
                                got.begin() + static_cast<std::ptrdiff_t>((r + 1) * k)) ==
              std::set<int64_t>(want.begin() + static_cast<std::ptrdiff_t>(r * k),
                                want.begin() + static_cast<std::ptrdiff_t>((r + 1) * k));
  }
  // Teacher-forced greedy agreement: at each decode step, feed the golden id and compare argmax.
  int agree = 0;
  for (size_t j = 0; j < decode_ids.size(); ++j) {
    agree += k3::argmax(last) == decode_ids[j];
    if (j + 1 < decode_ids.size()) last = session.step(decode_ids[j]);
  }
  std::printf(
      "%-16s %s | layer0 rel-L2 %.4g | layer1.mlp_out %.4g | logits %.4g (norm x%.4g) | routing "
      "rows %zu/%zu | greedy %d/%zu\n",
      s.name.c_str(), engine.describe().c_str(), layer0, layer1, logits_rel, norm_ratio, same, rows,
      agree, decode_ids.size());
  EXPECT_LE(layer0, s.layer0_bound);
  EXPECT_LE(layer1, s.layer1_bound);
  EXPECT_LE(logits_rel, s.logits_bound);
  EXPECT_GE(same, s.routing_min) << "MoE rows whose experts are the golden's, of " << rows;
  EXPECT_GE(agree, s.greedy_min) << "decode steps whose argmax is the golden's id, of "
                                 << decode_ids.size();
  EXPECT_GE(norm_ratio, 0.8);  // measured 0.996 .. 1.005
  EXPECT_LE(norm_ratio, 1.25);
  EXPECT_EQ(last.size(), V);
  std::filesystem::remove(path);
}

TEST_P(QuantGolden, WithinTheDocumentedBounds) {
  for (k3::Isa isa : k3::testing::twin_isas()) check(GetParam(), isa);
}

void PrintTo(const Setting& s, std::ostream* os) {
  *os << s.name;
}

// The release defaults (int4 g64 dense, int8 MLA and head, integer dots) layer by layer against
// other paths of the same engine on the same fixture. Against the golden their logits measure
// rel-L2 0.96, which all-zero logits (1.0) would nearly match; the checks below are ones a broken
// kernel fails: a zeroed kernel output measures ~1.0 in the first layer it enters, a flipped
// scale sign ~2, and an argmax agreement of garbage logits is ~0. Each run: a prefill of the
// golden prompt (per-layer tensors of every position), then the teacher-forced decode steps.
struct PathRun {
  std::vector<float> logits;                       // [T][V] prefill logits
  std::vector<std::vector<float>> decode;          // teacher-forced decode logits, one per step
  std::map<std::string, std::vector<float>> rows;  // layer.{i}.{site} -> [T][D]
};

PathRun run_path(k3::LoadOptions load, k3::Isa isa, const Tensors& golden) {
  load.isa = k3::isa_name(isa);
  k3::Engine engine(kTinyDir, load);
  const auto prompt = golden.i64("prompt_ids");
  const auto decode_ids = golden.i64("decode_ids");
  k3::Session session(engine, static_cast<int64_t>(prompt.size() + decode_ids.size()));
  k3::TraceRecorder recorder(engine.info().hidden_size, engine.info().num_experts_per_token);
  PathRun out;
  k3::PrefillHooks hooks;
  hooks.observer = &recorder;
  hooks.all_logits = &out.logits;
  out.decode.push_back(session.prefill(prompt, hooks));
  for (size_t j = 0; j + 1 < decode_ids.size(); ++j)
    out.decode.push_back(session.step(decode_ids[j]));
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("k3_drift_" + std::string(load.isa) + "_" + std::to_string(load.bits) +
                             "_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  recorder.write(path, prompt, out.logits, engine.info().vocab_size);
  {
    const Tensors trace(path);
    for (int64_t l = 0; l < engine.info().num_hidden_layers; ++l)
      for (const char* site : {"attn_out", "mlp_out", "layer_out"}) {
        const std::string name = "layer." + std::to_string(l) + "." + site;
        out.rows[name] = trace.f32(name);
      }
  }
  std::filesystem::remove(path);
  return out;
}

// Positions (rows of V logits) where b's argmax is among a's 10 highest logits.
size_t top10_containment(const std::vector<float>& a, const std::vector<float>& b, size_t V) {
  size_t in = 0;
  for (size_t r = 0; r < a.size() / V; ++r) {
    const float* ar = a.data() + r * V;
    const float* br = b.data() + r * V;
    const float want = ar[std::max_element(br, br + V) - br];
    in += std::count_if(ar, ar + V, [&](float x) { return x > want; }) < 10;
  }
  return in;
}

size_t argmax_agreement(const std::vector<float>& a, const std::vector<float>& b, size_t V) {
  size_t same = 0;
  for (size_t r = 0; r < a.size() / V; ++r)
    same += std::max_element(a.begin() + static_cast<std::ptrdiff_t>(r * V),
                             a.begin() + static_cast<std::ptrdiff_t>((r + 1) * V)) -
                a.begin() - static_cast<std::ptrdiff_t>(r * V) ==
            std::max_element(b.begin() + static_cast<std::ptrdiff_t>(r * V),
                             b.begin() + static_cast<std::ptrdiff_t>((r + 1) * V)) -
                b.begin() - static_cast<std::ptrdiff_t>(r * V);
  return same;
}

struct Drift {
  std::vector<std::array<double, 3>> layers;  // rel-L2 of attn_out, mlp_out, layer_out
  double logits = 0;                          // rel-L2 of the prefill logits
  size_t agree = 0, positions = 0;            // argmax agreement, prompt positions + decode steps
  size_t top10 = 0;  // positions where ref's argmax is among got's 10 highest logits
};

constexpr const char* kSites[3] = {"attn_out", "mlp_out", "layer_out"};

// The drift of `got` from `ref`, printed as a table.
Drift drift(const PathRun& got, const PathRun& ref, const std::string& what) {
  Drift d;
  const size_t layers = ref.rows.size() / 3;
  std::printf("%s, rel-L2 per layer (attn_out / mlp_out / layer_out):\n", what.c_str());
  for (size_t l = 0; l < layers; ++l) {
    std::array<double, 3> r{};
    for (int k = 0; k < 3; ++k) {
      const std::string name = "layer." + std::to_string(l) + "." + kSites[k];
      r[static_cast<size_t>(k)] = rel(got.rows.at(name), ref.rows.at(name));
    }
    std::printf("  layer %zu: %.3g / %.3g / %.3g\n", l, r[0], r[1], r[2]);
    d.layers.push_back(r);
  }
  const size_t V = ref.decode.front().size();
  d.logits = rel(got.logits, ref.logits);
  const size_t prompt_agree = argmax_agreement(got.logits, ref.logits, V);
  size_t decode_agree = 0;
  d.top10 = top10_containment(got.logits, ref.logits, V);
  for (size_t j = 0; j < ref.decode.size(); ++j) {
    decode_agree += argmax_agreement(got.decode[j], ref.decode[j], V);
    d.top10 += top10_containment(got.decode[j], ref.decode[j], V);
  }
  d.agree = prompt_agree + decode_agree;
  d.positions = ref.logits.size() / V + ref.decode.size();
  std::printf(
      "  logits %.4g | argmax agreement: prompt %zu/%zu, decode %zu/%zu | reference argmax in the "
      "top 10: %zu/%zu\n",
      d.logits, prompt_agree, ref.logits.size() / V, decode_agree, ref.decode.size(), d.top10,
      ref.logits.size() / V + ref.decode.size());
  return d;
}

// Layers 0 and 1 against the f32 path: the int4 g64 format's own error (layer 0: KDA + dense MLP,
// no routing) and the first MoE layer, before routing flips decorrelate the two paths. Measured
// (every ISA, K3_ISA unset, avx2 and scalar alike): 0.243 / 0.243 / 0.244 and 0.572 / 0.501 /
// 0.445; prompt + decode argmax 3/20, and the f32 path's argmax among the defaults' 10 highest
// logits at 10 of the 20 positions. Garbage or all-zero logits score ~0 on both (the chance is
// 1/1024 and 10/1024 a position); bounds: argmax - 1, top 10 - 2. From layer 2 on the paths are
// as far apart as unrelated vectors (rel-L2 0.6 .. 1.2): printed, not bounded.
constexpr double kF32Bound[2][3] = {{0.29, 0.29, 0.29}, {0.69, 0.60, 0.53}};
constexpr size_t kF32MinAgreement = 2;
constexpr size_t kF32MinTop10 = 8;

TEST(QuantDrift, DefaultsAgainstTheF32Path) {
  const Tensors golden(kTinyDir + "/golden.safetensors");
  for (k3::Isa isa : k3::testing::twin_isas()) {
    SCOPED_TRACE(k3::isa_name(isa));
    const Drift d = drift(run_path(k3::LoadOptions{}, isa, golden),
                          run_path(k3::LoadOptions::exact(), isa, golden),
                          std::string("defaults vs f32 (") + k3::isa_name(isa) + ")");
    for (size_t l = 0; l < 2; ++l)
      for (size_t k = 0; k < 3; ++k)
        EXPECT_LE(d.layers[l][k], kF32Bound[l][k]) << "layer." << l << "." << kSites[k];
    EXPECT_GE(d.agree, kF32MinAgreement)
        << "argmax agreement with the f32 path, of " << d.positions;
    EXPECT_GE(d.top10, kF32MinTop10)
        << "positions whose f32 argmax is among the defaults' 10 highest, of " << d.positions;
  }
}

// Every layer against the same int4 / int8 weights through the float kernels (K3_IDOT=0): what
// differs is the integer-dot path alone (q8 activations, MXFP4 and int4 idot kernels), ~1% a
// matrix, which flips some expert choices from layer 1 on. Bounds: the measured figures (every
// ISA prints the same digits) + 20%, 8 of the 20 argmax positions (measured 10), and 13 positions
// whose float-kernel argmax is among the defaults' 10 highest logits (measured 15).
constexpr double kFloatKernelsBound[8][3] = {
    {0.016, 0.017, 0.017}, {0.038, 0.18, 0.15}, {0.53, 0.32, 0.27}, {0.58, 0.63, 0.63},
    {0.84, 0.79, 0.75},    {0.86, 0.87, 0.79},  {0.95, 0.85, 0.88}, {0.88, 0.95, 0.90}};
constexpr double kFloatKernelsLogitsBound = 0.65;  // measured 0.543
constexpr size_t kFloatKernelsMinAgreement = 8;
constexpr size_t kFloatKernelsMinTop10 = 13;

TEST(QuantDrift, DefaultsAgainstTheFloatKernelsOnTheSameWeights) {
  const Tensors golden(kTinyDir + "/golden.safetensors");
  k3::LoadOptions float_kernels;
  float_kernels.idot = false;
  for (k3::Isa isa : k3::testing::twin_isas()) {
    SCOPED_TRACE(k3::isa_name(isa));
    const Drift d =
        drift(run_path(k3::LoadOptions{}, isa, golden), run_path(float_kernels, isa, golden),
              std::string("defaults vs float kernels (") + k3::isa_name(isa) + ")");
    ASSERT_EQ(d.layers.size(), 8u);
    for (size_t l = 0; l < d.layers.size(); ++l)
      for (size_t k = 0; k < 3; ++k)
        EXPECT_LE(d.layers[l][k], kFloatKernelsBound[l][k]) << "layer." << l << "." << kSites[k];
    EXPECT_LE(d.logits, kFloatKernelsLogitsBound);
    EXPECT_GE(d.agree, kFloatKernelsMinAgreement)
        << "argmax agreement with the float kernels, of " << d.positions;
    EXPECT_GE(d.top10, kFloatKernelsMinTop10)
        << "positions whose float-kernel argmax is among the defaults' 10 highest, of "
        << d.positions;
  }
}

// The defaults on every SIMD variant against the scalar twin, every layer: the integer dots and
// SiTU are bit-identical by contract and the float kernels differ in summation order only
// (~1e-7), so a broken SIMD kernel shows in the layer it enters. One thing moves a layer further
// without any kernel being wrong: a ~1e-7 difference can flip the rounding of a q8 activation
// sitting at a half (up to ~2.5e-5 of the elements at 1e-7, so about one flip is expected over this
// fixture's ~50,000 quantised values), and a flipped q8 value moves its matrix's output by
// ~1e-3. Measured: <= 2.5e-7 through layer 5 on every ISA, then a flip in layer 6's MLA
// attention (2.1e-3; layer 7 1.0e-2, logits 5.4e-3, argmax 20/20). The check: every site within
// 1e-5 up to the first that is not; that one not before layer 4, so that the dense MLP (layer
// 0), KDA (0-2), the routed experts (1-3) and MLA (3) are all compared strictly first; from there
// within 0.05 (a flip's scale with margin), and the logits' argmax equal everywhere.
TEST(QuantDrift, SimdDefaultsEqualTheScalarTwin) {
  const std::vector<k3::Isa> simd = k3::testing::simd_isas();
  if (simd.empty())
    GTEST_SKIP() << "no SIMD variant runs here (avx2: " << k3::testing::isa_left_out(k3::Isa::kAvx2)
                 << "; avx512: " << k3::testing::isa_left_out(k3::Isa::kAvx512)
                 << "): nothing to compare with the scalar twin";
  const Tensors golden(kTinyDir + "/golden.safetensors");
  const PathRun scalar = run_path(k3::LoadOptions{}, k3::Isa::kScalar, golden);
  for (k3::Isa isa : simd) {
    SCOPED_TRACE(k3::isa_name(isa));
    const Drift d = drift(run_path(k3::LoadOptions{}, isa, golden), scalar,
                          std::string("defaults, ") + k3::isa_name(isa) + " vs scalar");
    bool flipped = false;
    for (size_t l = 0; l < d.layers.size(); ++l)
      for (size_t k = 0; k < 3; ++k) {
        if (!flipped && d.layers[l][k] > 1e-5) {
          flipped = true;
          EXPECT_GE(l, 4u) << "layer." << l << "." << kSites[k] << " is the first site over 1e-5 ("
                           << d.layers[l][k] << "): a SIMD kernel differs from its scalar twin";
        }
        EXPECT_LE(d.layers[l][k], flipped ? 0.05 : 1e-5) << "layer." << l << "." << kSites[k];
      }
    EXPECT_LE(d.logits, flipped ? 0.05 : 1e-5);
    EXPECT_EQ(d.agree, d.positions);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Settings, QuantGolden,
    // Measured with K3_ISA unset (scalar, avx2, avx512), K3_ISA=avx2 and K3_ISA=scalar: every
    // variant prints the same four digits of each figure (layer 0 of f32 + idot aside, 3.4e-7 ..
    // 4.7e-7). layer0 / layer1.mlp_out / logits, routing rows, greedy:
    //   f32 + idot:  4.7e-7 / 0.00852 / 0.2608   routing 60/84, greedy 5/8
    //   int8 exact:  0.0158 / 0.0864  / 0.4236   routing 53/84, greedy 5/8
    //   int8 + idot: 0.0255 / 0.0921  / 0.4297   routing 51/84, greedy 4/8 (the int8 matrices
    //                take q8 activations too: ~0.5% more error per matrix)
    //   int4 exact:  0.2432 / 0.529   / 0.9045   routing 16/84, greedy 3/8 (bits 4/8/8, float
    //                                                                        kernels)
    //   defaults:    0.2452 / 0.5277  / 0.8995   routing 16/84, greedy 3/8 (int4 g64 on Gaussian
    //                random weights: ~10% error per matrix, compounding over 8 matrices a layer;
    //                the int4 and int8 matrices also take q8 activations with K3_IDOT=1, ~0.5%
    //                more).
    // Bounds: layer figures x 1.15 (f32 + idot: 1e-5, the f32 summation-order floor); logits
    // + 0.03; routing - 4 rows (a near-tie router flip moves one or two rows; random routing
    // matches ~0 rows: 1 in 1820 a row); greedy - 1 step (garbage logits match ~0 of 8). The int4
    // rows' logits sit near 1.0, where unrelated vectors of the same norm also are, and their
    // rel-L2 is not monotonic in the error (int4 scales 7/6 too coarse measure 0.922, routing
    // 22/84: the layer-0 bound catches that, 0.309). It still fails an int8 lm_head whose odd
    // rows are 30% off (0.993 and 1.053, norm x1.15; the former bound of 1.1 passed it), and the
    // QuantDrift tests above judge the int4 defaults on the same weights.
    ::testing::Values(Setting{"f32_idot", 32, 32, 32, true, 1e-5, 0.0098, 0.29, 56, 4},
                      Setting{"int8_exact", 8, 8, 8, false, 0.0182, 0.0994, 0.454, 49, 4},
                      Setting{"int8_idot", 8, 8, 8, true, 0.0293, 0.106, 0.46, 47, 3},
                      Setting{"int4_exact", 4, 8, 8, false, 0.28, 0.608, 0.935, 12, 2},
                      Setting{"defaults", 4, 8, 8, true, 0.281, 0.576, 0.993, 11, 1}),
    [](const ::testing::TestParamInfo<Setting>& param_info) { return param_info.param.name; });

}  // namespace

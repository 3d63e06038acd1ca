// The chunk (WY / UT) form of the KDA recurrence (KernelTable::kda_head_chunk, kernels/isa.h)
// against the token recurrence: every ISA build, awkward sizes (n = 1, 7, 33, 100; dk = 7 and
// K3's 128; sub-chunks of 16, 32 and 64 rows, n not a multiple of them), the real bounded gate
// a = exp(-5 sigmoid(z)) and decays at the bound over long chunks (where e^G_r e^-G_s over a
// whole chunk would overflow a float).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "io/file.h"
#include "kernels/isa.h"
#include "test_util.h"

namespace {

using k3::testing::kTinyDir;

K3_TWIN_ISA_TESTS(KdaChunk)

// Relative L2 error of the chunk form's outputs and final state against the token recurrence in
// double. The float token recurrence itself lands within ~4e-7 of it on these inputs (printed by
// TokenRecurrenceBaseline); the chunk form re-associates the sums (products over dk and over the
// sub-chunk's rows, decay factors as products of up to 16 steps and their ratios) and measured
// worst 7.0e-7 over every case below (every ISA, sub-chunk, size and gate). 1e-5 leaves room for
// other inputs and fails on any wrong term (a missing decay factor, an off-by-one row, a wrong
// sign all give 1e-3 and more).
constexpr double kChunkTol = 1e-5;

enum class Gate { kRandom, kNearBound, kMild, kMixed };

struct Case {
  size_t n, dk;
  std::vector<float> S0, q, k, v, a, beta;
};

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// Inputs shaped as kda_forward makes them: q and k L2-normalised (q scaled by dk^-1/2), beta a
// sigmoid, a = exp(-5 sigmoid(z)) (config.json's gate_lower_bound = -5).
Case make_case(size_t n, size_t dk, Gate gate, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  Case c;
  c.n = n;
  c.dk = dk;
  c.S0.resize(dk * dk);
  for (float& x : c.S0) x = uni(rng);
  c.q.resize(n * dk);
  c.k.resize(n * dk);
  c.v.resize(n * dk);
  c.a.resize(n * dk);
  c.beta.resize(n);
  for (size_t t = 0; t < n; ++t) {
    double qq = 0, kk = 0;
    for (size_t i = 0; i < dk; ++i) {
      c.q[t * dk + i] = normal(rng);
      c.k[t * dk + i] = normal(rng);
      c.v[t * dk + i] = uni(rng);
      qq += double(c.q[t * dk + i]) * c.q[t * dk + i];
      kk += double(c.k[t * dk + i]) * c.k[t * dk + i];
    }
    const float qs = static_cast<float>(1.0 / std::sqrt(qq + 1e-6) / std::sqrt(double(dk)));
    const float ks = static_cast<float>(1.0 / std::sqrt(kk + 1e-6));
    for (size_t i = 0; i < dk; ++i) {
      c.q[t * dk + i] *= qs;
      c.k[t * dk + i] *= ks;
      float z = 0;
      switch (gate) {
        case Gate::kRandom:
          z = 2.0f * normal(rng);
          break;
        case Gate::kNearBound:  // sigmoid within 1e-4 of 1: every step decays by ~e^-5
          z = 9.5f + normal(rng) * 0.1f;
          break;
        case Gate::kMild:  // a within 1e-3 of 1: the state keeps everything
          z = -9.0f + normal(rng);
          break;
        case Gate::kMixed:  // channels at the bound for a while, then mild (large G, then small
                            // differences: cumulative logs would lose them)
          z = (t % 40 < 20 && i % 2 == 0) ? 9.5f : -9.0f;
          break;
      }
      c.a[t * dk + i] = std::exp(-5.0f * sigmoid(z));
    }
    c.beta[t] = sigmoid(normal(rng));
  }
  return c;
}

double rel_l2(const std::vector<double>& want, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = got[i] - want[i];
    if (!std::isfinite(got[i])) return INFINITY;
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// The token recurrence of kernels/isa.h in double: S = Diag(a) S; u = beta (v - S^T k);
// S += k u^T; o = S^T q.
void reference(const Case& c, std::vector<double>& S, std::vector<double>& o) {
  const size_t dk = c.dk;
  S.assign(c.S0.begin(), c.S0.end());
  o.assign(c.n * dk, 0.0);
  std::vector<double> u(dk);
  for (size_t t = 0; t < c.n; ++t) {
    const float* q = &c.q[t * dk];
    const float* k = &c.k[t * dk];
    const float* a = &c.a[t * dk];
    std::fill(u.begin(), u.end(), 0.0);
    for (size_t i = 0; i < dk; ++i)
      for (size_t j = 0; j < dk; ++j) {
        S[i * dk + j] *= a[i];
        u[j] += k[i] * S[i * dk + j];
      }
    for (size_t j = 0; j < dk; ++j) u[j] = c.beta[t] * (c.v[t * dk + j] - u[j]);
    for (size_t i = 0; i < dk; ++i)
      for (size_t j = 0; j < dk; ++j) {
        S[i * dk + j] += k[i] * u[j];
        o[t * dk + j] += q[i] * S[i * dk + j];
      }
  }
}

struct Errors {
  double out, state;
};

Errors run_chunk(k3::Isa isa, const Case& c, size_t bt, const std::vector<double>& S_ref,
                 const std::vector<double>& o_ref) {
  std::vector<float> S = c.S0, o(c.n * c.dk, NAN);
  std::vector<float> scratch(k3::kda_chunk_scratch_floats(bt, c.dk), NAN);
  k3::kernel_table(isa).kda_head_chunk(S.data(), c.q.data(), c.k.data(), c.v.data(), c.a.data(),
                                       c.dk, c.beta.data(), 1, c.n, c.dk, bt, scratch.data(),
                                       o.data());
  return {rel_l2(o_ref, o), rel_l2(S_ref, S)};
}

Errors run_tokens(k3::Isa isa, const Case& c, const std::vector<double>& S_ref,
                  const std::vector<double>& o_ref) {
  std::vector<float> S = c.S0, o(c.n * c.dk), u(c.dk);
  for (size_t t = 0; t < c.n; ++t)
    k3::kernel_table(isa).kda_head_step(S.data(), &c.q[t * c.dk], &c.k[t * c.dk], &c.v[t * c.dk],
                                        &c.a[t * c.dk], c.beta[t], c.dk, u.data(), &o[t * c.dk]);
  return {rel_l2(o_ref, o), rel_l2(S_ref, S)};
}

const char* gate_name(Gate g) {
  switch (g) {
    case Gate::kRandom:
      return "random";
    case Gate::kNearBound:
      return "near-bound";
    case Gate::kMild:
      return "mild";
    case Gate::kMixed:
      return "mixed";
  }
  return "?";
}

void check_gate(Gate gate, std::initializer_list<size_t> ns) {
  uint32_t seed = 1;
  for (size_t dk : {7u, 128u}) {
    for (size_t n : ns) {
      const Case c = make_case(n, dk, gate, seed++);
      std::vector<double> S_ref, o_ref;
      reference(c, S_ref, o_ref);
      for (k3::Isa isa : k3::testing::twin_isas()) {
        for (size_t bt : {16u, 32u, 64u}) {
          const Errors e = run_chunk(isa, c, bt, S_ref, o_ref);
          const std::string what = std::string(k3::isa_name(isa)) + " " + gate_name(gate) + " dk " +
                                   std::to_string(dk) + " n " + std::to_string(n) + " bt " +
                                   std::to_string(bt);
          EXPECT_LT(e.out, kChunkTol) << what << " outputs";
          EXPECT_LT(e.state, kChunkTol) << what << " state";
        }
      }
    }
  }
}

TEST(KdaChunk, RandomGateMatchesTheTokenRecurrence) {
  check_gate(Gate::kRandom, {1, 7, 33, 100});
}

// Every step decays by ~e^-5: over a 64-row sub-chunk the cumulative log reaches -320, whose
// e^+320 is no float; the block-wise factors must stay finite and exact.
TEST(KdaChunk, DecayAtTheBoundOverLongChunks) {
  check_gate(Gate::kNearBound, {7, 33, 100, 200});
}

// Decays near 1: the state accumulates every row (the solve's triangle is full, not banded).
TEST(KdaChunk, MildDecayMatchesTheTokenRecurrence) {
  check_gate(Gate::kMild, {33, 100});
}

// Channels at the bound for 20 rows, then mild: small differences after a large cumulative log.
TEST(KdaChunk, MixedDecayMatchesTheTokenRecurrence) {
  check_gate(Gate::kMixed, {100, 200});
}

// Sub-chunks of one row and of more rows than the chunk are the same recurrence.
TEST(KdaChunk, AnySubChunkLength) {
  const Case c = make_case(37, 33, Gate::kRandom, 99);
  std::vector<double> S_ref, o_ref;
  reference(c, S_ref, o_ref);
  for (k3::Isa isa : k3::testing::twin_isas())
    for (size_t bt : {1u, 5u, 17u, 48u, 128u}) {
      const Errors e = run_chunk(isa, c, bt, S_ref, o_ref);
      EXPECT_LT(e.out, kChunkTol) << k3::isa_name(isa) << " bt " << bt;
      EXPECT_LT(e.state, kChunkTol) << k3::isa_name(isa) << " bt " << bt;
    }
}

// Row strides as kda_forward passes them: one head of a [n][heads * dk] buffer, beta [n][heads].
TEST(KdaChunk, StridedRowsOfOneHead) {
  const size_t n = 45, dk = 16, heads = 3, h = 1, ld = heads * dk;
  const Case c = make_case(n, dk, Gate::kRandom, 5);
  std::vector<double> S_ref, o_ref;
  reference(c, S_ref, o_ref);
  std::vector<float> q(n * ld, NAN), k(n * ld, NAN), v(n * ld, NAN), a(n * ld, NAN),
      beta(n * heads, NAN);
  for (size_t t = 0; t < n; ++t) {
    for (size_t i = 0; i < dk; ++i) {
      q[t * ld + h * dk + i] = c.q[t * dk + i];
      k[t * ld + h * dk + i] = c.k[t * dk + i];
      v[t * ld + h * dk + i] = c.v[t * dk + i];
      a[t * ld + h * dk + i] = c.a[t * dk + i];
    }
    beta[t * heads + h] = c.beta[t];
  }
  for (k3::Isa isa : k3::testing::twin_isas()) {
    std::vector<float> S = c.S0, o(n * ld, -7.0f);
    std::vector<float> scratch(k3::kda_chunk_scratch_floats(32, dk));
    k3::kernel_table(isa).kda_head_chunk(S.data(), q.data() + h * dk, k.data() + h * dk,
                                         v.data() + h * dk, a.data() + h * dk, ld, beta.data() + h,
                                         heads, n, dk, 32, scratch.data(), o.data() + h * dk);
    std::vector<float> oh(n * dk);
    for (size_t t = 0; t < n; ++t)
      for (size_t i = 0; i < ld; ++i) {
        if (i / dk == h)
          oh[t * dk + i % dk] = o[t * ld + i];
        else
          ASSERT_EQ(o[t * ld + i], -7.0f) << "wrote outside its head: row " << t << " lane " << i;
      }
    EXPECT_LT(rel_l2(o_ref, oh), kChunkTol) << k3::isa_name(isa);
    EXPECT_LT(rel_l2(S_ref, S), kChunkTol) << k3::isa_name(isa);
  }
}

// What the float token recurrence itself reaches against the double reference (the scale the
// tolerance above is set against), and the chunk form beside it: printed, and bounded by it.
TEST(KdaChunk, TokenRecurrenceBaseline) {
  for (Gate gate : {Gate::kRandom, Gate::kNearBound, Gate::kMild, Gate::kMixed}) {
    const Case c = make_case(200, 128, gate, 1234);
    std::vector<double> S_ref, o_ref;
    reference(c, S_ref, o_ref);
    for (k3::Isa isa : k3::testing::twin_isas()) {
      const Errors tok = run_tokens(isa, c, S_ref, o_ref);
      const Errors chk = run_chunk(isa, c, 64, S_ref, o_ref);
      std::printf("%-7s %-10s token: out %.2e state %.2e | chunk(64): out %.2e state %.2e\n",
                  k3::isa_name(isa), gate_name(gate), tok.out, tok.state, chk.out, chk.state);
      EXPECT_LT(tok.out, kChunkTol);
      EXPECT_LT(chk.out, kChunkTol);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The model with K3_KDA_CHUNKED (LoadOptions::kda_chunked) against without.

struct RunLogits {
  std::vector<float> prefill;  // [T][vocab], every prompt position
  std::vector<float> decoded;  // 3 decode steps after the prompt
};

RunLogits run_model(const std::string& dir, k3::LoadOptions load, bool chunked,
                    const std::vector<int64_t>& prompt, int64_t chunk) {
  load.kda_chunked = chunked;
  const k3::Engine engine(dir, load);
  RunLogits out;
  k3::Session s(engine, static_cast<int64_t>(prompt.size()) + 4);
  s.set_prefill_chunk(chunk);
  k3::PrefillHooks hooks;
  hooks.all_logits = &out.prefill;
  s.prefill(prompt, hooks);
  for (int64_t id : {3, 1, 4}) {
    const std::vector<float>& l = s.step(id);
    out.decoded.insert(out.decoded.end(), l.begin(), l.end());
  }
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const std::string kMini = std::string(K3_SOURCE_DIR) + "/assets/k3-mini";

std::vector<int64_t> random_prompt(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> ids(n);
  for (auto& id : ids) id = static_cast<int64_t>(rng() % 1000u);
  return ids;
}

// The first n ids of the held-out text of the trained model (tests/data/k3-mini).
std::vector<int64_t> heldout_prompt(size_t n) {
  const std::string path = std::string(K3_SOURCE_DIR) + "/tests/data/k3-mini/heldout_text.u32";
  std::ifstream f(path, std::ios::binary);
  std::vector<uint32_t> raw(n);
  f.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(n * 4));
  EXPECT_EQ(static_cast<size_t>(f.gcount()), n * 4) << path << ": fewer than " << n << " ids";
  return std::vector<int64_t>(raw.begin(), raw.end());
}

// Chunks of one row never take the chunk form: on at K3_CHUNK=1 is off, bit for bit (prefill and
// decode), at the exact setting and the default one.
TEST(KdaChunkModel, ChunkOfOneRowIsBitIdentical) {
  const auto prompt = random_prompt(40, 3);
  for (const k3::LoadOptions& load : {k3::LoadOptions::exact(), k3::LoadOptions{}}) {
    const RunLogits off = run_model(kTinyDir, load, false, prompt, 1);
    const RunLogits on = run_model(kTinyDir, load, true, prompt, 1);
    EXPECT_TRUE(bitwise_equal(off.prefill, on.prefill)) << "bits " << load.bits;
    EXPECT_TRUE(bitwise_equal(off.decoded, on.decoded)) << "bits " << load.bits;
  }
}

// Per position: the largest relative L2 distance of the logits, and how many argmaxes differ.
struct LogitsDiff {
  double worst_rel = 0, mean_rel = 0;
  size_t argmax_differ = 0, positions = 0;
};

LogitsDiff compare_logits(const std::vector<float>& want, const std::vector<float>& got,
                          size_t vocab) {
  LogitsDiff d;
  EXPECT_EQ(want.size(), got.size());
  for (size_t t = 0; t * vocab < std::min(want.size(), got.size()); ++t) {
    const float* w = want.data() + t * vocab;
    const float* g = got.data() + t * vocab;
    const double rel = k3::testing::closeness(g, w, vocab).rel_l2;
    d.worst_rel = std::max(d.worst_rel, rel);
    d.mean_rel += rel;
    ++d.positions;
    if (std::max_element(w, w + vocab) - w != std::max_element(g, g + vocab) - g) ++d.argmax_differ;
  }
  if (d.positions > 0) d.mean_rel /= static_cast<double>(d.positions);
  return d;
}

// A prefill of the trained model (assets/k3-mini: real text, trained gates) with the chunk form
// against the token recurrence, at chunks of 32 rows (sub-chunks of 64 cut short) and of the whole
// 150-token prompt, then three decode steps on the state it left.
// Exact setting (f32 weights): the KDA outputs differ by ~1e-7 relative (the KdaChunk tests
// above), carried through 8 layers; measured worst logits rel-L2 3.4e-7: bound 1e-5, and every
// greedy token the same.
// Default setting (int4 matrices on int8 activations): a 1e-7 difference can move an activation
// across a quantisation step or a router near a tie, which moves a row by ~1e-3..1e-2 (measured
// mean 6.3e-4, worst 1.8e-2). Bounded against the setting's own distance from exact (the
// quantisation, measured mean 2.7e-2): the chunk form must stay a tenth of it on average, the
// worst row under 5e-2, and at most 2% of the prompt's greedy tokens may change (measured 0 of
// 150; a dropped decay factor or a wrong row gives 1e-1 and more everywhere). The decode steps
// after it are bounded in distance only: one of three measured changed its greedy token (a near
// tie).
TEST(KdaChunkModel, PrefillLogitsCloseToTheTokenRecurrence) {
  const auto prompt = heldout_prompt(150);
  const RunLogits exact_off = run_model(kMini, k3::LoadOptions::exact(), false, prompt, 32);
  const size_t vocab = exact_off.prefill.size() / prompt.size();
  for (const bool exact : {true, false}) {
    const k3::LoadOptions load = exact ? k3::LoadOptions::exact() : k3::LoadOptions{};
    const char* name = exact ? "exact" : "default";
    const RunLogits off = exact ? exact_off : run_model(kMini, load, false, prompt, 32);
    const double quant = compare_logits(exact_off.prefill, off.prefill, vocab).mean_rel;
    for (int64_t chunk : {32, 4096}) {
      const RunLogits on = run_model(kMini, load, true, prompt, chunk);
      const LogitsDiff pre = compare_logits(off.prefill, on.prefill, vocab);
      const LogitsDiff dec = compare_logits(off.decoded, on.decoded, vocab);
      std::printf(
          "k3-mini %-7s chunk %4lld: prefill rel-L2 mean %.2e worst %.2e (%zu of %zu "
          "argmax differ; this setting vs exact: mean %.2e), decode mean %.2e worst "
          "%.2e (%zu of %zu differ)\n",
          name, static_cast<long long>(chunk), pre.mean_rel, pre.worst_rel, pre.argmax_differ,
          pre.positions, quant, dec.mean_rel, dec.worst_rel, dec.argmax_differ, dec.positions);
      const std::string what = std::string(name) + " chunk " + std::to_string(chunk);
      EXPECT_FALSE(bitwise_equal(off.prefill, on.prefill)) << what << ": the option did nothing";
      if (exact) {
        EXPECT_LT(pre.worst_rel, 1e-5) << what;
        EXPECT_LT(dec.worst_rel, 1e-5) << what;
        EXPECT_EQ(pre.argmax_differ + dec.argmax_differ, 0u) << what;
      } else {
        EXPECT_LT(pre.mean_rel, 0.1 * quant) << what;
        EXPECT_LT(pre.worst_rel, 5e-2) << what;
        EXPECT_LT(dec.worst_rel, 5e-2) << what;
        EXPECT_LE(pre.argmax_differ, prompt.size() / 50) << what;
      }
    }
  }
}

}  // namespace

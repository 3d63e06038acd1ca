// The KDA head step and the MLA head attention: every ISA build against the scalar twin and
// against a double-precision reference of the equations, on awkward sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/isa.h"
#include "test_util.h"

namespace {

// The SIMD variants twin_isas() leaves out, as skipped tests (tests/test_util.h).
K3_TWIN_ISA_TESTS(AttentionKernels)

constexpr double kAttentionTol = 2e-5;  // relative to the largest magnitude of the reference

std::vector<float> random_vector(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void expect_near_rel(const std::vector<double>& want, const float* got, const std::string& what) {
  double scale = 1e-30;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], kAttentionTol * scale) << what << " index " << i;
}

TEST(KernelsKdaHeadStep, EveryIsaMatchesTheEquations) {
  std::mt19937 rng(7);
  for (size_t dk : {1u, 7u, 16u, 33u, 128u}) {
    const auto S0 = random_vector(rng, dk * dk, -1, 1);
    const auto q = random_vector(rng, dk, -0.3f, 0.3f), k = random_vector(rng, dk, -0.3f, 0.3f);
    const auto v = random_vector(rng, dk, -1, 1), a = random_vector(rng, dk, 0.01f, 1.0f);
    const float beta = 0.7f;
    // Reference in double.
    std::vector<double> S(S0.begin(), S0.end()), u(dk, 0.0), o(dk, 0.0);
    for (size_t i = 0; i < dk; ++i)
      for (size_t j = 0; j < dk; ++j) S[i * dk + j] *= a[i];
    for (size_t i = 0; i < dk; ++i)
      for (size_t j = 0; j < dk; ++j) u[j] += k[i] * S[i * dk + j];
    for (size_t j = 0; j < dk; ++j) u[j] = beta * (v[j] - u[j]);
    for (size_t i = 0; i < dk; ++i)
      for (size_t j = 0; j < dk; ++j) S[i * dk + j] += k[i] * u[j];
    for (size_t i = 0; i < dk; ++i)
      for (size_t j = 0; j < dk; ++j) o[j] += q[i] * S[i * dk + j];
    for (k3::Isa isa : k3::testing::twin_isas()) {
      std::vector<float> state = S0, scratch(dk), out(dk);
      k3::kernel_table(isa).kda_head_step(state.data(), q.data(), k.data(), v.data(), a.data(),
                                          beta, dk, scratch.data(), out.data());
      const std::string what = std::string(k3::isa_name(isa)) + " dk " + std::to_string(dk);
      expect_near_rel(o, out.data(), what + " output");
      expect_near_rel(S, state.data(), what + " state");
    }
  }
}

TEST(KernelsMlaHeadAttend, EveryIsaMatchesTheEquations) {
  std::mt19937 rng(11);
  for (size_t kv : {1u, 7u, 32u, 100u, 512u}) {
    for (size_t rope : {0u, 3u, 64u}) {
      for (size_t T : {1u, 5u, 17u}) {
        const auto qabs = random_vector(rng, kv, -1, 1), q_pe = random_vector(rng, rope, -1, 1);
        const auto latent = random_vector(rng, T * kv, -1, 1),
                   pe = random_vector(rng, T * rope, -1, 1);
        const float scale = 0.125f;
        std::vector<double> s(T), lat(kv, 0.0);
        double mx = -1e300, sum = 0;
        for (size_t j = 0; j < T; ++j) {
          double d = 0;
          for (size_t r = 0; r < kv; ++r) d += static_cast<double>(qabs[r]) * latent[j * kv + r];
          for (size_t r = 0; r < rope; ++r) d += static_cast<double>(q_pe[r]) * pe[j * rope + r];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (size_t j = 0; j < T; ++j)
          for (size_t r = 0; r < kv; ++r) lat[r] += s[j] / sum * latent[j * kv + r];
        for (k3::Isa isa : k3::testing::twin_isas()) {
          std::vector<float> scores(T), out(kv);
          k3::kernel_table(isa).mla_head_attend(qabs.data(), q_pe.data(), latent.data(), pe.data(),
                                                T, kv, rope, scale, scores.data(), out.data());
          expect_near_rel(lat, out.data(),
                          std::string(k3::isa_name(isa)) + " kv " + std::to_string(kv) + " rope " +
                              std::to_string(rope) + " T " + std::to_string(T));
        }
      }
    }
  }
}

}  // namespace

// kernels/vec.h — elementwise and reduction helpers on f32 vectors: RMSNorm, L2 norm,
// activations (sigmoid, SiLU, SiTU-GLU), softmax. Scalar, deterministic.
#pragma once

#include <cmath>
#include <cstddef>

#include "kernels/situ_poly.h"

namespace k3 {

inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
inline float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

// The exp and tanh of SiTU, in plain f32 multiplies, adds, divides and compares (no FMA, no libm),
// so that the AVX2 and AVX-512 SiTU kernels (KernelTable::situ_glu, kernels/impl/situ_*.cpp)
// reproduce them bit for bit on every lane; ~1-2 ulp from the correctly rounded values
// (tests/kernels_test.cpp checks against double precision). NaN comes back as the NaN it
// was given.
//
// situ_exp: e^x = 2^n e^r, n = round(x / ln 2), e^r by Cephes' degree-7 expf polynomial
// (kernels/situ_poly.h has the numbers and the steps).
inline float situ_exp(float x) {
  using namespace situ_poly;
  if (x != x) return x;
  x = x < kExpMin ? kExpMin : x;
  x = x > kExpMax ? kExpMax : x;
  const float n = std::nearbyint(x * kLog2e);
  float r = x - n * kLn2High;
  r = r - n * kLn2Low;
  const float z = r * r;
  float p = kExpPoly[0];
  for (size_t k = 1; k < sizeof(kExpPoly) / sizeof(kExpPoly[0]); ++k) p = p * r + kExpPoly[k];
  p = p * z + r + 1.0f;
  const int exponent_bits = (static_cast<int>(n) + 127) << 23;
  float scale;
  static_assert(sizeof(scale) == sizeof(exponent_bits));
  __builtin_memcpy(&scale, &exponent_bits, sizeof(scale));
  return p * scale;
}
// situ_tanh: below |x| = 0.625 Cephes' odd tanhf polynomial x + x^3 P(x^2); above,
// sign(x) (1 - e) / (1 + e) with e = situ_exp(-2|x|) (no overflow; 1 - e >= 0.71 loses nothing
// to cancellation; saturates at +-1).
inline float situ_tanh(float x) {
  using namespace situ_poly;
  if (x != x) return x;
  const float ax = x < 0.0f ? -x : x;
  if (ax < kTanhSmall) {
    const float z = x * x;
    float p = kTanhPoly[0];
    for (size_t k = 1; k < sizeof(kTanhPoly) / sizeof(kTanhPoly[0]); ++k) p = p * z + kTanhPoly[k];
    return p * z * x + x;
  }
  const float e = situ_exp(-2.0f * ax);
  const float t = (1.0f - e) / (1.0f + e);
  return x < 0.0f ? -t : t;
}

// SiTU-GLU: [beta * tanh(g / beta) * sigmoid(g)] * [beta_linear * tanh(u / beta_linear)], with
// situ_tanh and sigmoid(g) = 1 / (1 + situ_exp(-g)), in this order of operations (the SIMD
// kernels follow it).
inline float situ(float g, float u, float beta, float beta_linear) {
  const float sig = 1.0f / (1.0f + situ_exp(-g));
  return beta * situ_tanh(g / beta) * sig * (beta_linear * situ_tanh(u / beta_linear));
}

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]   (mean accumulated in f64). out may alias x.
void rmsnorm(const float* x, const float* weight, size_t n, double eps, float* out);

// x /= sqrt(sum(x^2) + eps), in place (sum accumulated in f64).
void l2_normalize(float* x, size_t n, double eps);

// In-place numerically stable softmax (max subtracted), f32 exp, f64 sum.
void softmax(float* x, size_t n);

// sum x[i] y[i], accumulated in f64.
double dot_f64(const float* x, const float* y, size_t n);

}  // namespace k3

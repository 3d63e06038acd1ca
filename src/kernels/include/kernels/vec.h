// kernels/vec.h — elementwise and reduction helpers on f32 vectors: RMSNorm, L2 norm,
// activations (sigmoid, SiLU, SiTU-GLU), softmax. Scalar, deterministic.
#pragma once

#include <cmath>
#include <cstddef>

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
// situ_exp: e^x = 2^n e^r, x clamped to [-87, 88] (so 2^n and the result stay normal floats:
// e^-87 = 1.6e-38, e^88 = 1.7e38), n = round(x / ln 2), r = x - n ln 2 in two parts (the first
// with 9 bits, so n * it is exact), e^r by Cephes' degree-7 expf polynomial on |r| <= ln(2) / 2.
inline float situ_exp(float x) {
  if (x != x) return x;
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
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
  if (x != x) return x;
  const float ax = x < 0.0f ? -x : x;
  if (ax < 0.625f) {
    const float z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
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

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

// SiTU-GLU: [beta * tanh(g / beta) * sigmoid(g)] * [beta_linear * tanh(u / beta_linear)].
inline float situ(float g, float u, float beta, float beta_linear) {
  return beta * std::tanh(g / beta) * sigmoid(g) * (beta_linear * std::tanh(u / beta_linear));
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

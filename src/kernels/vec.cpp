#include "kernels/vec.h"

#include <algorithm>

namespace k3 {

void rmsnorm(const float* x, const float* weight, size_t n, double eps, float* out) {
  double ss = 0.0;
  for (size_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (size_t i = 0; i < n; ++i) out[i] = x[i] * inv * weight[i];
}

void l2_normalize(float* x, size_t n, double eps) {
  double ss = 0.0;
  for (size_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss + eps));
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
}

void softmax(float* x, size_t n) {
  if (n == 0) return;
  const float mx = *std::max_element(x, x + n);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
}

double dot_f64(const float* x, const float* y, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * y[i];
  return s;
}

}  // namespace k3

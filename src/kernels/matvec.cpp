#include "kernels/matvec.h"

#include <cstdint>

namespace k3 {
namespace {

inline float dot_f32(const float* a, const float* b, size_t n) {
  // Four independent partial sums in a fixed order: deterministic and vectorisable.
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace

void matvec_f32(const float* W, size_t rows, size_t cols, const float* x, float* y) {
  const int64_t n = static_cast<int64_t>(rows);
#pragma omp parallel for schedule(static) if (rows * cols > (1u << 16))
  for (int64_t o = 0; o < n; ++o) y[o] = dot_f32(W + static_cast<size_t>(o) * cols, x, cols);
}

void matmul_f32(const float* W, size_t rows, size_t cols, const float* X, size_t n_rows, float* Y) {
  const int64_t n = static_cast<int64_t>(rows);
#pragma omp parallel for schedule(static) if (rows * cols * n_rows > (1u << 16))
  for (int64_t o = 0; o < n; ++o) {
    const float* w = W + static_cast<size_t>(o) * cols;
    for (size_t t = 0; t < n_rows; ++t) Y[t * rows + static_cast<size_t>(o)] = dot_f32(w, X + t * cols, cols);
  }
}

}  // namespace k3

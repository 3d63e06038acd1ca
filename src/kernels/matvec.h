// kernels/matvec.h — dense f32 matrix times activations, W[out][in] row-major (nn.Linear).
// Parallel over output rows (OpenMP); each output is one f32 dot product in input order, so the
// result does not depend on the thread count.
#pragma once

#include <cstddef>

namespace k3 {

// y[o] = sum_i W[o][i] x[i].  W: [rows][cols], x: [cols], y: [rows].
void matvec_f32(const float* W, size_t rows, size_t cols, const float* x, float* y);

// Y[t][o] = sum_i W[o][i] X[t][i] for t in [0, n_rows). Each weight row is read once for all
// activation rows. X: [n_rows][cols], Y: [n_rows][rows].
void matmul_f32(const float* W, size_t rows, size_t cols, const float* X, size_t n_rows, float* Y);

}  // namespace k3

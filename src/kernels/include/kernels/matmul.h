// kernels/matmul.h — threaded matrix x activations for every weight format, over a chosen
// KernelTable. One OpenMP region per call, rows split in contiguous blocks: the result does not
// depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/isa.h"
#include "kernels/quant.h"

namespace k3 {

// Y[t][o] = (W X[t])[o] for t < n.  X: [n][W.cols], Y: [n][W.rows]. An int4 or int8 matrix
// flagged int8_activations (K3_IDOT) quantises X with quantize_q8_32 and takes its integer-dot
// kernel; the scratch for that is per thread and reused (no allocation once warm). (It is
// matmul_row_ranges on every row.)
void matmul(const KernelTable& k, const WeightMatrix& W, const float* X, size_t n, float* Y);

// Output rows [begin, end) of a matrix.
struct RowRange {
  size_t begin = 0;
  size_t end = 0;
};
// matmul() on some output rows only: Y[t][o] for o in one of `ranges` (sorted, disjoint, within
// W.rows), each bit-identical to matmul()'s Y[t][o] (every kernel's row does not depend on which
// rows it is computed with: tests/dense_kernels_test.cpp); the other rows of Y are not written.
// One OpenMP region, the ranges' rows split across the threads together. (The grammar-constrained
// head: src/engine/engine.cpp, Session::restrict_next_logits.)
void matmul_row_ranges(const KernelTable& k, const WeightMatrix& W, const float* X, size_t n,
                       std::span<const RowRange> ranges, float* Y);

// Several matrices applied to the same single activation row in one parallel region (the rows
// of all jobs are split across the threads together): one fork/join instead of one per matrix.
struct MatmulJob {
  const WeightMatrix* W;  // [rows][cols], cols equal across the jobs
  float* Y;               // [rows]
};
void matmul_batch(const KernelTable& k, const MatmulJob* jobs, size_t count, const float* x);

// Single-threaded pieces for callers that parallelise over something else (MLA heads):
// y[o - row_begin] = (W x)[o] for o in [row_begin, row_end).
void matmul_rows(const KernelTable& k, const WeightMatrix& W, size_t row_begin, size_t row_end,
                 const float* x, float* y);
// out[c] += sum_{r < count} coeffs[r] * W[row_begin + r][c]  for c < W.cols  (W^T times a vector
// restricted to a row block; dequantises on the fly).
void accumulate_rows_transposed(const WeightMatrix& W, size_t row_begin, size_t count,
                                const float* coeffs, float* out);

// An MXFP4 matrix straight from the checkpoint bytes: packed [rows][cols/2], scales
// [rows][cols/32].
struct Mxfp4Matrix {
  const uint8_t* packed = nullptr;
  const uint8_t* scales = nullptr;
  size_t rows = 0;
  size_t cols = 0;
};

// Exact float path.  X: [n][cols], Y: [n][rows].
void matmul_mxfp4_exact(const KernelTable& k, const Mxfp4Matrix& W, const float* X, size_t n,
                        float* Y);
// Integer path on pre-quantised activations.  Q8: [n][cols], D: [n][cols/32], Y: [n][rows].
void matmul_mxfp4_idot(const KernelTable& k, const Mxfp4Matrix& W, const int8_t* Q8, const float* D,
                       size_t n, float* Y);
// int4-g64 matrix on pre-quantised activations (the int4 idot contract of kernels/isa.h; the
// result does not depend on the thread count).  Q8: [n][W.cols], D: [n][W.cols/32] from
// quantize_q8_32, Y: [n][W.rows]. Throws k3::Error unless W is int4-g64.
void matmul_int4_idot(const KernelTable& k, const WeightMatrix& W, const int8_t* Q8, const float* D,
                      size_t n, float* Y);
// int8-per-row matrix on pre-quantised activations (the int8 idot contract of kernels/isa.h; the
// result does not depend on the thread count).  Q8: [n][W.cols], D: [n][W.cols/32] from
// quantize_q8_32, Y: [n][W.rows]. Throws k3::Error unless W is int8 per row with
// W.cols % 32 == 0.
void matmul_int8_idot(const KernelTable& k, const WeightMatrix& W, const int8_t* Q8, const float* D,
                      size_t n, float* Y);
// Quantises n activation rows for the integer path.  X: [n][cols] -> Q8 [n][cols], D [n][cols/32].
void quantize_q8_32(const KernelTable& k, const float* X, size_t n, size_t cols, int8_t* Q8,
                    float* D);

// The SiTU-GLU of an MLP's gate and up rows, in place: gate[i] = situ(gate[i], up[i], beta,
// beta_linear) (kernels/vec.h, bit for bit: KernelTable::situ_glu) for i < count; with Q8 given,
// each 32-group of the result is then quantised for the down projection's integer path
// (quantize_q8_32: Q8 [count], D [count / 32]; count % 32 == 0, else k3::Error). The 32-groups
// are split across the threads in contiguous blocks, and every element and group is computed as
// one thread computes it, so the result does not depend on the thread count.
void situ_glu(const KernelTable& k, float* gate, const float* up, size_t count, float beta,
              float beta_linear, int8_t* Q8 = nullptr, float* D = nullptr);

}  // namespace k3

#include "kernels/matmul.h"

#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "util/error.h"

namespace k3 {
namespace {

// Splits [0, rows) into one contiguous block per thread and calls body(begin, end). A single
// thread runs small problems (fork/join would cost more than the work).
template <typename Body>
void split_rows(size_t rows, size_t work, const Body& body) {
  const int threads =
      work < (size_t{1} << 15) ? 1 : std::min<int>(omp_get_max_threads(), static_cast<int>(rows));
  if (threads <= 1) {
    body(size_t{0}, rows);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const size_t t = static_cast<size_t>(omp_get_thread_num());
    const size_t nt = static_cast<size_t>(omp_get_num_threads());
    const size_t begin = rows * t / nt, end = rows * (t + 1) / nt;
    if (begin < end) body(begin, end);
  }
}

// The calling thread's q8 activations: X [n][cols] -> Q8 [n][cols], D [n][cols / 32], in
// buffers that grow once and are reused.
struct Q8Rows {
  const int8_t* q8;
  const float* d;
};
Q8Rows quantized_rows(const KernelTable& k, const float* X, size_t n, size_t cols) {
  thread_local std::vector<int8_t> q8;
  thread_local std::vector<float> d;
  if (q8.size() < n * cols) q8.resize(n * cols);
  if (d.size() < n * (cols / 32)) d.resize(n * (cols / 32));
  for (size_t t = 0; t < n; ++t)
    k.quantize_q8_32(X + t * cols, cols, q8.data() + t * cols, d.data() + t * (cols / 32));
  return {q8.data(), d.data()};
}

// One table call: Y[t][o] = (W X[t])[o] for t < n, o in [begin, end), Y's rows `rows` apart; an
// int8_activations matrix reads the quantised X (q), the others X itself.
void table_rows(const KernelTable& k, const WeightMatrix& W, const float* X, const Q8Rows& q,
                size_t n, float* Y, size_t begin, size_t end) {
  const size_t rows = static_cast<size_t>(W.rows), cols = static_cast<size_t>(W.cols);
  switch (W.format) {
    case WeightFormat::kF32:
      k.matmul_f32(W.f32_data(), cols, X, n, Y, rows, begin, end);
      break;
    case WeightFormat::kInt8Row:
      if (W.int8_activations)
        k.matmul_int8_idot(W.q8_data(), W.scale_data(), cols, q.q8, q.d, n, Y, rows, begin, end);
      else
        k.matmul_int8(W.q8_data(), W.scale_data(), cols, X, n, Y, rows, begin, end);
      break;
    case WeightFormat::kInt4G64:
      if (W.int8_activations)
        k.matmul_int4_idot(W.q4_data(), W.scale_data(), cols, q.q8, q.d, n, Y, rows, begin, end);
      else
        k.matmul_int4(W.q4_data(), W.scale_data(), cols, X, n, Y, rows, begin, end);
      break;
  }
}

}  // namespace

void matmul(const KernelTable& k, const WeightMatrix& W, const float* X, size_t n, float* Y) {
  const RowRange all{0, static_cast<size_t>(W.rows)};
  matmul_row_ranges(k, W, X, n, {&all, 1}, Y);
}

void matmul_row_ranges(const KernelTable& k, const WeightMatrix& W, const float* X, size_t n,
                       std::span<const RowRange> ranges, float* Y) {
  const size_t rows = static_cast<size_t>(W.rows), cols = static_cast<size_t>(W.cols);
  size_t total = 0;
  for (const RowRange& r : ranges) {
    if (r.begin > r.end || r.end > rows)
      throw Error("matmul_row_ranges: rows [" + std::to_string(r.begin) + ", " +
                  std::to_string(r.end) + ") outside the matrix's " + std::to_string(rows));
    total += r.end - r.begin;
  }
  if (W.int8_activations && W.format == WeightFormat::kInt8Row && cols % 32 != 0)
    throw Error("matmul: an int8 matrix on int8 activations needs a multiple of 32 columns, not " +
                std::to_string(cols) + " (quantize_q8_32 has no tail)");
  const Q8Rows q = W.int8_activations ? quantized_rows(k, X, n, cols) : Q8Rows{};
  // [begin, end) of the ranges' rows laid end to end -> each range's piece of it.
  split_rows(total, total * cols * n, [&](size_t begin, size_t end) {
    size_t base = 0;
    for (size_t i = 0; i < ranges.size() && base < end; ++i) {
      const size_t length = ranges[i].end - ranges[i].begin;
      const size_t lo = std::max(begin, base), hi = std::min(end, base + length);
      if (lo < hi)
        table_rows(k, W, X, q, n, Y, ranges[i].begin + (lo - base), ranges[i].begin + (hi - base));
      base += length;
    }
  });
}

void matmul_batch(const KernelTable& k, const MatmulJob* jobs, size_t count, const float* x) {
  size_t total_rows = 0, work = 0;
  bool any_int8_activations = false;
  for (size_t j = 0; j < count; ++j) {
    total_rows += static_cast<size_t>(jobs[j].W->rows);
    work += static_cast<size_t>(jobs[j].W->rows * jobs[j].W->cols);
    any_int8_activations = any_int8_activations || jobs[j].W->int8_activations;
  }
  // One quantisation of x serves every flagged job (the jobs share x, hence cols).
  const Q8Rows q = any_int8_activations
                       ? quantized_rows(k, x, 1, static_cast<size_t>(jobs[0].W->cols))
                       : Q8Rows{};
  split_rows(total_rows, work, [&](size_t begin, size_t end) {
    size_t base = 0;
    for (size_t j = 0; j < count && base < end; ++j) {
      const WeightMatrix& W = *jobs[j].W;
      const size_t rows = static_cast<size_t>(W.rows);
      const size_t lo = std::max(begin, base), hi = std::min(end, base + rows);
      if (lo < hi) table_rows(k, W, x, q, 1, jobs[j].Y, lo - base, hi - base);
      base += rows;
    }
  });
}

void matmul_rows(const KernelTable& k, const WeightMatrix& W, size_t row_begin, size_t row_end,
                 const float* x, float* y) {
  const size_t cols = static_cast<size_t>(W.cols), count = row_end - row_begin;
  switch (W.format) {
    case WeightFormat::kF32:
      k.matmul_f32(W.f32_data() + row_begin * cols, cols, x, 1, y, count, 0, count);
      break;
    case WeightFormat::kInt8Row:
      if (W.int8_activations) {
        const Q8Rows q = quantized_rows(k, x, 1, cols);
        k.matmul_int8_idot(W.q8_data() + row_begin * cols, W.scale_data() + row_begin, cols, q.q8,
                           q.d, 1, y, count, 0, count);
      } else {
        k.matmul_int8(W.q8_data() + row_begin * cols, W.scale_data() + row_begin, cols, x, 1, y,
                      count, 0, count);
      }
      break;
    case WeightFormat::kInt4G64:
      if (W.int8_activations) {
        const Q8Rows q = quantized_rows(k, x, 1, cols);
        k.matmul_int4_idot(W.q4_data() + row_begin * cols / 2,
                           W.scale_data() + row_begin * cols / 64, cols, q.q8, q.d, 1, y, count, 0,
                           count);
      } else {
        k.matmul_int4(W.q4_data() + row_begin * cols / 2, W.scale_data() + row_begin * cols / 64,
                      cols, x, 1, y, count, 0, count);
      }
      break;
  }
}

void accumulate_rows_transposed(const WeightMatrix& W, size_t row_begin, size_t count,
                                const float* coeffs, float* out) {
  const size_t cols = static_cast<size_t>(W.cols);
  for (size_t r = 0; r < count; ++r) {
    const size_t row = row_begin + r;
    const float c = coeffs[r];
    switch (W.format) {
      case WeightFormat::kF32: {
        const float* w = W.f32_data() + row * cols;
        for (size_t i = 0; i < cols; ++i) out[i] += c * w[i];
        break;
      }
      case WeightFormat::kInt8Row: {
        const int8_t* q = W.q8_data() + row * cols;
        const float cs = c * W.scale_data()[row];
        for (size_t i = 0; i < cols; ++i) out[i] += cs * static_cast<float>(q[i]);
        break;
      }
      case WeightFormat::kInt4G64: {
        const uint8_t* p = W.q4_data() + row * cols / 2;
        const float* s = W.scale_data() + row * cols / 64;
        for (size_t g = 0; g < cols / 64; ++g) {
          const float cs = c * s[g];
          for (size_t j = 0; j < 32; ++j) {
            const uint8_t b = p[g * 32 + j];
            out[g * 64 + 2 * j] += cs * static_cast<float>(static_cast<int>(b & 0xF) - 8);
            out[g * 64 + 2 * j + 1] += cs * static_cast<float>(static_cast<int>(b >> 4) - 8);
          }
        }
        break;
      }
    }
  }
}

void matmul_mxfp4_exact(const KernelTable& k, const Mxfp4Matrix& W, const float* X, size_t n,
                        float* Y) {
  split_rows(W.rows, W.rows * W.cols * n, [&](size_t begin, size_t end) {
    k.matmul_mxfp4_exact(W.packed, W.scales, W.cols, X, n, Y, W.rows, begin, end);
  });
}

void matmul_mxfp4_idot(const KernelTable& k, const Mxfp4Matrix& W, const int8_t* Q8, const float* D,
                       size_t n, float* Y) {
  split_rows(W.rows, W.rows * W.cols * n, [&](size_t begin, size_t end) {
    k.matmul_mxfp4_idot(W.packed, W.scales, W.cols, Q8, D, n, Y, W.rows, begin, end);
  });
}

void matmul_int4_idot(const KernelTable& k, const WeightMatrix& W, const int8_t* Q8, const float* D,
                      size_t n, float* Y) {
  if (W.format != WeightFormat::kInt4G64)
    throw Error(std::string("matmul_int4_idot: the matrix is ") + weight_format_name(W.format) +
                ", not int4-g64");
  const size_t rows = static_cast<size_t>(W.rows), cols = static_cast<size_t>(W.cols);
  split_rows(rows, rows * cols * n, [&](size_t begin, size_t end) {
    k.matmul_int4_idot(W.q4_data(), W.scale_data(), cols, Q8, D, n, Y, rows, begin, end);
  });
}

void matmul_int8_idot(const KernelTable& k, const WeightMatrix& W, const int8_t* Q8, const float* D,
                      size_t n, float* Y) {
  if (W.format != WeightFormat::kInt8Row)
    throw Error(std::string("matmul_int8_idot: the matrix is ") + weight_format_name(W.format) +
                ", not int8");
  const size_t rows = static_cast<size_t>(W.rows), cols = static_cast<size_t>(W.cols);
  if (cols % 32 != 0)
    throw Error("matmul_int8_idot: " + std::to_string(cols) +
                " columns is not a multiple of 32 (quantize_q8_32 has no tail)");
  split_rows(rows, rows * cols * n, [&](size_t begin, size_t end) {
    k.matmul_int8_idot(W.q8_data(), W.scale_data(), cols, Q8, D, n, Y, rows, begin, end);
  });
}

void quantize_q8_32(const KernelTable& k, const float* X, size_t n, size_t cols, int8_t* Q8,
                    float* D) {
  for (size_t t = 0; t < n; ++t)
    k.quantize_q8_32(X + t * cols, cols, Q8 + t * cols, D + t * (cols / 32));
}

void situ_glu(const KernelTable& k, float* gate, const float* up, size_t count, float beta,
              float beta_linear, int8_t* Q8, float* D) {
  if (Q8 != nullptr && count % 32 != 0)
    throw Error("situ_glu: " + std::to_string(count) +
                " elements are not whole 32-groups for the int8 quantisation");
  const size_t groups = (count + 31) / 32;
  // split_rows' measure in weight multiply-adds: a SiTU element costs about 2 of them on AVX2 /
  // AVX-512 (1.2-2.4 ns) and 256 in the scalar twin (~28 ns), so one thread below 16,384
  // elements (~20 us on AVX-512) or 128 scalar ones: a decode step's 3,072 (~4 us) are not worth
  // a fork/join.
  const size_t cost = k.isa == Isa::kScalar ? 256 : 2;
  split_rows(groups, count * cost, [&](size_t begin, size_t end) {
    const size_t lo = begin * 32, hi = std::min(count, end * 32);
    k.situ_glu(gate + lo, up + lo, hi - lo, beta, beta_linear);
    if (Q8 != nullptr) k.quantize_q8_32(gate + lo, hi - lo, Q8 + lo, D + begin);
  });
}

}  // namespace k3

// kernels/quant.h — load-time quantisation of dense matrices (docs/quant_formats.md §3–4) and the
// weight-matrix type the model holds. Bit-exact with the spec's arithmetic so that a repacked
// container stores the same bytes.
//
//   int8 per row:  s = max(max_i |w_i| / 127, 1e-20);  q_i = clamp(rne(w_i * (1/s)), -127, 127)
//   int4 g64:      per 64 columns s = max(max|w| / 7, 1e-20); q = clamp(rne(w * (1/s)), -8, 7);
//                  byte j = (q[2j] + 8) | ((q[2j+1] + 8) << 4)      (low nibble = even column)
// rne = round half to even; the reciprocal is an f32 multiply, never a divide per element.
//
//   int8 -> int4 g64 downcast (a stored int8 matrix asked for at 4 bits, docs/container.md §5),
//   per 64 columns:  am = max|q8|;  s4 = max(am * s8 / 7, 1e-20);  q4 = clamp(rne(q8 * s8 / s4),
//   -8, 7)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "util/uninit_vector.h"

namespace k3 {

struct KernelTable;

enum class WeightFormat { kF32, kInt8Row, kInt4G64 };

const char* weight_format_name(WeightFormat format);

// A dense weight matrix in one of the RAM formats. W[rows][cols], y = W x. The buffers are
// UninitVectors (util/uninit_vector.h): the loader writes each one once, in place.
struct WeightMatrix {
  WeightFormat format = WeightFormat::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  UninitVector<float> f32;     // kF32: [rows][cols]
  UninitVector<int8_t> q8;     // kInt8Row: [rows][cols]
  UninitVector<uint8_t> q4;    // kInt4G64: [rows][cols / 2]
  UninitVector<float> scales;  // kInt8Row: [rows]; kInt4G64: [rows][cols / 64]
  // kInt4G64, or kInt8Row with cols % 32 == 0 (K3_IDOT): the matmul wrappers multiply q8(x)
  // with exact integer dots (the int4 / int8 idot contracts of kernels/isa.h) instead of f32
  // activations.
  bool int8_activations = false;
  // K3_MMAP: the matrix lives in a read-only file mapping (kept alive by `mapping`, opaque here);
  // the vectors above stay empty and these point into the mapping.
  std::shared_ptr<const void> mapping;
  const float* mapped_f32 = nullptr;
  const int8_t* mapped_q8 = nullptr;
  const uint8_t* mapped_q4 = nullptr;
  const float* mapped_scales = nullptr;
  uint64_t mapped_bytes_ = 0;

  // The matrix's bytes wherever they live (heap vectors or the mapping): what kernels read.
  const float* f32_data() const { return mapped_f32 != nullptr ? mapped_f32 : f32.data(); }
  const int8_t* q8_data() const { return mapped_q8 != nullptr ? mapped_q8 : q8.data(); }
  const uint8_t* q4_data() const { return mapped_q4 != nullptr ? mapped_q4 : q4.data(); }
  const float* scale_data() const {
    return mapped_scales != nullptr ? mapped_scales : scales.data();
  }
  // Bytes of weights + scales held in heap memory (0 for a mapped matrix).
  uint64_t bytes() const;
  // Bytes of weights + scales read from a file mapping (0 unless mapped).
  uint64_t mapped_bytes() const { return mapped_bytes_; }
};

// Converts an f32 matrix to `bits` (32 keeps f32, 8 -> int8 per row, 4 -> int4 g64; a 4-bit
// request on a width that is not a multiple of 64 falls back to int8) with the row quantisers of
// `kernels` (the same bytes on every ISA). Frees the f32 copy. Parallel over rows; the bytes do
// not depend on the thread count.
void quantize_matrix(WeightMatrix& m, int bits, const KernelTable& kernels);

// The pieces of quantize_matrix, for a loader that quantises a matrix block by block straight
// from the file (no f32 copy of the whole matrix):
// The format quantize_matrix gives a `cols`-wide matrix at `bits` (4, 8 or 32). Throws k3::Error
// for another width.
WeightFormat quantized_format(int bits, int64_t cols);
// Sets m.format and sizes m's buffers for m.rows x m.cols in it, uninitialised (every row is then
// written once: by quantize_rows, a read, or a downcast); the other buffers are emptied.
void allocate_matrix(WeightMatrix& m, WeightFormat format);
// Quantises rows [row0, row0 + n) of m, given as f32 `w` [n][m.cols], into m's buffers with the
// row quantisers of `kernels` (the bytes quantize_matrix writes for those rows). REQUIRES:
// allocate_matrix(m, kInt8Row or kInt4G64) first, row0 + n <= m.rows. Serial: callers split the
// rows across threads.
void quantize_rows(WeightMatrix& m, size_t row0, size_t n, const float* w,
                   const KernelTable& kernels);

// The row quantisers' scalar twins: the formula above, the reference of the per-ISA variants in
// KernelTable (kernels/isa.h). A NaN level (a row or group holding an infinity) is 0.
void quantize_int8_row(const float* w, size_t cols, int8_t* q, float* scale);
void quantize_int4_g64_row(const float* w, size_t cols, uint8_t* packed, float* scales);
// One int8 row (scale s8) re-quantised to int4 g64 by the downcast rule above; cols % 64 == 0.
void downcast_int8_row_to_int4_g64(const int8_t* q8, float s8, size_t cols, uint8_t* packed,
                                   float* scales);

}  // namespace k3

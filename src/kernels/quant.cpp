#include "kernels/quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "impl/kernels_impl.h"
#include "impl/quant_common.h"
#include "kernels/isa.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3 {

using impl::quant_rne;

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kInt8Row:
      return "int8";
    case WeightFormat::kInt4G64:
      return "int4-g64";
  }
  return "?";
}

uint64_t WeightMatrix::bytes() const {
  return f32.size() * sizeof(float) + q8.size() + q4.size() + scales.size() * sizeof(float);
}

void quantize_int8_row(const float* w, size_t cols, int8_t* q, float* scale) {
  impl::quantize_int8_row_scalar(w, cols, q, scale);
}

void quantize_int4_g64_row(const float* w, size_t cols, uint8_t* packed, float* scales) {
  impl::quantize_int4_g64_row_scalar(w, cols, packed, scales);
}

void downcast_int8_row_to_int4_g64(const int8_t* q8, float s8, size_t cols, uint8_t* packed,
                                   float* scales) {
  for (size_t g = 0; g < cols / 64; ++g) {
    const int8_t* qg = q8 + g * 64;
    int am = 0;
    for (size_t i = 0; i < 64; ++i) am = std::max(am, std::abs(static_cast<int>(qg[i])));
    const float s4 = std::max(static_cast<float>(am) * s8 / 7.0f, 1e-20f);
    const auto q4 = [&](size_t i) {
      return static_cast<int>(
                 std::clamp(quant_rne(static_cast<float>(qg[i]) * s8 / s4), -8.0f, 7.0f)) +
             8;
    };
    for (size_t j = 0; j < 32; ++j)
      packed[g * 32 + j] = static_cast<uint8_t>(q4(2 * j) | (q4(2 * j + 1) << 4));
    scales[g] = s4;
  }
}

WeightFormat quantized_format(int bits, int64_t cols) {
  if (bits >= 32) return WeightFormat::kF32;
  if (bits != 4 && bits != 8)
    throw Error("quantize_matrix: unsupported bit width " + std::to_string(bits));
  return bits == 4 && cols % 64 == 0 ? WeightFormat::kInt4G64 : WeightFormat::kInt8Row;
}

void allocate_matrix(WeightMatrix& m, WeightFormat format) {
  const size_t rows = static_cast<size_t>(m.rows), cols = static_cast<size_t>(m.cols);
  const auto size = [](auto& v, size_t n) {
    if (n == 0) {
      std::remove_reference_t<decltype(v)>().swap(v);
    } else {
      v.clear();
      v.resize(n);
    }
  };
  size(m.f32, format == WeightFormat::kF32 ? rows * cols : 0);
  size(m.q8, format == WeightFormat::kInt8Row ? rows * cols : 0);
  size(m.q4, format == WeightFormat::kInt4G64 ? rows * cols / 2 : 0);
  size(m.scales, format == WeightFormat::kInt8Row   ? rows
                 : format == WeightFormat::kInt4G64 ? rows * cols / 64
                                                    : 0);
  m.format = format;
}

void quantize_rows(WeightMatrix& m, size_t row0, size_t n, const float* w,
                   const KernelTable& kernels) {
  const size_t cols = static_cast<size_t>(m.cols);
  for (size_t r = 0; r < n; ++r) {
    const size_t row = row0 + r;
    if (m.format == WeightFormat::kInt4G64)
      kernels.quantize_int4_g64_row(w + r * cols, cols, m.q4.data() + row * cols / 2,
                                    m.scales.data() + row * cols / 64);
    else
      kernels.quantize_int8_row(w + r * cols, cols, m.q8.data() + row * cols,
                                m.scales.data() + row);
  }
}

void quantize_matrix(WeightMatrix& m, int bits, const KernelTable& kernels) {
  if (m.format != WeightFormat::kF32) throw Error("quantize_matrix: matrix is already quantised");
  const WeightFormat format = quantized_format(bits, m.cols);
  if (format == WeightFormat::kF32) return;
  const size_t rows = static_cast<size_t>(m.rows), cols = static_cast<size_t>(m.cols);
  UninitVector<float> f32;
  f32.swap(m.f32);
  allocate_matrix(m, format);
  const int64_t n = m.rows;
#pragma omp parallel for schedule(static) if (rows * cols > (1u << 16))
  for (int64_t r = 0; r < n; ++r) {
    const size_t row = static_cast<size_t>(r);
    quantize_rows(m, row, 1, f32.data() + row * cols, kernels);
  }
}

}  // namespace k3

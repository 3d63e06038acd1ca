// kernels/impl/quant_scalar.cpp — the scalar twins of the row quantisers (kernels/quant.h): the
// formula itself, element by element, and the reference the vector variants are tested against
// byte for byte (tests/dense_kernels_test.cpp).
#include <cstdint>

#include "kernels_impl.h"
#include "quant_common.h"

namespace k3::impl {

void quantize_int8_row_scalar(const float* w, size_t cols, int8_t* q, float* scale) {
  float amax = 0.0f;
  for (size_t i = 0; i < cols; ++i) amax = abs_max_step(amax, w[i]);
  const float s = int8_row_scale(amax);
  const float inv = 1.0f / s;
  for (size_t i = 0; i < cols; ++i)
    q[i] = static_cast<int8_t>(quant_level(w[i] * inv, -127.0f, 127.0f));
  *scale = s;
}

void quantize_int4_g64_row_scalar(const float* w, size_t cols, uint8_t* packed, float* scales) {
  for (size_t g = 0; g < cols / 64; ++g) {
    const float* wg = w + g * 64;
    float amax = 0.0f;
    for (size_t i = 0; i < 64; ++i) amax = abs_max_step(amax, wg[i]);
    const float s = int4_group_scale(amax);
    const float inv = 1.0f / s;
    for (size_t j = 0; j < 32; ++j) {
      const int lo = quant_level(wg[2 * j] * inv, -8.0f, 7.0f) + 8;
      const int hi = quant_level(wg[2 * j + 1] * inv, -8.0f, 7.0f) + 8;
      packed[g * 32 + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
    scales[g] = s;
  }
}

}  // namespace k3::impl

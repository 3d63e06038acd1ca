#include "kernels/convert.h"

#include <cmath>

namespace k3 {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal (exact)
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &magnitude, 4);
  bits |= sign;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

size_t find_non_finite(const float* v, size_t count) {
  uint32_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, 4);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (bad == 0) return count;
  for (size_t i = 0; i < count; ++i)
    if (!std::isfinite(v[i])) return i;
  return count;
}

size_t widen_bf16(const uint8_t* src, size_t count, float* dst) {
  uint32_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint16_t h = static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
    bad |= static_cast<uint32_t>((h & 0x7f80u) == 0x7f80u);  // exponent all ones: NaN or Inf
    dst[i] = bf16_to_f32(h);
  }
  return bad == 0 ? count : find_non_finite(dst, count);
}

size_t widen_f16(const uint8_t* src, size_t count, float* dst) {
  uint32_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint16_t h = static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
    bad |= static_cast<uint32_t>((h & 0x7c00u) == 0x7c00u);
    dst[i] = f16_to_f32(h);
  }
  return bad == 0 ? count : find_non_finite(dst, count);
}

}  // namespace k3

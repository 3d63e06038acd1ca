// kernels/convert.h — exact widening of stored element types to f32.
// BF16 -> F32 is exact (the 16 bits become the upper half of the f32 word); F16 -> F32 is exact.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace k3 {

inline float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float f16_to_f32(uint16_t h);

// Rounds to nearest even (NaN kept quiet). Used by writers of synthetic checkpoints.
uint16_t f32_to_bf16(float f);

// Widens `count` elements of `src` (BF16, F16 or F32 bytes, little-endian) to f32.
void widen_bf16(const uint8_t* src, size_t count, float* dst);
void widen_f16(const uint8_t* src, size_t count, float* dst);

}  // namespace k3

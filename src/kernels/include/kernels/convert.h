// kernels/convert.h — exact widening of stored element types to f32, and the non-finite check
// every load-time conversion makes.
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

// Widens `count` elements of `src` (BF16 or F16 bytes, little-endian) to f32, every one of them,
// and returns the index of the first non-finite value (NaN, +Inf or -Inf), or `count` when all
// are finite. Loaders refuse a tensor holding one (a single NaN weight makes every output NaN);
// the check is a branch-free accumulation beside the conversion, and only a failing call scans
// again for the index.
[[nodiscard]] size_t widen_bf16(const uint8_t* src, size_t count, float* dst);
[[nodiscard]] size_t widen_f16(const uint8_t* src, size_t count, float* dst);

// The index of the first non-finite value of v[0, count), or `count` when all are finite (the
// same check for tensors stored as F32).
size_t find_non_finite(const float* v, size_t count);

}  // namespace k3

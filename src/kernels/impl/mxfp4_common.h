// kernels/impl/mxfp4_common.h — arithmetic shared by every ISA variant of the MXFP4 integer path,
// so that all of them round identically (the TUs are built with -ffp-contract=off). Everything
// here has internal linkage: each ISA translation unit keeps its own copy, so the linker can
// never hand the scalar path a copy compiled with AVX-512 enabled.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/mxfp4.h"

namespace k3::impl {
namespace {

// Doubled e2m1 values: exact small integers (|v| <= 12). The 0.5 is folded into the scale.
inline constexpr int8_t kE2M1Doubled[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};

// Largest number of 32-groups in one row of an MXFP4 matrix (cols <= 131072).
inline constexpr size_t kMaxMxfp4Groups = 4096;

// Activation scale of a 32-group: max(amax / 127, 1e-20).
inline float q8_scale(float amax) {
  return std::max(amax / 127.0f, 1e-20f);
}

// clamp(round_half_even(v), -127, 127).
inline int8_t q8_round(float v) {
  const float r = std::nearbyint(v);  // default rounding mode: to nearest, ties to even
  return static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
}

// 2^(s - 128): the MXFP4 scale with the 0.5 of the doubled values folded in. s = 255 -> NaN.
inline float mxfp4_half_scale(uint8_t s) {
  return s == 255 ? NAN : std::ldexp(1.0f, static_cast<int>(s) - 128);
}

// The one float reduction of the integer path: acc = sum_g isum[g] * (d[g] * 2^(s[g]-128)),
// g ascending.
inline float idot_reduce(const int32_t* isum, const float* d, const uint8_t* s, size_t groups) {
  float acc = 0.0f;
  for (size_t g = 0; g < groups; ++g)
    acc += static_cast<float>(isum[g]) * (d[g] * mxfp4_half_scale(s[g]));
  return acc;
}

}  // namespace
}  // namespace k3::impl

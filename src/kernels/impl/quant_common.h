// kernels/impl/quant_common.h — the element rules of the row quantisers (kernels/quant.h),
// shared by every ISA's variant so that a column tail computed in scalar code rounds exactly as
// the vector body next to it. Internal linkage: each translation unit keeps its own copy.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>

static_assert(FLT_EVAL_METHOD == 0, "quant_rne() needs float arithmetic without excess precision");

namespace k3::impl {
namespace {

// Round half to even (the default rounding mode), as nearbyint but without its libm call (which
// saves and restores the FP environment: 2/3 of the scalar quantisers' time). For |v| < 2^22,
// adding 1.5 * 2^23 lands in [2^23, 2^24), where floats are spaced exactly 1 apart, so the
// addition itself rounds half to even and the subtraction is exact. Larger magnitudes, inf and
// NaN take nearbyint. Needs float arithmetic without excess precision (FLT_EVAL_METHOD 0, x86-64
// SSE) and no -ffast-math (which would fold the two operations away). Only the sign of a zero
// result can differ from nearbyint, and every caller converts to an integer. The vector variants
// use the instruction's round-to-nearest-even, which is the same function.
inline float quant_rne(float v) {
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  if (!(std::fabs(v) < 4194304.0f)) return std::nearbyint(v);
  return (v + kShift) - kShift;
}

// One quantised level: clamp(rne(v), lo, hi). NaN (a row or group holding an infinity, whose
// scale is then inf and its reciprocal 0: inf * 0) gives 0.
inline int quant_level(float v, float lo, float hi) {
  if (std::isnan(v)) return 0;
  return static_cast<int>(std::clamp(quant_rne(v), lo, hi));
}

// The running max of |w|: NaN weights are skipped (std::max keeps its first argument when the
// comparison is unordered; the vector maxps keeps its second, the running max, the same way).
inline float abs_max_step(float amax, float w) {
  return std::max(amax, std::fabs(w));
}

inline float int8_row_scale(float amax) {
  return std::max(amax / 127.0f, 1e-20f);
}
inline float int4_group_scale(float amax) {
  return std::max(amax / 7.0f, 1e-20f);
}

}  // namespace
}  // namespace k3::impl

#include "kernels/mxfp4.h"

#include <cmath>
#include <limits>

namespace k3 {

float mxfp4_scale(uint8_t s) {
  if (s == 255) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(s) - 127);
}

float mxfp4_weight(const uint8_t* packed, const uint8_t* scales, size_t cols, size_t o, size_t i) {
  const uint8_t byte = packed[o * (cols / 2) + i / 2];
  const uint8_t nib = (i & 1) ? (byte >> 4) : (byte & 0xF);
  return kE2M1[nib] * mxfp4_scale(scales[o * (cols / kMxfp4Group) + i / kMxfp4Group]);
}

}  // namespace k3

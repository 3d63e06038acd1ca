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

void matvec_mxfp4_f32_exact(const uint8_t* packed, const uint8_t* scales, size_t rows, size_t cols,
                            const float* x, float* y) {
  const size_t groups = cols / kMxfp4Group;
  for (size_t o = 0; o < rows; ++o) {
    const uint8_t* row = packed + o * (cols / 2);
    const uint8_t* row_scales = scales + o * groups;
    float acc = 0.0f;
    for (size_t g = 0; g < groups; ++g) {
      const uint8_t* bytes = row + g * (kMxfp4Group / 2);
      const float* xg = x + g * kMxfp4Group;
      float ga = 0.0f;
      for (int j = 0; j < kMxfp4Group / 2; ++j) {
        ga += xg[2 * j] * kE2M1[bytes[j] & 0xF];
        ga += xg[2 * j + 1] * kE2M1[bytes[j] >> 4];
      }
      acc += ga * mxfp4_scale(row_scales[g]);
    }
    y[o] = acc;
  }
}

}  // namespace k3

// kernels/impl/mxfp4_scalar.cpp — the scalar twins of the MXFP4 kernels: the exact float path
// and the integer-dot path (activation quantisation, exact integer group sums, one shared
// float reduction).
#include <cmath>

#include "kernels/mxfp4.h"
#include "kernels_impl.h"
#include "mxfp4_common.h"

namespace k3::impl {

void matmul_mxfp4_exact_scalar(const uint8_t* packed, const uint8_t* scales, size_t cols,
                               const float* X, size_t n, float* Y, size_t ldy, size_t row_begin,
                               size_t row_end) {
  const size_t groups = cols / kMxfp4Group;
  for (size_t o = row_begin; o < row_end; ++o) {
    const uint8_t* row = packed + o * (cols / 2);
    const uint8_t* row_scales = scales + o * groups;
    for (size_t t = 0; t < n; ++t) {
      const float* x = X + t * cols;
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
      Y[t * ldy + o] = acc;
    }
  }
}

void quantize_q8_32_scalar(const float* x, size_t cols, int8_t* q, float* d) {
  for (size_t g = 0; g < cols / kMxfp4Group; ++g) {
    const float* xg = x + g * kMxfp4Group;
    float amax = 0.0f;
    for (int i = 0; i < kMxfp4Group; ++i) amax = std::fmax(amax, std::fabs(xg[i]));
    const float scale = q8_scale(amax);
    const float inv = 1.0f / scale;
    d[g] = scale;
    for (int i = 0; i < kMxfp4Group; ++i) q[g * kMxfp4Group + i] = q8_round(xg[i] * inv);
  }
}

void matmul_mxfp4_idot_scalar(const uint8_t* packed, const uint8_t* scales, size_t cols,
                              const int8_t* Q8, const float* D, size_t n, float* Y, size_t ldy,
                              size_t row_begin, size_t row_end) {
  const size_t groups = cols / kMxfp4Group;
  int32_t isum[kMaxMxfp4Groups];  // [groups] exact integer dots of one (row, activation) pair
  for (size_t o = row_begin; o < row_end; ++o) {
    const uint8_t* row = packed + o * (cols / 2);
    for (size_t t = 0; t < n; ++t) {
      const int8_t* q = Q8 + t * cols;
      for (size_t g = 0; g < groups; ++g) {
        const uint8_t* bytes = row + g * (kMxfp4Group / 2);
        const int8_t* qg = q + g * kMxfp4Group;
        int32_t acc = 0;
        for (int j = 0; j < kMxfp4Group / 2; ++j) {
          acc += static_cast<int32_t>(qg[2 * j]) * kE2M1Doubled[bytes[j] & 0xF];
          acc += static_cast<int32_t>(qg[2 * j + 1]) * kE2M1Doubled[bytes[j] >> 4];
        }
        isum[g] = acc;
      }
      Y[t * ldy + o] = idot_reduce(isum, D + t * groups, scales + o * groups, groups);
    }
  }
}

}  // namespace k3::impl

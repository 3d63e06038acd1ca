// kernels/impl/dense_scalar.cpp — the scalar twins of the dense kernels (f32, int8 per row,
// int4 group-64, and int4 group-64 on int8 activations). The reference every SIMD variant is
// tested against.
#include "kernels_impl.h"

namespace k3::impl {

void matmul_f32_scalar(const float* W, size_t cols, const float* X, size_t n, float* Y, size_t ldy,
                       size_t row_begin, size_t row_end) {
  for (size_t o = row_begin; o < row_end; ++o) {
    const float* w = W + o * cols;
    for (size_t t = 0; t < n; ++t) {
      const float* x = X + t * cols;
      float acc = 0.0f;
      for (size_t i = 0; i < cols; ++i) acc += w[i] * x[i];
      Y[t * ldy + o] = acc;
    }
  }
}

void matmul_int8_scalar(const int8_t* Q, const float* scales, size_t cols, const float* X, size_t n,
                        float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  for (size_t o = row_begin; o < row_end; ++o) {
    const int8_t* q = Q + o * cols;
    for (size_t t = 0; t < n; ++t) {
      const float* x = X + t * cols;
      float acc = 0.0f;
      for (size_t i = 0; i < cols; ++i) acc += static_cast<float>(q[i]) * x[i];
      Y[t * ldy + o] = scales[o] * acc;
    }
  }
}

void matmul_int4_scalar(const uint8_t* packed, const float* scales, size_t cols, const float* X,
                        size_t n, float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  const size_t groups = cols / 64;
  for (size_t o = row_begin; o < row_end; ++o) {
    const uint8_t* p = packed + o * (cols / 2);
    const float* s = scales + o * groups;
    for (size_t t = 0; t < n; ++t) {
      const float* x = X + t * cols;
      float acc = 0.0f;
      for (size_t g = 0; g < groups; ++g) {
        float ga = 0.0f;
        for (size_t j = 0; j < 32; ++j) {
          const uint8_t b = p[g * 32 + j];
          ga += static_cast<float>(static_cast<int>(b & 0xF) - 8) * x[g * 64 + 2 * j];
          ga += static_cast<float>(static_cast<int>(b >> 4) - 8) * x[g * 64 + 2 * j + 1];
        }
        acc += s[g] * ga;
      }
      Y[t * ldy + o] = acc;
    }
  }
}

// int4 weights x q8_32 activations (kernels/isa.h): per 32-column half-group h (16 packed bytes,
// low nibble = even column) the exact integer dot isum = sum (nib - 8) q, then the shared float
// step int4_idot_step in ascending h. |isum| <= 32 * 8 * 128, so int32 is exact for any int8 q.
void matmul_int4_idot_scalar(const uint8_t* packed, const float* scales, size_t cols,
                             const int8_t* Q8, const float* D, size_t n, float* Y, size_t ldy,
                             size_t row_begin, size_t row_end) {
  const size_t groups = cols / 64, halves = 2 * groups;
  for (size_t o = row_begin; o < row_end; ++o) {
    const uint8_t* p = packed + o * (cols / 2);
    const float* s = scales + o * groups;
    for (size_t t = 0; t < n; ++t) {
      const int8_t* q = Q8 + t * cols;
      const float* d = D + t * (cols / 32);
      float acc = 0.0f;
      for (size_t h = 0; h < halves; ++h) {
        int32_t isum = 0;
        for (size_t j = 0; j < 16; ++j) {
          const int b = p[h * 16 + j];
          isum += ((b & 0xF) - 8) * q[h * 32 + 2 * j];
          isum += ((b >> 4) - 8) * q[h * 32 + 2 * j + 1];
        }
        acc = int4_idot_step(acc, isum, d[h], s[h / 2]);
      }
      Y[t * ldy + o] = acc;
    }
  }
}

// int8 per row x q8_32 activations (kernels/isa.h): per 32-column group h the exact integer dot
// isum = sum q q8 (|isum| <= 32 * 128 * 128: int32 is exact), the shared float step
// int8_idot_step in ascending h, then the row scale.
void matmul_int8_idot_scalar(const int8_t* Q, const float* scales, size_t cols, const int8_t* Q8,
                             const float* D, size_t n, float* Y, size_t ldy, size_t row_begin,
                             size_t row_end) {
  const size_t groups = cols / 32;
  for (size_t o = row_begin; o < row_end; ++o) {
    const int8_t* w = Q + o * cols;
    for (size_t t = 0; t < n; ++t) {
      const int8_t* q = Q8 + t * cols;
      const float* d = D + t * groups;
      float acc = 0.0f;
      for (size_t h = 0; h < groups; ++h) {
        int32_t isum = 0;
        for (size_t j = 0; j < 32; ++j) isum += static_cast<int32_t>(w[h * 32 + j]) * q[h * 32 + j];
        acc = int8_idot_step(acc, isum, d[h]);
      }
      Y[t * ldy + o] = scales[o] * acc;
    }
  }
}

}  // namespace k3::impl

// kernels/impl/avx512_common.h — pieces shared by the AVX-512 dense and MXFP4 kernels (only
// AVX-512 TUs include it): the 16x16 dword transpose, and the reduction of 16 weight rows'
// partial dots to one vector per group with one row per lane. Internal linkage: each TU keeps
// its own copy.
#pragma once

#include "avx512_intrin.h"

namespace k3::impl {
namespace {

// r[i] = the 16 dwords of row i -> r[c] = dword c of the 16 rows (lane i = row i).
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // u[4i + c], 128-bit lane L: column 4L + c of rows 4i..4i+3.
  for (int c = 0; c < 4; ++c) {
    const __m512i va = _mm512_shuffle_i32x4(u[c], u[4 + c], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i wa = _mm512_shuffle_i32x4(u[c], u[4 + c], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i vb = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i wb = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(3, 1, 3, 1));
    r[c] = _mm512_shuffle_i32x4(va, vb, _MM_SHUFFLE(2, 0, 2, 0));
    r[8 + c] = _mm512_shuffle_i32x4(va, vb, _MM_SHUFFLE(3, 1, 3, 1));
    r[4 + c] = _mm512_shuffle_i32x4(wa, wb, _MM_SHUFFLE(2, 0, 2, 0));
    r[12 + c] = _mm512_shuffle_i32x4(wa, wb, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

inline __m512i reduce_pair32(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
inline __m512i reduce_pair64(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

// dr[i]: row i's 16 dword partials, 4 per group for 4 groups (128-bit lane g = group g) ->
// sums[g]: group g's dot of the 16 rows, one row per lane (exact int32 adds).
inline void sum_rows16(const __m512i dr[16], __m512i sums[4]) {
  __m512i e[8], f[4];
  for (int i = 0; i < 8; ++i) e[i] = reduce_pair32(dr[2 * i], dr[2 * i + 1]);
  for (int k = 0; k < 4; ++k) f[k] = reduce_pair64(e[2 * k], e[2 * k + 1]);
  // f[k], 128-bit lane g: rows 4k..4k+3 of group g. Transpose the 4x4 of 128-bit blocks.
  const __m512i ta = _mm512_shuffle_i32x4(f[0], f[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i tb = _mm512_shuffle_i32x4(f[0], f[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i tc = _mm512_shuffle_i32x4(f[2], f[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i td = _mm512_shuffle_i32x4(f[2], f[3], _MM_SHUFFLE(3, 2, 3, 2));
  sums[0] = _mm512_shuffle_i32x4(ta, tc, _MM_SHUFFLE(2, 0, 2, 0));
  sums[1] = _mm512_shuffle_i32x4(ta, tc, _MM_SHUFFLE(3, 1, 3, 1));
  sums[2] = _mm512_shuffle_i32x4(tb, td, _MM_SHUFFLE(2, 0, 2, 0));
  sums[3] = _mm512_shuffle_i32x4(tb, td, _MM_SHUFFLE(3, 1, 3, 1));
}

}  // namespace
}  // namespace k3::impl

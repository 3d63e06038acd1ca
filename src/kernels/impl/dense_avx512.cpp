// kernels/impl/dense_avx512.cpp — AVX-512 (F/BW/VL; VNNI for the integer path) variants of the
// dense kernels (f32, int8 per row, int4 group-64, and int4 group-64 on int8 activations, whose
// section below describes its own layout). Compiled with -mavx512*; called only after a run-time
// CPU check (isa.cpp).
//
// Each weight row is read from memory once per call (the int4 panel: once per 64 activation
// rows). Weight rows are taken 4 at a time against up to 4 (int4 in registers: 2) activation
// rows in a register tile of independent accumulators:
//  * f32, int8 (any n) and int4 (n <= 4): weights are widened to f32 in registers (f32: loaded
//    as they are). For more activation rows than one tile holds, the activation rows are swept
//    over a panel of weight rows sized to stay in L2, so only the first sweep reads DRAM. int4
//    splits each group's activations into even/odd columns (the low/high nibbles) and decodes a
//    nibble with one permute from the 16-entry table s_g * (k - 8).
//  * int4 (n == 1): the activations are rearranged once per call (to the nibble order of 64
//    packed bytes), so a weight costs a permute from the constant table k - 8 and an FMA; the
//    next block of rows is prefetched.
//  * int4 (n > 4): in-register decoding would be repeated per tile and costs more than the FMAs
//    it feeds, so 4 rows x 512 columns are decoded once into an f32 stack buffer and swept by
//    the tile against up to 64 activation rows, partial sums kept across column chunks; the
//    next chunk is prefetched.
// Column tails use masked loads. Results of the float kernels match the scalar twins up to
// summation order (int4 also rounds s_g * (k - 8) to f32 before multiplying); a row's result
// does not depend on the row range it is computed in.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "avx512_common.h"
#include "avx512_intrin.h"
#include "kernels_impl.h"
#include "x86_common.h"

namespace k3::impl {
namespace {

constexpr size_t kV = 16;             // f32 lanes
constexpr int kR = 4;                 // weight rows per register tile
constexpr int kT = 4;                 // activation rows per register tile
constexpr size_t kKC = 512;           // int4 panel: columns per decoded chunk
constexpr size_t kNT = 64;            // int4 panel: activation rows per accumulator block
constexpr size_t kInt4DirectMax = 4;  // int4: in-register decode up to this many activation rows

inline __mmask16 tail_mask(size_t rem) {
  return static_cast<__mmask16>((1u << rem) - 1u);
}

// Weight rows per panel (a multiple of kR, 4..64) so that a panel of rows of `row_bytes` each
// takes about `budget` bytes: it stays in L2 (next to one tile of activation rows) while the
// activation rows are swept over it.
inline size_t panel_rows(size_t row_bytes, size_t budget) {
  return std::clamp<size_t>(budget / std::max<size_t>(row_bytes, 1) / kR * kR, kR, 64);
}

// Software prefetch of `bytes` starting at p (the next weight chunk while this one is computed:
// chunks are read in bursts, which the hardware prefetcher does not run ahead of).
inline void prefetch(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T0);
}

// The 16 nibble values minus 8, as floats.
inline __m512 nibble_table() {
  return _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
}

// ---------------------------------------------------------------------------------------------
// The f32 register tile (f32 path and int4 panel).

// acc[t][r] (kR slots per t, kV lanes each) = (first ? 0 : acc) + W[r][0..kc) . X[t][0..kc)
// lane-wise over R x T rows, kc = kfull + popcount(tail) (the tail lanes are masked loads).
template <int R, int T>
void tile(const float* w, size_t ldw, const float* x, size_t ldx, size_t kfull, __mmask16 tail,
          float* acc, bool first) {
  __m512 a[R][T];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      a[r][t] = first ? _mm512_setzero_ps()
                      : _mm512_load_ps(acc + (static_cast<size_t>(t) * kR + r) * kV);
  for (size_t k = 0; k < kfull; k += kV) {
    __m512 wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_ps(w + static_cast<size_t>(r) * ldw + k);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + static_cast<size_t>(t) * ldx + k);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
    }
  }
  if (tail) {
    __m512 wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      wv[r] = _mm512_maskz_loadu_ps(tail, w + static_cast<size_t>(r) * ldw + kfull);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(tail, x + static_cast<size_t>(t) * ldx + kfull);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      _mm512_store_ps(acc + (static_cast<size_t>(t) * kR + r) * kV, a[r][t]);
}

using TileFn = void (*)(const float*, size_t, const float*, size_t, size_t, __mmask16, float*,
                        bool);

template <int R>
constexpr TileFn tile_for(int t) {
  switch (t) {
    case 1:
      return tile<R, 1>;
    case 2:
      return tile<R, 2>;
    case 3:
      return tile<R, 3>;
    default:
      return tile<R, 4>;
  }
}

TileFn pick_tile(int r, int t) {
  switch (r) {
    case 1:
      return tile_for<1>(t);
    case 2:
      return tile_for<2>(t);
    case 3:
      return tile_for<3>(t);
    default:
      return tile_for<4>(t);
  }
}

// f32 "direct": weights read in place by the register tile over all columns, activation rows 4
// at a time over panels of weight rows that stay in L2.
void f32_rows(const float* W, size_t cols, const float* X, size_t n, float* Y, size_t ldy,
              size_t row_begin, size_t row_end) {
  alignas(64) float acc[kT * kR * kV];
  const size_t prows = panel_rows(cols * sizeof(float), size_t{256} << 10);
  const size_t kfull = cols & ~(kV - 1);
  const __mmask16 tail = tail_mask(cols - kfull);
  for (size_t p0 = row_begin; p0 < row_end; p0 += prows) {
    const size_t p1 = std::min(row_end, p0 + prows);
    for (size_t t = 0; t < n; t += kT) {
      const int tb = static_cast<int>(std::min<size_t>(kT, n - t));
      for (size_t o = p0; o < p1; o += kR) {
        const int rb = static_cast<int>(std::min<size_t>(kR, p1 - o));
        pick_tile(rb, tb)(W + o * cols, cols, X + t * cols, cols, kfull, tail, acc, true);
        for (int tt = 0; tt < tb; ++tt)
          for (int r = 0; r < rb; ++r)
            Y[(t + static_cast<size_t>(tt)) * ldy + o + static_cast<size_t>(r)] =
                _mm512_reduce_add_ps(_mm512_load_ps(
                    acc + (static_cast<size_t>(tt) * kR + static_cast<size_t>(r)) * kV));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// int8: weights widened in registers, R weight rows x T activation rows.

template <int R, int T>
void int8_direct(const int8_t* Q, const float* scales, size_t cols, const float* X, float* Y,
                 size_t ldy, size_t o0) {
  __m512 a[R][T];
  const int8_t* q[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    q[r] = Q + (o0 + static_cast<size_t>(r)) * cols;
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) a[r][t] = _mm512_setzero_ps();
  }
  size_t k = 0;
  for (; k + kV <= cols; k += kV) {
    __m512 wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      wv[r] = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q[r] + k))));
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(X + static_cast<size_t>(t) * cols + k);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
    }
  }
  if (k < cols) {
    const __mmask16 m = tail_mask(cols - k);
    __m512 wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      wv[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, q[r] + k)));
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, X + static_cast<size_t>(t) * cols + k);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      Y[static_cast<size_t>(t) * ldy + o0 + static_cast<size_t>(r)] =
          scales[o0 + static_cast<size_t>(r)] * _mm512_reduce_add_ps(a[r][t]);
}

using Int8DirectFn = void (*)(const int8_t*, const float*, size_t, const float*, float*, size_t,
                              size_t);

template <int R>
Int8DirectFn int8_direct_for(size_t t) {
  switch (t) {
    case 1:
      return int8_direct<R, 1>;
    case 2:
      return int8_direct<R, 2>;
    case 3:
      return int8_direct<R, 3>;
    default:
      return int8_direct<R, 4>;
  }
}

// For each panel of weight rows and each tile of up to 4 activation rows, every block of 4
// weight rows (weights come from DRAM on the first tile, from L2 after).
void int8_rows(const int8_t* Q, const float* scales, size_t cols, const float* X, size_t n,
               float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  const size_t prows = panel_rows(cols, size_t{128} << 10);
  for (size_t p0 = row_begin; p0 < row_end; p0 += prows) {
    const size_t p1 = std::min(row_end, p0 + prows);
    for (size_t t = 0; t < n; t += 4) {
      const size_t tb = std::min<size_t>(4, n - t);
      const float* x = X + t * cols;
      float* y = Y + t * ldy;
      size_t o = p0;
      for (; o + kR <= p1; o += kR) int8_direct_for<kR>(tb)(Q, scales, cols, x, y, ldy, o);
      for (; o < p1; ++o) int8_direct_for<1>(tb)(Q, scales, cols, x, y, ldy, o);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// int4, few activation rows: the activations of one group are split into even and odd columns
// (matching the low and high nibbles of 16 consecutive bytes), the nibbles index a 16-entry table
// s_g * (k - 8).
template <int R, int T>
void int4_direct(const uint8_t* packed, const float* scales, size_t cols, const float* X, float* Y,
                 size_t ldy, size_t o0) {
  const size_t groups = cols / 64;
  const __m512 base = nibble_table();
  const __m512i idx_even =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i idx_odd =
      _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  __m512 a[R][T];
  const uint8_t* p[R];
  const float* s[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    p[r] = packed + (o0 + static_cast<size_t>(r)) * (cols / 2);
    s[r] = scales + (o0 + static_cast<size_t>(r)) * groups;
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) a[r][t] = _mm512_setzero_ps();
  }
  for (size_t g = 0; g < groups; ++g) {
    __m512 xe[T][2], xo[T][2];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const float* x = X + static_cast<size_t>(t) * cols + g * 64;
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512 x0 = _mm512_loadu_ps(x + h * 32), x1 = _mm512_loadu_ps(x + h * 32 + 16);
        xe[t][h] = _mm512_permutex2var_ps(x0, idx_even, x1);
        xo[t][h] = _mm512_permutex2var_ps(x0, idx_odd, x1);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 table = _mm512_mul_ps(_mm512_set1_ps(s[r][g]), base);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i v = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[r] + g * 32 + h * 16)));
        const __m512 lo = _mm512_permutexvar_ps(v, table);
        const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          a[r][t] = _mm512_fmadd_ps(lo, xe[t][h], a[r][t]);
          a[r][t] = _mm512_fmadd_ps(hi, xo[t][h], a[r][t]);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      Y[static_cast<size_t>(t) * ldy + o0 + static_cast<size_t>(r)] = _mm512_reduce_add_ps(a[r][t]);
}

// int4, one activation row: the activations are rearranged once per call so that the packed
// bytes need no reordering. A window of 128 columns (64 bytes) is loaded as 16 dwords; lane i
// holds columns 8i..8i+7 as nibbles 0..7 (nibble k of lane i is column 8i + k), so nibble k of
// every lane indexes (vpermps uses index bits 0..3 only) the constant table k - 8 once it is in
// bits 0..3 (even k = 2m: the dwords loaded m bytes further on; odd k: those shifted by 4). xr[w *
// 128 + k * 16 + i] = x[w * 128 + 8i + k] (zero past cols). Lanes 0..7 belong to group 2w,
// lanes 8..15 to group 2w + 1, so the window's sum is scaled lane-wise at the end.
void int4_arrange_x(const float* x, size_t cols, float* xr) {
  const size_t windows = (cols + 127) / 128;
  for (size_t w = 0; w < windows; ++w)
    for (size_t i = 0; i < 16; ++i)
      for (size_t k = 0; k < 8; ++k) {
        const size_t c = w * 128 + 8 * i + k;
        xr[w * 128 + k * 16 + i] = c < cols ? x[c] : 0.0f;
      }
}

template <int R>
void int4_row1(const uint8_t* packed, const float* scales, size_t cols, const float* xr, float* Y,
               size_t o0) {
  const size_t groups = cols / 64;
  const size_t wfull = cols / 128;
  __m512 acc[R];
  const uint8_t* p[R];
  const float* s[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    p[r] = packed + (o0 + static_cast<size_t>(r)) * (cols / 2);
    s[r] = scales + (o0 + static_cast<size_t>(r)) * groups;
    acc[r] = _mm512_setzero_ps();
  }
  const __m512 base = nibble_table();
  auto window = [&](size_t w, bool half, bool over) {
    const float* xw = xr + w * 128;
    __m512i v[R];
    __m512 te[R], to[R];
    // Prefetch the same window (and scales) of the next block of R rows: the R row streams are
    // short, and the hardware prefetcher alone leaves DRAM bandwidth unused. (A prefetch past
    // the end of the buffer does not fault.)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(p[r] + w * 64 + R * (cols / 2)), _MM_HINT_T0);
    if ((w & 7) == 0)
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(s[r] + 2 * w + R * groups), _MM_HINT_T0);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      v[r] = half ? _mm512_zextsi256_si512(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[r] + w * 64)))
                  : _mm512_loadu_si512(p[r] + w * 64);
      // Even nibbles 2m: the low nibble of byte m of each dword, i.e. bits 0..3 of the dwords
      // loaded m bytes further on (safe only where 3 more bytes may be read); odd nibbles shifted.
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
      const __m512 x0 = _mm512_load_ps(xw + m * 32), x1 = _mm512_load_ps(xw + m * 32 + 16);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512i ve = (m == 0 || !over) ? v[r] : _mm512_loadu_si512(p[r] + w * 64 + m);
        const __m512 we = _mm512_permutexvar_ps(over ? ve : _mm512_srli_epi32(v[r], 8 * m), base);
        const __m512 wo = _mm512_permutexvar_ps(
            over ? _mm512_srli_epi32(ve, 4) : _mm512_srli_epi32(v[r], 8 * m + 4), base);
        te[r] = m == 0 ? _mm512_mul_ps(we, x0) : _mm512_fmadd_ps(we, x0, te[r]);
        to[r] = m == 0 ? _mm512_mul_ps(wo, x1) : _mm512_fmadd_ps(wo, x1, to[r]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float* sg = s[r] + 2 * w;
      const __m512 sv =
          half ? _mm512_set1_ps(sg[0])
               : _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(sg[0]), _mm512_set1_ps(sg[1]));
      acc[r] = _mm512_fmadd_ps(_mm512_add_ps(te[r], to[r]), sv, acc[r]);
    }
  };
  const size_t wlast = wfull * 128 < cols ? wfull : wfull - 1;  // read without over-reading
  for (size_t w = 0; w < wlast; ++w) window(w, false, true);
  window(wlast, wlast == wfull, false);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) Y[o0 + static_cast<size_t>(r)] = _mm512_reduce_add_ps(acc[r]);
}

void int4_row1_rows(const uint8_t* packed, const float* scales, size_t cols, const float* X,
                    float* Y, size_t row_begin, size_t row_end) {
  thread_local std::vector<float, AlignedAlloc<float, 64>> xr;
  const size_t padded = (cols + 127) / 128 * 128;
  if (xr.size() < padded) xr.resize(padded);
  int4_arrange_x(X, cols, xr.data());
  size_t o = row_begin;
  for (; o + kR <= row_end; o += kR) int4_row1<kR>(packed, scales, cols, xr.data(), Y, o);
  for (; o < row_end; ++o) int4_row1<1>(packed, scales, cols, xr.data(), Y, o);
}

// As int8_rows, activation rows 2 at a time (n <= kInt4DirectMax).
void int4_direct_rows(const uint8_t* packed, const float* scales, size_t cols, const float* X,
                      size_t n, float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  const size_t prows = panel_rows(cols / 2, size_t{128} << 10);
  for (size_t p0 = row_begin; p0 < row_end; p0 += prows) {
    const size_t p1 = std::min(row_end, p0 + prows);
    for (size_t t = 0; t < n; t += 2) {
      const float* x = X + t * cols;
      float* y = Y + t * ldy;
      const bool pair = n - t >= 2;
      size_t o = p0;
      for (; o + kR <= p1; o += kR) {
        if (pair)
          int4_direct<kR, 2>(packed, scales, cols, x, y, ldy, o);
        else
          int4_direct<kR, 1>(packed, scales, cols, x, y, ldy, o);
      }
      for (; o < p1; ++o) {
        if (pair)
          int4_direct<1, 2>(packed, scales, cols, x, y, ldy, o);
        else
          int4_direct<1, 1>(packed, scales, cols, x, y, ldy, o);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// int4, many activation rows: 4 weight rows x kKC columns decoded once to w = s_g * (k - 8) in
// column order (kc is a multiple of 64), swept by the register tile against up to kNT activation
// rows; per-lane partial sums persist across column chunks.

void decode_int4(const uint8_t* packed, const float* scales, size_t cols, size_t o0, int rb,
                 size_t c0, size_t kc, float* buf) {
  const __m512 base = nibble_table();
  const __m512i il_a = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i il_b =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const size_t groups = cols / 64;
  for (int r = 0; r < rb; ++r) {
    const size_t o = o0 + static_cast<size_t>(r);
    const uint8_t* p = packed + o * (cols / 2) + c0 / 2;
    const float* s = scales + o * groups + c0 / 64;
    float* d = buf + static_cast<size_t>(r) * kKC;
    for (size_t g = 0; g < kc / 64; ++g) {
      const __m512 table = _mm512_mul_ps(_mm512_set1_ps(s[g]), base);
      for (size_t h = 0; h < 2; ++h) {
        const __m512i v = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + g * 32 + h * 16)));
        const __m512 lo = _mm512_permutexvar_ps(v, table);                        // even columns
        const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);  // odd columns
        _mm512_store_ps(d + g * 64 + h * 32, _mm512_permutex2var_ps(lo, il_a, hi));
        _mm512_store_ps(d + g * 64 + h * 32 + 16, _mm512_permutex2var_ps(lo, il_b, hi));
      }
    }
  }
}

void prefetch_int4(const uint8_t* packed, const float* scales, size_t cols, size_t o, size_t c0,
                   size_t kc) {
  prefetch(packed + o * (cols / 2) + c0 / 2, kc / 2);
  prefetch(scales + o * (cols / 64) + c0 / 64, kc / 16);
}

void int4_panel(const uint8_t* packed, const float* scales, size_t cols, const float* X, size_t n,
                float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  alignas(64) float wbuf[kR * kKC];
  alignas(64) float accbuf[kNT * kR * kV];
  for (size_t o0 = row_begin; o0 < row_end; o0 += kR) {
    const int rb = static_cast<int>(std::min<size_t>(kR, row_end - o0));
    for (size_t t0 = 0; t0 < n; t0 += kNT) {
      const size_t nt = std::min(kNT, n - t0);
      for (size_t c0 = 0; c0 < cols; c0 += kKC) {
        const size_t kc = std::min(kKC, cols - c0);
        // Prefetch the chunk after this one (next columns, else the next block's first columns).
        if (c0 + kKC < cols) {
          for (int r = 0; r < rb; ++r)
            prefetch_int4(packed, scales, cols, o0 + static_cast<size_t>(r), c0 + kKC,
                          std::min(kKC, cols - c0 - kKC));
        } else {
          for (size_t o = o0 + kR; o < std::min(row_end, o0 + 2 * kR); ++o)
            prefetch_int4(packed, scales, cols, o, 0, std::min(kKC, cols));
        }
        decode_int4(packed, scales, cols, o0, rb, c0, kc, wbuf);
        for (size_t t = 0; t < nt; t += kT) {
          const int tb = static_cast<int>(std::min<size_t>(kT, nt - t));
          pick_tile(rb, tb)(wbuf, kKC, X + (t0 + t) * cols + c0, cols, kc, 0, accbuf + t * kR * kV,
                            c0 == 0);
        }
      }
      for (size_t t = 0; t < nt; ++t)
        for (int r = 0; r < rb; ++r)
          Y[(t0 + t) * ldy + o0 + static_cast<size_t>(r)] =
              cols ? _mm512_reduce_add_ps(
                         _mm512_load_ps(accbuf + (t * kR + static_cast<size_t>(r)) * kV))
                   : 0.0f;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// int4 on int8 activations (matmul_int4_idot): the exact int32 half-group dots by vpdpbusd
// (unsigned nibble x signed activation), then the float step of int4_idot_step lane-wise with
// one weight row per 32-bit lane, half-groups ascending: bit-identical to the scalar twin.
//
// The activations are prepared once per call and tile of up to 64 rows (thread-local buffers):
// per half-group h of row t, its 32 bytes with the columns of every 8 reordered as
// 0,2,4,6,1,3,5,7 (dword 2j: the even columns of 8-column unit j, held by the low nibbles of
// packed dword j of the half; dword 2j + 1: the odd ones, the high nibbles), and
// qo = -8 * sum(q), so that isum = qo + sum nib * q.
//
// Several activation rows: blocks of 16 weight rows. Per block and unit of kIdotUnit groups,
// the packed bytes (16 rows x 2 groups at a time) are transposed (16x16 dwords) and split into
// low and high nibbles once, into an L1 buffer, and the scales are transposed alike; the unit
// is then applied to every activation row of the tile, 8 at a time in a register tile: per
// half-group and activation row, 8 vpdpbusd against broadcast activation dwords give the 16
// rows' sums. Each weight is decoded once per 64 activation rows; the next unit is prefetched.
//
// One activation row: no weight transpose (idot_block_n1). Measured on the 2-core Zen 4 box
// (2 threads, 12288x7168 and 7168x12288, weights from DRAM): 1 row ~29-36 GB/s (the
// f32-activation int4 path: ~24-29), 64 rows ~2.3-2.4 GB/s (f32 activations: ~0.85), i.e.
// 4-5x the one-row throughput per activation row.

constexpr size_t kIdotRows = 16;  // weight rows per block, one per 32-bit lane
constexpr size_t kIdotUnit = 8;   // groups decoded at a time (8 KiB of decoded weights)
constexpr size_t kIdotTile = 64;  // activation rows per tile
constexpr int kIdotSub = 8;       // activation rows per register tile
// One activation row: groups whose scales are transposed at once.
constexpr size_t kIdotScaleUnit = 16;
// One activation row: each row of a block is prefetched into L2 this many bytes ahead (the 16
// interleaved row streams defeat the hardware prefetchers; as mxfp4_avx512.cpp measured), and
// the next block's scales when a block starts. (Prefetching the next block in memory order, as
// the MXFP4 and int8 one-row paths do, was ~10 % slower here from DRAM on the 2-core Zen 5.)
constexpr size_t kIdotAhead = 1024;

inline __m512i bcast32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Prepared activation rows of a tile (row 0 of the tile; row stride `halves` half-groups).
struct IdotActs {
  const uint8_t* qp;  // [t][halves][32] reordered int8 values
  const int32_t* qo;  // [t][halves] -8 * sum(q)
  const float* d;     // [t][halves] the q8_32 scales (D)
  size_t halves;      // cols / 32
};

// The rows [o0, o0 + nr) of a block.
struct IdotBlock {
  const uint8_t* p;  // packed bytes of row o0
  const float* s;    // scales of row o0
  size_t row_bytes;  // cols / 2
  size_t groups;     // cols / 64
  size_t nr;         // valid rows (<= 16)
};

// hs[g] = the scales of groups [g0, g0 + ug) (ug <= 16), one row per lane (0 past nr).
inline void idot_scales(const IdotBlock& b, size_t g0, size_t ug, __m512* hs) {
  const __mmask16 m = static_cast<__mmask16>((1u << ug) - 1);
  __m512i r[16];
  for (size_t i = 0; i < kIdotRows; ++i)
    r[i] = i < b.nr ? _mm512_castps_si512(_mm512_maskz_loadu_ps(m, b.s + i * b.groups + g0))
                    : _mm512_setzero_si512();
  transpose16(r);
  for (size_t g = 0; g < ug; ++g) hs[g] = _mm512_castsi512_ps(r[g]);
}

// Decodes groups [g0, g0 + ug) (ug <= kIdotUnit) of a block into w: w[(2 gl + hh) * 8 + 2j] =
// the low nibbles (u8 0..15) of packed dword j of half hh of group g0 + gl, w[... + 2j + 1] the
// high ones, one row per lane (0 past nr); hs[gl] = the scales. Prefetches the next unit (the
// next block's first unit at the end of the rows) into L2.
void idot_decode_unit(const IdotBlock& b, size_t g0, size_t ug, __m512i* w, __m512* hs) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const size_t next = (g0 + ug) * 32;
  // An address only (it may lie past the matrix; prefetches do not fault), kept as an integer.
  const uintptr_t pf =
      reinterpret_cast<uintptr_t>(b.p) + (next < b.row_bytes ? next : kIdotRows * b.row_bytes);
  const size_t pf_bytes =
      std::min(kIdotUnit * 32, next < b.row_bytes ? b.row_bytes - next : b.row_bytes);
  for (size_t i = 0; i < kIdotRows; ++i)
    for (size_t c = 0; c < pf_bytes; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(pf + i * b.row_bytes + c), _MM_HINT_T1);
  for (size_t g = 0; g < ug; g += 2) {
    const bool pair = ug - g >= 2;
    const __mmask16 m = pair ? 0xFFFF : 0x00FF;
    __m512i r[16];
    for (size_t i = 0; i < kIdotRows; ++i)
      r[i] = i < b.nr ? _mm512_maskz_loadu_epi32(m, b.p + i * b.row_bytes + (g0 + g) * 32)
                      : _mm512_setzero_si512();
    transpose16(r);  // r[k]: packed dword k % 4 of half k / 4 (counted from group g0 + g)
    for (size_t k = 0; k < (pair ? 16u : 8u); ++k) {
      __m512i* o = w + (2 * g + k / 4) * 8 + 2 * (k % 4);
      o[0] = _mm512_and_si512(r[k], low4);
      o[1] = _mm512_and_si512(_mm512_srli_epi32(r[k], 4), low4);
    }
  }
  idot_scales(b, g0, ug, hs);
}

// acc[s] (16 rows each) += half-groups [h0, h0 + uh) (decoded weights w, group scales hs) of
// activation rows s < S, in ascending h, exactly as int4_idot_step.
template <int S>
void idot_unit(const __m512i* w, const __m512* hs, size_t h0, size_t uh, const IdotActs& x,
               float* acc) {
  __m512 a[S];
  for (int s = 0; s < S; ++s) a[s] = _mm512_load_ps(acc + s * kIdotRows);
  for (size_t hl = 0; hl < uh; ++hl) {
    const size_t h = h0 + hl;
    __m512i wv[8];
    for (int k = 0; k < 8; ++k) wv[k] = _mm512_load_si512(w + hl * 8 + k);
    const __m512 sg = hs[hl / 2];
    for (int s = 0; s < S; ++s) {
      const uint8_t* q = x.qp + (s * x.halves + h) * 32;
      __m512i i = _mm512_set1_epi32(x.qo[s * x.halves + h]);  // -8 * sum(q): the offset
      for (int k = 0; k < 8; ++k) i = _mm512_dpbusd_epi32(i, wv[k], bcast32(q + 4 * k));
      // Exactly int4_idot_step: acc + (float)isum * (d * s), no FMA.
      const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(x.d[s * x.halves + h]), sg);
      a[s] = _mm512_add_ps(a[s], _mm512_mul_ps(_mm512_cvtepi32_ps(i), scale));
    }
  }
  for (int s = 0; s < S; ++s) _mm512_store_ps(acc + s * kIdotRows, a[s]);
}

// tn (>= 2) activation rows over the rows [row_begin, row_end).
void idot_many(const uint8_t* packed, const float* scales, size_t cols, const IdotActs& x,
               size_t tn, float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  using Fn = void (*)(const __m512i*, const __m512*, size_t, size_t, const IdotActs&, float*);
  static constexpr Fn kFns[kIdotSub] = {idot_unit<1>, idot_unit<2>, idot_unit<3>, idot_unit<4>,
                                        idot_unit<5>, idot_unit<6>, idot_unit<7>, idot_unit<8>};
  const size_t groups = cols / 64, row_bytes = cols / 2;
  alignas(64) __m512i w[kIdotUnit * 16];
  alignas(64) __m512 hs[kIdotUnit];
  alignas(64) float acc[kIdotTile * kIdotRows];
  for (size_t o0 = row_begin; o0 < row_end; o0 += kIdotRows) {
    const size_t nr = std::min(kIdotRows, row_end - o0);
    const __mmask16 rmask = static_cast<__mmask16>((1u << nr) - 1);
    const IdotBlock b{packed + o0 * row_bytes, scales + o0 * groups, row_bytes, groups, nr};
    for (size_t t = 0; t < tn; ++t) _mm512_store_ps(acc + t * kIdotRows, _mm512_setzero_ps());
    for (size_t g0 = 0; g0 < groups; g0 += kIdotUnit) {
      const size_t ug = std::min(kIdotUnit, groups - g0);
      idot_decode_unit(b, g0, ug, w, hs);
      for (size_t ts = 0; ts < tn; ts += kIdotSub) {
        const size_t sn = std::min<size_t>(kIdotSub, tn - ts);
        const IdotActs xs{x.qp + ts * x.halves * 32, x.qo + ts * x.halves, x.d + ts * x.halves,
                          x.halves};
        kFns[sn - 1](w, hs, 2 * g0, 2 * ug, xs, acc + ts * kIdotRows);
      }
    }
    for (size_t t = 0; t < tn; ++t)
      _mm512_mask_storeu_ps(Y + t * ldy + o0, rmask, _mm512_load_ps(acc + t * kIdotRows));
  }
}

// One activation row (decode). Per weight row, one 64-byte load covers a window of 128 columns
// (4 half-groups, one per 128-bit lane); its low and high nibbles meet the activations laid out
// to match (ql: dword 4L + j = the even columns of 8-column unit j of half L, qh the odd ones;
// qo: -8 * sum(q) of half L in dword 4L), so two vpdpbusd give 16 partial dwords, 4 per half.
// The 16 rows' partials are reduced and transposed together into one vector per half, one row
// per lane, and the float step runs lane-wise. Rows are read two windows (128 contiguous bytes)
// at a time and prefetched kIdotAhead bytes ahead into L2.
struct IdotWindow {
  __m512i ql, qh, qo;
};

void idot_prepare_n1(const uint8_t* qp, const int32_t* qo, size_t halves, IdotWindow* out) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i oidx =
      _mm512_setr_epi32(0, 16, 16, 16, 1, 16, 16, 16, 2, 16, 16, 16, 3, 16, 16, 16);
  for (size_t h0 = 0, w = 0; h0 < halves; h0 += 4, ++w) {
    const size_t hw = std::min<size_t>(4, halves - h0);  // 4, or 2 in a last half window
    const __m512i a = _mm512_loadu_si512(qp + h0 * 32);
    const __m512i b = hw == 4 ? _mm512_loadu_si512(qp + h0 * 32 + 64) : _mm512_setzero_si512();
    out[w].ql = _mm512_permutex2var_epi32(a, even, b);
    out[w].qh = _mm512_permutex2var_epi32(a, odd, b);
    const __m512i s = _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << hw) - 1), qo + h0);
    out[w].qo = _mm512_permutex2var_epi32(s, oidx, _mm512_setzero_si512());
  }
}

inline __m512i idot_dot_n1(__m512i v, const IdotWindow& x) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i wl = _mm512_and_si512(v, low4);
  const __m512i wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x.qo, wl, x.ql), wh, x.qh);
}

// The 16 rows' partials of one window (dr[i]: row i) -> one vector per half, one row per lane;
// then for the hw halves L ascending: a = a + (float)isum * (d[L] * s[L / 2]).
inline __m512 idot_finish_n1(const __m512i dr[16], const float* d, const __m512* s, size_t hw,
                             __m512 a) {
  __m512i isum[4];
  sum_rows16(dr, isum);
  for (size_t L = 0; L < hw; ++L) {
    // Exactly int4_idot_step: acc + (float)isum * (d * s), no FMA.
    const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(d[L]), s[L / 2]);
    a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_cvtepi32_ps(isum[L]), scale));
  }
  return a;
}

// One block of rows (kFull: all 16 valid) against one prepared activation row; y: Y + o0.
template <bool kFull>
void idot_block_n1(const IdotBlock& b, const IdotWindow* qx, const float* d, float* y) {
  __m512 a = _mm512_setzero_ps();
  alignas(64) __m512 hs[kIdotScaleUnit];
  // Prefetch address of byte `off` of each row, kIdotAhead ahead (into the next block past the
  // end of the rows). An address only (it may lie past the matrix), kept as an integer.
  auto ahead = [&](size_t off) {
    const size_t at = off + kIdotAhead;
    return reinterpret_cast<uintptr_t>(b.p) +
           (at < b.row_bytes ? at : kIdotRows * b.row_bytes + (at - b.row_bytes));
  };
  const uintptr_t next_s = reinterpret_cast<uintptr_t>(b.s + kIdotRows * b.groups);
  for (size_t o = 0; o < kIdotRows * b.groups * sizeof(float); o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(next_s + o), _MM_HINT_T0);
  for (size_t g0 = 0; g0 < b.groups; g0 += kIdotScaleUnit) {
    const size_t ug = std::min(kIdotScaleUnit, b.groups - g0), gend = g0 + ug;
    idot_scales(b, g0, ug, hs);
    size_t w = g0 / 2;                   // window w = groups 2w, 2w + 1
    for (; 2 * w + 4 <= gend; w += 2) {  // two full windows
      const size_t off = w * 64;
      const uintptr_t pf = ahead(off);
      __m512i d0[16], d1[16];
#pragma GCC unroll 16
      for (size_t i = 0; i < kIdotRows; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(pf + i * b.row_bytes), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(pf + i * b.row_bytes + 64), _MM_HINT_T1);
        const __mmask16 m = kFull || i < b.nr ? 0xFFFF : 0;
        d0[i] = idot_dot_n1(_mm512_maskz_loadu_epi32(m, b.p + i * b.row_bytes + off), qx[w]);
        d1[i] =
            idot_dot_n1(_mm512_maskz_loadu_epi32(m, b.p + i * b.row_bytes + off + 64), qx[w + 1]);
      }
      a = idot_finish_n1(d0, d + 4 * w, hs + (2 * w - g0), 4, a);
      a = idot_finish_n1(d1, d + 4 * w + 4, hs + (2 * w + 2 - g0), 4, a);
    }
    for (; 2 * w < gend; ++w) {  // one window, full or (the last of an odd group count) half
      const size_t hw = 2 * w + 2 <= gend ? 4 : 2;
      const size_t off = w * 64;
      const uintptr_t pf = ahead(off);
      __m512i d0[16];
#pragma GCC unroll 16
      for (size_t i = 0; i < kIdotRows; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(pf + i * b.row_bytes), _MM_HINT_T1);
        const __mmask16 m = kFull || i < b.nr ? (hw == 4 ? 0xFFFF : 0x00FF) : 0;
        d0[i] = idot_dot_n1(_mm512_maskz_loadu_epi32(m, b.p + i * b.row_bytes + off), qx[w]);
      }
      a = idot_finish_n1(d0, d + 4 * w, hs + (2 * w - g0), hw, a);
    }
  }
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << b.nr) - 1), a);
}

// ---------------------------------------------------------------------------------------------
// int8 per row on int8 activations (matmul_int8_idot): blocks of 16 weight rows, one row per
// 32-bit lane. Per block and unit of kI8Unit 32-column groups, 16 rows x 2 groups of weight
// bytes are transposed (16x16 dwords) and biased to u8 (w + 128) once, into an L1 buffer; the
// unit is then applied to every activation row, 8 at a time in a register tile: per group and
// activation row, 8 vpdpbusd (u8 w + 128 x broadcast s8 activation dword) started from
// qo = -128 * sum(q8 of the group) give the exact int32 isum of the 16 rows (|partial| <=
// 32 * 255 * 128: no overflow), then the float step of int8_idot_step lane-wise, groups
// ascending, and the row scales at the end: bit-identical to the scalar twin. Each weight is
// read from memory once per call (a block, 16 x cols bytes, stays in L2 across the tiles of 64
// activation rows); the next unit is prefetched.
//
// One activation row (i8_block_n1) skips the transpose: per weight row, one 64-byte load covers
// 2 groups (one per 256-bit half), biased to u8 by a xor and met by one vpdpbusd with the 64
// activation bytes as they are; the 16 rows' partials (8 dwords per group) are reduced and
// transposed together (sum_rows16, then the two 128-bit lanes of a group added) to one vector
// per group with one row per lane, -128 * sum(q) added, and the float step runs lane-wise as
// above. The next block (16 whole rows, contiguous) is prefetched in memory order. On the 2-core
// Zen 5 (7168 columns): from L2 ~0.08-0.12 -> ~0.035-0.045 cycles per weight byte, from DRAM
// 1.6-1.9x the GB/s of the transposing path (median of paired runs, 1 and 2 threads). (Reading
// each row start to end instead, partials to an L2 buffer, was slower from DRAM.)

constexpr size_t kI8Rows = 16;  // weight rows per block, one per 32-bit lane
constexpr size_t kI8Unit = 8;   // groups transposed at a time (8 KiB of weights)
constexpr size_t kI8Tile = 64;  // activation rows per accumulator tile
constexpr int kI8Sub = 8;       // activation rows per register tile

struct I8Acts {
  const int8_t* q;    // [t][cols] the q8 values
  const int32_t* qo;  // [t][groups] -128 * sum(q8 of the group)
  const float* d;     // [t][groups] the q8_32 scales (D)
  size_t cols, groups;
};

// w[gl * 8 + k] = dword k of group g0 + gl of the block's rows (lane i = row i; 0 past nr),
// biased to u8 (xor 0x80). Prefetches the next unit (past the rows: the next block) into L2.
void i8_decode_unit(const int8_t* p, size_t cols, size_t nr, size_t g0, size_t ug, __m512i* w) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const size_t next = (g0 + ug) * 32;
  // An address only (it may lie past the matrix; prefetches do not fault), kept as an integer.
  const uintptr_t pf = reinterpret_cast<uintptr_t>(p) + (next < cols ? next : kI8Rows * cols);
  const size_t pf_bytes = std::min(kI8Unit * 32, next < cols ? cols - next : cols);
  for (size_t i = 0; i < kI8Rows; ++i)
    for (size_t c = 0; c < pf_bytes; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(pf + i * cols + c), _MM_HINT_T1);
  for (size_t g = 0; g < ug; g += 2) {
    const bool pair = ug - g >= 2;
    const __mmask16 m = pair ? 0xFFFF : 0x00FF;
    __m512i r[16];
    for (size_t i = 0; i < kI8Rows; ++i)
      r[i] = i < nr ? _mm512_maskz_loadu_epi32(m, p + i * cols + (g0 + g) * 32)
                    : _mm512_setzero_si512();
    transpose16(r);
    for (size_t k = 0; k < (pair ? 16u : 8u); ++k) w[g * 8 + k] = _mm512_xor_si512(r[k], bias);
  }
}

// acc[s] (16 rows each) += groups [g0, g0 + ug) of activation rows s < S, exactly as
// int8_idot_step, g ascending.
template <int S>
void i8_unit(const __m512i* w, size_t g0, size_t ug, const I8Acts& x, float* acc) {
  __m512 a[S];
  for (int s = 0; s < S; ++s) a[s] = _mm512_load_ps(acc + s * kI8Rows);
  for (size_t gl = 0; gl < ug; ++gl) {
    const size_t h = g0 + gl;
    __m512i wv[8];
    for (int k = 0; k < 8; ++k) wv[k] = _mm512_load_si512(w + gl * 8 + k);
    for (int s = 0; s < S; ++s) {
      const uint8_t* q = reinterpret_cast<const uint8_t*>(x.q + s * x.cols + h * 32);
      __m512i i = _mm512_set1_epi32(x.qo[s * x.groups + h]);
      for (int k = 0; k < 8; ++k) i = _mm512_dpbusd_epi32(i, wv[k], bcast32(q + 4 * k));
      // Exactly int8_idot_step: acc + (float)isum * d, no FMA.
      const __m512 d = _mm512_set1_ps(x.d[s * x.groups + h]);
      a[s] = _mm512_add_ps(a[s], _mm512_mul_ps(_mm512_cvtepi32_ps(i), d));
    }
  }
  for (int s = 0; s < S; ++s) _mm512_store_ps(acc + s * kI8Rows, a[s]);
}

void i8_rows(const int8_t* Q, const float* scales, const I8Acts& x, size_t n, float* Y, size_t ldy,
             size_t row_begin, size_t row_end) {
  using Fn = void (*)(const __m512i*, size_t, size_t, const I8Acts&, float*);
  static constexpr Fn kFns[kI8Sub] = {i8_unit<1>, i8_unit<2>, i8_unit<3>, i8_unit<4>,
                                      i8_unit<5>, i8_unit<6>, i8_unit<7>, i8_unit<8>};
  const size_t cols = x.cols, groups = x.groups;
  alignas(64) __m512i w[kI8Unit * 8];
  alignas(64) float acc[kI8Tile * kI8Rows];
  for (size_t o0 = row_begin; o0 < row_end; o0 += kI8Rows) {
    const size_t nr = std::min(kI8Rows, row_end - o0);
    const __mmask16 rmask = static_cast<__mmask16>((1u << nr) - 1);
    const int8_t* p = Q + o0 * cols;
    const __m512 sv = _mm512_maskz_loadu_ps(rmask, scales + o0);
    for (size_t t0 = 0; t0 < n; t0 += kI8Tile) {
      const size_t tn = std::min(kI8Tile, n - t0);
      for (size_t t = 0; t < tn; ++t) _mm512_store_ps(acc + t * kI8Rows, _mm512_setzero_ps());
      for (size_t g0 = 0; g0 < groups; g0 += kI8Unit) {
        const size_t ug = std::min(kI8Unit, groups - g0);
        i8_decode_unit(p, cols, nr, g0, ug, w);
        for (size_t ts = 0; ts < tn; ts += kI8Sub) {
          const size_t sn = std::min<size_t>(kI8Sub, tn - ts);
          const size_t t = t0 + ts;
          const I8Acts xs{x.q + t * cols, x.qo + t * groups, x.d + t * groups, cols, groups};
          kFns[sn - 1](w, g0, ug, xs, acc + ts * kI8Rows);
        }
      }
      for (size_t t = 0; t < tn; ++t)
        _mm512_mask_storeu_ps(Y + (t0 + t) * ldy + o0, rmask,
                              _mm512_mul_ps(sv, _mm512_load_ps(acc + t * kI8Rows)));
    }
  }
}

// One activation row: the block of rows [o0, o0 + nr) (kFull: nr = 16) of Q (row o0 at p);
// y = Y + o0, sv = the row scales.
template <bool kFull>
void i8_block_n1(const int8_t* p, size_t nr, const I8Acts& x, __m512 sv, float* y) {
  const size_t cols = x.cols, groups = x.groups;
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  // The next block: an address only (it may lie past the matrix; prefetches do not fault).
  const uintptr_t next = reinterpret_cast<uintptr_t>(p) + kI8Rows * cols;
  __m512 a = _mm512_setzero_ps();
  // Groups h and h + 1 (hm = 0x00FF: h only) of the 16 rows.
  auto window = [&](size_t h, __mmask16 hm) {
    const size_t off = h * 32;
    const __m512i q = _mm512_maskz_loadu_epi32(hm, x.q + off);
    __m512i dr[16];
#pragma GCC unroll 16
    for (size_t i = 0; i < kI8Rows; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(next + kI8Rows * off + i * 64), _MM_HINT_T1);
      const __mmask16 m = kFull || i < nr ? hm : 0;
      const __m512i w = _mm512_xor_si512(_mm512_maskz_loadu_epi32(m, p + i * cols + off), bias);
      dr[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, q);
    }
    __m512i lane[4];
    sum_rows16(dr, lane);
    // Exactly int8_idot_step: acc + (float)isum * d, no FMA, h ascending.
    const __m512i i0 =
        _mm512_add_epi32(_mm512_add_epi32(lane[0], lane[1]), _mm512_set1_epi32(x.qo[h]));
    a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_cvtepi32_ps(i0), _mm512_set1_ps(x.d[h])));
    if (hm == 0xFFFF) {
      const __m512i i1 =
          _mm512_add_epi32(_mm512_add_epi32(lane[2], lane[3]), _mm512_set1_epi32(x.qo[h + 1]));
      a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_cvtepi32_ps(i1), _mm512_set1_ps(x.d[h + 1])));
    }
  };
  size_t h = 0;
  for (; h + 2 <= groups; h += 2) window(h, 0xFFFF);
  if (h < groups) window(h, 0x00FF);
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << nr) - 1), _mm512_mul_ps(sv, a));
}

}  // namespace

void matmul_f32_avx512(const float* W, size_t cols, const float* X, size_t n, float* Y, size_t ldy,
                       size_t row_begin, size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  f32_rows(W, cols, X, n, Y, ldy, row_begin, row_end);
}

void matmul_int8_avx512(const int8_t* Q, const float* scales, size_t cols, const float* X, size_t n,
                        float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  int8_rows(Q, scales, cols, X, n, Y, ldy, row_begin, row_end);
}

void matmul_int4_avx512(const uint8_t* packed, const float* scales, size_t cols, const float* X,
                        size_t n, float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  if (n == 1) return int4_row1_rows(packed, scales, cols, X, Y, row_begin, row_end);
  if (n <= kInt4DirectMax)
    return int4_direct_rows(packed, scales, cols, X, n, Y, ldy, row_begin, row_end);
  int4_panel(packed, scales, cols, X, n, Y, ldy, row_begin, row_end);
}

void matmul_int4_idot_avx512(const uint8_t* packed, const float* scales, size_t cols,
                             const int8_t* Q8, const float* D, size_t n, float* Y, size_t ldy,
                             size_t row_begin, size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  const size_t groups = cols / 64, halves = 2 * groups, row_bytes = cols / 2;
  if (groups == 0) {
    for (size_t t = 0; t < n; ++t)
      for (size_t o = row_begin; o < row_end; ++o) Y[t * ldy + o] = 0.0f;
    return;
  }
  thread_local std::vector<uint8_t, AlignedAlloc<uint8_t, 64>> qp;
  thread_local std::vector<int32_t, AlignedAlloc<int32_t, 64>> qo;
  thread_local std::vector<IdotWindow, AlignedAlloc<IdotWindow, 64>> qw;
  const size_t tile = std::min(n, kIdotTile);
  if (qp.size() < tile * halves * 32) qp.resize(tile * halves * 32);
  if (qo.size() < tile * halves) qo.resize(tile * halves);
  for (size_t t0 = 0; t0 < n; t0 += kIdotTile) {
    const size_t tn = std::min(kIdotTile, n - t0);
    prepare(Q8 + t0 * cols, cols, tn, 0, halves, 8, qp.data(), qo.data());
    const IdotActs x{qp.data(), qo.data(), D + t0 * halves, halves};
    if (tn > 1) {
      idot_many(packed, scales, cols, x, tn, Y + t0 * ldy, ldy, row_begin, row_end);
      continue;
    }
    const size_t windows = (halves + 3) / 4;
    if (qw.size() < windows) qw.resize(windows);
    idot_prepare_n1(qp.data(), qo.data(), halves, qw.data());
    for (size_t o0 = row_begin; o0 < row_end; o0 += kIdotRows) {
      const size_t nr = std::min(kIdotRows, row_end - o0);
      const IdotBlock b{packed + o0 * row_bytes, scales + o0 * groups, row_bytes, groups, nr};
      if (nr == kIdotRows)
        idot_block_n1<true>(b, qw.data(), x.d, Y + t0 * ldy + o0);
      else
        idot_block_n1<false>(b, qw.data(), x.d, Y + t0 * ldy + o0);
    }
  }
}

void matmul_int8_idot_avx512(const int8_t* Q, const float* scales, size_t cols, const int8_t* Q8,
                             const float* D, size_t n, float* Y, size_t ldy, size_t row_begin,
                             size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  const size_t groups = cols / 32;
  thread_local std::vector<int32_t, AlignedAlloc<int32_t, 64>> qo;
  if (qo.size() < n * groups) qo.resize(n * groups);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  for (size_t t = 0; t < n; ++t)
    for (size_t h = 0; h < groups; ++h) {
      // sum(q + 128) of the group by vpsadbw, then -128 * sum(q).
      const __m256i v =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Q8 + t * cols + h * 32));
      const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(v, bias), _mm256_setzero_si256());
      const int32_t sum = _mm256_extract_epi32(sad, 0) + _mm256_extract_epi32(sad, 2) +
                          _mm256_extract_epi32(sad, 4) + _mm256_extract_epi32(sad, 6) - 32 * 128;
      qo[t * groups + h] = -128 * sum;
    }
  const I8Acts x{Q8, qo.data(), D, cols, groups};
  if (n > 1) return i8_rows(Q, scales, x, n, Y, ldy, row_begin, row_end);
  for (size_t o0 = row_begin; o0 < row_end; o0 += kI8Rows) {
    const size_t nr = std::min(kI8Rows, row_end - o0);
    const __m512 sv = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << nr) - 1), scales + o0);
    if (nr == kI8Rows)
      i8_block_n1<true>(Q + o0 * cols, nr, x, sv, Y + o0);
    else
      i8_block_n1<false>(Q + o0 * cols, nr, x, sv, Y + o0);
  }
}

}  // namespace k3::impl

// kernels/impl/dense_avx2.cpp — AVX2+FMA variants of the dense kernels (f32, int8 per row, int4
// group-64). Compiled with -mavx2 -mfma; called only after a run-time CPU check (isa.cpp).
//
// The loop shapes of dense_avx512.cpp at 8 lanes and 16 registers. Each weight row is read from
// memory once per call (the int4 panel: once per 64 activation rows):
//  * f32, int8 (any n) and int4 (n <= 2): weights widened to f32 in registers (f32: loaded as
//    they are) and FMA'd against a few activation rows at a time (register tiles of 4 x 1..2
//    or 2 x 3..6 independent accumulators), the activation rows swept over a panel of weight
//    rows sized to stay in L2 so only the first sweep reads DRAM. int4 (one row at a time)
//    splits the activations into even/odd columns (the low/high nibbles) and scales each
//    group's partial sum once.
//  * int4 (n > 2): 4 weight rows x 512 columns decoded once into an f32 stack buffer and swept
//    by the register tiles against up to 64 activation rows, partial sums kept across column
//    chunks; the next chunk is prefetched.
// Columns past the last multiple of 8 are summed in scalar code. Results match the scalar twins
// up to summation order (int4 also rounds s_g * (k - 8) to f32 in the panel); a row's result
// does not depend on the row range it is computed in.
#include <immintrin.h>

#include <algorithm>

#include "kernels/impl/kernels_impl.h"

namespace k3::impl {
namespace {

constexpr size_t kV = 8;              // f32 lanes
constexpr int kR = 4;                 // weight rows per block
constexpr int kTR = 2;                // weight rows of the wide register tile
constexpr size_t kT = 6;              // activation rows of the wide register tile
constexpr size_t kKC = 512;           // int4 panel: columns per decoded chunk
constexpr size_t kNT = 64;            // int4 panel: activation rows per accumulator block
constexpr size_t kInt4DirectMax = 2;  // int4: in-register decode up to this many activation rows

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Software prefetch of `bytes` starting at p (the next weight chunk while this one is computed:
// chunks are read in bursts, which the hardware prefetcher does not run ahead of).
inline void prefetch(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T0);
}

inline __m256 widen8(const int8_t* q) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}

// Weight rows per panel (a multiple of kR, 4..64) so that a panel of rows of `row_bytes` each
// takes about `budget` bytes: it stays in L2 (next to one tile of activation rows) while the
// activation rows are swept over it.
inline size_t panel_rows(size_t row_bytes, size_t budget) {
  return std::clamp<size_t>(budget / std::max<size_t>(row_bytes, 1) / kR * kR, kR, 64);
}

// ---------------------------------------------------------------------------------------------
// The f32 register tile (f32 path and int4 panel).

// acc[t][r] (kR slots per t, kV lanes each) = (first ? 0 : acc) + W[r][0..kc) . X[t][0..kc)
// lane-wise, over R x T rows; kc is a multiple of 8.
template <int R, int T>
void tile(const float* w, size_t ldw, const float* x, size_t ldx, size_t kc, float* acc, bool first) {
  __m256 a[R][T];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      a[r][t] = first ? _mm256_setzero_ps() : _mm256_load_ps(acc + (static_cast<size_t>(t) * kR + r) * kV);
  for (size_t k = 0; k < kc; k += kV) {
    __m256 wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w + static_cast<size_t>(r) * ldw + k);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + static_cast<size_t>(t) * ldx + k);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) a[r][t] = _mm256_fmadd_ps(wv[r], xv, a[r][t]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) _mm256_store_ps(acc + (static_cast<size_t>(t) * kR + r) * kV, a[r][t]);
}

using TileFn = void (*)(const float*, size_t, const float*, size_t, size_t, float*, bool);

template <int R>
TileFn tile_for(size_t t) {
  switch (t) {
    case 1: return tile<R, 1>;
    case 2: return tile<R, 2>;
    case 3: return tile<R, 3>;
    case 4: return tile<R, 4>;
    case 5: return tile<R, 5>;
    default: return tile<R, 6>;
  }
}

// rb (<= 4) weight rows x tb (<= 6) activation rows: one 4 x tb tile when tb <= 2 (enough
// independent accumulators), else 2 x tb tiles (16 registers).
void sweep(const float* w, size_t ldw, const float* x, size_t ldx, size_t kc, int rb, size_t tb,
           float* acc, bool first) {
  if (rb == kR && tb <= 2) return tile_for<kR>(tb)(w, ldw, x, ldx, kc, acc, first);
  int r = 0;
  for (; r + kTR <= rb; r += kTR)
    tile_for<kTR>(tb)(w + static_cast<size_t>(r) * ldw, ldw, x, ldx, kc, acc + static_cast<size_t>(r) * kV, first);
  if (r < rb) tile_for<1>(tb)(w + static_cast<size_t>(r) * ldw, ldw, x, ldx, kc, acc + static_cast<size_t>(r) * kV, first);
}

// f32: weights read in place over all columns, activation rows kT at a time over panels of
// weight rows that stay in L2.
void f32_rows(const float* W, size_t cols, const float* X, size_t n, float* Y, size_t ldy,
              size_t row_begin, size_t row_end) {
  alignas(32) float acc[kT * kR * kV];
  const size_t cv = cols & ~(kV - 1);
  const size_t prows = panel_rows(cols * sizeof(float), size_t{256} << 10);
  for (size_t p0 = row_begin; p0 < row_end; p0 += prows) {
    const size_t p1 = std::min(row_end, p0 + prows);
    for (size_t t = 0; t < n; t += kT) {
      const size_t tb = std::min(kT, n - t);
      for (size_t o = p0; o < p1; o += kR) {
        const int rb = static_cast<int>(std::min<size_t>(kR, p1 - o));
        sweep(W + o * cols, cols, X + t * cols, cols, cv, rb, tb, acc, true);
        for (size_t tt = 0; tt < tb; ++tt)
          for (int r = 0; r < rb; ++r) {
            const float* w = W + (o + static_cast<size_t>(r)) * cols;
            const float* x = X + (t + tt) * cols;
            float sum = hsum(_mm256_load_ps(acc + (tt * kR + static_cast<size_t>(r)) * kV));
            for (size_t i = cv; i < cols; ++i) sum += w[i] * x[i];
            Y[(t + tt) * ldy + o + static_cast<size_t>(r)] = sum;
          }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// int8: weights widened in registers, R weight rows x T activation rows.

template <int R, int T>
void int8_direct(const int8_t* Q, const float* scales, size_t cols, const float* X, float* Y,
                 size_t ldy, size_t o0) {
  __m256 a[R][T];
  const int8_t* q[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    q[r] = Q + (o0 + static_cast<size_t>(r)) * cols;
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) a[r][t] = _mm256_setzero_ps();
  }
  const size_t cv = cols & ~(kV - 1);
  for (size_t k = 0; k < cv; k += kV) {
    __m256 wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wv[r] = widen8(q[r] + k);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(X + static_cast<size_t>(t) * cols + k);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) a[r][t] = _mm256_fmadd_ps(wv[r], xv, a[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      const float* x = X + static_cast<size_t>(t) * cols;
      float sum = hsum(a[r][t]);
      for (size_t i = cv; i < cols; ++i) sum += static_cast<float>(q[r][i]) * x[i];
      Y[static_cast<size_t>(t) * ldy + o0 + static_cast<size_t>(r)] = scales[o0 + static_cast<size_t>(r)] * sum;
    }
}

using Int8Fn = void (*)(const int8_t*, const float*, size_t, const float*, float*, size_t, size_t);

template <int R>
Int8Fn int8_direct_for(size_t t) {
  switch (t) {
    case 1: return int8_direct<R, 1>;
    case 2: return int8_direct<R, 2>;
    case 3: return int8_direct<R, 3>;
    case 4: return int8_direct<R, 4>;
    case 5: return int8_direct<R, 5>;
    default: return int8_direct<R, 6>;
  }
}

// For each panel of weight rows and each tile of activation rows (n <= 4: 2 at a time against 4
// weight rows; else up to 6 against 2 weight rows), every block of weight rows (weights come
// from DRAM on the first tile, from L2 after).
void int8_rows(const int8_t* Q, const float* scales, size_t cols, const float* X, size_t n, float* Y,
               size_t ldy, size_t row_begin, size_t row_end) {
  const size_t prows = panel_rows(cols, size_t{128} << 10);
  const bool wide = n > 4;
  const size_t step = wide ? kT : 2;
  for (size_t p0 = row_begin; p0 < row_end; p0 += prows) {
    const size_t p1 = std::min(row_end, p0 + prows);
    for (size_t t = 0; t < n; t += step) {
      const size_t tb = std::min(step, n - t);
      const float* x = X + t * cols;
      float* y = Y + t * ldy;
      size_t o = p0;
      if (wide) {
        for (; o + kTR <= p1; o += kTR) int8_direct_for<kTR>(tb)(Q, scales, cols, x, y, ldy, o);
      } else {
        for (; o + kR <= p1; o += kR) int8_direct_for<kR>(tb)(Q, scales, cols, x, y, ldy, o);
      }
      for (; o < p1; ++o) int8_direct_for<1>(tb)(Q, scales, cols, x, y, ldy, o);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// int4, few activation rows (one at a time): per 16 columns the activations are split into even
// and odd columns (matching the low and high nibbles of 8 consecutive bytes); per-group partial
// sums are scaled once per group.

template <int R>
void int4_direct(const uint8_t* packed, const float* scales, size_t cols, const float* x, float* y,
                 size_t o0) {
  const size_t groups = cols / 64;
  const __m256i mask = _mm256_set1_epi32(0xF), eight = _mm256_set1_epi32(8);
  __m256 acc[R];
  const uint8_t* p[R];
  const float* s[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    p[r] = packed + (o0 + static_cast<size_t>(r)) * (cols / 2);
    s[r] = scales + (o0 + static_cast<size_t>(r)) * groups;
    acc[r] = _mm256_setzero_ps();
  }
  for (size_t g = 0; g < groups; ++g) {
    __m256 ga[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) ga[r] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (size_t k = 0; k < 64; k += 16) {
      const __m256 x0 = _mm256_loadu_ps(x + g * 64 + k), x1 = _mm256_loadu_ps(x + g * 64 + k + 8);
      const __m256 xe = _mm256_castpd_ps(_mm256_permute4x64_pd(
          _mm256_castps_pd(_mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)));
      const __m256 xo = _mm256_castpd_ps(_mm256_permute4x64_pd(
          _mm256_castps_pd(_mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p[r] + g * 32 + k / 2)));
        const __m256 lo = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v, mask), eight));
        const __m256 hi = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v, 4), eight));
        ga[r] = _mm256_fmadd_ps(lo, xe, ga[r]);
        ga[r] = _mm256_fmadd_ps(hi, xo, ga[r]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(s[r][g]), ga[r], acc[r]);
  }
  for (int r = 0; r < R; ++r) y[o0 + static_cast<size_t>(r)] = hsum(acc[r]);
}

// One activation row at a time over panels of weight rows that stay in L2.
void int4_direct_rows(const uint8_t* packed, const float* scales, size_t cols, const float* X,
                      size_t n, float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  const size_t prows = panel_rows(cols / 2, size_t{128} << 10);
  for (size_t p0 = row_begin; p0 < row_end; p0 += prows) {
    const size_t p1 = std::min(row_end, p0 + prows);
    for (size_t t = 0; t < n; ++t) {
      size_t o = p0;
      for (; o + kR <= p1; o += kR) int4_direct<kR>(packed, scales, cols, X + t * cols, Y + t * ldy, o);
      for (; o < p1; ++o) int4_direct<1>(packed, scales, cols, X + t * cols, Y + t * ldy, o);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// int4, many activation rows: 4 weight rows x kKC columns decoded once to w = s_g * (k - 8) in
// column order, swept by the register tiles against up to kNT activation rows; per-lane partial
// sums persist across column chunks.

void decode_int4(const uint8_t* packed, const float* scales, size_t cols, size_t o0, int rb,
                 size_t c0, size_t kc, float* buf) {
  const __m256i mask = _mm256_set1_epi32(0xF), eight = _mm256_set1_epi32(8);
  const size_t groups = cols / 64;
  for (int r = 0; r < rb; ++r) {
    const size_t o = o0 + static_cast<size_t>(r);
    const uint8_t* p = packed + o * (cols / 2) + c0 / 2;
    const float* s = scales + o * groups + c0 / 64;
    float* d = buf + static_cast<size_t>(r) * kKC;
    for (size_t g = 0; g < kc / 64; ++g) {
      const __m256 sv = _mm256_set1_ps(s[g]);
      for (size_t k = 0; k < 64; k += 16) {
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + g * 32 + k / 2)));
        const __m256 lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v, mask), eight)), sv);
        const __m256 hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v, 4), eight)), sv);
        const __m256 u0 = _mm256_unpacklo_ps(lo, hi);  // l0 h0 l1 h1 | l4 h4 l5 h5
        const __m256 u1 = _mm256_unpackhi_ps(lo, hi);  // l2 h2 l3 h3 | l6 h6 l7 h7
        _mm256_store_ps(d + g * 64 + k, _mm256_permute2f128_ps(u0, u1, 0x20));
        _mm256_store_ps(d + g * 64 + k + 8, _mm256_permute2f128_ps(u0, u1, 0x31));
      }
    }
  }
}

void prefetch_int4(const uint8_t* packed, const float* scales, size_t cols, size_t o, size_t c0, size_t kc) {
  prefetch(packed + o * (cols / 2) + c0 / 2, kc / 2);
  prefetch(scales + o * (cols / 64) + c0 / 64, kc / 16);
}

void int4_panel(const uint8_t* packed, const float* scales, size_t cols, const float* X, size_t n,
                float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  alignas(32) float wbuf[kR * kKC];
  alignas(32) float accbuf[kNT * kR * kV];
  for (size_t o0 = row_begin; o0 < row_end; o0 += kR) {
    const int rb = static_cast<int>(std::min<size_t>(kR, row_end - o0));
    for (size_t t0 = 0; t0 < n; t0 += kNT) {
      const size_t nt = std::min(kNT, n - t0);
      for (size_t c0 = 0; c0 < cols; c0 += kKC) {
        const size_t kc = std::min(kKC, cols - c0);
        // Prefetch the chunk after this one (next columns, else the next block's first columns).
        if (c0 + kKC < cols) {
          for (int r = 0; r < rb; ++r)
            prefetch_int4(packed, scales, cols, o0 + static_cast<size_t>(r), c0 + kKC, std::min(kKC, cols - c0 - kKC));
        } else {
          for (size_t o = o0 + kR; o < std::min(row_end, o0 + 2 * kR); ++o)
            prefetch_int4(packed, scales, cols, o, 0, std::min(kKC, cols));
        }
        decode_int4(packed, scales, cols, o0, rb, c0, kc, wbuf);
        for (size_t t = 0; t < nt; t += kT)
          sweep(wbuf, kKC, X + (t0 + t) * cols + c0, cols, kc, rb, std::min(kT, nt - t), accbuf + t * kR * kV, c0 == 0);
      }
      for (size_t t = 0; t < nt; ++t)
        for (int r = 0; r < rb; ++r)
          Y[(t0 + t) * ldy + o0 + static_cast<size_t>(r)] =
              cols ? hsum(_mm256_load_ps(accbuf + (t * kR + static_cast<size_t>(r)) * kV)) : 0.0f;
    }
  }
}

}  // namespace

void matmul_f32_avx2(const float* W, size_t cols, const float* X, size_t n, float* Y, size_t ldy,
                     size_t row_begin, size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  f32_rows(W, cols, X, n, Y, ldy, row_begin, row_end);
}

void matmul_int8_avx2(const int8_t* Q, const float* scales, size_t cols, const float* X, size_t n,
                      float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  int8_rows(Q, scales, cols, X, n, Y, ldy, row_begin, row_end);
}

void matmul_int4_avx2(const uint8_t* packed, const float* scales, size_t cols, const float* X,
                      size_t n, float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  if (n <= kInt4DirectMax) return int4_direct_rows(packed, scales, cols, X, n, Y, ldy, row_begin, row_end);
  int4_panel(packed, scales, cols, X, n, Y, ldy, row_begin, row_end);
}

}  // namespace k3::impl

// kernels/impl/dense_avx2.cpp — AVX2+FMA variants of the dense kernels (f32, int8 per row, int4
// group-64, and int4 group-64 on int8 activations, whose section below describes its own
// layout). Compiled with -mavx2 -mfma; called only after a run-time CPU check (isa.cpp).
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
// Columns past the last multiple of 8 are summed in scalar code. Results of the float kernels
// match the scalar twins up to summation order (int4 also rounds s_g * (k - 8) to f32 in the
// panel); a row's result does not depend on the row range it is computed in.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "kernels_impl.h"
#include "x86_common.h"

namespace k3::impl {
namespace {

constexpr size_t kV = 8;              // f32 lanes
constexpr int kR = 4;                 // weight rows per block
constexpr int kTR = 2;                // weight rows of the wide register tile
constexpr size_t kT = 6;              // activation rows of the wide register tile
constexpr size_t kKC = 512;           // int4 panel: columns per decoded chunk
constexpr size_t kNT = 64;            // int4 panel: activation rows per accumulator block
constexpr size_t kInt4DirectMax = 2;  // int4: in-register decode up to this many activation rows

// Software prefetch of `bytes` starting at p (the next weight chunk while this one is computed:
// chunks are read in bursts, which the hardware prefetcher does not run ahead of).
inline void prefetch(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T0);
}

inline __m256 widen8(const int8_t* q) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
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
void tile(const float* w, size_t ldw, const float* x, size_t ldx, size_t kc, float* acc,
          bool first) {
  __m256 a[R][T];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      a[r][t] = first ? _mm256_setzero_ps()
                      : _mm256_load_ps(acc + (static_cast<size_t>(t) * kR + r) * kV);
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
    for (int t = 0; t < T; ++t)
      _mm256_store_ps(acc + (static_cast<size_t>(t) * kR + r) * kV, a[r][t]);
}

using TileFn = void (*)(const float*, size_t, const float*, size_t, size_t, float*, bool);

template <int R>
TileFn tile_for(size_t t) {
  switch (t) {
    case 1:
      return tile<R, 1>;
    case 2:
      return tile<R, 2>;
    case 3:
      return tile<R, 3>;
    case 4:
      return tile<R, 4>;
    case 5:
      return tile<R, 5>;
    default:
      return tile<R, 6>;
  }
}

// rb (<= 4) weight rows x tb (<= 6) activation rows: one 4 x tb tile when tb <= 2 (enough
// independent accumulators), else 2 x tb tiles (16 registers).
void sweep(const float* w, size_t ldw, const float* x, size_t ldx, size_t kc, int rb, size_t tb,
           float* acc, bool first) {
  if (rb == kR && tb <= 2) return tile_for<kR>(tb)(w, ldw, x, ldx, kc, acc, first);
  int r = 0;
  for (; r + kTR <= rb; r += kTR)
    tile_for<kTR>(tb)(w + static_cast<size_t>(r) * ldw, ldw, x, ldx, kc,
                      acc + static_cast<size_t>(r) * kV, first);
  if (r < rb)
    tile_for<1>(tb)(w + static_cast<size_t>(r) * ldw, ldw, x, ldx, kc,
                    acc + static_cast<size_t>(r) * kV, first);
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
      Y[static_cast<size_t>(t) * ldy + o0 + static_cast<size_t>(r)] =
          scales[o0 + static_cast<size_t>(r)] * sum;
    }
}

using Int8Fn = void (*)(const int8_t*, const float*, size_t, const float*, float*, size_t, size_t);

template <int R>
Int8Fn int8_direct_for(size_t t) {
  switch (t) {
    case 1:
      return int8_direct<R, 1>;
    case 2:
      return int8_direct<R, 2>;
    case 3:
      return int8_direct<R, 3>;
    case 4:
      return int8_direct<R, 4>;
    case 5:
      return int8_direct<R, 5>;
    default:
      return int8_direct<R, 6>;
  }
}

// For each panel of weight rows and each tile of activation rows (n <= 4: 2 at a time against 4
// weight rows; else up to 6 against 2 weight rows), every block of weight rows (weights come
// from DRAM on the first tile, from L2 after).
void int8_rows(const int8_t* Q, const float* scales, size_t cols, const float* X, size_t n,
               float* Y, size_t ldy, size_t row_begin, size_t row_end) {
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
          _mm256_castps_pd(_mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0))),
          _MM_SHUFFLE(3, 1, 2, 0)));
      const __m256 xo = _mm256_castpd_ps(_mm256_permute4x64_pd(
          _mm256_castps_pd(_mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1))),
          _MM_SHUFFLE(3, 1, 2, 0)));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m256i v = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p[r] + g * 32 + k / 2)));
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
      for (; o + kR <= p1; o += kR)
        int4_direct<kR>(packed, scales, cols, X + t * cols, Y + t * ldy, o);
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
        const __m256i v = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + g * 32 + k / 2)));
        const __m256 lo = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v, mask), eight)), sv);
        const __m256 hi =
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v, 4), eight)), sv);
        const __m256 u0 = _mm256_unpacklo_ps(lo, hi);  // l0 h0 l1 h1 | l4 h4 l5 h5
        const __m256 u1 = _mm256_unpackhi_ps(lo, hi);  // l2 h2 l3 h3 | l6 h6 l7 h7
        _mm256_store_ps(d + g * 64 + k, _mm256_permute2f128_ps(u0, u1, 0x20));
        _mm256_store_ps(d + g * 64 + k + 8, _mm256_permute2f128_ps(u0, u1, 0x31));
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
            prefetch_int4(packed, scales, cols, o0 + static_cast<size_t>(r), c0 + kKC,
                          std::min(kKC, cols - c0 - kKC));
        } else {
          for (size_t o = o0 + kR; o < std::min(row_end, o0 + 2 * kR); ++o)
            prefetch_int4(packed, scales, cols, o, 0, std::min(kKC, cols));
        }
        decode_int4(packed, scales, cols, o0, rb, c0, kc, wbuf);
        for (size_t t = 0; t < nt; t += kT)
          sweep(wbuf, kKC, X + (t0 + t) * cols + c0, cols, kc, rb, std::min(kT, nt - t),
                accbuf + t * kR * kV, c0 == 0);
      }
      for (size_t t = 0; t < nt; ++t)
        for (int r = 0; r < rb; ++r)
          Y[(t0 + t) * ldy + o0 + static_cast<size_t>(r)] =
              cols ? hsum(_mm256_load_ps(accbuf + (t * kR + static_cast<size_t>(r)) * kV)) : 0.0f;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// int4 on int8 activations (matmul_int4_idot): as in dense_avx512.cpp, with 8 weight rows per
// block (one per 32-bit lane) and no VNNI. The activations are prepared once per call and tile
// of up to 64 rows (per half-group: the columns of every 8 reordered as 0,2,4,6,1,3,5,7, and
// qo = -8 * sum(q)). Per block and unit of kIdotUnit groups, 8 rows x 1 group of packed bytes
// are transposed (8x8 dwords) and split into low and high nibbles once, into an L1 buffer, and
// the scales likewise. Per half-group and activation row, vpmaddubsw (unsigned nibble x signed
// broadcast activation dword) gives int16 pair sums; the 8 of a half-group are added in int16
// (|sum| <= 8 * 2 * 15 * 128 = 30720: no overflow) and vpmaddwd widens them, so
//   isum = qo + sum nib * q      (exact int32),
// then the float step of int4_idot_step runs lane-wise, half-groups ascending: bit-identical to
// the scalar twin. Up to 4 activation rows per register tile; the next unit is prefetched into
// L2. One activation row: no weight transpose (idot_block_n1). Measured on the Zen 4 box with
// --isa avx2 (2 threads, weights from DRAM): 1 row ~27-29 GB/s (f32-activation int4 path
// ~14-16), 64 rows ~1.4 GB/s (~0.5), 3.2-3.3x the one-row throughput per activation row.

constexpr size_t kIdotRows = 8;   // weight rows per block, one per 32-bit lane
constexpr size_t kIdotUnit = 8;   // groups decoded at a time (4 KiB of decoded weights)
constexpr size_t kIdotTile = 64;  // activation rows per tile
constexpr int kIdotSub = 4;       // activation rows per register tile

inline __m256i bcast32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
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
  size_t nr;         // valid rows (<= 8)
};

// hs[g] = the scales of groups [g0, g0 + ug) (ug <= 8), one row per lane (0 past nr).
inline void idot_scales(const IdotBlock& b, size_t g0, size_t ug, __m256* hs) {
  __m256i r[8];
  for (size_t i = 0; i < kIdotRows; ++i) {
    alignas(32) float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (i < b.nr) std::memcpy(v, b.s + i * b.groups + g0, ug * sizeof(float));
    r[i] = _mm256_castps_si256(_mm256_load_ps(v));
  }
  transpose8(r);
  for (size_t g = 0; g < ug; ++g) hs[g] = _mm256_castsi256_ps(r[g]);
}

// Decodes groups [g0, g0 + ug) (ug <= kIdotUnit) of a block into w: w[(2 gl + hh) * 8 + 2j] =
// the low nibbles (u8 0..15) of packed dword j of half hh of group g0 + gl, w[... + 2j + 1] the
// high ones, one row per lane (0 past nr); hs[gl] = the scales. Prefetches the next unit (the
// next block's first unit at the end of the rows) into L2.
void idot_decode_unit(const IdotBlock& b, size_t g0, size_t ug, __m256i* w, __m256* hs) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const size_t next = (g0 + ug) * 32;
  // An address only (it may lie past the matrix; prefetches do not fault), kept as an integer.
  const uintptr_t pf =
      reinterpret_cast<uintptr_t>(b.p) + (next < b.row_bytes ? next : kIdotRows * b.row_bytes);
  const size_t pf_bytes =
      std::min(kIdotUnit * 32, next < b.row_bytes ? b.row_bytes - next : b.row_bytes);
  for (size_t i = 0; i < kIdotRows; ++i)
    for (size_t c = 0; c < pf_bytes; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(pf + i * b.row_bytes + c), _MM_HINT_T1);
  for (size_t g = 0; g < ug; ++g) {
    __m256i r[8];
    for (size_t i = 0; i < kIdotRows; ++i)
      r[i] = i < b.nr ? _mm256_loadu_si256(
                            reinterpret_cast<const __m256i*>(b.p + i * b.row_bytes + (g0 + g) * 32))
                      : _mm256_setzero_si256();
    transpose8(r);  // r[k]: packed dword k % 4 of half k / 4
    for (size_t k = 0; k < 8; ++k) {
      __m256i* o = w + (2 * g + k / 4) * 8 + 2 * (k % 4);
      o[0] = _mm256_and_si256(r[k], low4);
      o[1] = _mm256_and_si256(_mm256_srli_epi32(r[k], 4), low4);
    }
  }
  idot_scales(b, g0, ug, hs);
}

// acc[s] (8 rows each) += half-groups [h0, h0 + uh) (decoded weights w, group scales hs) of
// activation rows s < S, in ascending h, exactly as int4_idot_step.
template <int S>
void idot_unit(const __m256i* w, const __m256* hs, size_t h0, size_t uh, const IdotActs& x,
               float* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 a[S];
  for (int s = 0; s < S; ++s) a[s] = _mm256_load_ps(acc + s * kIdotRows);
  for (size_t hl = 0; hl < uh; ++hl) {
    const size_t h = h0 + hl;
    const __m256i* wv = w + hl * 8;
    const __m256 sg = hs[hl / 2];
    for (int s = 0; s < S; ++s) {
      const uint8_t* q = x.qp + (s * x.halves + h) * 32;
      __m256i p0 = _mm256_maddubs_epi16(wv[0], bcast32(q));
      __m256i p1 = _mm256_maddubs_epi16(wv[4], bcast32(q + 16));
      for (int k = 1; k < 4; ++k) {
        p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(wv[k], bcast32(q + 4 * k)));
        p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(wv[4 + k], bcast32(q + 16 + 4 * k)));
      }
      __m256i i = _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones);
      i = _mm256_add_epi32(i,
                           _mm256_set1_epi32(x.qo[s * x.halves + h]));  // -8 * sum(q): the offset
      // Exactly int4_idot_step: acc + (float)isum * (d * s), no FMA.
      const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(x.d[s * x.halves + h]), sg);
      a[s] = _mm256_add_ps(a[s], _mm256_mul_ps(_mm256_cvtepi32_ps(i), scale));
    }
  }
  for (int s = 0; s < S; ++s) _mm256_store_ps(acc + s * kIdotRows, a[s]);
}

inline __m256i row_mask(size_t nr) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(nr)), lane);
}

void idot_rows(const uint8_t* packed, const float* scales, size_t cols, const IdotActs& x,
               size_t tn, float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  using Fn = void (*)(const __m256i*, const __m256*, size_t, size_t, const IdotActs&, float*);
  static constexpr Fn kFns[kIdotSub] = {idot_unit<1>, idot_unit<2>, idot_unit<3>, idot_unit<4>};
  const size_t groups = cols / 64, row_bytes = cols / 2;
  alignas(32) __m256i w[kIdotUnit * 16];
  alignas(32) __m256 hs[kIdotUnit];
  alignas(32) float acc[kIdotTile * kIdotRows];
  for (size_t o0 = row_begin; o0 < row_end; o0 += kIdotRows) {
    const size_t nr = std::min(kIdotRows, row_end - o0);
    const __m256i rmask = row_mask(nr);
    const IdotBlock b{packed + o0 * row_bytes, scales + o0 * groups, row_bytes, groups, nr};
    for (size_t t = 0; t < tn; ++t) _mm256_store_ps(acc + t * kIdotRows, _mm256_setzero_ps());
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
      _mm256_maskstore_ps(Y + t * ldy + o0, rmask, _mm256_load_ps(acc + t * kIdotRows));
  }
}

// One activation row (decode): no weight transpose. Per weight row, one 32-byte load covers a
// group (one half-group per 128-bit lane); its low and high nibbles meet the activations laid
// out to match (ql: dword 4L + j = the even columns of 8-column unit j of half L, qh the odd
// ones), vpmaddubsw + vpmaddwd give 8 partial dwords, 4 per half. The 8 rows' partials are
// reduced and transposed together into one vector per half, one row per lane; the offset
// -8 * sum(q) is added there and the float step runs lane-wise. Each row is prefetched
// kIdotAhead bytes ahead into L2 (the 8 interleaved row streams defeat the hardware prefetchers).
constexpr size_t kIdotAhead = 1024;

struct IdotGroup {
  __m256i ql, qh;
};

void idot_prepare_n1(const uint8_t* qp, size_t groups, IdotGroup* out) {
  const __m256i split = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // E0 E1 E2 E3 | O0 O1 O2 O3
  for (size_t g = 0; g < groups; ++g) {
    const __m256i a = _mm256_permutevar8x32_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qp + g * 64)), split);
    const __m256i b = _mm256_permutevar8x32_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qp + g * 64 + 32)), split);
    out[g].ql = _mm256_permute2x128_si256(a, b, 0x20);
    out[g].qh = _mm256_permute2x128_si256(a, b, 0x31);
  }
}

inline __m256i reduce_pair32(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
inline __m256i reduce_pair64(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

// One block of rows (kFull: all 8 valid) against one prepared activation row; y: Y + o0.
template <bool kFull>
void idot_block_n1(const IdotBlock& b, const IdotGroup* qx, const int32_t* qo, const float* d,
                   float* y) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 a = _mm256_setzero_ps();
  alignas(32) __m256 hs[kIdotUnit];
  for (size_t g0 = 0; g0 < b.groups; g0 += kIdotUnit) {
    const size_t ug = std::min(kIdotUnit, b.groups - g0);
    idot_scales(b, g0, ug, hs);
    for (size_t g = g0; g < g0 + ug; ++g) {
      const size_t off = g * 32;
      if (g % 2 == 0) {
        // An address only (it may lie past the matrix; prefetches do not fault), kept as an
        // integer.
        const size_t at = off + kIdotAhead;
        const uintptr_t pf = reinterpret_cast<uintptr_t>(b.p) +
                             (at < b.row_bytes ? at : kIdotRows * b.row_bytes + (at - b.row_bytes));
        for (size_t i = 0; i < kIdotRows; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(pf + i * b.row_bytes), _MM_HINT_T1);
      }
      __m256i dr[8];
#pragma GCC unroll 8
      for (size_t i = 0; i < kIdotRows; ++i) {
        const __m256i v =
            kFull || i < b.nr
                ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.p + i * b.row_bytes + off))
                : _mm256_setzero_si256();
        const __m256i wl = _mm256_and_si256(v, low4);
        const __m256i wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        // Each vpmaddubsw lane is <= 2 * 15 * 128 = 3840 in magnitude; two are added: no int16
        // overflow.
        dr[i] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(wl, qx[g].ql),
                                                   _mm256_maddubs_epi16(wh, qx[g].qh)),
                                  ones);
      }
      __m256i e[4];
      for (int i = 0; i < 4; ++i) e[i] = reduce_pair32(dr[2 * i], dr[2 * i + 1]);
      // f[k], 128-bit lane L: rows 4k..4k+3 of half L.
      const __m256i f0 = reduce_pair64(e[0], e[1]), f1 = reduce_pair64(e[2], e[3]);
      const __m256i is[2] = {_mm256_permute2x128_si256(f0, f1, 0x20),
                             _mm256_permute2x128_si256(f0, f1, 0x31)};
      for (size_t L = 0; L < 2; ++L) {
        const __m256i i =
            _mm256_add_epi32(is[L], _mm256_set1_epi32(qo[2 * g + L]));  // -8 * sum(q): the offset
        // Exactly int4_idot_step: acc + (float)isum * (d * s), no FMA.
        const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(d[2 * g + L]), hs[g - g0]);
        a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_cvtepi32_ps(i), scale));
      }
    }
  }
  _mm256_maskstore_ps(y, row_mask(b.nr), a);
}
// int8 per row on int8 activations (matmul_int8_idot): blocks of 8 weight rows, one row per
// 32-bit lane, no VNNI. Per block and unit of kI8Unit 32-column groups, 8 rows x 1 group of
// weight bytes are transposed (8x8 dwords) once into an L1 buffer, kept as |w| (the u8 operand)
// and w (the sign). Per group and activation row, vpsignb moves the sign of w onto the broadcast
// activation dword and vpmaddubsw (|w| x +-q) gives int16 pair sums, |sum| <= 2 * 127 * 127 =
// 32258 (weights and activations in [-127, 127]: no saturation), widened by vpmaddwd and added
// in int32: the exact isum; then the float step of int8_idot_step lane-wise, groups ascending,
// and the row scales at the end: bit-identical to the scalar twin. Up to 4 activation rows per
// register tile; a block (8 x cols bytes) stays in L1/L2 across the tiles of 64 activation rows.

constexpr size_t kI8Rows = 8;   // weight rows per block, one per 32-bit lane
constexpr size_t kI8Unit = 8;   // groups transposed at a time (4 KiB of |w| and w)
constexpr size_t kI8Tile = 64;  // activation rows per accumulator tile
constexpr int kI8Sub = 4;       // activation rows per register tile

struct I8Acts {
  const int8_t* q;  // [t][cols] the q8 values
  const float* d;   // [t][groups] the q8_32 scales (D)
  size_t cols, groups;
};

// wa/ws[gl * 8 + k] = |w| / w of dword k of group g0 + gl of the block's rows (lane i = row i;
// 0 past nr). Prefetches the next unit (past the rows: the next block) into L2.
void i8_decode_unit(const int8_t* p, size_t cols, size_t nr, size_t g0, size_t ug, __m256i* wa,
                    __m256i* ws) {
  const size_t next = (g0 + ug) * 32;
  // An address only (it may lie past the matrix; prefetches do not fault), kept as an integer.
  const uintptr_t pf = reinterpret_cast<uintptr_t>(p) + (next < cols ? next : kI8Rows * cols);
  const size_t pf_bytes = std::min(kI8Unit * 32, next < cols ? cols - next : cols);
  for (size_t i = 0; i < kI8Rows; ++i)
    for (size_t c = 0; c < pf_bytes; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(pf + i * cols + c), _MM_HINT_T1);
  for (size_t g = 0; g < ug; ++g) {
    __m256i r[8];
    for (size_t i = 0; i < kI8Rows; ++i)
      r[i] =
          i < nr
              ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * cols + (g0 + g) * 32))
              : _mm256_setzero_si256();
    transpose8(r);
    for (size_t k = 0; k < 8; ++k) {
      wa[g * 8 + k] = _mm256_abs_epi8(r[k]);
      ws[g * 8 + k] = r[k];
    }
  }
}

// acc[s] (8 rows each) += groups [g0, g0 + ug) of activation rows s < S, exactly as
// int8_idot_step, g ascending.
template <int S>
void i8_unit(const __m256i* wa, const __m256i* ws, size_t g0, size_t ug, const I8Acts& x,
             float* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 a[S];
  for (int s = 0; s < S; ++s) a[s] = _mm256_load_ps(acc + s * kI8Rows);
  for (size_t gl = 0; gl < ug; ++gl) {
    const size_t h = g0 + gl;
    __m256i is[S];
    for (int s = 0; s < S; ++s) is[s] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i va = _mm256_load_si256(wa + gl * 8 + k);
      const __m256i vs = _mm256_load_si256(ws + gl * 8 + k);
      for (int s = 0; s < S; ++s) {
        const uint8_t* q = reinterpret_cast<const uint8_t*>(x.q + s * x.cols + h * 32 + 4 * k);
        const __m256i p = _mm256_maddubs_epi16(va, _mm256_sign_epi8(bcast32(q), vs));
        is[s] = _mm256_add_epi32(is[s], _mm256_madd_epi16(p, ones));
      }
    }
    for (int s = 0; s < S; ++s) {  // Exactly int8_idot_step: acc + (float)isum * d, no FMA.
      const __m256 d = _mm256_set1_ps(x.d[s * x.groups + h]);
      a[s] = _mm256_add_ps(a[s], _mm256_mul_ps(_mm256_cvtepi32_ps(is[s]), d));
    }
  }
  for (int s = 0; s < S; ++s) _mm256_store_ps(acc + s * kI8Rows, a[s]);
}

void i8_rows(const int8_t* Q, const float* scales, const I8Acts& x, size_t n, float* Y, size_t ldy,
             size_t row_begin, size_t row_end) {
  using Fn = void (*)(const __m256i*, const __m256i*, size_t, size_t, const I8Acts&, float*);
  static constexpr Fn kFns[kI8Sub] = {i8_unit<1>, i8_unit<2>, i8_unit<3>, i8_unit<4>};
  const size_t cols = x.cols, groups = x.groups;
  alignas(32) __m256i wa[kI8Unit * 8], ws[kI8Unit * 8];
  alignas(32) float acc[kI8Tile * kI8Rows];
  alignas(32) float sv[kI8Rows];
  for (size_t o0 = row_begin; o0 < row_end; o0 += kI8Rows) {
    const size_t nr = std::min(kI8Rows, row_end - o0);
    const int8_t* p = Q + o0 * cols;
    for (size_t i = 0; i < kI8Rows; ++i) sv[i] = i < nr ? scales[o0 + i] : 0.0f;
    for (size_t t0 = 0; t0 < n; t0 += kI8Tile) {
      const size_t tn = std::min(kI8Tile, n - t0);
      for (size_t t = 0; t < tn; ++t) _mm256_store_ps(acc + t * kI8Rows, _mm256_setzero_ps());
      for (size_t g0 = 0; g0 < groups; g0 += kI8Unit) {
        const size_t ug = std::min(kI8Unit, groups - g0);
        i8_decode_unit(p, cols, nr, g0, ug, wa, ws);
        for (size_t ts = 0; ts < tn; ts += kI8Sub) {
          const size_t sn = std::min<size_t>(kI8Sub, tn - ts);
          const size_t t = t0 + ts;
          const I8Acts xs{x.q + t * cols, x.d + t * groups, cols, groups};
          kFns[sn - 1](wa, ws, g0, ug, xs, acc + ts * kI8Rows);
        }
      }
      for (size_t t = 0; t < tn; ++t) {
        const __m256 yv = _mm256_mul_ps(_mm256_load_ps(sv), _mm256_load_ps(acc + t * kI8Rows));
        if (nr == kI8Rows) {
          _mm256_storeu_ps(Y + (t0 + t) * ldy + o0, yv);
        } else {
          alignas(32) float tmp[kI8Rows];
          _mm256_store_ps(tmp, yv);
          for (size_t i = 0; i < nr; ++i) Y[(t0 + t) * ldy + o0 + i] = tmp[i];
        }
      }
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
  if (n <= kInt4DirectMax)
    return int4_direct_rows(packed, scales, cols, X, n, Y, ldy, row_begin, row_end);
  int4_panel(packed, scales, cols, X, n, Y, ldy, row_begin, row_end);
}

void matmul_int4_idot_avx2(const uint8_t* packed, const float* scales, size_t cols,
                           const int8_t* Q8, const float* D, size_t n, float* Y, size_t ldy,
                           size_t row_begin, size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  const size_t groups = cols / 64, halves = 2 * groups, row_bytes = cols / 2;
  if (groups == 0) {
    for (size_t t = 0; t < n; ++t)
      for (size_t o = row_begin; o < row_end; ++o) Y[t * ldy + o] = 0.0f;
    return;
  }
  thread_local std::vector<uint8_t, AlignedAlloc<uint8_t, 32>> qp;
  thread_local std::vector<int32_t, AlignedAlloc<int32_t, 32>> qo;
  thread_local std::vector<IdotGroup, AlignedAlloc<IdotGroup, 32>> qg;
  const size_t tile = std::min(n, kIdotTile);
  if (qp.size() < tile * halves * 32) qp.resize(tile * halves * 32);
  if (qo.size() < tile * halves) qo.resize(tile * halves);
  for (size_t t0 = 0; t0 < n; t0 += kIdotTile) {
    const size_t tn = std::min(kIdotTile, n - t0);
    prepare(Q8 + t0 * cols, cols, tn, 0, halves, 8, qp.data(), qo.data());
    const IdotActs x{qp.data(), qo.data(), D + t0 * halves, halves};
    if (tn > 1) {
      idot_rows(packed, scales, cols, x, tn, Y + t0 * ldy, ldy, row_begin, row_end);
      continue;
    }
    if (qg.size() < groups) qg.resize(groups);
    idot_prepare_n1(qp.data(), groups, qg.data());
    for (size_t o0 = row_begin; o0 < row_end; o0 += kIdotRows) {
      const size_t nr = std::min(kIdotRows, row_end - o0);
      const IdotBlock b{packed + o0 * row_bytes, scales + o0 * groups, row_bytes, groups, nr};
      if (nr == kIdotRows)
        idot_block_n1<true>(b, qg.data(), qo.data(), x.d, Y + t0 * ldy + o0);
      else
        idot_block_n1<false>(b, qg.data(), qo.data(), x.d, Y + t0 * ldy + o0);
    }
  }
}

void matmul_int8_idot_avx2(const int8_t* Q, const float* scales, size_t cols, const int8_t* Q8,
                           const float* D, size_t n, float* Y, size_t ldy, size_t row_begin,
                           size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  i8_rows(Q, scales, I8Acts{Q8, D, cols, cols / 32}, n, Y, ldy, row_begin, row_end);
}

}  // namespace k3::impl

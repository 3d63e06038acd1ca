// kernels/impl/dense_avx512.cpp — AVX-512 (F/BW/VL) variants of the dense kernels (f32, int8 per
// row, int4 group-64). Compiled with -mavx512*; called only after a run-time CPU check (isa.cpp).
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
// Column tails use masked loads. Results match the scalar twins up to summation order (int4 also
// rounds s_g * (k - 8) to f32 before multiplying); a row's result does not depend on the row
// range it is computed in.
//
// GCC 12's _mm512_undefined_* self-initialise and trip -W(maybe-)uninitialized once inlined
// (GCC PR 105593, fixed in 13); the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <vector>

#include "kernels/impl/kernels_impl.h"



namespace k3::impl {
namespace {

constexpr size_t kV = 16;             // f32 lanes
constexpr int kR = 4;                 // weight rows per register tile
constexpr int kT = 4;                 // activation rows per register tile
constexpr size_t kKC = 512;           // int4 panel: columns per decoded chunk
constexpr size_t kNT = 64;            // int4 panel: activation rows per accumulator block
constexpr size_t kInt4DirectMax = 4;  // int4: in-register decode up to this many activation rows

// 64-byte aligned allocator (the rearranged activations are read with aligned loads).
template <class T>
struct AlignedAlloc64 {
  using value_type = T;
  AlignedAlloc64() = default;
  template <class U>
  AlignedAlloc64(const AlignedAlloc64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  template <class U>
  bool operator==(const AlignedAlloc64<U>&) const { return true; }
};

inline __mmask16 tail_mask(size_t rem) { return static_cast<__mmask16>((1u << rem) - 1u); }

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
      a[r][t] = first ? _mm512_setzero_ps() : _mm512_load_ps(acc + (static_cast<size_t>(t) * kR + r) * kV);
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
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_ps(tail, w + static_cast<size_t>(r) * ldw + kfull);
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
    for (int t = 0; t < T; ++t) _mm512_store_ps(acc + (static_cast<size_t>(t) * kR + r) * kV, a[r][t]);
}

using TileFn = void (*)(const float*, size_t, const float*, size_t, size_t, __mmask16, float*, bool);

template <int R>
constexpr TileFn tile_for(int t) {
  switch (t) {
    case 1: return tile<R, 1>;
    case 2: return tile<R, 2>;
    case 3: return tile<R, 3>;
    default: return tile<R, 4>;
  }
}

TileFn pick_tile(int r, int t) {
  switch (r) {
    case 1: return tile_for<1>(t);
    case 2: return tile_for<2>(t);
    case 3: return tile_for<3>(t);
    default: return tile_for<4>(t);
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
                _mm512_reduce_add_ps(_mm512_load_ps(acc + (static_cast<size_t>(tt) * kR + static_cast<size_t>(r)) * kV));
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
      wv[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q[r] + k))));
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
    for (int r = 0; r < R; ++r) wv[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, q[r] + k)));
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
      Y[static_cast<size_t>(t) * ldy + o0 + static_cast<size_t>(r)] = scales[o0 + static_cast<size_t>(r)] * _mm512_reduce_add_ps(a[r][t]);
}

using Int8DirectFn = void (*)(const int8_t*, const float*, size_t, const float*, float*, size_t, size_t);

template <int R>
Int8DirectFn int8_direct_for(size_t t) {
  switch (t) {
    case 1: return int8_direct<R, 1>;
    case 2: return int8_direct<R, 2>;
    case 3: return int8_direct<R, 3>;
    default: return int8_direct<R, 4>;
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
// int4, few activation rows: the activations of one group are split into even and odd columns (matching the low and
// high nibbles of 16 consecutive bytes), the nibbles index a 16-entry table s_g * (k - 8).
template <int R, int T>
void int4_direct(const uint8_t* packed, const float* scales, size_t cols, const float* X, float* Y,
                 size_t ldy, size_t o0) {
  const size_t groups = cols / 64;
  const __m512 base = nibble_table();
  const __m512i idx_even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i idx_odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
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
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[r] + g * 32 + h * 16)));
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
// bits 0..3 (even k = 2m: the dwords loaded m bytes further on; odd k: those shifted by 4). xr[w * 128 + k * 16 + i] = x[w * 128 + 8i + k] (zero past cols). Lanes 0..7 belong to
// group 2w, lanes 8..15 to group 2w + 1, so the window's sum is scaled lane-wise at the end.
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
    for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(p[r] + w * 64 + R * (cols / 2)), _MM_HINT_T0);
    if ((w & 7) == 0)
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(s[r] + 2 * w + R * groups), _MM_HINT_T0);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      v[r] = half ? _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[r] + w * 64)))
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
        const __m512 wo = _mm512_permutexvar_ps(over ? _mm512_srli_epi32(ve, 4) : _mm512_srli_epi32(v[r], 8 * m + 4), base);
        te[r] = m == 0 ? _mm512_mul_ps(we, x0) : _mm512_fmadd_ps(we, x0, te[r]);
        to[r] = m == 0 ? _mm512_mul_ps(wo, x1) : _mm512_fmadd_ps(wo, x1, to[r]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float* sg = s[r] + 2 * w;
      const __m512 sv = half ? _mm512_set1_ps(sg[0])
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
  thread_local std::vector<float, AlignedAlloc64<float>> xr;
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
        if (pair) int4_direct<kR, 2>(packed, scales, cols, x, y, ldy, o);
        else int4_direct<kR, 1>(packed, scales, cols, x, y, ldy, o);
      }
      for (; o < p1; ++o) {
        if (pair) int4_direct<1, 2>(packed, scales, cols, x, y, ldy, o);
        else int4_direct<1, 1>(packed, scales, cols, x, y, ldy, o);
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
  const __m512i il_b = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const size_t groups = cols / 64;
  for (int r = 0; r < rb; ++r) {
    const size_t o = o0 + static_cast<size_t>(r);
    const uint8_t* p = packed + o * (cols / 2) + c0 / 2;
    const float* s = scales + o * groups + c0 / 64;
    float* d = buf + static_cast<size_t>(r) * kKC;
    for (size_t g = 0; g < kc / 64; ++g) {
      const __m512 table = _mm512_mul_ps(_mm512_set1_ps(s[g]), base);
      for (size_t h = 0; h < 2; ++h) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + g * 32 + h * 16)));
        const __m512 lo = _mm512_permutexvar_ps(v, table);                          // even columns
        const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);  // odd columns
        _mm512_store_ps(d + g * 64 + h * 32, _mm512_permutex2var_ps(lo, il_a, hi));
        _mm512_store_ps(d + g * 64 + h * 32 + 16, _mm512_permutex2var_ps(lo, il_b, hi));
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
            prefetch_int4(packed, scales, cols, o0 + static_cast<size_t>(r), c0 + kKC, std::min(kKC, cols - c0 - kKC));
        } else {
          for (size_t o = o0 + kR; o < std::min(row_end, o0 + 2 * kR); ++o)
            prefetch_int4(packed, scales, cols, o, 0, std::min(kKC, cols));
        }
        decode_int4(packed, scales, cols, o0, rb, c0, kc, wbuf);
        for (size_t t = 0; t < nt; t += kT) {
          const int tb = static_cast<int>(std::min<size_t>(kT, nt - t));
          pick_tile(rb, tb)(wbuf, kKC, X + (t0 + t) * cols + c0, cols, kc, 0, accbuf + t * kR * kV, c0 == 0);
        }
      }
      for (size_t t = 0; t < nt; ++t)
        for (int r = 0; r < rb; ++r)
          Y[(t0 + t) * ldy + o0 + static_cast<size_t>(r)] =
              cols ? _mm512_reduce_add_ps(_mm512_load_ps(accbuf + (t * kR + static_cast<size_t>(r)) * kV)) : 0.0f;
    }
  }
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
  if (n <= kInt4DirectMax) return int4_direct_rows(packed, scales, cols, X, n, Y, ldy, row_begin, row_end);
  int4_panel(packed, scales, cols, X, n, Y, ldy, row_begin, row_end);
}

}  // namespace k3::impl

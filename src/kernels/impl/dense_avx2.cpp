// kernels/impl/dense_avx2.cpp — AVX2+FMA variants of the dense kernels (f32, int8 per row, int4
// group-64). Compiled with -mavx2 -mfma; called only after a run-time CPU check (isa.cpp).
//
// Same two loop shapes as dense_avx512.cpp, each reading a weight row from memory once per call
// (per 64 activation rows):
//  * direct (decode, n <= 2 for int8, n == 1 for int4): 4 weight rows widened to f32 in
//    registers, FMA'd against the activation rows;
//  * panel (prefill): 4 weight rows x 512 columns decoded once into an f32 stack buffer, swept by
//    a 4 x 2 register tile against up to 64 activation rows; per-lane partial sums persist across
//    column chunks in a stack buffer.
// Columns past the last multiple of 8 are summed in scalar code. Results match the scalar twins
// up to summation order.
#include <immintrin.h>

#include <algorithm>

#include "kernels/impl/kernels_impl.h"

namespace k3::impl {
namespace {

constexpr size_t kV = 8;     // f32 lanes
constexpr int kR = 4;        // weight rows per block
constexpr int kTR = 2;       // weight rows per register tile (panel)
constexpr int kT = 6;        // activation rows per register tile (panel)
constexpr size_t kKC = 512;  // columns per decoded chunk (panel)
constexpr size_t kNT = 64;   // activation rows per accumulator block (panel)
constexpr size_t kInt8DirectMax = 1024;  // int8: direct path up to this many activation rows

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

// ---------------------------------------------------------------------------------------------
// Panel path: weight sources yield a [rb][kc] f32 block (row stride *ldw) for columns [c0, c0+kc)
// with kc a multiple of 8; tail() sums the columns from `from` to the end in scalar code.

struct F32Src {
  const float* W;
  size_t cols;
  const float* block(size_t o0, int, size_t c0, size_t, float*, size_t* ldw) const {
    *ldw = cols;
    return W + o0 * cols + c0;
  }
  float tail(size_t o, const float* x, size_t from) const {
    float acc = 0.0f;
    for (size_t i = from; i < cols; ++i) acc += W[o * cols + i] * x[i];
    return acc;
  }
  float finish(size_t, float sum) const { return sum; }
  void prefetch_chunk(size_t o, size_t c0, size_t kc) const { prefetch(W + o * cols + c0, kc * 4); }
};

struct Int8Src {
  const int8_t* Q;
  const float* scales;
  size_t cols;
  const float* block(size_t o0, int rb, size_t c0, size_t kc, float* buf, size_t* ldw) const {
    *ldw = kKC;
    for (int r = 0; r < rb; ++r) {
      const int8_t* q = Q + (o0 + static_cast<size_t>(r)) * cols + c0;
      float* d = buf + static_cast<size_t>(r) * kKC;
      for (size_t k = 0; k < kc; k += kV) _mm256_store_ps(d + k, widen8(q + k));
    }
    return buf;
  }
  float tail(size_t o, const float* x, size_t from) const {
    float acc = 0.0f;
    for (size_t i = from; i < cols; ++i) acc += static_cast<float>(Q[o * cols + i]) * x[i];
    return acc;
  }
  float finish(size_t o, float sum) const { return scales[o] * sum; }
  void prefetch_chunk(size_t o, size_t c0, size_t kc) const { prefetch(Q + o * cols + c0, kc); }
};

struct Int4Src {
  const uint8_t* packed;
  const float* scales;
  size_t cols;
  // Decodes to w = s_g * (nib - 8) in column order (cols is a multiple of 64, so is kc).
  const float* block(size_t o0, int rb, size_t c0, size_t kc, float* buf, size_t* ldw) const {
    *ldw = kKC;
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
    return buf;
  }
  float tail(size_t, const float*, size_t) const { return 0.0f; }
  float finish(size_t, float sum) const { return sum; }
  void prefetch_chunk(size_t o, size_t c0, size_t kc) const {
    prefetch(packed + o * (cols / 2) + c0 / 2, kc / 2);
    prefetch(scales + o * (cols / 64) + c0 / 64, kc / 16);
  }
};

// acc[t][r] (kR slots per t, kV lanes each) += W[r][0..kc) . X[t][0..kc) over R x T rows.
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

template <class Src>
void panel(const Src& src, size_t cols, const float* X, size_t n, float* Y, size_t ldy,
           size_t row_begin, size_t row_end) {
  alignas(32) float wbuf[kR * kKC];
  alignas(32) float accbuf[kNT * kR * kV];
  const size_t cv = cols & ~(kV - 1);
  for (size_t o0 = row_begin; o0 < row_end; o0 += kR) {
    const int rb = static_cast<int>(std::min<size_t>(kR, row_end - o0));
    for (size_t t0 = 0; t0 < n; t0 += kNT) {
      const size_t nt = std::min(kNT, n - t0);
      for (size_t c0 = 0; c0 < cv; c0 += kKC) {
        const size_t kc = std::min(kKC, cv - c0);
        // Prefetch the chunk after this one (next columns, else the next block's first columns).
        if (c0 + kKC < cv) {
          for (int r = 0; r < rb; ++r) src.prefetch_chunk(o0 + static_cast<size_t>(r), c0 + kKC, std::min(kKC, cv - c0 - kKC));
        } else {
          for (size_t o = o0 + kR; o < std::min(row_end, o0 + 2 * kR); ++o) src.prefetch_chunk(o, 0, std::min(kKC, cv));
        }
        size_t ldw = 0;
        const float* w = src.block(o0, rb, c0, kc, wbuf, &ldw);
        for (size_t t = 0; t < nt; t += kT) {
          const size_t tb = std::min<size_t>(kT, nt - t);
          const float* x = X + (t0 + t) * cols + c0;
          float* acc = accbuf + t * kR * kV;
          int r = 0;
          for (; r + kTR <= rb; r += kTR)
            tile_for<kTR>(tb)(w + static_cast<size_t>(r) * ldw, ldw, x, cols, kc, acc + static_cast<size_t>(r) * kV, c0 == 0);
          if (r < rb) tile_for<1>(tb)(w + static_cast<size_t>(r) * ldw, ldw, x, cols, kc, acc + static_cast<size_t>(r) * kV, c0 == 0);
        }
      }
      for (size_t t = 0; t < nt; ++t)
        for (int r = 0; r < rb; ++r) {
          const size_t o = o0 + static_cast<size_t>(r);
          float sum = cv ? hsum(_mm256_load_ps(accbuf + (t * kR + static_cast<size_t>(r)) * kV)) : 0.0f;
          if (cv < cols) sum += src.tail(o, X + (t0 + t) * cols, cv);
          Y[(t0 + t) * ldy + o] = src.finish(o, sum);
        }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Direct paths (decode): weights widened in registers, R weight rows x T activation rows.

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

// Rows per panel for the int8 direct path: the panel's weights plus one 2-row activation tile
// stay in L2 while the activation rows are swept 2 at a time.
inline size_t int8_panel_rows(size_t cols) {
  return std::clamp<size_t>((size_t{128} << 10) / std::max<size_t>(cols, 1) / kR * kR, kR, 64);
}

// For each panel of weight rows and each pair of activation rows, every block of 4 weight rows
// (weights come from DRAM on the first pair, from L2 after).
void int8_direct_rows(const int8_t* Q, const float* scales, size_t cols, const float* X, size_t n,
                      float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  const size_t panel_rows = int8_panel_rows(cols);
  for (size_t p0 = row_begin; p0 < row_end; p0 += panel_rows) {
    const size_t p1 = std::min(row_end, p0 + panel_rows);
    for (size_t t = 0; t < n; t += 2) {
      const float* x = X + t * cols;
      float* y = Y + t * ldy;
      const bool pair = n - t >= 2;
      size_t o = p0;
      for (; o + kR <= p1; o += kR) {
        if (pair) int8_direct<kR, 2>(Q, scales, cols, x, y, ldy, o);
        else int8_direct<kR, 1>(Q, scales, cols, x, y, ldy, o);
      }
      for (; o < p1; ++o) {
        if (pair) int8_direct<1, 2>(Q, scales, cols, x, y, ldy, o);
        else int8_direct<1, 1>(Q, scales, cols, x, y, ldy, o);
      }
    }
  }
}

// int4, one activation row: per 16 columns the activations are split into even and odd columns
// (matching the low and high nibbles of 8 consecutive bytes); per-group partial sums are scaled
// once per group.
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

}  // namespace

void matmul_f32_avx2(const float* W, size_t cols, const float* X, size_t n, float* Y, size_t ldy,
                     size_t row_begin, size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  panel(F32Src{W, cols}, cols, X, n, Y, ldy, row_begin, row_end);
}

void matmul_int8_avx2(const int8_t* Q, const float* scales, size_t cols, const float* X, size_t n,
                      float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  if (n <= kInt8DirectMax) return int8_direct_rows(Q, scales, cols, X, n, Y, ldy, row_begin, row_end);
  panel(Int8Src{Q, scales, cols}, cols, X, n, Y, ldy, row_begin, row_end);
}

void matmul_int4_avx2(const uint8_t* packed, const float* scales, size_t cols, const float* X,
                      size_t n, float* Y, size_t ldy, size_t row_begin, size_t row_end) {
  if (n == 0 || row_begin >= row_end) return;
  if (n == 1) {
    size_t o = row_begin;
    for (; o + kR <= row_end; o += kR) int4_direct<kR>(packed, scales, cols, X, Y, o);
    for (; o < row_end; ++o) int4_direct<1>(packed, scales, cols, X, Y, o);
    return;
  }
  panel(Int4Src{packed, scales, cols}, cols, X, n, Y, ldy, row_begin, row_end);
}

}  // namespace k3::impl

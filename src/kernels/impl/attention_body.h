// kernels/impl/attention_body.h — the KDA head step and the MLA head attention, written once as
// plain loops shaped for the vectoriser (inner loops over contiguous value/latent lanes, dot
// products split into 16 independent partial sums). Included by attention_<isa>.cpp, each
// compiled with its own -m flags: the scalar build is the twin of the AVX2 and AVX-512 builds.
// Define K3_ATTENTION_SUFFIX before including.
#include <algorithm>
#include <cmath>
#include <cstddef>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kernels_impl.h"

#define K3_CAT2(a, b) a##b
#define K3_CAT(a, b) K3_CAT2(a, b)
#define K3_NAME(base) K3_CAT(base, K3_ATTENTION_SUFFIX)

namespace k3::impl {
namespace {

// sum_i a[i] b[i] in 16 interleaved partial sums (vectorisable without reassociation flags).
inline float dot16(const float* a, const float* b, size_t n) {
  float part[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (size_t j = 0; j < 16; ++j) part[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) part[i % 16] += a[i] * b[i];
  float s = 0.0f;
  for (size_t j = 0; j < 16; ++j) s += part[j];
  return s;
}

// The chunk form's two matrix products, in register tiles of kTileRows x kTileCols accumulators
// (sized per build for the registers it has; the scalar build keeps the same loops unvectorised).
#if defined(__AVX512F__)
constexpr size_t kTileRows = 4, kTileCols = 64;  // 16 zmm accumulators
#else
constexpr size_t kTileRows = 4, kTileCols = 16;  // 8 ymm accumulators on AVX2
#endif

// Factors and products below this magnitude are set to zero: their terms are negligible against
// the O(1) state, and denormal operands would only slow the products down.
inline float flush_tiny(float x) {
  return std::fabs(x) < 1e-30f ? 0.0f : x;
}

// a + x y: fused (one rounding) in the SIMD builds, as the dense kernels' FMAs; the build's
// -ffp-contract=off keeps `a + x * y` two operations, which the scalar twin does.
inline float madd(float a, float x, float y) {
#if defined(__FMA__)
  return __builtin_fmaf(x, y, a);
#else
  return a + x * y;
#endif
}

// Elementwise helpers over n floats (restrict: the vectoriser needs no overlap checks).
inline void vmul(float* __restrict out, const float* __restrict x, const float* __restrict y,
                 size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = x[i] * y[i];
}
inline void vmul_flush(float* __restrict out, const float* __restrict x, const float* __restrict y,
                       size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = flush_tiny(x[i] * y[i]);
}
inline void vdiv(float* __restrict out, const float* __restrict x, const float* __restrict y,
                 size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = x[i] / y[i];
}
inline void vscale(float* __restrict x, const float* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] *= y[i];
}
inline void vscale_flush(float* __restrict x, const float* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = flush_tiny(x[i] * y[i]);
}

// Xt[c][s] = X[s][c] for s < rows (X: [rows][dk]); the columns s in [rows, kKdaBlockRows) zero.
inline void transpose_block(const float* __restrict X, size_t dk, size_t rows,
                            float* __restrict Xt) {
  constexpr size_t B = kKdaBlockRows;
  for (size_t c = 0; c < dk; ++c) {
    float* t = Xt + c * B;
    for (size_t s = 0; s < B; ++s) t[s] = s < rows ? X[s * dk + c] : 0.0f;
  }
}

// C[r][j] = (d ? d[r] C[r][j] : 0) + sum_t X[r * xr + t * xt] B[t][j] for r < R, j < W: the
// register tile of both products of the chunk form. The SIMD builds hold the R x W accumulators
// in vector registers through intrinsics (the vectoriser, left to the plain loops, spilled them
// to the stack in the AVX2 build: 6x slower than the token step); the scalar twin is the loops.
template <size_t R, size_t W>
inline void tile_accumulate(const float* X, size_t xr, size_t xt, const float* B, size_t ldb,
                            size_t count, float* C, size_t ldc, const float* d) {
#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__AVX512F__)
  using V = __m512;
  constexpr size_t kLanes = 16;
  const auto load = [](const float* p) { return _mm512_loadu_ps(p); };
  const auto store = [](float* p, V v) { _mm512_storeu_ps(p, v); };
  const auto set1 = [](float x) { return _mm512_set1_ps(x); };
  const auto fma = [](V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); };
  const auto mul = [](V a, V b) { return _mm512_mul_ps(a, b); };
#else
  using V = __m256;
  constexpr size_t kLanes = 8;
  const auto load = [](const float* p) { return _mm256_loadu_ps(p); };
  const auto store = [](float* p, V v) { _mm256_storeu_ps(p, v); };
  const auto set1 = [](float x) { return _mm256_set1_ps(x); };
  const auto fma = [](V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); };
  const auto mul = [](V a, V b) { return _mm256_mul_ps(a, b); };
#endif
  static_assert(W % kLanes == 0);
  constexpr size_t NV = W / kLanes;
  V acc[R][NV];
  for (size_t r = 0; r < R; ++r)
    for (size_t v = 0; v < NV; ++v)
      acc[r][v] = d ? mul(set1(d[r]), load(C + r * ldc + v * kLanes)) : set1(0.0f);
  for (size_t t = 0; t < count; ++t) {
    const float* b = B + t * ldb;
    V bv[NV];
    for (size_t v = 0; v < NV; ++v) bv[v] = load(b + v * kLanes);
    for (size_t r = 0; r < R; ++r) {
      const V x = set1(X[r * xr + t * xt]);
      for (size_t v = 0; v < NV; ++v) acc[r][v] = fma(x, bv[v], acc[r][v]);
    }
  }
  for (size_t r = 0; r < R; ++r)
    for (size_t v = 0; v < NV; ++v) store(C + r * ldc + v * kLanes, acc[r][v]);
#else
  float acc[R][W];
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < W; ++j) acc[r][j] = d ? d[r] * C[r * ldc + j] : 0.0f;
  for (size_t t = 0; t < count; ++t) {
    const float* b = B + t * ldb;
    for (size_t r = 0; r < R; ++r) {
      const float x = X[r * xr + t * xt];
      for (size_t j = 0; j < W; ++j) acc[r][j] += x * b[j];
    }
  }
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < W; ++j) C[r * ldc + j] = acc[r][j];
#endif
}

// C[r][j] = sum_i A[r][i] B[i][j] for r < R, j < W.
template <size_t R, size_t W>
inline void gemm_tile(const float* A, size_t lda, const float* B, size_t ldb, size_t inner,
                      float* C, size_t ldc) {
  tile_accumulate<R, W>(A, lda, 1, B, ldb, inner, C, ldc, nullptr);
}

// C = A B: A [m][inner] (row stride lda), B [inner][cols], C [m][cols].
inline void gemm(const float* A, size_t lda, const float* B, size_t ldb, size_t m, size_t inner,
                 size_t cols, float* C, size_t ldc) {
  size_t j = 0;
  for (; j + kTileCols <= cols; j += kTileCols) {
    size_t r = 0;
    for (; r + kTileRows <= m; r += kTileRows)
      gemm_tile<kTileRows, kTileCols>(A + r * lda, lda, B + j, ldb, inner, C + r * ldc + j, ldc);
    for (; r < m; ++r)
      gemm_tile<1, kTileCols>(A + r * lda, lda, B + j, ldb, inner, C + r * ldc + j, ldc);
  }
  if (j == cols) return;
  for (size_t r = 0; r < m; ++r) {
    float* c = C + r * ldc;
    for (size_t jj = j; jj < cols; ++jj) c[jj] = 0.0f;
    for (size_t i = 0; i < inner; ++i) {
      const float x = A[r * lda + i];
      const float* b = B + i * ldb;
      for (size_t jj = j; jj < cols; ++jj) c[jj] += x * b[jj];
    }
  }
}

// C [m][B] = A [m][inner] Bt [inner][B], B = kKdaBlockRows columns.
inline void gemm_block_cols(const float* A, size_t lda, const float* Bt, size_t m, size_t inner,
                            float* C) {
  constexpr size_t B = kKdaBlockRows;
  size_t r = 0;
  for (; r + 4 <= m; r += 4) gemm_tile<4, B>(A + r * lda, lda, Bt, B, inner, C + r * B, B);
  for (; r < m; ++r) gemm_tile<1, B>(A + r * lda, lda, Bt, B, inner, C + r * B, B);
}

// S[i][j] = d[i] S[i][j] + sum_t K[t][i] U[t][j] for i < R, j < W (K read transposed).
template <size_t R, size_t W>
inline void update_tile(float* S, size_t lds, const float* d, const float* K, size_t ldk,
                        const float* U, size_t ldu, size_t rows) {
  tile_accumulate<R, W>(K, 1, ldk, U, ldu, rows, S, lds, d);
}

// S = Diag(d) S + K^T U: S [dk][dk], d [dk], K and U [rows][dk].
inline void state_update(float* S, size_t dk, const float* d, const float* K, const float* U,
                         size_t rows) {
  size_t j = 0;
  for (; j + kTileCols <= dk; j += kTileCols) {
    size_t i = 0;
    for (; i + kTileRows <= dk; i += kTileRows)
      update_tile<kTileRows, kTileCols>(S + i * dk + j, dk, d + i, K + i, dk, U + j, dk, rows);
    for (; i < dk; ++i)
      update_tile<1, kTileCols>(S + i * dk + j, dk, d + i, K + i, dk, U + j, dk, rows);
  }
  if (j == dk) return;
  for (size_t i = 0; i < dk; ++i) {
    float* row = S + i * dk;
    for (size_t jj = j; jj < dk; ++jj) row[jj] *= d[i];
    for (size_t t = 0; t < rows; ++t) {
      const float x = K[t * dk + i];
      const float* u = U + t * dk;
      for (size_t jj = j; jj < dk; ++jj) row[jj] += x * u[jj];
    }
  }
}

}  // namespace

void K3_NAME(kda_head_step_)(float* S, const float* q, const float* k, const float* v,
                             const float* a, float beta, size_t dk, float* u, float* o) {
  // Sweep 1: decay each key row and read it with the key: u = k^T Diag(a) S.
  std::fill(u, u + dk, 0.0f);
  for (size_t i = 0; i < dk; ++i) {
    float* row = S + i * dk;
    const float ai = a[i], ki = k[i];
    for (size_t j = 0; j < dk; ++j) {
      row[j] *= ai;
      u[j] += ki * row[j];
    }
  }
  for (size_t j = 0; j < dk; ++j) u[j] = beta * (v[j] - u[j]);
  // Sweep 2: rank-1 write, and read the updated rows with the query.
  std::fill(o, o + dk, 0.0f);
  for (size_t i = 0; i < dk; ++i) {
    float* row = S + i * dk;
    const float ki = k[i], qi = q[i];
    for (size_t j = 0; j < dk; ++j) {
      row[j] += ki * u[j];
      o[j] += qi * row[j];
    }
  }
}

// The chunk (WY / UT) form of n steps of kda_head_step (kernels/isa.h), per sub-chunk of L <= bt
// rows with incoming state S0 and G_r the cumulative log decay from the sub-chunk start:
//   A_rs = beta_r k_r . (e^(G_r - G_s) k_s), s < r;   (I + A) [U | W] = [beta V | beta e^G K]
//   U' = U - W S0;   O = (e^G q) S0 + Mq U',  Mq_rs = q_r . (e^(G_r - G_s) k_s), s <= r
//   S = Diag(e^G_L) S0 + (e^(G_L - G) k)^T U'
// Every decay factor is a product of per-step decays a (no exp, no log), formed inside blocks of
// kKdaBlockRows rows: E_r = prod of a from the block's start to r, in [e^-80, 1] when a >= e^-5;
// e^(G_r - G_s) = E_r / E_s within a block (k_s / E_s <= e^80 stays finite) and
// E_r * (D_b' / E_s) * (the decays of the blocks between) across blocks, every factor <= 1, so
// nothing overflows and what underflows is negligible. Never e^G_r * e^-G_s over a whole chunk.
void K3_NAME(kda_head_chunk_)(float* S, const float* q, const float* k, const float* v,
                              const float* a, size_t ld, const float* beta, size_t ldb, size_t n,
                              size_t dk, size_t bt, float* scratch, float* o) {
  const size_t B = kKdaBlockRows;
  const size_t max_blocks = (bt + B - 1) / B;
  float* Kr = scratch;          // [bt][dk] k_r E_r
  float* Qr = Kr + bt * dk;     // [bt][dk] q_r E_r
  float* Ki = Qr + bt * dk;     // [bt][dk] k_r / E_r
  float* Ke = Ki + bt * dk;     // [bt][dk] k_r D_b / E_r: k_r decayed to its block's end
  float* U = Ke + bt * dk;      // [bt][dk] the solved values, then U'
  float* Kn = U + bt * dk;      // [bt][dk] k_r decayed to the sub-chunk's end
  float* WQ = Kn + bt * dk;     // [2 bt][dk] W (solved keys), then e^G q
  float* C = WQ + 2 * bt * dk;  // [2 bt][dk] WQ S0
  float* X = C + 2 * bt * dk;   // [B][dk] an earlier block's keys decayed to this block's start
  float* Xt = X + B * dk;       // [dk][B] a block's keys, transposed (see step 2)
  float* TA = Xt + B * dk;      // [B][B] products of one pair of blocks
  float* TM = TA + B * B;       // [B][B]
  float* A = TM + B * B;        // [bt][bt]
  float* M = A + bt * bt;       // [bt][bt]
  float* E = M + bt * bt;       // [dk]
  float* eG = E + dk;           // [dk] the sub-chunk's total decay
  float* P = eG + dk;           // [dk]
  float* before = P + dk;       // [blocks][dk] decay from the sub-chunk's start to a block's start
  float* D = before + max_blocks * dk;  // [blocks][dk] a block's total decay

  for (size_t c0 = 0; c0 < n; c0 += bt) {
    const size_t L = std::min(bt, n - c0);
    const size_t nb = (L + B - 1) / B;
    const float* qc = q + c0 * ld;
    const float* kc = k + c0 * ld;
    const float* vc = v + c0 * ld;
    const float* ac = a + c0 * ld;
    const float* bc = beta + c0 * ldb;
    float* oc = o + c0 * ld;

    // 1. Decay factors of every row inside its block.
    for (size_t b = 0; b < nb; ++b) {
      const size_t r0 = b * B, r1 = std::min(L, r0 + B);
      float* bb = before + b * dk;
      if (b == 0)
        std::fill(bb, bb + dk, 1.0f);
      else
        vmul_flush(bb, before + (b - 1) * dk, D + (b - 1) * dk, dk);
      std::fill(E, E + dk, 1.0f);
      for (size_t r = r0; r < r1; ++r) {
        const float* kr = kc + r * ld;
        // The rows are a head's slice of [n][heads * dk] buffers, one stride apart: ask for the
        // next row's inputs, and this row's values and output (read and written in steps 3-4).
        for (size_t c = 0; c < dk; c += 16) {
          if (r + 1 < L) {
            __builtin_prefetch(ac + (r + 1) * ld + c);
            __builtin_prefetch(kc + (r + 1) * ld + c);
            __builtin_prefetch(qc + (r + 1) * ld + c);
          }
          __builtin_prefetch(vc + r * ld + c);
          __builtin_prefetch(oc + r * ld + c, 1);
        }
        vscale(E, ac + r * ld, dk);
        // Not flushed: down to e^-80 |k|, they meet k_s / E_s up to e^80 |k_s|.
        vmul(Kr + r * dk, kr, E, dk);
        vmul(Qr + r * dk, qc + r * ld, E, dk);
        vdiv(Ki + r * dk, kr, E, dk);
      }
      std::copy(E, E + dk, D + b * dk);
      for (size_t r = r0; r < r1; ++r) vmul_flush(Ke + r * dk, Ki + r * dk, E, dk);
    }
    // Keys decayed to the sub-chunk's end (block by block from the last) and its total decay.
    std::fill(P, P + dk, 1.0f);
    for (size_t b = nb; b-- > 0;) {
      for (size_t r = b * B; r < std::min(L, b * B + B); ++r)
        vmul_flush(Kn + r * dk, Ke + r * dk, P, dk);
      vscale_flush(P, D + b * dk, dk);
    }
    std::copy(P, P + dk, eG);

    // 2. The intra-chunk matrices A (strictly lower, times beta_r) and M (lower), per pair of
    // blocks (b2 <= b) as two [rows of b][dk] x [dk][B] products with the earlier block's keys,
    // transposed into Xt: k_s / E_s for the same block, k_s D_b2 / E_s times the decays of the
    // blocks between for an earlier one.
    for (size_t b = 0; b < nb; ++b) {
      const size_t r0 = b * B, r1 = std::min(L, r0 + B), rn = r1 - r0;
      for (size_t b2 = 0; b2 <= b; ++b2) {
        const size_t s0 = b2 * B, sn = b2 < b ? B : rn;
        if (b2 < b) {
          std::fill(P, P + dk, 1.0f);
          for (size_t m = b2 + 1; m < b; ++m) vscale_flush(P, D + m * dk, dk);
          for (size_t s = 0; s < B; ++s) vmul_flush(X + s * dk, Ke + (s0 + s) * dk, P, dk);
          transpose_block(X, dk, B, Xt);
        } else {
          transpose_block(Ki + s0 * dk, dk, sn, Xt);
        }
        gemm_block_cols(Kr + r0 * dk, dk, Xt, rn, dk, TA);
        gemm_block_cols(Qr + r0 * dk, dk, Xt, rn, dk, TM);
        for (size_t r = r0; r < r1; ++r) {
          const size_t s1 = b2 < b ? s0 + B : r + 1;
          const float br = bc[r * ldb];
          for (size_t s = s0; s < s1; ++s) {
            M[r * bt + s] = TM[(r - r0) * B + (s - s0)];
            if (s < r) A[r * bt + s] = br * TA[(r - r0) * B + (s - s0)];
          }
        }
      }
    }

    // 3. UT transform: forward substitution of (I + A) [U | W] = [beta V | beta e^G K]; the rows
    // of e^G q beside W for one product with S0.
    float* W = WQ;
    float* Qp = WQ + L * dk;
    for (size_t r = 0; r < L; ++r) {
      const float br = bc[r * ldb];
      const float* bb = before + (r / B) * dk;
      const float* vr = vc + r * ld;
      float* ur = U + r * dk;
      float* wr = W + r * dk;
      for (size_t c = 0; c < dk; ++c) ur[c] = br * vr[c];
      vmul_flush(wr, Kr + r * dk, bb, dk);
      for (size_t c = 0; c < dk; ++c) wr[c] *= br;
      vmul_flush(Qp + r * dk, Qr + r * dk, bb, dk);
      for (size_t s = 0; s < r; ++s) {
        const float x = A[r * bt + s];
        const float* us = U + s * dk;
        const float* ws = W + s * dk;
        for (size_t c = 0; c < dk; ++c) {
          ur[c] = madd(ur[c], -x, us[c]);
          wr[c] = madd(wr[c], -x, ws[c]);
        }
      }
    }

    // 4. [W; e^G q] S0, then U' = U - W S0 and O = e^G q S0 + M U'.
    gemm(WQ, dk, S, dk, 2 * L, dk, dk, C, dk);
    for (size_t i = 0; i < L * dk; ++i) U[i] -= C[i];
    for (size_t r = 0; r < L; ++r) {
      float* orow = oc + r * ld;
      std::copy(C + (L + r) * dk, C + (L + r + 1) * dk, orow);
      for (size_t s = 0; s <= r; ++s) {
        const float x = M[r * bt + s];
        const float* us = U + s * dk;
        for (size_t c = 0; c < dk; ++c) orow[c] = madd(orow[c], x, us[c]);
      }
    }

    // 5. S = Diag(e^G_L) S0 + Kn^T U'.
    state_update(S, dk, eG, Kn, U, L);
  }
}

void K3_NAME(mla_head_attend_)(const float* qabs, const float* q_pe, const float* latent,
                               const float* rope, size_t T, size_t kv_lora, size_t rope_dim,
                               float scale, float* scores, float* lat) {
  float max_score = -INFINITY;
  for (size_t j = 0; j < T; ++j) {
    const float s =
        (dot16(qabs, latent + j * kv_lora, kv_lora) + dot16(q_pe, rope + j * rope_dim, rope_dim)) *
        scale;
    scores[j] = s;
    max_score = std::max(max_score, s);
  }
  float sum = 0.0f;
  for (size_t j = 0; j < T; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  const float inv = 1.0f / sum;
  std::fill(lat, lat + kv_lora, 0.0f);
  for (size_t j = 0; j < T; ++j) {
    const float p = scores[j] * inv;
    const float* c = latent + j * kv_lora;
    for (size_t r = 0; r < kv_lora; ++r) lat[r] += p * c[r];
  }
}

}  // namespace k3::impl

#undef K3_NAME
#undef K3_CAT
#undef K3_CAT2

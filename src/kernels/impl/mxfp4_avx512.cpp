// kernels/impl/mxfp4_avx512.cpp — AVX-512 (F, BW, VL, VNNI) variants of the MXFP4 kernels.
//
// Both paths work on "transposed" blocks of 16 weight rows, one row per 32-bit lane: the packed
// bytes of 16 rows x 4 groups are loaded as 16 vectors (prefetched ahead into L2) and transposed
// (16x16 dwords), so that each vector holds 4 packed bytes (8 columns) of every row, and the
// scale bytes likewise, so that no horizontal reduction is ever needed.
//
// Exact float path: nibble p of dword j is column 8j + p; vpermps against the 16-entry f32 E2M1
// table (it reads only the low 4 index bits, so a shift is the whole decode) gives that column's
// weights of the 16 rows, FMA'd with the broadcast activation. Per lane, as the scalar twin:
// ga = sum over the group's 32 columns (two FMA chains), acc += ga * 2^(s-127) (one FMA).
//
// Integer path: the low and the high nibbles are decoded separately by a byte shuffle to u8
// values (doubled e2m1 + 12, in [0, 24]). The activations are prepared once per call tile in the
// matching order (per 8 columns: the 4 even, then the 4 odd columns) with -12 * sum(q) per group,
// so vpdpbusd with a broadcast activation dword gives the partial dots of 16 rows at once, and
// the group sum of each row is (starting the accumulator at the offset term)
//   isum = -12 * sum(q) + sum_k dpbusd(w + 12, q)      (exact int32).
// The float reduction is then done lane-wise with exactly the operations of idot_reduce
// (acc + (float)isum * (d * 2^(s-128)), g ascending, no FMA), so the results are bit-identical
// to the scalar twin.
//
// One activation row (decode, integer path) skips the weight transpose: see block_n1.
//
// With few activation rows (<= 8 integer, <= 4 exact) each group is decoded straight into
// registers and applied to every row; with more, 4..16 groups are decoded into a buffer and
// applied to up to 64 activation rows 8 at a time: each weight is decoded once per 64 rows.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "avx512_common.h"
#include "avx512_intrin.h"
#include "kernels/mxfp4.h"
#include "kernels_impl.h"
#include "mxfp4_common.h"
#include "x86_common.h"

namespace k3::impl {
namespace {

// ---------------------------------------------------------------------------------------------
// Blocks of 16 rows, shared by both paths

constexpr size_t kRows = 16;         // weight rows per block (one per 32-bit lane)
constexpr size_t kUnit = 16;         // groups decoded at a time
constexpr size_t kTileT = 64;        // activation rows per tile
constexpr int kSubT = 8;             // activation rows per register tile
constexpr size_t kPrepSlots = 1024;  // (activation row, group) pairs prepared at a time
constexpr size_t kMaxChunk = 256;    // groups per chunk

// Groups per chunk for a tile of `tn` activation rows: a multiple of kUnit, tn * chunk <= slots.
size_t chunk_groups(size_t tn) {
  return std::min(kMaxChunk, std::max(kUnit, (kPrepSlots / tn) / kUnit * kUnit));
}

// 2^(s - bias) per lane, exact (subnormal below 2^-126); NaN for s = 255. bias 127 is
// mxfp4_scale, bias 128 mxfp4_half_scale.
inline __m512 pow2_scale(__m512i s, int bias) {
  const __m512 e = _mm512_cvtepi32_ps(_mm512_sub_epi32(s, _mm512_set1_epi32(bias)));
  const __m512 h = _mm512_scalef_ps(_mm512_set1_ps(1.0f), e);
  return _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(s, _mm512_set1_epi32(255)), h,
                              _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}

// The weight rows of a block are read 4 groups (64 bytes) at a time per row, 16 rows at once;
// the hardware prefetchers do not follow that many interleaved streams well, so the weights are
// prefetched in software. Measured on Zen 4 with 2 threads streaming one expert after another
// from DRAM at n = 1: ~12 GB/s without, ~27 GB/s with (the DRAM read rate).
constexpr size_t kAhead = 1024;

struct Block {
  const uint8_t* p;    // packed bytes of (row o0, group c0)
  size_t row_bytes;    // packed row stride
  size_t chunk_bytes;  // packed bytes of the chunk in one row (gc * 16)
  const uint8_t* sp;   // scales of (row o0, group c0)
  size_t groups;       // scale row stride
  size_t nr;           // valid rows (<= 16)
  size_t gc;           // groups in the chunk
};

// Where row i prefetches while the block reads `step` bytes of each row at byte `off` of the
// chunk. An address only (it may lie past the matrix; prefetches do not fault), kept as an
// integer. When the chunk is whole rows, the block is one contiguous run of 16 rows and the next
// block is prefetched in memory order, 16 * step bytes per step, so that it is in cache when the
// block ends (on the 2-core Zen 5 at n = 1 from DRAM, with the scales below: ~10 % more GB/s than
// kAhead per row, median of paired runs, 1 and 2 threads); otherwise (a chunk of long rows) each
// row kAhead bytes ahead, wrapping into the next block of rows at the end of the chunk.
inline uintptr_t prefetch_at(const Block& b, size_t off, size_t step, size_t i) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(b.p);
  if (b.chunk_bytes == b.row_bytes) return base + kRows * b.row_bytes + kRows * off + i * step;
  const size_t ahead = off + kAhead;
  return base + i * b.row_bytes +
         (ahead < b.chunk_bytes ? ahead : kRows * b.row_bytes + (ahead - b.chunk_bytes));
}

// The scales of the next block of rows (a chunk's worth per row; 16 x groups bytes when the chunk
// is whole rows), prefetched when a block starts: a demand miss on them stalls every lane.
inline void prefetch_next_scales(const Block& b) {
  const uintptr_t next = reinterpret_cast<uintptr_t>(b.sp) + kRows * b.groups;
  if (b.gc == b.groups) {
    for (size_t o = 0; o < kRows * b.groups; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(next + o), _MM_HINT_T0);
  } else {
    for (size_t i = 0; i < kRows; ++i)
      for (size_t o = 0; o < b.gc; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + i * b.groups + o), _MM_HINT_T0);
  }
}

// Loads the packed bytes of groups [g0, g0 + gq) (gq <= 4) of the block's rows and transposes
// them: r[4 * gl + j] holds dword j (packed bytes 4j..4j+3, columns 8j..8j+7) of group g0 + gl,
// one row per lane.
inline void load_quad(const Block& b, size_t g0, size_t gq, __m512i r[16]) {
  const __mmask16 mask = static_cast<__mmask16>((1u << (4 * gq)) - 1);
  const size_t off = g0 * (kMxfp4Group / 2);
  const size_t ahead = off + kAhead;
  // An address only (it may lie past the matrix; prefetches do not fault), kept as an integer.
  // (Prefetching the next block in memory order, as block_n1, made the exact path slower: ~13
  // -> ~10 GB/s per core from DRAM.)
  const uintptr_t pf =
      reinterpret_cast<uintptr_t>(b.p) +
      (ahead < b.chunk_bytes ? ahead : kRows * b.row_bytes + (ahead - b.chunk_bytes));
  for (size_t i = 0; i < kRows; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(pf + i * b.row_bytes), _MM_HINT_T1);
    r[i] = i < b.nr ? _mm512_maskz_loadu_epi32(mask, b.p + i * b.row_bytes + off)
                    : _mm512_setzero_si512();
  }
  transpose16(r);
}

// Decodes group gl of a transposed quad into the u8 weights (doubled e2m1 + 12) matching the
// prepared activation dwords k = 0..7.
inline void decode_group(const __m512i r[16], size_t gl, __m512i w[8]) {
  const __m512i table = _mm512_broadcast_i32x4(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (size_t j = 0; j < 4; ++j) {
    const __m512i x = r[4 * gl + j];
    w[2 * j] = _mm512_shuffle_epi8(table, _mm512_and_si512(x, low4));  // 8j + 0,2,4,6
    w[2 * j + 1] = _mm512_shuffle_epi8(
        table, _mm512_and_si512(_mm512_srli_epi32(x, 4), low4));  // 8j + 1,3,5,7
  }
}

// hs[g] = 2^(s - bias) of groups [g0, g0 + ug) (ug <= 16), one row per lane.
inline void decode_scales(const Block& b, size_t g0, size_t ug, int bias, __m512* hs) {
  const __mmask16 mask = static_cast<__mmask16>((1u << ug) - 1);
  __m512i r[16];
  for (size_t i = 0; i < kRows; ++i)
    r[i] = i < b.nr ? _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, b.sp + i * b.groups + g0))
                    : _mm512_setzero_si512();
  transpose16(r);
  for (size_t g = 0; g < ug; ++g) hs[g] = pow2_scale(r[g], bias);
}

// decode_scales for a full block (16 rows) and a full unit (16 groups): each row's 16 scale
// bytes are 4 dwords, so a 16x4 dword transpose (8 shuffles) gives per 4 groups a vector with
// one row per lane, from which each group's byte is taken with a shift and a mask.
inline void decode_scales16(const Block& b, size_t g0, int bias, __m512* hs) {
  __m512i z[4];
  for (size_t k = 0; k < 4; ++k) {
    const uint8_t* sp = b.sp + k * b.groups + g0;  // lane L: row 4L + k
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sp)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp + 4 * b.groups)),
                           1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp + 8 * b.groups)),
                           2);
    z[k] = _mm512_inserti32x4(
        v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp + 12 * b.groups)), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
  __m512i x[4];  // x[h], lane r: scale bytes of groups 4h..4h+3 of row r
  x[0] = _mm512_unpacklo_epi64(t0, t2);
  x[1] = _mm512_unpackhi_epi64(t0, t2);
  x[2] = _mm512_unpacklo_epi64(t1, t3);
  x[3] = _mm512_unpackhi_epi64(t1, t3);
  const __m512i m8 = _mm512_set1_epi32(0xFF);
  for (int h = 0; h < 4; ++h) {
    hs[4 * h + 0] = pow2_scale(_mm512_and_si512(x[h], m8), bias);
    hs[4 * h + 1] = pow2_scale(_mm512_and_si512(_mm512_srli_epi32(x[h], 8), m8), bias);
    hs[4 * h + 2] = pow2_scale(_mm512_and_si512(_mm512_srli_epi32(x[h], 16), m8), bias);
    hs[4 * h + 3] = pow2_scale(_mm512_srli_epi32(x[h], 24), bias);
  }
}

// ---------------------------------------------------------------------------------------------
// Exact float path

// Decodes group gl of a transposed quad into f32 weights: w[c] holds column c of the 16 rows.
inline void decode_group_f32(const __m512i r[16], size_t gl, __m512* w) {
  const __m512 table = _mm512_loadu_ps(kE2M1);
  for (size_t j = 0; j < 4; ++j) {
    __m512i x = r[4 * gl + j];
    for (size_t p = 0; p < 8; ++p) {  // nibble p of dword j = column 8j + p
      w[8 * j + p] = _mm512_permutexvar_ps(x, table);
      x = _mm512_srli_epi32(x, 4);
    }
  }
}

// Few activation rows (S <= kExactDirect): the whole row block with the accumulators in
// registers; each column of weights is decoded once and used for the S rows. Per (activation row,
// group) the 32 products go into two FMA chains (even and odd columns), added at the end, as in
// exact_unit: a row's result does not depend on how many rows share the call. kG groups of a quad
// are summed side by side (2 * S * kG FMA chains in flight instead of 2 * S): one row on one Zen 5
// core from the L3, 4 alternated pairs, 12.9-17.2 -> 15.3-18.1 GB/s. What binds it is the mix of
// permutes, shifts and FMAs (docs/streaming.md §1.7).
template <int S>
void exact_direct(const Block& b, const float* X, size_t cols, float* acc) {
  constexpr size_t kG = S == 1 ? 4 : S == 2 ? 2 : 1;  // divides 4: a step never leaves its quad
  const __m512 table = _mm512_loadu_ps(kE2M1);
  __m512 a[S];
  for (int s = 0; s < S; ++s) a[s] = _mm512_load_ps(acc + s * kRows);
  alignas(64) __m512 hs[kUnit];
  __m512i r[16];
  for (size_t u0 = 0; u0 < b.gc; u0 += kUnit) {
    const size_t ug = std::min(kUnit, b.gc - u0);
    decode_scales(b, u0, ug, 127, hs);
    for (size_t q = 0; q * 4 < ug; ++q) {
      const size_t gq = std::min<size_t>(4, ug - q * 4);
      load_quad(b, u0 + q * 4, gq, r);
      for (size_t g0 = 0; g0 < gq; g0 += kG) {
        // Groups past gq (a last quad of fewer than 4) have zero weights and are not added; their
        // activations are read from the quad's last group so that nothing past X is touched.
        const float* xg[kG];
        for (size_t k = 0; k < kG; ++k)
          xg[k] = X + (u0 + q * 4 + std::min(g0 + k, gq - 1)) * kMxfp4Group;
        __m512 ga[S][kG][2];
        for (int s = 0; s < S; ++s)
          for (size_t k = 0; k < kG; ++k) ga[s][k][0] = ga[s][k][1] = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (size_t j = 0; j < 4; ++j) {
          __m512i x[kG];
          for (size_t k = 0; k < kG; ++k) x[k] = r[4 * (g0 + k) + j];
#pragma GCC unroll 4
          for (size_t p = 0; p < 8; p += 2) {  // nibbles p, p + 1 of dword j = columns 8j + p, + 1
#pragma GCC unroll 4
            for (size_t k = 0; k < kG; ++k) {
              const __m512 w0 = _mm512_permutexvar_ps(x[k], table);
              const __m512 w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(x[k], 4), table);
              x[k] = _mm512_srli_epi32(x[k], 8);
              for (int s = 0; s < S; ++s) {
                const float* xc = xg[k] + s * cols + 8 * j + p;
                ga[s][k][0] = _mm512_fmadd_ps(w0, _mm512_set1_ps(xc[0]), ga[s][k][0]);
                ga[s][k][1] = _mm512_fmadd_ps(w1, _mm512_set1_ps(xc[1]), ga[s][k][1]);
              }
            }
          }
        }
        for (size_t k = 0; k < kG && g0 + k < gq; ++k)
          for (int s = 0; s < S; ++s)
            a[s] =
                _mm512_fmadd_ps(_mm512_add_ps(ga[s][k][0], ga[s][k][1]), hs[q * 4 + g0 + k], a[s]);
      }
    }
  }
  for (int s = 0; s < S; ++s) _mm512_store_ps(acc + s * kRows, a[s]);
}

// acc[s] += groups [0, ug) of decoded f32 weights w ([g][32]) with row scales hs against
// activation rows s < S (X: group 0 of row 0, stride cols); per (row, group) the same two chains
// as exact_direct.
template <int S>
void exact_unit(const __m512* w, const __m512* hs, size_t ug, const float* X, size_t cols,
                float* acc) {
  __m512 a[S];
  for (int s = 0; s < S; ++s) a[s] = _mm512_load_ps(acc + s * kRows);
  for (size_t g = 0; g < ug; ++g) {
    __m512 ga[S][2];
    for (int s = 0; s < S; ++s) ga[s][0] = ga[s][1] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (size_t c = 0; c < kMxfp4Group; c += 2) {
      const __m512 w0 = _mm512_load_ps(reinterpret_cast<const float*>(w + g * kMxfp4Group + c));
      const __m512 w1 = _mm512_load_ps(reinterpret_cast<const float*>(w + g * kMxfp4Group + c + 1));
      for (int s = 0; s < S; ++s) {
        const float* xc = X + s * cols + g * kMxfp4Group + c;
        ga[s][0] = _mm512_fmadd_ps(w0, _mm512_set1_ps(xc[0]), ga[s][0]);
        ga[s][1] = _mm512_fmadd_ps(w1, _mm512_set1_ps(xc[1]), ga[s][1]);
      }
    }
    for (int s = 0; s < S; ++s)
      a[s] = _mm512_fmadd_ps(_mm512_add_ps(ga[s][0], ga[s][1]), hs[g], a[s]);
  }
  for (int s = 0; s < S; ++s) _mm512_store_ps(acc + s * kRows, a[s]);
}

// Many activation rows: each quad of groups is decoded once into a buffer and applied to the
// tn rows of the tile, kSubT at a time.
void exact_buffered(const Block& b, const float* X, size_t cols, size_t tn, float* acc) {
  using Fn = void (*)(const __m512*, const __m512*, size_t, const float*, size_t, float*);
  static constexpr Fn kFns[kSubT] = {exact_unit<1>, exact_unit<2>, exact_unit<3>, exact_unit<4>,
                                     exact_unit<5>, exact_unit<6>, exact_unit<7>, exact_unit<8>};
  alignas(64) __m512 w[4 * kMxfp4Group];
  alignas(64) __m512 hs[kUnit];
  __m512i r[16];
  for (size_t u0 = 0; u0 < b.gc; u0 += kUnit) {
    const size_t ug = std::min(kUnit, b.gc - u0);
    decode_scales(b, u0, ug, 127, hs);
    for (size_t q = 0; q * 4 < ug; ++q) {
      const size_t gq = std::min<size_t>(4, ug - q * 4);
      load_quad(b, u0 + q * 4, gq, r);
      for (size_t gl = 0; gl < gq; ++gl) decode_group_f32(r, gl, w + gl * kMxfp4Group);
      for (size_t ts = 0; ts < tn; ts += kSubT) {
        const size_t sn = std::min<size_t>(kSubT, tn - ts);
        kFns[sn - 1](w, hs + q * 4, gq, X + ts * cols + (u0 + q * 4) * kMxfp4Group, cols,
                     acc + ts * kRows);
      }
    }
  }
}

constexpr size_t kExactDirect = 4;
using ExactDirect = void (*)(const Block&, const float*, size_t, float*);
const ExactDirect kExactDirectFns[kExactDirect] = {exact_direct<1>, exact_direct<2>,
                                                   exact_direct<3>, exact_direct<4>};

// ---------------------------------------------------------------------------------------------
// Integer path

inline __m512i bcast32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Activation rows of a tile: prepared bytes, -12 * sums and scales of (row 0, group c0 of the
// chunk) with their row strides.
struct Acts {
  const uint8_t* qp;
  size_t qp_stride;
  const int32_t* qs;
  size_t qs_stride;
  const float* d;
  size_t d_stride;
};

// a += the contribution of group g (decoded weights w, row scales h) for activation rows s < S.
template <int S>
inline void idot_group(const __m512i w[8], __m512 h, const Acts& x, size_t g, __m512 a[S]) {
  for (int s = 0; s < S; ++s) {
    const uint8_t* q = x.qp + s * x.qp_stride + g * kMxfp4Group;
    __m512i i = _mm512_set1_epi32(x.qs[s * x.qs_stride + g]);  // -12 * sum(q): the offset
    for (int k = 0; k < 8; ++k) i = _mm512_dpbusd_epi32(i, w[k], bcast32(q + 4 * k));
    // Exactly idot_reduce: acc + (float)isum * (d * 2^(s-128)), no FMA.
    const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(x.d[s * x.d_stride + g]), h);
    a[s] = _mm512_add_ps(a[s], _mm512_mul_ps(_mm512_cvtepi32_ps(i), scale));
  }
}

// Few activation rows (S <= kSubT): the whole chunk of a block with the accumulators in
// registers, each group decoded straight into registers.
template <int S>
void block_direct(const Block& b, const Acts& x, float* acc) {
  __m512 a[S];
  for (int s = 0; s < S; ++s) a[s] = _mm512_load_ps(acc + s * kRows);
  prefetch_next_scales(b);
  alignas(64) __m512 hs[kUnit];
  __m512i r[16], w[8];
  for (size_t u0 = 0; u0 < b.gc; u0 += kUnit) {
    const size_t ug = std::min(kUnit, b.gc - u0);
    decode_scales(b, u0, ug, 128, hs);
    for (size_t q = 0; q * 4 < ug; ++q) {
      const size_t gq = std::min<size_t>(4, ug - q * 4);
      load_quad(b, u0 + q * 4, gq, r);
      for (size_t gl = 0; gl < gq; ++gl) {
        decode_group(r, gl, w);
        idot_group<S>(w, hs[q * 4 + gl], x, u0 + q * 4 + gl, a);
      }
    }
  }
  for (int s = 0; s < S; ++s) _mm512_store_ps(acc + s * kRows, a[s]);
}

// Many activation rows: a unit of up to 16 groups is decoded once into a buffer, then applied
// to every activation row of the tile, kSubT rows at a time.
template <int S>
void unit_buffered(const __m512i* wbuf, const __m512* hs, size_t u0, size_t ug, const Acts& x,
                   float* acc) {
  __m512 a[S];
  for (int s = 0; s < S; ++s) a[s] = _mm512_load_ps(acc + s * kRows);
  for (size_t g = 0; g < ug; ++g) {
    __m512i w[8];
    for (int k = 0; k < 8; ++k) w[k] = _mm512_load_si512(wbuf + g * 8 + k);
    idot_group<S>(w, hs[g], x, u0 + g, a);
  }
  for (int s = 0; s < S; ++s) _mm512_store_ps(acc + s * kRows, a[s]);
}

void block_buffered(const Block& b, const Acts& x, size_t tn, float* acc) {
  using Fn = void (*)(const __m512i*, const __m512*, size_t, size_t, const Acts&, float*);
  static constexpr Fn kFns[kSubT] = {unit_buffered<1>, unit_buffered<2>, unit_buffered<3>,
                                     unit_buffered<4>, unit_buffered<5>, unit_buffered<6>,
                                     unit_buffered<7>, unit_buffered<8>};
  alignas(64) __m512i wbuf[kUnit * 8];
  alignas(64) __m512 hs[kUnit];
  __m512i r[16];
  for (size_t u0 = 0; u0 < b.gc; u0 += kUnit) {
    const size_t ug = std::min(kUnit, b.gc - u0);
    decode_scales(b, u0, ug, 128, hs);
    for (size_t q = 0; q * 4 < ug; ++q) {
      const size_t gq = std::min<size_t>(4, ug - q * 4);
      load_quad(b, u0 + q * 4, gq, r);
      for (size_t gl = 0; gl < gq; ++gl) decode_group(r, gl, wbuf + (q * 4 + gl) * 8);
    }
    for (size_t ts = 0; ts < tn; ts += kSubT) {
      const size_t sn = std::min<size_t>(kSubT, tn - ts);
      const Acts xs{x.qp + ts * x.qp_stride, x.qp_stride, x.qs + ts * x.qs_stride, x.qs_stride,
                    x.d + ts * x.d_stride,   x.d_stride};
      kFns[sn - 1](wbuf, hs, u0, ug, xs, acc + ts * kRows);
    }
  }
}

// One activation row (decode): no weight transpose. Per weight row, one 64-byte load covers 4
// groups; its low and high nibbles decode to u8 (w + 12) with a byte shuffle and meet the
// activations laid out to match (ql: dword 4gl + j = even columns 8j + {0,2,4,6} of group gl,
// qh the odd ones; qo: -12 * sum(q) of group gl in dword 4gl), so two vpdpbusd give 16 partial
// dwords, 4 per group. The 16 rows' partials are then reduced and transposed together
// (32 shuffles per 16 rows x 4 groups, against 64 for the weight transpose) into one vector per
// group with one row per lane, and the float reduction runs lane-wise as in idot_group. The rows
// are read two quads (128 contiguous bytes) at a time; the scales of full blocks and units are
// transposed as dwords (decode_scales16). Measured on the 2-core Zen 4 box at n = 1 from DRAM:
// 1 thread ~17 -> ~20 GB/s, 2 threads ~32 -> ~34 GB/s (probe ~36); ~29.6 GB/s per core from L3.
// The weights are prefetched into L2 (T1), as the other kernels' weights: on a 2-core Xeon
// (Sapphire Rapids class) from DRAM, T0 -> T1 took 1 thread from 9.7 to 11.3 GB/s and 2 threads
// from 18.9 to 21.7 (probe 15.9 / 31.0; without software prefetch 9.1 GB/s). A prefetch distance
// of one block (16 rows, 24-28 KB) beat 4 KB to 64 KB there.
struct Quad1 {
  __m512i ql, qh, qo;
};

// The 64-byte line at address `line` (64-aligned; an integer, as it may lie up to 63 bytes before
// or after the matrix). Those bytes share a line, so a page, with bytes of the matrix: never a
// fault, and their lanes are permuted away. Outside AddressSanitizer's view for that reason (it
// would call them a heap overflow); in a build without it the attribute does nothing and this
// inlines.
__attribute__((no_sanitize_address)) inline __m512i load_line(uintptr_t line) {
  return _mm512_load_si512(reinterpret_cast<const void*>(line));
}

// Lays out the prepared activations (tn = 1) of the chunk's gc groups as quads.
void prepare_n1(const uint8_t* qp, const int32_t* qs, size_t gc, Quad1* out) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i oidx =
      _mm512_setr_epi32(0, 16, 16, 16, 1, 16, 16, 16, 2, 16, 16, 16, 3, 16, 16, 16);
  for (size_t g0 = 0, q = 0; g0 < gc; g0 += 4, ++q) {
    const size_t gq = std::min<size_t>(4, gc - g0);
    const __mmask16 m0 = static_cast<__mmask16>(gq >= 2 ? 0xFFFF : 0x00FF);
    const __mmask16 m1 = static_cast<__mmask16>(gq >= 4 ? 0xFFFF : gq == 3 ? 0x00FF : 0);
    const __m512i a = _mm512_maskz_loadu_epi32(m0, qp + g0 * kMxfp4Group);
    const __m512i b = _mm512_maskz_loadu_epi32(m1, qp + g0 * kMxfp4Group + 64);
    out[q].ql = _mm512_permutex2var_epi32(a, even, b);
    out[q].qh = _mm512_permutex2var_epi32(a, odd, b);
    const __m512i s = _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << gq) - 1), qs + g0);
    out[q].qo = _mm512_permutex2var_epi32(s, oidx, _mm512_setzero_si512());
  }
}

// The 16 rows' partials of one quad (dr[i]: row i) -> one vector per group, one row per lane,
// then acc += isum * (d * h) per group, exactly as idot_reduce.
inline __m512 finish_quad(const __m512i dr[16], const float* d, const __m512* hs, size_t gq,
                          __m512 a) {
  __m512i gs[4];
  sum_rows16(dr, gs);
  for (size_t gl = 0; gl < gq; ++gl) {
    // Exactly idot_reduce: acc + (float)isum * (d * 2^(s-128)), no FMA.
    const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(d[gl]), hs[gl]);
    a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_cvtepi32_ps(gs[gl]), scale));
  }
  return a;
}

// How block_n1 prefetches the next block of rows (the two x86 families want opposite things;
// results are the same bytes either way). Two paired-run series, 2 threads from DRAM:
// - 2-core KVM Xeon (Sapphire Rapids class), probe 29-31 GB/s: both 128-byte lines of every row
//   into L1 (T0) 18.9 GB/s, into L2 (T1) 20.5-21.6, one line per row into L2 (the even rows'
//   pieces; the L2 streamer fetches the rest) 22.3-22.9;
// - 2-core KVM EPYC (Zen 5 class), probe 69.5 GB/s: one line per row into L2 26.5-28.4 GB/s,
//   both lines into L2 35.2-36.2, both into L1 39.4-41.2.
// kL1Whole: both lines of every row into L1 (what Zen wants); otherwise one line per row into L2.
//
// kRealign: the rows start `mis` bytes past a cache line (a snapshot's expert read with O_DIRECT
// starts wherever its file offset falls, a multiple of 8; the container's aligned layout puts it
// on a 4 KiB boundary), the same in every row (row_bytes % 64 == 0), mis % 4 == 0. Each row's 128
// bytes are then read as the three whole lines they touch and put together with two dword permutes,
// instead of two loads that each straddle two lines. On the 2-core Zen 5, 2 threads from DRAM,
// paired medians of 300 passes: 1.07-1.19x the straddling loads at every offset tried (4 to 56),
// about the speed of rows on a line boundary.
template <bool kFull, bool kL1Whole, bool kRealign>
void block_n1(const Block& b, const Quad1* qx, const float* d, float* acc) {
  constexpr _mm_hint kHint = kL1Whole ? _MM_HINT_T0 : _MM_HINT_T1;
  const __m512i table = _mm512_broadcast_i32x4(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  auto dot = [&](__m512i v, const Quad1& x) {
    const __m512i wl = _mm512_shuffle_epi8(table, _mm512_and_si512(v, low4));
    const __m512i wh = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x.qo, wl, x.ql), wh, x.qh);
  };
  __m512 a = _mm512_load_ps(acc);
  prefetch_next_scales(b);
  const bool linear = b.chunk_bytes == b.row_bytes;  // the block is one run of 16 rows
  // kRealign: lane j of permutex2var(line k, shift, line k + 1) = dword j + mis / 4 of the two.
  const size_t mis = kRealign ? reinterpret_cast<uintptr_t>(b.p) % 64 : 0;
  const __m512i shift = kRealign ? _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                                                                      10, 11, 12, 13, 14, 15),
                                                    _mm512_set1_epi32(static_cast<int>(mis / 4)))
                                 : _mm512_setzero_si512();
  alignas(64) __m512 hs[kUnit];
  alignas(64) __m512i d2[kRows];
  for (size_t u0 = 0; u0 < b.gc; u0 += kUnit) {
    const size_t ug = std::min(kUnit, b.gc - u0);
    if (kFull && ug == kUnit)
      decode_scales16(b, u0, 128, hs);
    else
      decode_scales(b, u0, ug, 128, hs);
    size_t q = 0;
    // Two quads (128 contiguous bytes per row) at a time.
    for (; q * 4 + 8 <= ug; q += 2) {
      const size_t g0 = u0 + q * 4;
      const size_t off = g0 * (kMxfp4Group / 2);
      const Quad1& x0 = qx[g0 / 4];
      const Quad1& x1 = qx[g0 / 4 + 1];
      __m512i dr[16];
      const uint8_t* p = b.p + off;
#pragma GCC unroll 16
      for (size_t i = 0; i < kRows; ++i) {
        if (linear && !kL1Whole) {
          // One prefetch per row: row i takes line i & 1 of the 128-byte piece of row i & ~1 in
          // the next block, so a step prefetches the even rows' pieces (half of what it reads)
          // and the L2 streamer fetches the rest. On the Xeon two per row (all of it) left the
          // loads waiting longer (a quarter: 19.2-19.6 GB/s; the first half: 21.0-21.2; two per
          // even row: 21.6-22.2; docs/streaming.md §1.7).
          _mm_prefetch(reinterpret_cast<const char*>(prefetch_at(b, off, 128, i & ~size_t{1}) +
                                                     64 * (i & 1)),
                       _MM_HINT_T1);
        } else {
          const uintptr_t pf = prefetch_at(b, off, 128, i);
          _mm_prefetch(reinterpret_cast<const char*>(pf), kHint);
          _mm_prefetch(reinterpret_cast<const char*>(pf + 64), kHint);
        }
        if constexpr (kRealign) {
          const uintptr_t line = reinterpret_cast<uintptr_t>(p) + i * b.row_bytes - mis;
          const __m512i l1 = load_line(line + 64);
          dr[i] = dot(_mm512_permutex2var_epi32(load_line(line), shift, l1), x0);
          d2[i] = dot(_mm512_permutex2var_epi32(l1, shift, load_line(line + 128)), x1);
        } else {
          const __mmask16 m = kFull || i < b.nr ? 0xFFFF : 0;
          dr[i] = dot(_mm512_maskz_loadu_epi32(m, p + i * b.row_bytes), x0);
          d2[i] = dot(_mm512_maskz_loadu_epi32(m, p + i * b.row_bytes + 64), x1);
        }
      }
      a = finish_quad(dr, d + g0, hs + q * 4, 4, a);
      a = finish_quad(d2, d + g0 + 4, hs + q * 4 + 4, 4, a);
    }
    for (; q * 4 < ug; ++q) {
      const size_t g0 = u0 + q * 4;
      const size_t gq = std::min<size_t>(4, ug - q * 4);
      const __mmask16 mask = static_cast<__mmask16>((1u << (4 * gq)) - 1);
      const size_t off = g0 * (kMxfp4Group / 2);
      __m512i dr[16];
      const uint8_t* p = b.p + off;
#pragma GCC unroll 16
      for (size_t i = 0; i < kRows; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch_at(b, off, 64, i)), kHint);
        dr[i] = dot(_mm512_maskz_loadu_epi32(kFull || i < b.nr ? mask : 0, p + i * b.row_bytes),
                    qx[g0 / 4]);
      }
      a = finish_quad(dr, d + g0, hs + q * 4, gq, a);
    }
  }
  _mm512_store_ps(acc, a);
}

using BlockDirect = void (*)(const Block&, const Acts&, float*);
const BlockDirect kBlockDirect[kSubT] = {block_direct<1>, block_direct<2>, block_direct<3>,
                                         block_direct<4>, block_direct<5>, block_direct<6>,
                                         block_direct<7>, block_direct<8>};

}  // namespace

void matmul_mxfp4_exact_avx512(const uint8_t* packed, const uint8_t* scales, size_t cols,
                               const float* X, size_t n, float* Y, size_t ldy, size_t row_begin,
                               size_t row_end) {
  if (row_begin >= row_end || n == 0) return;
  const size_t groups = cols / kMxfp4Group, row_bytes = cols / 2;
  alignas(64) float acc[kTileT * kRows];
  for (size_t t0 = 0; t0 < n; t0 += kTileT) {
    const size_t tn = std::min(kTileT, n - t0);
    for (size_t o0 = row_begin; o0 < row_end; o0 += kRows) {
      const size_t nr = std::min(kRows, row_end - o0);
      const __mmask16 rmask = static_cast<__mmask16>((1u << nr) - 1);
      for (size_t t = 0; t < tn; ++t) _mm512_store_ps(acc + t * kRows, _mm512_setzero_ps());
      const Block b{
          packed + o0 * row_bytes, row_bytes, row_bytes, scales + o0 * groups, groups, nr, groups};
      if (tn <= kExactDirect)
        kExactDirectFns[tn - 1](b, X + t0 * cols, cols, acc);
      else
        exact_buffered(b, X + t0 * cols, cols, tn, acc);
      for (size_t t = 0; t < tn; ++t)
        _mm512_mask_storeu_ps(Y + (t0 + t) * ldy + o0, rmask, _mm512_load_ps(acc + t * kRows));
    }
  }
}

void quantize_q8_32_avx512(const float* x, size_t cols, int8_t* q, float* d) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (size_t g = 0; g < cols / kMxfp4Group; ++g) {
    const float* xg = x + g * kMxfp4Group;
    const __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
    const __m512 aa = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), abs_mask));
    const __m512 ab = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(b), abs_mask));
    // maxps returns its second operand when either is NaN: NaN inputs are skipped, as fmax does.
    const __m512 m = _mm512_max_ps(aa, _mm512_max_ps(ab, _mm512_setzero_ps()));
    const float scale = q8_scale(_mm512_reduce_max_ps(m));
    const float inv = 1.0f / scale;
    d[g] = scale;
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int h = 0; h < 2; ++h) {
      __m512 v = _mm512_mul_ps(h == 0 ? a : b, vinv);
      v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      // As q8_round: max(r, -127) then min(., 127), NaN -> -127.
      v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * kMxfp4Group + 16 * h),
                       _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
    }
  }
}

namespace {

template <bool kL1Whole>
void idot_avx512_rows(const uint8_t* packed, const uint8_t* scales, size_t cols, const int8_t* Q8,
                      const float* D, size_t n, float* Y, size_t ldy, size_t row_begin,
                      size_t row_end) {
  if (row_begin >= row_end || n == 0) return;
  const size_t groups = cols / kMxfp4Group, row_bytes = cols / 2;
  if (groups == 0) {
    for (size_t t = 0; t < n; ++t)
      for (size_t o = row_begin; o < row_end; ++o) Y[t * ldy + o] = 0.0f;
    return;
  }
  alignas(64) uint8_t qp[kPrepSlots * kMxfp4Group];
  alignas(64) int32_t qs[kPrepSlots];
  alignas(64) float acc[kTileT * kRows];
  alignas(64) Quad1 q1[kMaxChunk / 4];
  for (size_t t0 = 0; t0 < n; t0 += kTileT) {
    const size_t tn = std::min(kTileT, n - t0);
    const size_t chunk = chunk_groups(tn);
    for (size_t c0 = 0; c0 < groups; c0 += chunk) {
      const size_t gc = std::min(chunk, groups - c0);
      prepare(Q8 + t0 * cols, cols, tn, c0, gc, 12, qp, qs);
      const Acts x{qp, gc * kMxfp4Group, qs, gc, D + t0 * groups + c0, groups};
      if (tn == 1) prepare_n1(qp, qs, gc, q1);
      for (size_t o0 = row_begin; o0 < row_end; o0 += kRows) {
        const size_t nr = std::min(kRows, row_end - o0);
        const __mmask16 rmask = static_cast<__mmask16>((1u << nr) - 1);
        for (size_t t = 0; t < tn; ++t)
          _mm512_store_ps(acc + t * kRows,
                          c0 == 0 ? _mm512_setzero_ps()
                                  : _mm512_maskz_loadu_ps(rmask, Y + (t0 + t) * ldy + o0));
        const Block b{packed + o0 * row_bytes + c0 * (kMxfp4Group / 2),
                      row_bytes,
                      gc * (kMxfp4Group / 2),
                      scales + o0 * groups + c0,
                      groups,
                      nr,
                      gc};
        if (tn == 1) {
          const size_t mis = reinterpret_cast<uintptr_t>(b.p) % 64;
          if (nr == kRows && mis != 0 && mis % 4 == 0 && row_bytes % 64 == 0)
            block_n1<true, kL1Whole, true>(b, q1, x.d, acc);
          else if (nr == kRows)
            block_n1<true, kL1Whole, false>(b, q1, x.d, acc);
          else
            block_n1<false, kL1Whole, false>(b, q1, x.d, acc);
        } else if (tn <= static_cast<size_t>(kSubT))
          kBlockDirect[tn - 1](b, x, acc);
        else
          block_buffered(b, x, tn, acc);
        for (size_t t = 0; t < tn; ++t)
          _mm512_mask_storeu_ps(Y + (t0 + t) * ldy + o0, rmask, _mm512_load_ps(acc + t * kRows));
      }
    }
  }
}

}  // namespace

void matmul_mxfp4_idot_avx512(const uint8_t* packed, const uint8_t* scales, size_t cols,
                              const int8_t* Q8, const float* D, size_t n, float* Y, size_t ldy,
                              size_t row_begin, size_t row_end) {
  idot_avx512_rows<false>(packed, scales, cols, Q8, D, n, Y, ldy, row_begin, row_end);
}

void matmul_mxfp4_idot_avx512_l1(const uint8_t* packed, const uint8_t* scales, size_t cols,
                                 const int8_t* Q8, const float* D, size_t n, float* Y, size_t ldy,
                                 size_t row_begin, size_t row_end) {
  idot_avx512_rows<true>(packed, scales, cols, Q8, D, n, Y, ldy, row_begin, row_end);
}

}  // namespace k3::impl

// kernels/impl/mxfp4_avx2.cpp — AVX2 + FMA variants of the MXFP4 kernels.
//
// Exact float path: row-major, one weight row x up to 8 activation rows per register tile (each
// group is decoded once per 8 activation rows). Two groups' 32 packed bytes at a time, one group
// per 128-bit lane, are split into nibbles and turned into the floats of the doubled e2m1 values
// by byte shuffles and unpacking (no int -> float conversion; see exact_tile), in an order the
// activation rows are permuted to once per call; per lane the group partial is scaled by
// 2^(s-128) (the 0.5 of the doubling folded in) and accumulated; one horizontal sum per output.
//
// Integer path: as the AVX-512 variant (see mxfp4_avx512.cpp) with 8 weight rows per block, one
// row per 32-bit lane: 8 rows x 2 groups of packed bytes are transposed (8x8 dwords), the nibbles
// decoded by a byte shuffle to u8 (doubled e2m1 + 12), and vpmaddubsw against broadcast
// activation dwords (prepared once per call tile: per 8 columns the 4 even then the 4 odd ones)
// gives int16 pair sums; four of them are added in int16 (|sum| <= 4 * 2 * 24 * 128 = 24576, no
// overflow) before vpmaddwd widens to int32, so the group sums are exact:
//   isum = sum_k (w + 12) q - 12 * sum(q).
// The float reduction is done lane-wise with exactly the operations of idot_reduce
// (acc + (float)isum * (d * 2^(s-128)), g ascending, no FMA): bit-identical to the scalar twin.
// With 1 or 2 activation rows each group is decoded straight into registers; with more, 8 groups
// are decoded into a buffer and applied to up to 64 activation rows 4 at a time. The rows of a
// block are prefetched ahead into L2.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/mxfp4.h"
#include "kernels_impl.h"
#include "mxfp4_common.h"
#include "x86_common.h"

namespace k3::impl {
namespace {

// ---------------------------------------------------------------------------------------------
// Exact float path

struct ScaleTable {
  float v[256];
};
// 2^(s-128): mxfp4_scale with the 0.5 of the doubled values folded in; s = 255 -> NaN.
constexpr ScaleTable make_half_scale_table() {
  ScaleTable t{};
  for (uint32_t s = 0; s < 256; ++s)
    t.v[s] = std::bit_cast<float>(s == 0     ? 0x00200000u
                                  : s == 1   ? 0x00400000u
                                  : s == 255 ? 0x7FC00000u
                                             : (s - 1) << 23);
  return t;
}
constexpr ScaleTable kHalfScale = make_half_scale_table();

// The exact path reads one weight row after another; the hardware prefetchers alone left it
// waiting on DRAM (2-core Xeon, 2 threads: 5.9 GB/s, against 9.7 from L3). One prefetch into L2
// per 64 bytes, 4 KiB ahead (2+ rows of 3072-3584 columns): 15.2 GB/s (1 KiB: 13.2, 8 KiB: 14.9).
constexpr size_t kExactAhead = 4096;

// Doubled e2m1 values of one group as int8 in column order: c[0] columns 0..15, c[1] 16..31.
inline void decode_exact_one(const uint8_t* p, __m128i c[2]) {
  const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i lo = _mm_and_si128(v, low4);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
  c[0] = _mm_shuffle_epi8(table, _mm_unpacklo_epi8(lo, hi));
  c[1] = _mm_shuffle_epi8(table, _mm_unpackhi_epi8(lo, hi));
}

// The 16 int8 weights of c as two vectors of floats.
inline void widen16(__m128i c, __m256* w) {
  w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
  w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8)));
}

// Column of a group held by float j (0..3) of decoded vector k (0..7) of a pair of groups (see
// exact_tile): even columns 0..30 in vectors 0..3, odd columns in vectors 4..7.
constexpr int exact_pair_column(int k, int j) {
  return 2 * (4 * (k & 3) + j) + (k >> 2);
}

// Activation rows [t0, t0 + n) of X in the order exact_tile reads them: per pair of groups
// (g, g + 1), 8 vectors of 8 floats, vector k = group g's columns exact_pair_column(k, 0..3) then
// group g + 1's; an odd last group as it is. Row stride cols.
void permute_exact_rows(const float* X, size_t cols, size_t n, float* out) {
  const size_t groups = cols / kMxfp4Group;
  for (size_t t = 0; t < n; ++t) {
    const float* x = X + t * cols;
    float* d = out + t * cols;
    size_t g = 0;
    for (; g + 2 <= groups; g += 2, x += 2 * kMxfp4Group, d += 2 * kMxfp4Group)
      for (int k = 0; k < 8; ++k)
        for (int j = 0; j < 4; ++j) {
          d[8 * k + j] = x[exact_pair_column(k, j)];
          d[8 * k + 4 + j] = x[kMxfp4Group + exact_pair_column(k, j)];
        }
    if (g < groups) std::memcpy(d, x, kMxfp4Group * sizeof(float));
  }
}

// acc[s] += (sum_k w[k] * x_s[8k .. 8k + 7]) * sc for the S activation rows x_s (row stride
// cols) of K vectors of weights.
template <int S, int K>
inline void exact_accumulate(const __m256 (&w)[K], __m256 sc, const float* x, size_t cols,
                             __m256 (&acc)[S]) {
  for (int s = 0; s < S; ++s, x += cols) {
    __m256 ga = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
    for (int k = 1; k < K; ++k) ga = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x + 8 * k), ga);
    acc[s] = _mm256_fmadd_ps(ga, sc, acc[s]);
  }
}

// One weight row o x activation rows [t0, t0 + S) of XP (permute_exact_rows' order).
//
// Two groups at a time, one per 128-bit lane, with no int -> float conversion: the doubled e2m1
// values are exact floats whose low 16 bits are zero, so two byte shuffles give each nibble's top
// two bytes and two rounds of unpacking (bytes into words, words under a zero word) build the
// floats. The nibbles are not interleaved back into column order: the activations were permuted
// to match once per call instead. That is 29 vector instructions per two groups where widening
// int8 (vpmovsxbd, a shuffle-port instruction, then vcvtdq2ps) took 39: one core on a matrix in
// the cache, 2-core Xeon, 0.47-0.49 -> 0.34 cycles/byte (docs/streaming.md §1.7).
template <int S>
void exact_tile(const uint8_t* packed, const uint8_t* scales, size_t cols, const float* XP,
                float* Y, size_t ldy, size_t o, size_t t0) {
  const size_t groups = cols / kMxfp4Group, row_bytes = cols / 2;
  const uint8_t* row = packed + o * row_bytes;
  const uint8_t* row_scales = scales + o * groups;
  // Top byte, then second byte, of the doubled e2m1 values as f32 (0, 1, 2, 3, 4, 6, 8, 12 =
  // 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40C0, 0x4100, 0x4140; sign in bit 7 of the top).
  const __m256i top = _mm256_setr_epi8(
      0, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, -128, -65, -64, -64, -64, -64, -63, -63,  //
      0, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, -128, -65, -64, -64, -64, -64, -63, -63);
  const __m256i second = _mm256_setr_epi8(
      0, -128, 0, 0x40, -128, -64, 0, 0x40, 0, -128, 0, 0x40, -128, -64, 0, 0x40,  //
      0, -128, 0, 0x40, -128, -64, 0, 0x40, 0, -128, 0, 0x40, -128, -64, 0, 0x40);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i zero = _mm256_setzero_si256();
  __m256 acc[S];
  for (int s = 0; s < S; ++s) acc[s] = _mm256_setzero_ps();
  size_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    const uint8_t* p = row + g * 16;
    // An address only (it may lie past the matrix; prefetches do not fault), kept as an integer.
    if ((g & 3) == 0)
      _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + kExactAhead),
                   _MM_HINT_T1);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    __m256 w[8];  // w[k]: exact_pair_column(k, 0..3) of group g, then of group g + 1
    for (int h = 0; h < 2; ++h) {  // h = 0: low nibbles (even columns), 1: high (odd)
      const __m256i n =
          _mm256_and_si256(h == 0 ? v : _mm256_srli_epi16(v, 4), low4);  // [32] nibbles
      const __m256i b1 = _mm256_shuffle_epi8(top, n), b2 = _mm256_shuffle_epi8(second, n);
      const __m256i lo16 = _mm256_unpacklo_epi8(b2, b1), hi16 = _mm256_unpackhi_epi8(b2, b1);
      w[4 * h + 0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, lo16));
      w[4 * h + 1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, lo16));
      w[4 * h + 2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, hi16));
      w[4 * h + 3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, hi16));
    }
    const __m256 sc = _mm256_blend_ps(_mm256_set1_ps(kHalfScale.v[row_scales[g]]),
                                      _mm256_set1_ps(kHalfScale.v[row_scales[g + 1]]), 0xF0);
    exact_accumulate(w, sc, XP + t0 * cols + g * kMxfp4Group, cols, acc);
  }
  if (g < groups) {  // an odd last group, in column order
    __m128i c[2];
    decode_exact_one(row + g * 16, c);
    __m256 w[4];
    widen16(c[0], w);
    widen16(c[1], w + 2);
    exact_accumulate(w, _mm256_set1_ps(kHalfScale.v[row_scales[g]]),
                     XP + t0 * cols + g * kMxfp4Group, cols, acc);
  }
  for (int s = 0; s < S; ++s) Y[(t0 + s) * ldy + o] = hsum(acc[s]);
}

using ExactTile = void (*)(const uint8_t*, const uint8_t*, size_t, const float*, float*, size_t,
                           size_t, size_t);
constexpr int kExactS = 8;
const ExactTile kExactTiles[kExactS] = {exact_tile<1>, exact_tile<2>, exact_tile<3>, exact_tile<4>,
                                        exact_tile<5>, exact_tile<6>, exact_tile<7>, exact_tile<8>};

// ---------------------------------------------------------------------------------------------
// Integer path

constexpr size_t kRows = 8;          // weight rows per block (one per 32-bit lane)
constexpr size_t kUnit = 8;          // groups decoded at a time
constexpr size_t kTileT = 64;        // activation rows per tile
constexpr int kSubT = 4;             // activation rows per register tile
constexpr size_t kPrepSlots = 1024;  // (activation row, group) pairs prepared at a time
constexpr size_t kMaxChunk = 256;    // groups per chunk

size_t chunk_groups(size_t tn) {
  return std::min(kMaxChunk, std::max<size_t>(16, (kPrepSlots / tn) / 16 * 16));
}

// 2^(s - 128) per lane, as mxfp4_half_scale (exact, subnormal for s <= 1; NaN for s = 255).
inline __m256 half_scale(__m256i s) {
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(s, _mm256_set1_epi32(1)), 23);
  const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), s);  // s = 0, 1
  __m256i v = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), s));
  const __m256i nan = _mm256_and_si256(_mm256_cmpeq_epi32(s, _mm256_set1_epi32(255)),
                                       _mm256_set1_epi32(0x7FC00000));
  return _mm256_castsi256_ps(_mm256_or_si256(v, nan));  // 254 << 23 | 0x7FC00000 = 0x7FC00000
}

// The hardware prefetchers do not follow 8 interleaved row streams well (see mxfp4_avx512.cpp):
// when the chunk is whole rows (the block is one contiguous run of 8 rows) the next block is
// prefetched in memory order, 8 * 64 bytes per 64 bytes of each row read, and its scales when
// the block starts; otherwise each row kAhead bytes ahead, wrapping into the next block of rows
// at the end of the chunk.
constexpr size_t kAhead = 1024;

struct Block {
  const uint8_t* p;    // packed bytes of (row o0, group c0)
  size_t row_bytes;    // packed row stride
  size_t chunk_bytes;  // packed bytes of the chunk in one row (gc * 16)
  const uint8_t* sp;   // scales of (row o0, group c0)
  size_t groups;       // scale row stride
  size_t nr;           // valid rows (<= 8)
  size_t gc;           // groups in the chunk
};

// Loads the packed bytes of groups [g0, g0 + gq) (gq <= 2) of the block's rows and transposes
// them: r[4 * gl + j] holds dword j (packed bytes 4j..4j+3, columns 8j..8j+7) of group g0 + gl,
// one row per lane.
inline void load_pair(const Block& b, size_t g0, size_t gq, __m256i r[8]) {
  const __m256i half_mask = _mm256_setr_epi32(-1, -1, -1, -1, 0, 0, 0, 0);
  const size_t off = g0 * (kMxfp4Group / 2);
  const size_t ahead = off + kAhead;
  // Addresses only (they may lie past the matrix; prefetches do not fault), kept as integers.
  const uintptr_t base = reinterpret_cast<uintptr_t>(b.p);
  const bool linear = b.chunk_bytes == b.row_bytes;
  const uintptr_t pf =
      linear
          ? base + kRows * b.row_bytes + kRows * off
          : base + (ahead < b.chunk_bytes ? ahead : kRows * b.row_bytes + (ahead - b.chunk_bytes));
  const size_t pf_stride = linear ? 64 : b.row_bytes;
  const bool prefetch = (g0 & 3) == 0;  // one prefetch per 64 bytes of a row
  for (size_t i = 0; i < kRows; ++i) {
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(pf + i * pf_stride), _MM_HINT_T0);
    const uint8_t* src = b.p + i * b.row_bytes + off;
    r[i] = i >= b.nr ? _mm256_setzero_si256()
           : gq == 2 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))
                     : _mm256_maskload_epi32(reinterpret_cast<const int*>(src), half_mask);
  }
  transpose8(r);
}

// Decodes group gl of a transposed pair into the u8 weights (doubled e2m1 + 12) matching the
// prepared activation dwords k = 0..7.
inline void decode_group(const __m256i r[8], size_t gl, __m256i w[8]) {
  const __m256i table =
      _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,  //
                       12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (size_t j = 0; j < 4; ++j) {
    const __m256i x = r[4 * gl + j];
    w[2 * j] = _mm256_shuffle_epi8(table, _mm256_and_si256(x, low4));  // 8j + 0,2,4,6
    w[2 * j + 1] = _mm256_shuffle_epi8(
        table, _mm256_and_si256(_mm256_srli_epi32(x, 4), low4));  // 8j + 1,3,5,7
  }
}

// hs[g] = 2^(s - 128) of groups [g0, g0 + ug) (ug <= 8), one row per lane.
inline void decode_scales(const Block& b, size_t g0, size_t ug, __m256* hs) {
  __m256i r[8];
  for (size_t i = 0; i < kRows; ++i) {
    int64_t v = 0;
    if (i < b.nr) {
      if (ug == 8) {
        std::memcpy(&v, b.sp + i * b.groups + g0, 8);
      } else {
        uint8_t t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        std::memcpy(t, b.sp + i * b.groups + g0, ug);
        std::memcpy(&v, t, 8);
      }
    }
    r[i] = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v));
  }
  transpose8(r);
  for (size_t g = 0; g < ug; ++g) hs[g] = half_scale(r[g]);
}

inline __m256i bcast32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
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
inline void idot_group(const __m256i w[8], __m256 h, const Acts& x, size_t g, __m256 a[S]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int s = 0; s < S; ++s) {
    const uint8_t* q = x.qp + s * x.qp_stride + g * kMxfp4Group;
    __m256i p0 = _mm256_maddubs_epi16(w[0], bcast32(q));
    __m256i p1 = _mm256_maddubs_epi16(w[4], bcast32(q + 16));
    for (int k = 1; k < 4; ++k) {
      p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(w[k], bcast32(q + 4 * k)));
      p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(w[4 + k], bcast32(q + 16 + 4 * k)));
    }
    __m256i i = _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones));
    i = _mm256_add_epi32(i,
                         _mm256_set1_epi32(x.qs[s * x.qs_stride + g]));  // -12 * sum(q): the offset
    // Exactly idot_reduce: acc + (float)isum * (d * 2^(s-128)), no FMA.
    const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(x.d[s * x.d_stride + g]), h);
    a[s] = _mm256_add_ps(a[s], _mm256_mul_ps(_mm256_cvtepi32_ps(i), scale));
  }
}

// Few activation rows (S <= kDirectMax): the whole chunk of a block with the accumulators in
// registers, each group decoded straight into registers.
template <int S>
void block_direct(const Block& b, const Acts& x, float* acc) {
  __m256 a[S];
  for (int s = 0; s < S; ++s) a[s] = _mm256_load_ps(acc + s * kRows);
  // The next block's scales (an address only: it may lie past the matrix).
  const uintptr_t next = reinterpret_cast<uintptr_t>(b.sp) + kRows * b.groups;
  for (size_t i = 0; i < kRows; ++i)
    for (size_t o = 0; o < b.gc; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(next + i * b.groups + o), _MM_HINT_T0);
  alignas(32) __m256 hs[kUnit];
  __m256i r[8], w[8];
  for (size_t u0 = 0; u0 < b.gc; u0 += kUnit) {
    const size_t ug = std::min(kUnit, b.gc - u0);
    decode_scales(b, u0, ug, hs);
    for (size_t q = 0; q * 2 < ug; ++q) {
      const size_t gq = std::min<size_t>(2, ug - q * 2);
      load_pair(b, u0 + q * 2, gq, r);
      for (size_t gl = 0; gl < gq; ++gl) {
        decode_group(r, gl, w);
        idot_group<S>(w, hs[q * 2 + gl], x, u0 + q * 2 + gl, a);
      }
    }
  }
  for (int s = 0; s < S; ++s) _mm256_store_ps(acc + s * kRows, a[s]);
}

// Many activation rows: a unit of up to 8 groups is decoded once into a buffer, then applied to
// every activation row of the tile, kSubT rows at a time.
template <int S>
void unit_buffered(const __m256i* wbuf, const __m256* hs, size_t u0, size_t ug, const Acts& x,
                   float* acc) {
  __m256 a[S];
  for (int s = 0; s < S; ++s) a[s] = _mm256_load_ps(acc + s * kRows);
  for (size_t g = 0; g < ug; ++g) idot_group<S>(wbuf + g * 8, hs[g], x, u0 + g, a);
  for (int s = 0; s < S; ++s) _mm256_store_ps(acc + s * kRows, a[s]);
}

void block_buffered(const Block& b, const Acts& x, size_t tn, float* acc) {
  using Fn = void (*)(const __m256i*, const __m256*, size_t, size_t, const Acts&, float*);
  static constexpr Fn kFns[kSubT] = {unit_buffered<1>, unit_buffered<2>, unit_buffered<3>,
                                     unit_buffered<4>};
  alignas(32) __m256i wbuf[kUnit * 8];
  alignas(32) __m256 hs[kUnit];
  __m256i r[8];
  for (size_t u0 = 0; u0 < b.gc; u0 += kUnit) {
    const size_t ug = std::min(kUnit, b.gc - u0);
    decode_scales(b, u0, ug, hs);
    for (size_t q = 0; q * 2 < ug; ++q) {
      const size_t gq = std::min<size_t>(2, ug - q * 2);
      load_pair(b, u0 + q * 2, gq, r);
      for (size_t gl = 0; gl < gq; ++gl) decode_group(r, gl, wbuf + (q * 2 + gl) * 8);
    }
    for (size_t ts = 0; ts < tn; ts += kSubT) {
      const size_t sn = std::min<size_t>(kSubT, tn - ts);
      const Acts xs{x.qp + ts * x.qp_stride, x.qp_stride, x.qs + ts * x.qs_stride, x.qs_stride,
                    x.d + ts * x.d_stride,   x.d_stride};
      kFns[sn - 1](wbuf, hs, u0, ug, xs, acc + ts * kRows);
    }
  }
}

// Up to kDirectMax activation rows the direct path is faster (measured on Zen 4: with 3 or 4
// rows it runs out of the 16 registers and the buffered path wins).
constexpr size_t kDirectMax = 2;
using BlockDirect = void (*)(const Block&, const Acts&, float*);
const BlockDirect kBlockDirect[kDirectMax] = {block_direct<1>, block_direct<2>};

inline __m256i row_mask(size_t nr) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(nr)), lane);
}

}  // namespace

void matmul_mxfp4_exact_avx2(const uint8_t* packed, const uint8_t* scales, size_t cols,
                             const float* X, size_t n, float* Y, size_t ldy, size_t row_begin,
                             size_t row_end) {
  if (row_begin >= row_end) return;
  // Activation rows permuted in blocks of about 1 MB (at least one tile), each block applied to
  // every weight row of the range while a weight row stays in L1 across the block's tiles.
  const size_t block = std::max<size_t>(
      kExactS, ((size_t{1} << 18) / std::max<size_t>(cols, 1)) / kExactS * kExactS);
  thread_local std::vector<float, AlignedAlloc<float, 32>> xp;
  for (size_t t0 = 0; t0 < n; t0 += block) {
    const size_t tn = std::min(block, n - t0);
    if (xp.size() < tn * cols) xp.resize(tn * cols);
    permute_exact_rows(X + t0 * cols, cols, tn, xp.data());
    for (size_t o = row_begin; o < row_end; ++o)
      for (size_t t = 0; t < tn; t += kExactS)
        kExactTiles[std::min<size_t>(kExactS, tn - t) - 1](packed, scales, cols, xp.data(),
                                                           Y + t0 * ldy, ldy, o, t);
  }
}

void quantize_q8_32_avx2(const float* x, size_t cols, int8_t* q, float* d) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (size_t g = 0; g < cols / kMxfp4Group; ++g) {
    const float* xg = x + g * kMxfp4Group;
    __m256 v[4];
    // maxps returns its second operand when either is NaN: NaN inputs are skipped, as fmax does.
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(xg + 8 * k);
      m = _mm256_max_ps(_mm256_and_ps(v[k], abs_mask), m);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float scale = q8_scale(_mm_cvtss_f32(m4));
    const float inv = 1.0f / scale;
    d[g] = scale;
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i iv[4];
    for (int k = 0; k < 4; ++k) {
      __m256 r =
          _mm256_round_ps(_mm256_mul_ps(v[k], vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);  // as q8_round: NaN -> -127
      iv[k] = _mm256_cvtps_epi32(r);
    }
    // packs interleave the 128-bit lanes: dwords 0,4,1,5,2,6,3,7 restore column order.
    const __m256i p16 =
        _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + g * kMxfp4Group),
                        _mm256_permutevar8x32_epi32(p16, order));
  }
}

void matmul_mxfp4_idot_avx2(const uint8_t* packed, const uint8_t* scales, size_t cols,
                            const int8_t* Q8, const float* D, size_t n, float* Y, size_t ldy,
                            size_t row_begin, size_t row_end) {
  if (row_begin >= row_end || n == 0) return;
  const size_t groups = cols / kMxfp4Group, row_bytes = cols / 2;
  if (groups == 0) {
    for (size_t t = 0; t < n; ++t)
      for (size_t o = row_begin; o < row_end; ++o) Y[t * ldy + o] = 0.0f;
    return;
  }
  alignas(32) uint8_t qp[kPrepSlots * kMxfp4Group];
  alignas(32) int32_t qs[kPrepSlots];
  alignas(32) float acc[kTileT * kRows];
  for (size_t t0 = 0; t0 < n; t0 += kTileT) {
    const size_t tn = std::min(kTileT, n - t0);
    const size_t chunk = chunk_groups(tn);
    for (size_t c0 = 0; c0 < groups; c0 += chunk) {
      const size_t gc = std::min(chunk, groups - c0);
      prepare(Q8 + t0 * cols, cols, tn, c0, gc, 12, qp, qs);
      const Acts x{qp, gc * kMxfp4Group, qs, gc, D + t0 * groups + c0, groups};
      for (size_t o0 = row_begin; o0 < row_end; o0 += kRows) {
        const size_t nr = std::min(kRows, row_end - o0);
        const __m256i rmask = row_mask(nr);
        for (size_t t = 0; t < tn; ++t)
          _mm256_store_ps(
              acc + t * kRows,
              c0 == 0 ? _mm256_setzero_ps() : _mm256_maskload_ps(Y + (t0 + t) * ldy + o0, rmask));
        const Block b{packed + o0 * row_bytes + c0 * (kMxfp4Group / 2),
                      row_bytes,
                      gc * (kMxfp4Group / 2),
                      scales + o0 * groups + c0,
                      groups,
                      nr,
                      gc};
        if (tn <= kDirectMax)
          kBlockDirect[tn - 1](b, x, acc);
        else
          block_buffered(b, x, tn, acc);
        for (size_t t = 0; t < tn; ++t)
          _mm256_maskstore_ps(Y + (t0 + t) * ldy + o0, rmask, _mm256_load_ps(acc + t * kRows));
      }
    }
  }
}

}  // namespace k3::impl

// kernels/impl/kernels_impl.h — the per-ISA kernel functions behind KernelTable (kernels/isa.h).
// Internal to kernels/: dense_<isa>.cpp, mxfp4_<isa>.cpp, attention_<isa>.cpp and situ_<isa>.cpp
// implement them; isa.cpp assembles the tables. The AVX2 and AVX-512 files are compiled with their
// own -m flags and are only called after a run-time CPU check.
#pragma once

#include <cstddef>
#include <cstdint>

namespace k3::impl {

#define K3_DECLARE_KERNELS(suffix)                                                                 \
  void matmul_f32_##suffix(const float* W, size_t cols, const float* X, size_t n, float* Y,        \
                           size_t ldy, size_t row_begin, size_t row_end);                          \
  void matmul_int8_##suffix(const int8_t* Q, const float* scales, size_t cols, const float* X,     \
                            size_t n, float* Y, size_t ldy, size_t row_begin, size_t row_end);     \
  void matmul_int4_##suffix(const uint8_t* packed, const float* scales, size_t cols,               \
                            const float* X, size_t n, float* Y, size_t ldy, size_t row_begin,      \
                            size_t row_end);                                                       \
  void matmul_int4_idot_##suffix(const uint8_t* packed, const float* scales, size_t cols,          \
                                 const int8_t* Q8, const float* D, size_t n, float* Y, size_t ldy, \
                                 size_t row_begin, size_t row_end);                                \
  void matmul_int8_idot_##suffix(const int8_t* Q, const float* scales, size_t cols,                \
                                 const int8_t* Q8, const float* D, size_t n, float* Y, size_t ldy, \
                                 size_t row_begin, size_t row_end);                                \
  void matmul_mxfp4_exact_##suffix(const uint8_t* packed, const uint8_t* scales, size_t cols,      \
                                   const float* X, size_t n, float* Y, size_t ldy,                 \
                                   size_t row_begin, size_t row_end);                              \
  void quantize_q8_32_##suffix(const float* x, size_t cols, int8_t* q, float* d);                  \
  void matmul_mxfp4_idot_##suffix(const uint8_t* packed, const uint8_t* scales, size_t cols,       \
                                  const int8_t* Q8, const float* D, size_t n, float* Y,            \
                                  size_t ldy, size_t row_begin, size_t row_end);                   \
  void kda_head_step_##suffix(float* S, const float* q, const float* k, const float* v,            \
                              const float* a, float beta, size_t dk, float* u, float* o);          \
  void mla_head_attend_##suffix(const float* qabs, const float* q_pe, const float* latent,         \
                                const float* rope, size_t T, size_t kv_lora, size_t rope_dim,      \
                                float scale, float* scores, float* lat);                           \
  void kda_head_chunk_##suffix(float* S, const float* q, const float* k, const float* v,           \
                               const float* a, size_t ld, const float* beta, size_t ldb, size_t n, \
                               size_t dk, size_t bt, float* scratch, float* o);                    \
  void situ_glu_##suffix(float* gate, const float* up, size_t n, float beta, float beta_linear);

K3_DECLARE_KERNELS(scalar)
K3_DECLARE_KERNELS(avx2)
K3_DECLARE_KERNELS(avx512)
// The AVX-512 MXFP4 integer path with the one-row prefetch that Zen wants (kernels/isa.h,
// RowPrefetch::kL1Whole); matmul_mxfp4_idot_avx512 has the one Intel wants.
void matmul_mxfp4_idot_avx512_l1(const uint8_t* packed, const uint8_t* scales, size_t cols,
                                 const int8_t* Q8, const float* D, size_t n, float* Y, size_t ldy,
                                 size_t row_begin, size_t row_end);

#undef K3_DECLARE_KERNELS

// The row quantisers (kernels/quant.h): scalar and AVX2 (the AVX-512 table uses AVX2's).
void quantize_int8_row_scalar(const float* w, size_t cols, int8_t* q, float* scale);
void quantize_int4_g64_row_scalar(const float* w, size_t cols, uint8_t* packed, float* scales);
void quantize_int8_row_avx2(const float* w, size_t cols, int8_t* q, float* scale);
void quantize_int4_g64_row_avx2(const float* w, size_t cols, uint8_t* packed, float* scales);

// The chunk form of KDA (kda_head_chunk, kernels/isa.h) forms its decay factors per block of
// this many rows: a cumulative decay inside a block is at least e^(-5 * 16) = e^-80, a normal
// float (its reciprocal e^80 too), when every per-step decay is at least e^-5.
inline constexpr size_t kKdaBlockRows = 16;

// Floats of kda_head_chunk's scratch for sub-chunks of `bt` rows of a head of `dk` channels.
inline size_t kda_chunk_scratch(size_t bt, size_t dk) {
  const size_t blocks = (bt + kKdaBlockRows - 1) / kKdaBlockRows;
  // Kr, Qr, Ki, Ke, U, Kn: [bt][dk]; WQ and C: [2 bt][dk]; X: [block][dk]; Xt: [dk][block];
  // TA, TM: [block][block]; A, M: [bt][bt]; E, eG, P and the per-block decays before and in each
  // block: [dk] each.
  return 10 * bt * dk + 2 * kKdaBlockRows * dk + 2 * kKdaBlockRows * kKdaBlockRows + 2 * bt * bt +
         (3 + 2 * blocks) * dk;
}

namespace {

// The one float step of the int4 integer path (kernels/isa.h), shared so that every ISA rounds
// identically: per 32-column half-group h of output row o, in ascending h from acc = 0.0f,
//   acc = acc + (float)isum(t, o, h) * (d[t][h] * s[o][h / 2])
// (no FMA: the build has -ffp-contract=off). The scalar twin calls it; the SIMD variants do the
// same three operations lane-wise, one weight row per lane. Internal linkage: each ISA
// translation unit keeps its own copy.
inline float int4_idot_step(float acc, int32_t isum, float d, float s) {
  return acc + static_cast<float>(isum) * (d * s);
}

// The one float step of the int8 integer path (kernels/isa.h): per 32-column group h, ascending
// from acc = 0.0f, acc = acc + (float)isum(t, o, h) * d[t][h]; then Y = s[o] * acc.
inline float int8_idot_step(float acc, int32_t isum, float d) {
  return acc + static_cast<float>(isum) * d;
}

}  // namespace

}  // namespace k3::impl

// kernels/isa.h — instruction-set variants of the kernels and run-time dispatch.
// Every kernel exists as a scalar twin (always built) and, where the CPU has them, AVX2+FMA and
// AVX-512 (F, BW, VL, VNNI) variants compiled in their own translation units. The choice is a
// value (no global state): callers hold a `const KernelTable&` obtained once at start-up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace k3 {

enum class Isa { kScalar, kAvx2, kAvx512 };

const char* isa_name(Isa isa);
// Parses "scalar", "avx2", "avx512"; false for anything else.
bool parse_isa(const std::string& name, Isa* out);
// True when this CPU (and OS) can run `isa`.
bool isa_supported(Isa isa);
// The best variant this CPU runs.
Isa best_isa();
// Every variant this CPU runs, scalar first.
std::vector<Isa> supported_isas();

// Single-threaded kernels over a range of output rows [row_begin, row_end). Threading is done
// once, by the callers in kernels/matmul.h, by splitting rows. Matrices are W[rows][cols]
// (nn.Linear); activations X[n][cols] row-major; outputs Y[n][ldy] with Y[t][o] for o in the
// range. Each weight row is read once for all n activation rows.
//
// Numerics (identical contract on every ISA unless stated):
//   f32:   Y[t][o] = sum_i W[o][i] X[t][i]            (f32 accumulation; order is per-ISA)
//   int8:  Y[t][o] = s[o] * sum_i q[o][i] X[t][i]     (docs/quant_formats.md §3)
//   int4:  Y[t][o] = sum_g s[o][g] * sum_{i in g} (nib[o][i] - 8) X[t][i]   (groups of 64,
//   docs/quant_formats.md §4) mxfp4 exact: per 32-group g: ga = sum_i E2M1[nib] X[t][i] (f32), acc
//   += ga * 2^(s-127) mxfp4 idot: integer group sums of q8(X) against doubled e2m1 values, produced
//   exactly (so
//     bit-identical on every ISA); the float reduction over groups is done by one shared scalar
//     routine: acc += (float)isum_g * (d[t][g] * 2^(s[o][g]-128)), g ascending.
//   int4 idot: activations pre-quantised by quantize_q8_32 (q [n][cols] int8, d [n][cols/32]);
//     per 32-column half-group h of output row o the exact int32
//       isum(t, o, h) = sum_{i in h} (nib[o][i] - 8) q[t][i],
//     then one shared scalar step (impl::int4_idot_step), h ascending from acc = 0.0f, no FMA:
//       acc += (float)isum(t, o, h) * (d[t][h] * s[o][h / 2]);   Y[t][o] = acc.
//     Bit-identical on every ISA (and for any row range or thread split). The scaling costs
//     ~20% at 64 rows on Zen 4 AVX-512 (dropping it entirely: 2.4 -> 2.9 GB/s), but the
//     reordering that saves work and is just as reproducible, ((float)isum_0 * d_0 +
//     (float)isum_1 * d_1) * s per 64-group (one multiply fewer per half-group), measured no
//     faster, so the plain per-half step was kept (an FMA step would be reproducible too, but
//     the scalar twin would need a software fma on CPUs without FMA).
//   int8 idot: int8-per-row weights (as matmul_int8) on activations pre-quantised by
//     quantize_q8_32 (q [n][cols] int8, d [n][cols/32]); per 32-column group h the exact int32
//       isum(t, o, h) = sum_{i in h} q[o][i] q8[t][i],
//     then one shared scalar step (impl::int8_idot_step), h ascending from acc = 0.0f, no FMA:
//       acc += (float)isum(t, o, h) * d[t][h];   Y[t][o] = s[o] * acc.
//     Bit-identical on every ISA (and for any row range or thread split). REQUIRES
//     cols % 32 == 0 (quantize_q8_32 has no tail; the wrapper matmul_int8_idot throws
//     otherwise) and weights and activations in [-127, 127] (what quantize_int8_row and
//     quantize_q8_32 produce; the AVX2 pair sums |w| * |q| rely on it).
struct KernelTable {
  Isa isa;
  void (*matmul_f32)(const float* W, size_t cols, const float* X, size_t n, float* Y, size_t ldy,
                     size_t row_begin, size_t row_end);
  void (*matmul_int8)(const int8_t* Q, const float* scales, size_t cols, const float* X, size_t n,
                      float* Y, size_t ldy, size_t row_begin, size_t row_end);
  void (*matmul_int4)(const uint8_t* packed, const float* scales, size_t cols, const float* X,
                      size_t n, float* Y, size_t ldy, size_t row_begin, size_t row_end);
  void (*matmul_mxfp4_exact)(const uint8_t* packed, const uint8_t* scales, size_t cols,
                             const float* X, size_t n, float* Y, size_t ldy, size_t row_begin,
                             size_t row_end);
  // Activations for the integer path: per 32-group d = max(max|x| / 127, 1e-20),
  // q = clamp(round_half_even(x * (1 / d)), -127, 127). q: [cols], d: [cols / 32].
  void (*quantize_q8_32)(const float* x, size_t cols, int8_t* q, float* d);
  // Y[t][o] = sum_g isum(t, o, g) * (d[t][g] * 2^(s[o][g] - 128)).  Q8: [n][cols], D: [n][cols/32].
  void (*matmul_mxfp4_idot)(const uint8_t* packed, const uint8_t* scales, size_t cols,
                            const int8_t* Q8, const float* D, size_t n, float* Y, size_t ldy,
                            size_t row_begin, size_t row_end);
  // int4 g64 weights (as matmul_int4) on pre-quantised activations: the int4 idot contract above.
  // Q8: [n][cols], D: [n][cols/32]. REQUIRES cols % 64 == 0 (the int4-g64 format guarantees it).
  void (*matmul_int4_idot)(const uint8_t* packed, const float* scales, size_t cols,
                           const int8_t* Q8, const float* D, size_t n, float* Y, size_t ldy,
                           size_t row_begin, size_t row_end);
  // int8-per-row weights (as matmul_int8) on pre-quantised activations: the int8 idot contract
  // above. Q8: [n][cols], D: [n][cols/32]. REQUIRES cols % 32 == 0.
  void (*matmul_int8_idot)(const int8_t* Q, const float* scales, size_t cols, const int8_t* Q8,
                           const float* D, size_t n, float* Y, size_t ldy, size_t row_begin,
                           size_t row_end);

  // One KDA head, one token (docs/architecture.md §3.4): S [dk key][dk value] is decayed by a[i]
  // per key row, read with k, written with the delta beta * (v - k^T S), then read with q:
  //   S = Diag(a) S;  u = beta (v - k^T S);  S += k u^T;  o = S^T q.
  // q, k: [dk] (normalised and scaled by the caller), v, a: [dk], o: [dk], u: [dk] scratch.
  void (*kda_head_step)(float* S, const float* q, const float* k, const float* v, const float* a,
                        float beta, size_t dk, float* u, float* o);
  // The same recurrence over n consecutive tokens of one sequence in the chunk (WY / UT) form
  // (docs/streaming.md §1.9): sub-chunks of `bt` rows, each a few [bt][dk] x [dk][dk] products
  // with S and a triangular solve instead of bt rank-1 sweeps. Not bit-identical to n calls of
  // kda_head_step (the sums are re-associated); S and o agree to a relative 1e-5 or so
  // (tests/kda_chunk_test.cpp). Row t of q, k, v, a, o at t * ld (each [dk]); beta[t * ldb] (the
  // sigmoid, not the logit). REQUIRES every a in [e^-5, 1] (K3's gate_lower_bound: the decay
  // factors are formed in blocks of 16 rows whose products stay normal floats), q and k
  // normalised as the model does, and scratch of kda_chunk_scratch_floats(bt, dk) floats.
  void (*kda_head_chunk)(float* S, const float* q, const float* k, const float* v, const float* a,
                         size_t ld, const float* beta, size_t ldb, size_t n, size_t dk, size_t bt,
                         float* scratch, float* o);
  // One MLA head over the latent cache, absorbed form: for j < T,
  //   s_j = (qabs . latent[j] + q_pe . rope[j]) * scale;  p = softmax(s);  lat = sum_j p_j
  //   latent[j]
  // qabs, lat: [kv_lora]; q_pe: [rope_dim]; latent: [T][kv_lora]; rope: [T][rope_dim];
  // scores: [T] scratch.
  void (*mla_head_attend)(const float* qabs, const float* q_pe, const float* latent,
                          const float* rope, size_t T, size_t kv_lora, size_t rope_dim, float scale,
                          float* scores, float* lat);

  // The row quantisers of kernels/quant.h (int8 per row; int4 g64 over cols / 64 whole groups),
  // byte for byte equal on every ISA: the formula's f32 operations in the same order, rounding
  // half to even, NaN levels 0.
  void (*quantize_int8_row)(const float* w, size_t cols, int8_t* q, float* scale);
  void (*quantize_int4_g64_row)(const float* w, size_t cols, uint8_t* packed, float* scales);

  // SiTU-GLU in place over n elements: gate[i] = situ(gate[i], up[i], beta, beta_linear), the
  // scalar definition of kernels/vec.h bit for bit on every ISA.
  void (*situ_glu)(float* gate, const float* up, size_t n, float beta, float beta_linear);
};

// Floats of kda_head_chunk's scratch for sub-chunks of `bt` rows and heads of `dk` channels.
size_t kda_chunk_scratch_floats(size_t bt, size_t dk);

// How the AVX-512 MXFP4 integer kernel prefetches the next block of weight rows with one
// activation row (decode): Intel's cores stream fastest when it asks for one line per row into L2
// and lets the L2 streamer fetch the rest, Zen's when it asks for every line into L1; each is
// 1.2-1.5x slower with the other's (docs/streaming.md §1.7). The results are the same bytes.
enum class RowPrefetch { kL2Half, kL1Whole };
// kL2Half on Intel CPUs, kL1Whole on every other (AMD's Zen).
RowPrefetch row_prefetch_for_this_cpu();
const char* row_prefetch_name(RowPrefetch prefetch);

// The table of `isa`, with this CPU's row prefetch. REQUIRES isa_supported(isa) (throws k3::Error
// otherwise).
const KernelTable& kernel_table(Isa isa);
// The same with a chosen row prefetch (tests run both; k3_bench compares them).
const KernelTable& kernel_table(Isa isa, RowPrefetch prefetch);

}  // namespace k3

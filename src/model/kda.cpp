#include "model/kda.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/vec.h"

namespace k3 {
namespace {

// Channel c of one row: y = SiLU(sum_j taps[c][j] * s_{t-K+1+j}[c]); shifts channel c of
// `window` ([K - 1][channels], oldest first) by one token.
inline void conv_silu_channel(const float* taps, float* window, float* stream, size_t c,
                              size_t channels, size_t width) {
  const size_t history = width - 1;
  const float* tap = taps + c * width;
  float y = 0.0f;
  for (size_t j = 0; j < history; ++j) y += tap[j] * window[j * channels + c];
  y += tap[history] * stream[c];
  if (history > 0) {
    for (size_t j = 0; j + 1 < history; ++j)
      window[j * channels + c] = window[(j + 1) * channels + c];
    window[(history - 1) * channels + c] = stream[c];
  }
  stream[c] = silu(y);
}

// Below this many channel steps (rows x 3 x channels) the short convolutions run on one thread.
constexpr size_t kConvParallelSteps = 4096;

// The q, k and v short convolutions of m consecutive rows of one sequence (row t's projections
// at t * P, overwritten): each channel's window advances row by row, so every value is the one
// the token-by-token order gives; the channels (independent) are split across the threads (on
// one thread they and their expf were 2.6-6.4 % of a chunk-32 prefill's samples on the 2-core
// EPYC while the other thread waited).
void conv_silu_rows(const KdaWeights& w, KdaState& state, size_t m, float* q, float* k, float* v,
                    size_t P, size_t K) {
  const int64_t channels = static_cast<int64_t>(P);
#pragma omp parallel for schedule(static) if (3 * m * P >= kConvParallelSteps)
  for (int64_t cc = 0; cc < channels; ++cc) {
    const size_t c = static_cast<size_t>(cc);
    for (size_t t = 0; t < m; ++t) {
      conv_silu_channel(w.q_conv.data(), state.q_window.data(), q + t * P, c, P, K);
      conv_silu_channel(w.k_conv.data(), state.k_window.data(), k + t * P, c, P, K);
      conv_silu_channel(w.v_conv.data(), state.v_window.data(), v + t * P, c, P, K);
    }
  }
}

// Rows of one sub-chunk of the chunk form (K3_KDA_CHUNKED): 16 measured fastest of 16, 32 and 64
// at every chunk size (`k3_bench kda`, docs/streaming.md §1.9).
constexpr size_t kKdaSubChunk = 16;

// One head of one token before the recurrence: q and k L2-normalised (q scaled by dk^-1/2), the
// per-key-channel decay a_i = exp(lower_bound * sigmoid(exp(A_log[h]) * (f_b f_a x + dt_bias)_i))
// in place of its logit.
inline void prepare_head(const KdaWeights& w, size_t h, size_t dk, float q_scale, float lower_bound,
                         float* qh, float* kh, float* a) {
  l2_normalize(qh, dk, K3Config::kKdaL2NormEps);
  for (size_t i = 0; i < dk; ++i) qh[i] *= q_scale;
  l2_normalize(kh, dk, K3Config::kKdaL2NormEps);
  for (size_t i = 0; i < dk; ++i)
    a[i] = std::exp(lower_bound * sigmoid(w.a_exp[h] * (a[i] + w.dt_bias[h * dk + i])));
}

// One head of one token after the recurrence: RMSNorm, then the output gate.
inline void finish_head(const K3Config& config, const KdaWeights& w, size_t h, size_t dk,
                        const float* gate_out, float* oh) {
  rmsnorm(oh, w.o_norm.data(), dk, config.rms_norm_eps, oh);
  for (size_t j = 0; j < dk; ++j) oh[j] *= sigmoid(gate_out[h * dk + j]);
}

// The sequential part of one token after its short convolutions (conv_silu_rows): the recurrence
// advances by one token. q, k, v (convolved), gate_out, decay: [P] (projections of this token; q,
// k, decay overwritten), beta: [H] logits; o: [P] gated, normed head outputs.
void kda_token(const K3Config& config, const KernelTable& kt, const KdaWeights& w, KdaState& state,
               Workspace& ws, float* q, float* k, float* v, const float* gate_out, float* decay,
               const float* beta, float* o) {
  const size_t H = static_cast<size_t>(config.kda_num_heads);
  const size_t dk = static_cast<size_t>(config.kda_head_dim);

  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const float lower_bound = static_cast<float>(config.gate_lower_bound);
  const int64_t heads = static_cast<int64_t>(H);
#pragma omp parallel for schedule(static) if (H * dk * dk > 4096)
  for (int64_t hh = 0; hh < heads; ++hh) {
    const size_t h = static_cast<size_t>(hh);
    float* qh = q + h * dk;
    float* kh = k + h * dk;
    const float* vh = v + h * dk;
    float* u = ws.kda_u.data() + h * dk;  // [dk value]
    float* a = decay + h * dk;            // [dk], in place
    prepare_head(w, h, dk, q_scale, lower_bound, qh, kh, a);
    float* oh = o + h * dk;
    kt.kda_head_step(state.recurrent.data() + h * dk * dk, qh, kh, vh, a, sigmoid(beta[h]), dk, u,
                     oh);
    finish_head(config, w, h, dk, gate_out, oh);
  }
}

// kda_token over m consecutive rows of one sequence with the recurrence in the chunk form
// (KernelTable::kda_head_chunk, sub-chunks of kKdaSubChunk rows), after their short convolutions
// (conv_silu_rows): the same normalisation and decay of every row and head, one chunk call per
// head over all m rows, and the same output norm and gate of every row and head. Row t's buffers
// at t * P (beta: t * H, overwritten with its sigmoid).
void kda_rows_chunked(const K3Config& config, const KernelTable& kt, const KdaWeights& w,
                      KdaState& state, Workspace& ws, size_t m, float* q, float* k, float* v,
                      const float* gate_out, float* decay, float* beta, float* o) {
  const size_t P = static_cast<size_t>(config.kda_projection_size());
  const size_t H = static_cast<size_t>(config.kda_num_heads);
  const size_t dk = static_cast<size_t>(config.kda_head_dim);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const float lower_bound = static_cast<float>(config.gate_lower_bound);
  const size_t scratch = kda_chunk_scratch_floats(kKdaSubChunk, dk);
  const size_t threads = static_cast<size_t>(std::max(1, omp_get_max_threads()));
  if (ws.kda_chunk.size() < threads * scratch) ws.kda_chunk.resize(threads * scratch);
  // Row by row (contiguous heads) before and after; head by head through the chunk form, whose
  // kernel prefetches a head's strided rows itself.
  const int64_t rows = static_cast<int64_t>(m);
#pragma omp parallel for schedule(static)
  for (int64_t tt = 0; tt < rows; ++tt) {
    const size_t t = static_cast<size_t>(tt);
    for (size_t h = 0; h < H; ++h) {
      prepare_head(w, h, dk, q_scale, lower_bound, q + t * P + h * dk, k + t * P + h * dk,
                   decay + t * P + h * dk);
      beta[t * H + h] = sigmoid(beta[t * H + h]);
    }
  }
  const int64_t heads = static_cast<int64_t>(H);
#pragma omp parallel for schedule(static)
  for (int64_t hh = 0; hh < heads; ++hh) {
    const size_t h = static_cast<size_t>(hh);
    float* scr = ws.kda_chunk.data() + static_cast<size_t>(omp_get_thread_num()) * scratch;
    kt.kda_head_chunk(state.recurrent.data() + h * dk * dk, q + h * dk, k + h * dk, v + h * dk,
                      decay + h * dk, P, beta + h, H, m, dk, kKdaSubChunk, scr, o + h * dk);
  }
#pragma omp parallel for schedule(static)
  for (int64_t tt = 0; tt < rows; ++tt) {
    const size_t t = static_cast<size_t>(tt);
    for (size_t h = 0; h < H; ++h)
      finish_head(config, w, h, dk, gate_out + t * P, o + t * P + h * dk);
  }
}

}  // namespace

void kda_forward(const K3Config& config, const Compute& compute, const KdaWeights& w, size_t layer,
                 const SequenceRow* rows, Workspace& ws, const float* X, size_t n, float* out) {
  const size_t P = static_cast<size_t>(config.kda_projection_size());
  const size_t H = static_cast<size_t>(config.kda_num_heads);
  const KernelTable& kt = *compute.kernels;
  // Projections of every row, batched (each weight streams once per pass).
  const MatmulJob jobs[] = {
      {&w.q_proj, ws.kda_q.data()},           {&w.k_proj, ws.kda_k.data()},
      {&w.v_proj, ws.kda_v.data()},           {&w.g_proj, ws.kda_gate.data()},
      {&w.f_a_proj, ws.kda_decay_low.data()}, {&w.b_proj, ws.kda_beta.data()}};
  matmul_jobs(compute, jobs, std::size(jobs), X, n);
  matmul_chunk(compute, w.f_b_proj, ws.kda_decay_low.data(), n, ws.kda_decay.data());
  // Each run of one sequence's consecutive rows: their short convolutions together, then the
  // recurrence one row at a time in order (on the sequence's state). K3_KDA_CHUNKED: a run of two
  // or more rows (a prompt chunk) goes through the chunk form instead; single rows (decode, a
  // batched decode step's rows) keep the token recurrence. Its decay factors need every step's
  // decay >= e^-5 (kernels/isa.h).
  const bool chunked = compute.kda_chunked && config.gate_lower_bound >= -5.0;
  const size_t K = static_cast<size_t>(config.short_conv_kernel_size);
  for (size_t t = 0; t < n;) {
    size_t end = t + 1;
    while (end < n && rows[end].state == rows[t].state) ++end;
    KdaState& state = rows[t].state->kda[layer];
    conv_silu_rows(w, state, end - t, ws.kda_q.data() + t * P, ws.kda_k.data() + t * P,
                   ws.kda_v.data() + t * P, P, K);
    if (chunked && end - t >= 2) {
      kda_rows_chunked(config, kt, w, state, ws, end - t, ws.kda_q.data() + t * P,
                       ws.kda_k.data() + t * P, ws.kda_v.data() + t * P, ws.kda_gate.data() + t * P,
                       ws.kda_decay.data() + t * P, ws.kda_beta.data() + t * H,
                       ws.kda_out.data() + t * P);
    } else {
      for (size_t r = t; r < end; ++r)
        kda_token(config, kt, w, state, ws, ws.kda_q.data() + r * P, ws.kda_k.data() + r * P,
                  ws.kda_v.data() + r * P, ws.kda_gate.data() + r * P, ws.kda_decay.data() + r * P,
                  ws.kda_beta.data() + r * H, ws.kda_out.data() + r * P);
    }
    t = end;
  }
  matmul_chunk(compute, w.o_proj, ws.kda_out.data(), n, out);
}

}  // namespace k3

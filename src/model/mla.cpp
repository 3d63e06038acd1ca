#include "model/mla.h"

#include <algorithm>
#include <cmath>

#include "kernels/vec.h"

namespace k3 {

namespace {

// The attention of one token over cache rows [0, T) (its own latent already appended). Q: [H][qk]
// its query, G: [H][v] its gate logits; ctx: [H][v] the gated per-head context.
void mla_attend(const K3Config& c, const KernelTable& kt, const MlaWeights& w,
                const MlaCache& cache, Workspace& ws, size_t T, const float* Q, const float* G,
                float* ctx) {
  const size_t H = static_cast<size_t>(c.num_attention_heads);
  const size_t kvr = static_cast<size_t>(c.kv_lora_rank);
  const size_t nope = static_cast<size_t>(c.qk_nope_head_dim);
  const size_t rope = static_cast<size_t>(c.qk_rope_head_dim);
  const size_t vdim = static_cast<size_t>(c.v_head_dim);
  const size_t qk = nope + rope;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(qk)));
  const int64_t heads = static_cast<int64_t>(H);
#pragma omp parallel for schedule(static) if (H * T * kvr > 16384)
  for (int64_t hh = 0; hh < heads; ++hh) {
    const size_t h = static_cast<size_t>(hh);
    const float* q_nope = Q + h * qk;
    const float* q_pe = q_nope + nope;
    const size_t wuk_row = h * (nope + vdim);    // rows [wuk_row, +nope) = W_UK_h, then W_UV_h
    float* qabs = ws.mla_qabs.data() + h * kvr;  // [kvr]
    float* lat = ws.mla_lat.data() + h * kvr;    // [kvr]
    // [T]: the heads' scores packed at stride T (not the capacity), so a pass touches the first
    // H * T floats of the buffer only (state.h: UninitVector).
    float* scores = ws.mla_scores.data() + h * T;
    std::fill(qabs, qabs + kvr, 0.0f);
    accumulate_rows_transposed(w.kv_b_proj, wuk_row, nope, q_nope, qabs);  // W_UK_h^T q_nope
    kt.mla_head_attend(qabs, q_pe, cache.latent.data(), cache.rope.data(), T, kvr, rope, scale,
                       scores, lat);
    float* ctx_h = ctx + h * vdim;
    matmul_rows(kt, w.kv_b_proj, wuk_row + nope, wuk_row + nope + vdim, lat, ctx_h);  // W_UV_h lat
    for (size_t d = 0; d < vdim; ++d) ctx_h[d] *= sigmoid(G[h * vdim + d]);
  }
}

// Appends (normalised c_t, k_pe_t) of ckv [kv_lora + rope] to the cache at `position`.
void mla_append(const K3Config& c, const MlaWeights& w, MlaCache& cache, int64_t position,
                const float* ckv) {
  const size_t kvr = static_cast<size_t>(c.kv_lora_rank);
  const size_t rope = static_cast<size_t>(c.qk_rope_head_dim);
  float* c_t = cache.latent.data() + static_cast<size_t>(position) * kvr;
  rmsnorm(ckv, w.kv_a_norm.data(), kvr, K3Config::kMlaLowRankNormEps, c_t);
  std::copy(ckv + kvr, ckv + kvr + rope, cache.rope.data() + static_cast<size_t>(position) * rope);
}

}  // namespace

void mla_forward(const K3Config& c, const Compute& compute, const MlaWeights& w, size_t layer,
                 const SequenceRow* rows, Workspace& ws, const float* X, size_t n, float* out) {
  const size_t H = static_cast<size_t>(c.num_attention_heads);
  const size_t qlr = static_cast<size_t>(c.q_lora_rank);
  const size_t qk = static_cast<size_t>(c.qk_head_dim());
  const size_t vdim = static_cast<size_t>(c.v_head_dim);
  const size_t ckv_dim = static_cast<size_t>(c.kv_lora_rank + c.qk_rope_head_dim);
  const KernelTable& kt = *compute.kernels;
  float* cq = ws.mla_cq.data();    // [n][q_lora]
  float* Q = ws.mla_q.data();      // [n][H][qk]
  float* ckv = ws.mla_ckv.data();  // [n][kv_lora + rope]
  float* G = ws.mla_gate.data();   // [n][H][v]
  float* ctx = ws.mla_ctx.data();  // [n][H][v]
  const MatmulJob jobs[] = {{&w.q_a_proj, cq}, {&w.kv_a_proj, ckv}, {&w.g_proj, G}};
  matmul_jobs(compute, jobs, std::size(jobs), X, n);
  for (size_t t = 0; t < n; ++t)
    rmsnorm(cq + t * qlr, w.q_a_norm.data(), qlr, K3Config::kMlaLowRankNormEps, cq + t * qlr);
  matmul_chunk(compute, w.q_b_proj, cq, n, Q);
  // The whole pass's latent rows first; row t then reads its own sequence's positions <= its
  // position only.
  for (size_t t = 0; t < n; ++t)
    mla_append(c, w, rows[t].state->mla[layer], rows[t].position, ckv + t * ckv_dim);
  for (size_t t = 0; t < n; ++t)
    mla_attend(c, kt, w, rows[t].state->mla[layer], ws, static_cast<size_t>(rows[t].position) + 1,
               Q + t * H * qk, G + t * H * vdim, ctx + t * H * vdim);
  matmul_chunk(compute, w.o_proj, ctx, n, out);
}

}  // namespace k3

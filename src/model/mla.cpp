#include "model/mla.h"

#include <cmath>
#include <vector>

#include "kernels/vec.h"

namespace k3 {

void mla_forward(const K3Config& c, const MlaWeights& w, MlaCache& cache, int64_t position,
                 const float* x, float* out) {
  const size_t H = static_cast<size_t>(c.num_attention_heads);
  const size_t qlr = static_cast<size_t>(c.q_lora_rank);
  const size_t kvr = static_cast<size_t>(c.kv_lora_rank);
  const size_t nope = static_cast<size_t>(c.qk_nope_head_dim);
  const size_t rope = static_cast<size_t>(c.qk_rope_head_dim);
  const size_t vdim = static_cast<size_t>(c.v_head_dim);
  const size_t qk = nope + rope;
  const size_t T = static_cast<size_t>(position) + 1;  // positions attended, current included

  std::vector<float> cq(qlr), Q(H * qk), ckv(kvr + rope), G(H * vdim), ctx(H * vdim);
  w.q_a_proj.apply(x, cq.data());                       // [q_lora]
  rmsnorm(cq.data(), w.q_a_norm.data(), qlr, K3Config::kMlaLowRankNormEps, cq.data());
  w.q_b_proj.apply(cq.data(), Q.data());                // [H][qk]
  w.kv_a_proj.apply(x, ckv.data());                     // [kv_lora + rope]
  float* c_t = cache.latent.data() + static_cast<size_t>(position) * kvr;
  rmsnorm(ckv.data(), w.kv_a_norm.data(), kvr, K3Config::kMlaLowRankNormEps, c_t);
  for (size_t i = 0; i < rope; ++i) cache.rope[static_cast<size_t>(position) * rope + i] = ckv[kvr + i];
  w.g_proj.apply(x, G.data());                          // [H][v]

  const double scale = 1.0 / std::sqrt(static_cast<double>(qk));
  const int64_t heads = static_cast<int64_t>(H);
#pragma omp parallel for schedule(static) if (H * T * kvr > 16384)
  for (int64_t hh = 0; hh < heads; ++hh) {
    const size_t h = static_cast<size_t>(hh);
    const float* q_nope = Q.data() + h * qk;
    const float* q_pe = q_nope + nope;
    const float* wuk = w.kv_b_proj.row(static_cast<int64_t>(h * (nope + vdim)));  // [nope][kvr]
    const float* wuv = wuk + nope * kvr;                                        // [v][kvr]
    std::vector<float> qabs(kvr, 0.0f), scores(T), lat(kvr, 0.0f);
    for (size_t d = 0; d < nope; ++d)
      for (size_t r = 0; r < kvr; ++r) qabs[r] += wuk[d * kvr + r] * q_nope[d];
    for (size_t j = 0; j < T; ++j) {
      const double s = dot_f64(qabs.data(), cache.latent.data() + j * kvr, kvr) +
                       dot_f64(q_pe, cache.rope.data() + j * rope, rope);
      scores[j] = static_cast<float>(s * scale);
    }
    softmax(scores.data(), T);
    for (size_t j = 0; j < T; ++j) {
      const float* cj = cache.latent.data() + j * kvr;
      for (size_t r = 0; r < kvr; ++r) lat[r] += scores[j] * cj[r];
    }
    for (size_t d = 0; d < vdim; ++d) {
      const float v = static_cast<float>(dot_f64(wuv + d * kvr, lat.data(), kvr));
      ctx[h * vdim + d] = v * sigmoid(G[h * vdim + d]);
    }
  }
  w.o_proj.apply(ctx.data(), out);
}

}  // namespace k3

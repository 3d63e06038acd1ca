#include "model/latent_moe.h"

#include <algorithm>
#include <numeric>

#include "kernels/mxfp4.h"
#include "kernels/vec.h"
#include "model/dense_mlp.h"

namespace k3 {

RoutingResult route(const K3Config& c, const MoeWeights& w, const float* x) {
  const size_t E = static_cast<size_t>(c.num_experts);
  const size_t k = static_cast<size_t>(c.num_experts_per_token);
  std::vector<float> scores(E), choice(E);  // [E]
  w.router.apply(x, scores.data());
  for (size_t e = 0; e < E; ++e) {
    scores[e] = sigmoid(scores[e]);
    choice[e] = scores[e] + w.router_bias[e];
  }
  std::vector<int64_t> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](int64_t a, int64_t b) {
                      const float ca = choice[static_cast<size_t>(a)], cb = choice[static_cast<size_t>(b)];
                      return ca != cb ? ca > cb : a < b;
                    });
  RoutingResult r;
  r.ids.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  std::sort(r.ids.begin(), r.ids.end());
  float sum = 0.0f;
  for (int64_t id : r.ids) sum += scores[static_cast<size_t>(id)];
  const float scale = static_cast<float>(c.routed_scaling_factor);
  for (int64_t id : r.ids) r.weights.push_back(scores[static_cast<size_t>(id)] / (sum + 1e-20f) * scale);
  return r;
}

void latent_moe_forward(const K3Config& c, const MoeWeights& w, const ExpertStore& experts,
                        int64_t layer, const float* x, float* out, RoutingResult* routing) {
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t R = static_cast<size_t>(c.routed_expert_hidden_size);
  const size_t I = static_cast<size_t>(c.moe_intermediate_size);
  const float beta = static_cast<float>(c.activation_situ_beta);
  const float beta_linear = static_cast<float>(c.activation_situ_linear_beta);

  RoutingResult r = route(c, w, x);
  std::vector<float> z(R), acc(R, 0.0f), gate(I), up(I), down(R), routed(D);
  w.latent_down.apply(x, z.data());  // [R]
  std::vector<uint8_t> buffer;
  for (size_t k = 0; k < r.ids.size(); ++k) {
    const ExpertView e = experts.read(layer, r.ids[k], buffer);
    matvec_mxfp4_f32_exact(e.gate_packed, e.gate_scale, I, R, z.data(), gate.data());  // [I]
    matvec_mxfp4_f32_exact(e.up_packed, e.up_scale, I, R, z.data(), up.data());        // [I]
    for (size_t i = 0; i < I; ++i) gate[i] = situ(gate[i], up[i], beta, beta_linear);
    matvec_mxfp4_f32_exact(e.down_packed, e.down_scale, R, I, gate.data(), down.data());  // [R]
    for (size_t i = 0; i < R; ++i) acc[i] += r.weights[k] * down[i];
  }
  rmsnorm(acc.data(), w.latent_norm.data(), R, c.rms_norm_eps, acc.data());
  w.latent_up.apply(acc.data(), routed.data());  // [D]
  if (c.num_shared_experts > 0) {
    situ_mlp_forward(c, w.shared_gate, w.shared_up, w.shared_down, x, out);
    for (size_t i = 0; i < D; ++i) out[i] += routed[i];
  } else {
    std::copy(routed.begin(), routed.end(), out);
  }
  if (routing) *routing = std::move(r);
}

}  // namespace k3

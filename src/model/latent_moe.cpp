#include "model/latent_moe.h"

#include <algorithm>
#include <numeric>

#include "kernels/vec.h"
#include "model/dense_mlp.h"

namespace k3 {

void route(const K3Config& c, const MoeWeights& w, const float* logits, Workspace& ws, RoutingResult* r) {
  const size_t E = static_cast<size_t>(c.num_experts);
  const size_t k = static_cast<size_t>(c.num_experts_per_token);
  float* scores = ws.moe_scores.data();  // [E]
  float* choice = ws.moe_choice.data();  // [E]
  for (size_t e = 0; e < E; ++e) {
    scores[e] = sigmoid(logits[e]);
    choice[e] = scores[e] + w.router_bias[e];
  }
  std::vector<int64_t>& order = ws.moe_order;
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](int64_t a, int64_t b) {
                      const float ca = choice[static_cast<size_t>(a)], cb = choice[static_cast<size_t>(b)];
                      return ca != cb ? ca > cb : a < b;
                    });
  r->ids.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  std::sort(r->ids.begin(), r->ids.end());
  float sum = 0.0f;
  for (int64_t id : r->ids) sum += scores[static_cast<size_t>(id)];
  const float scale = static_cast<float>(c.routed_scaling_factor);
  r->weights.resize(k);
  for (size_t j = 0; j < k; ++j) r->weights[j] = scores[static_cast<size_t>(r->ids[j])] / (sum + 1e-20f) * scale;
}

void latent_moe_forward(const K3Config& c, const Compute& compute, const MoeWeights& w,
                        const ExpertStore& experts, int64_t layer, Workspace& ws, StageStats& stats,
                        const float* x, float* out, RoutingResult* r) {
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t R = static_cast<size_t>(c.routed_expert_hidden_size);
  const size_t I = static_cast<size_t>(c.moe_intermediate_size);
  const float beta = static_cast<float>(c.activation_situ_beta);
  const float beta_linear = static_cast<float>(c.activation_situ_linear_beta);
  const KernelTable& kt = *compute.kernels;
  const bool shared = c.num_shared_experts > 0;
  float* z = ws.moe_z.data();       // [R]
  float* acc = ws.moe_acc.data();   // [R]
  float* gate = ws.moe_gate.data(); // [I]
  float* up = ws.moe_up.data();     // [I]
  float* down = ws.moe_down.data(); // [R]
  float* routed = ws.moe_routed.data();  // [D]
  {
    // Everything that reads x, in one parallel region: router logits, latent down, shared gate/up.
    StageTimer timer(stats, Stage::kRouter);
    const MatmulJob jobs[] = {{&w.router, ws.moe_scores.data()}, {&w.latent_down, z},
                              {&w.shared_gate, ws.mlp_gate.data()}, {&w.shared_up, ws.mlp_up.data()}};
    matmul_batch(kt, jobs, shared ? 4 : 2, x);
    route(c, w, ws.moe_scores.data(), ws, r);
  }
  {
    StageTimer timer(stats, Stage::kExperts);
    std::fill(acc, acc + R, 0.0f);
    if (compute.idot) quantize_q8_32(kt, z, 1, R, ws.moe_z_q8.data(), ws.moe_z_d.data());  // shared by gate and up
    for (size_t j = 0; j < r->ids.size(); ++j) {
      const ExpertView e = experts.read(layer, r->ids[j], ws.expert_bytes);
      const Mxfp4Matrix gate_w{e.gate_packed, e.gate_scale, I, R}, up_w{e.up_packed, e.up_scale, I, R};
      const Mxfp4Matrix down_w{e.down_packed, e.down_scale, R, I};
      if (compute.idot) {
        matmul_mxfp4_idot(kt, gate_w, ws.moe_z_q8.data(), ws.moe_z_d.data(), 1, gate);
        matmul_mxfp4_idot(kt, up_w, ws.moe_z_q8.data(), ws.moe_z_d.data(), 1, up);
      } else {
        matmul_mxfp4_exact(kt, gate_w, z, 1, gate);
        matmul_mxfp4_exact(kt, up_w, z, 1, up);
      }
      if (compute.idot) {
        // SiTU fused with the down projection's activation quantisation, one 32-group at a time.
        for (size_t g = 0; g < I / 32; ++g) {
          for (size_t i = g * 32; i < g * 32 + 32; ++i) gate[i] = situ(gate[i], up[i], beta, beta_linear);
          kt.quantize_q8_32(gate + g * 32, 32, ws.moe_h_q8.data() + g * 32, ws.moe_h_d.data() + g);
        }
        matmul_mxfp4_idot(kt, down_w, ws.moe_h_q8.data(), ws.moe_h_d.data(), 1, down);
      } else {
        for (size_t i = 0; i < I; ++i) gate[i] = situ(gate[i], up[i], beta, beta_linear);
        matmul_mxfp4_exact(kt, down_w, gate, 1, down);
      }
      const float weight = r->weights[j];
      for (size_t i = 0; i < R; ++i) acc[i] += weight * down[i];
    }
    rmsnorm(acc, w.latent_norm.data(), R, c.rms_norm_eps, acc);
    matmul(kt, w.latent_up, acc, 1, routed);  // [D]
  }
  StageTimer timer(stats, Stage::kShared);
  if (shared) {
    situ_down(c, compute, w.shared_down, ws.mlp_gate.data(), ws.mlp_up.data(), out);
    for (size_t i = 0; i < D; ++i) out[i] += routed[i];
  } else {
    std::copy(routed, routed + D, out);
  }
}

}  // namespace k3

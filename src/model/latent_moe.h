// model/latent_moe.h — LatentMoE with SiTU experts (ARCHITECTURE.md §3.6).
//
//   s      = sigmoid(Wr x)                         [num_experts]
//   sel    = top-k of (s + e_score_correction_bias)      (ties -> lower expert id)
//   w_k    = s[sel_k] / (sum_k s[sel_k] + 1e-20) * routed_scaling_factor
//   z      = Wdown_latent x                        [routed_expert_hidden_size]
//   acc    = sum_k w_k W2_k SiTU(W1_k z, W3_k z)   (MXFP4 experts, ascending expert id)
//   out    = Wup_latent RMSNorm(acc, routed_expert_norm) + SharedMLP(x)
#pragma once

#include <cstdint>
#include <vector>

#include "experts/expert_store.h"
#include "model/config.h"
#include "model/weights.h"

namespace k3 {

struct RoutingResult {
  std::vector<int64_t> ids;     // [num_experts_per_token], ascending
  std::vector<float> weights;   // [num_experts_per_token], aligned with ids
};

// The router alone: selection and combine weights for normalised input x [hidden].
RoutingResult route(const K3Config& config, const MoeWeights& weights, const float* x);

// x: [hidden] normalised input; out: [hidden]. `routing` receives the choice (may be null).
void latent_moe_forward(const K3Config& config, const MoeWeights& weights,
                        const ExpertStore& experts, int64_t layer, const float* x, float* out,
                        RoutingResult* routing);

}  // namespace k3

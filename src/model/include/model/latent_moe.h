// model/latent_moe.h — LatentMoE with SiTU experts (docs/architecture.md §3.6).
//
//   s      = sigmoid(Wr x)                         [num_experts]
//   sel    = top-k of (s + e_score_correction_bias)      (ties -> lower expert id)
//   w_k    = s[sel_k] / (sum_k s[sel_k] + 1e-20) * routed_scaling_factor
//   z      = Wdown_latent x                        [routed_expert_hidden_size]
//   acc    = sum_k w_k W2_k SiTU(W1_k z, W3_k z)   (MXFP4 experts, ascending expert id;
//            K3_IDOT=1: z and SiTU's output quantised to int8 per 32-group, integer dots)
//   out    = Wup_latent RMSNorm(acc, routed_expert_norm) + SharedMLP(x)
#pragma once

#include <cstdint>
#include <vector>

#include "experts/expert_source.h"
#include "model/compute.h"
#include "model/config.h"
#include "model/state.h"
#include "model/weights.h"

namespace k3 {

// Selection and combine weights from router logits [num_experts] (scratch in `work`; `logits`
// may be work.moe_scores itself): the top num_experts_per_token by sigmoid + bias, weights the
// sigmoids normalised over the picks. `top_p` in (0, 1) (K3_TOPP) keeps only the shortest
// prefix of the picks by weight reaching that cumulative weight, renormalised; 0 keeps all.
void route(const K3Config& config, const MoeWeights& weights, const float* logits, double top_p,
           Workspace& work, RoutingResult* routing);

// The next MoE layer, whose experts may be read ahead while this one runs (K3_PREFETCH, the
// source decides): its router applied to this layer's input predicts them; the real router
// still decides later.
struct NextMoe {
  const MoeWeights* weights = nullptr;  // nullptr: no read-ahead
  int64_t layer = -1;
};

// n consecutive rows X [n][hidden] (normalised inputs; n = 1 in decode); out: [n][hidden].
// Router, latent down/up and shared experts batched over the rows; each distinct routed expert of
// the step asked of `experts` once and applied to all its rows (their choices are recorded in the
// routing history); ws.routing[t] receives row t's choice. Every row bit-identical to the call on
// that row alone. Stage times go to `stats` (router, experts, shared).
void latent_moe_forward(const K3Config& config, const Compute& compute, const MoeWeights& weights,
                        ExpertSource& experts, int64_t layer, Workspace& work, StageStats& stats,
                        const float* X, size_t n, float* out, NextMoe next = {});

}  // namespace k3

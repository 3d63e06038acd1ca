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

// One routed expert applied to m rows: down[j] = W2 SiTU(W1 z_j, W3 z_j) for j < m, as the CPU
// executor computes it (an executor that computes on a CPU elsewhere gets the same bits). The
// idot path (compute.idot) takes z pre-quantised (zq8 [m][R], zd [m][R/32]); the float path z
// [m][R]. gate, up: [m][I] scratch; hq8 [m][I], hd [m][I/32] scratch; down: [m][R]. Every row is
// bit-identical to m = 1 on that row (the kernels' per-row results do not depend on m).
void apply_expert(const K3Config& config, const Compute& compute, const ExpertView& expert,
                  size_t m, const float* z, const int8_t* zq8, const float* zd, float* gate,
                  float* up, int8_t* hq8, float* hd, float* down);

// The next MoE layer, whose experts may be read ahead while this one runs (K3_PREFETCH, the
// source decides): its router applied to this layer's input predicts them; the real router
// still decides later.
struct NextMoe {
  const MoeWeights* weights = nullptr;  // nullptr: no read-ahead
  int64_t layer = -1;
};

// n consecutive rows X [n][hidden] (normalised inputs; n = 1 in decode); out: [n][hidden].
// Router, latent down/up and shared experts batched over the rows; the routed (row, expert) pairs
// go to compute.executors, then to the CPU executor (docs/architecture.md §3.10), which asks each
// remaining distinct expert of `experts` once and applies it to all its rows (their choices are
// recorded in the routing history); ws.routing[t] receives row t's choice. Every row bit-identical
// to the call on that row alone. Stage times go to `stats` (router, experts, shared).
void latent_moe_forward(const K3Config& config, const Compute& compute, const MoeWeights& weights,
                        ExpertSource& experts, int64_t layer, Workspace& work, StageStats& stats,
                        const float* X, size_t n, float* out, NextMoe next = {});

}  // namespace k3

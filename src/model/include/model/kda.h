// model/kda.h — Kimi Delta Attention (docs/architecture.md §3.4), per token:
//
//   q0, k0, v0 = Wq x, Wk x, Wv x                      [kda_projection] each
//   q, k, v    = SiLU(causal depthwise conv_K(stream))  tap K-1 = current token
//   per head h (slices of kda_head_dim):
//     q = q / sqrt(sum q^2 + 1e-6) * kda_head_dim^-1/2 ;  k = k / sqrt(sum k^2 + 1e-6)
//     g_i = gate_lower_bound * sigmoid(exp(A_log[h]) * ((Wfb Wfa x)_i + dt_bias_i)),  a_i = e^g_i
//     beta = sigmoid((Wb x)_h)
//     S[i][:] *= a_i ; u = beta (v - k^T S) ; S += k u^T ; o = q^T S      (decay, write, read)
//     o = RMSNorm(o, o_norm, rms_norm_eps) * sigmoid((Wg x)_h)
//   out = Wo concat_h(o)                                [hidden]
// Equivalent to fla's fused_recurrent_kda with in-kernel l2norm, gate and beta sigmoid.
#pragma once

#include "model/compute.h"
#include "model/config.h"
#include "model/state.h"
#include "model/weights.h"

namespace k3 {

// n rows X [n][hidden] (normalised inputs); out: [n][hidden]. Row t advances the KDA state of
// layer `layer` of rows[t].state: the rows of a chunk share one state (consecutive tokens, in
// order), the rows of a batched decode step each have their own. Projections batched over the
// rows, conv windows and recurrence advanced row by row; scratch in `work`. Every row
// bit-identical to n calls of one row, unless compute.kda_chunked (K3_KDA_CHUNKED): then a run of
// two or more consecutive rows of one sequence takes the recurrence in the chunk form
// (KernelTable::kda_head_chunk), close to the token recurrence but not bit-identical.
void kda_forward(const K3Config& config, const Compute& compute, const KdaWeights& weights,
                 size_t layer, const SequenceRow* rows, Workspace& work, const float* X, size_t n,
                 float* out);

}  // namespace k3

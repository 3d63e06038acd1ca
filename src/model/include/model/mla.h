// model/mla.h — gated NoPE multi-head latent attention (docs/architecture.md §3.5), per token,
// in the absorbed form over the latent cache.
//
//   cq   = RMSNorm(Wqa x, q_a_layernorm, 1e-6)          Q = Wqb cq   [heads][nope | rope]
//   ckv  = Wkva x ;  c_t = RMSNorm(ckv[:kv_lora], kv_a_layernorm, 1e-6) ;  kpe_t = ckv[kv_lora:]
//   cache <- (c_t, kpe_t)                                (no rotary anywhere: NoPE)
//   per head h:  qabs = WUK_h^T q_nope                   [kv_lora]
//                s_j  = (qabs . c_j + q_pe . kpe_j) / sqrt(qk_nope + qk_rope),  j = 0..t
//                p = softmax(s) ; lat = sum_j p_j c_j ; ctx_h = (WUV_h lat) * sigmoid((Wg x)_h)
//   out = Wo concat_h(ctx_h)
// WUK_h / WUV_h are rows [h(nope+v), h(nope+v)+nope) / [.. +nope, .. +nope+v) of kv_b_proj.
#pragma once

#include "model/compute.h"
#include "model/config.h"
#include "model/state.h"
#include "model/weights.h"

namespace k3 {

// n rows X [n][hidden] (normalised inputs); out: [n][hidden]. Row t is the token at position
// rows[t].position of the sequence rows[t].state (a chunk: one sequence, consecutive positions; a
// batched decode step: one row per sequence). Projections batched, every row's latent row and
// rope key appended to its sequence's cache of layer `layer` first (it must hold the position),
// then each row attends over its own sequence's positions up to its own. Every row bit-identical
// to n calls of one row.
void mla_forward(const K3Config& config, const Compute& compute, const MlaWeights& weights,
                 size_t layer, const SequenceRow* rows, Workspace& work, const float* X, size_t n,
                 float* out);

}  // namespace k3

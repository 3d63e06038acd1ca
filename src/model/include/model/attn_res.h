// model/attn_res.h — Attention Residuals: the mix that replaces the residual stream.
//
//   score_e = dot(v_e, w) / sqrt(mean(v_e^2) + eps)        w = res_norm ⊙ res_proj[0]
//   p       = softmax(score_0 .. score_n)                   (max subtracted)
//   Mix     = sum_e p_e v_e                                 over the RAW sources
//
// Sources are the completed blocks (embedding first) and the running partial sum, last.
// Dot and mean-square are accumulated in f64, the softmax in f32 with an f64 sum.
#pragma once

#include <cstddef>

namespace k3 {

// sources: `count` pointers to vectors of `hidden` floats. weights: [count] scratch (the
// softmax). out[hidden] (may not alias sources).
void attn_res_mix(const float* const* sources, size_t count, const float* query, size_t hidden,
                  double eps, float* weights, float* out);

}  // namespace k3

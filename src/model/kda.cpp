#include "model/kda.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/vec.h"

namespace k3 {
namespace {

// y = SiLU(sum_j taps[c][j] * s_{t-K+1+j}[c]); shifts `window` (oldest first) by one token.
void conv_silu(const std::vector<float>& taps, std::vector<float>& window, float* stream,
               size_t channels, size_t width) {
  const size_t history = width - 1;
  for (size_t c = 0; c < channels; ++c) {
    const float* tap = taps.data() + c * width;
    float y = 0.0f;
    for (size_t j = 0; j < history; ++j) y += tap[j] * window[j * channels + c];
    y += tap[history] * stream[c];
    if (history > 0) {
      for (size_t j = 0; j + 1 < history; ++j) window[j * channels + c] = window[(j + 1) * channels + c];
      window[(history - 1) * channels + c] = stream[c];
    }
    stream[c] = silu(y);
  }
}

}  // namespace

void kda_forward(const K3Config& config, const KdaWeights& w, KdaState& state, const float* x,
                 float* out) {
  const size_t P = static_cast<size_t>(config.kda_projection_size());
  const size_t H = static_cast<size_t>(config.kda_num_heads);
  const size_t dk = static_cast<size_t>(config.kda_head_dim);
  const size_t K = static_cast<size_t>(config.short_conv_kernel_size);

  std::vector<float> q(P), k(P), v(P), gate_out(P), decay_low(dk), decay(P), beta(H), o(P);
  w.q_proj.apply(x, q.data());                  // [P]
  w.k_proj.apply(x, k.data());                  // [P]
  w.v_proj.apply(x, v.data());                  // [P]
  w.f_a_proj.apply(x, decay_low.data());        // [dk]
  w.f_b_proj.apply(decay_low.data(), decay.data());  // [P]
  w.b_proj.apply(x, beta.data());               // [H]
  w.g_proj.apply(x, gate_out.data());           // [P]

  conv_silu(w.q_conv, state.q_window, q.data(), P, K);
  conv_silu(w.k_conv, state.k_window, k.data(), P, K);
  conv_silu(w.v_conv, state.v_window, v.data(), P, K);

  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const float lower_bound = static_cast<float>(config.gate_lower_bound);
  const int64_t heads = static_cast<int64_t>(H);
#pragma omp parallel for schedule(static) if (H * dk * dk > 4096)
  for (int64_t hh = 0; hh < heads; ++hh) {
    const size_t h = static_cast<size_t>(hh);
    float* qh = q.data() + h * dk;
    float* kh = k.data() + h * dk;
    const float* vh = v.data() + h * dk;
    l2_normalize(qh, dk, K3Config::kKdaL2NormEps);
    for (size_t i = 0; i < dk; ++i) qh[i] *= q_scale;
    l2_normalize(kh, dk, K3Config::kKdaL2NormEps);
    const float b = sigmoid(beta[h]);
    float* S = state.recurrent.data() + h * dk * dk;  // [dk key][dk value]
    // 1. decay rows by key channel
    for (size_t i = 0; i < dk; ++i) {
      const float z = decay[h * dk + i] + w.dt_bias[h * dk + i];
      const float a = std::exp(lower_bound * sigmoid(w.a_exp[h] * z));
      for (size_t j = 0; j < dk; ++j) S[i * dk + j] *= a;
    }
    // 2-3. read with the key, delta
    std::vector<float> u(dk, 0.0f);  // [dk value]
    for (size_t i = 0; i < dk; ++i)
      for (size_t j = 0; j < dk; ++j) u[j] += kh[i] * S[i * dk + j];
    for (size_t j = 0; j < dk; ++j) u[j] = b * (vh[j] - u[j]);
    // 4. rank-1 write
    for (size_t i = 0; i < dk; ++i)
      for (size_t j = 0; j < dk; ++j) S[i * dk + j] += kh[i] * u[j];
    // 5. read with the query
    float* oh = o.data() + h * dk;
    std::fill(oh, oh + dk, 0.0f);
    for (size_t i = 0; i < dk; ++i)
      for (size_t j = 0; j < dk; ++j) oh[j] += qh[i] * S[i * dk + j];
    rmsnorm(oh, w.o_norm.data(), dk, config.rms_norm_eps, oh);
    for (size_t j = 0; j < dk; ++j) oh[j] *= sigmoid(gate_out[h * dk + j]);
  }
  w.o_proj.apply(o.data(), out);
}

}  // namespace k3

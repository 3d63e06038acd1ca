#include "model/state.h"

#include <algorithm>

namespace k3 {

ModelState::ModelState(const K3Config& c, int64_t num_layers, int64_t capacity_)
    : capacity(capacity_) {
  const size_t P = static_cast<size_t>(c.kda_projection_size());
  const size_t history = static_cast<size_t>(c.short_conv_kernel_size - 1);
  const size_t dk = static_cast<size_t>(c.kda_head_dim);
  kda.resize(static_cast<size_t>(num_layers));
  mla.resize(static_cast<size_t>(num_layers));
  for (size_t l = 0; l < static_cast<size_t>(num_layers); ++l) {
    if (c.attention[l] == AttentionKind::kKDA) {
      kda[l].q_window.assign(history * P, 0.0f);
      kda[l].k_window.assign(history * P, 0.0f);
      kda[l].v_window.assign(history * P, 0.0f);
      kda[l].recurrent.assign(static_cast<size_t>(c.kda_num_heads) * dk * dk, 0.0f);
    } else {
      mla[l].latent.assign(static_cast<size_t>(capacity) * static_cast<size_t>(c.kv_lora_rank), 0.0f);
      mla[l].rope.assign(static_cast<size_t>(capacity) * static_cast<size_t>(c.qk_rope_head_dim), 0.0f);
    }
  }
}

void ModelState::reset() {
  position = 0;
  for (auto& s : kda) {
    std::fill(s.q_window.begin(), s.q_window.end(), 0.0f);
    std::fill(s.k_window.begin(), s.k_window.end(), 0.0f);
    std::fill(s.v_window.begin(), s.v_window.end(), 0.0f);
    std::fill(s.recurrent.begin(), s.recurrent.end(), 0.0f);
  }
  // MLA rows past `position` are never read; no need to clear them.
}

}  // namespace k3

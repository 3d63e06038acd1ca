// model/state.h — per-sequence state of the stack: KDA conv windows and recurrent matrices, the
// MLA latent cache, the position. Owned by a Session; the model reads and advances it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace k3 {

struct KdaState {
  // The last (short_conv_kernel_size - 1) inputs of each conv stream, oldest first; zero at the
  // sequence start.
  std::vector<float> q_window, k_window, v_window;  // [short_conv_kernel_size - 1][kda_projection]
  std::vector<float> recurrent;  // [kda_num_heads][kda_head_dim (key)][kda_head_dim (value)]
};

struct MlaCache {
  std::vector<float> latent;  // [capacity][kv_lora_rank]   normalised c_t
  std::vector<float> rope;    // [capacity][qk_rope_head_dim] raw k_pe_t
};

struct ModelState {
  int64_t position = 0;   // tokens fed so far
  int64_t capacity = 0;   // positions the MLA caches can hold
  std::vector<KdaState> kda;  // [layers]; empty entries for MLA layers
  std::vector<MlaCache> mla;  // [layers]; empty entries for KDA layers

  // Zeroed state for `num_layers` layers of `config` holding up to `capacity` positions.
  ModelState(const K3Config& config, int64_t num_layers, int64_t capacity);
  void reset();
};

}  // namespace k3

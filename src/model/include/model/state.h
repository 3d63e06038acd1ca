// model/state.h — per-sequence state of the stack: KDA conv windows and recurrent matrices, the
// MLA latent cache, the position, stage timers, and the scratch buffers of one forward step
// (allocated once, so a decode step allocates nothing). Owned by a Session; the model reads and
// advances it.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "experts/expert_cache.h"
#include "model/compute.h"
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

// The experts a MoE layer chose for one token.
struct RoutingResult {
  std::vector<int64_t> ids;     // [num_experts_per_token], ascending
  std::vector<float> weights;   // [num_experts_per_token], aligned with ids
};

// Scratch of one forward step, sized from the config (and the capacity for MLA scores).
struct Workspace {
  // Stack walk.
  std::vector<float> x0;       // [hidden] the input row of the token
  std::vector<uint8_t> embed_bytes;  // [hidden * stored element size] the embedding row as stored
  std::vector<float> final_hidden;  // [hidden]
  std::vector<float> blocks;   // [num_blocks][hidden]
  std::vector<float> partial, mixed, normed, branch;  // [hidden] each
  std::vector<const float*> sources;  // [num_blocks + 1]
  std::vector<float> mix_weights;     // [num_blocks + 1]
  // KDA.
  std::vector<float> kda_q, kda_k, kda_v, kda_gate, kda_decay, kda_out;  // [kda_projection]
  std::vector<float> kda_decay_low;  // [kda_head_dim]
  std::vector<float> kda_beta;       // [kda_num_heads]
  std::vector<float> kda_u;          // [kda_num_heads][kda_head_dim]
  // MLA.
  std::vector<float> mla_cq;     // [q_lora_rank]
  std::vector<float> mla_q;      // [heads][qk_head_dim]
  std::vector<float> mla_ckv;    // [kv_lora_rank + qk_rope_head_dim]
  std::vector<float> mla_gate;   // [heads][v_head_dim]
  std::vector<float> mla_ctx;    // [heads][v_head_dim]
  std::vector<float> mla_qabs;   // [heads][kv_lora_rank]
  std::vector<float> mla_lat;    // [heads][kv_lora_rank]
  std::vector<float> mla_scores; // [heads][capacity]
  // MoE.
  std::vector<float> moe_scores, moe_choice;  // [num_experts]
  std::vector<int64_t> moe_order;             // [num_experts]
  std::vector<float> moe_predict;             // [num_experts]: the next MoE layer's router logits (read-ahead)
  std::vector<uint32_t> predict_count;        // [num_experts]: a chunk's predicted picks per expert
  std::vector<int64_t> predict_order;         // [<= num_experts]: the chunk's predicted experts
  RoutingResult predicted;                    // the next MoE layer's predicted choice
  std::vector<float> moe_z, moe_acc;            // [routed_expert_hidden_size]
  std::vector<float> moe_gate, moe_up;          // [moe_intermediate_size]
  std::vector<int8_t> moe_z_q8, moe_h_q8;       // [routed_expert_hidden_size], [moe_intermediate_size]
  std::vector<float> moe_z_d, moe_h_d;          // [.. / 32]
  std::vector<float> moe_routed;                // [hidden]
  std::vector<float> moe_downs;                 // [ExpertCache::kMaxBatch][routed_expert_hidden_size]
  std::vector<uint8_t> moe_done;                // [ExpertCache::kMaxBatch]
  ExpertBatch expert_batch;                     // the routed experts of the running step
  RoutingResult routing;
  // SiTU MLP (dense layers and shared experts).
  std::vector<float> mlp_gate, mlp_up;  // [max(intermediate_size, shared_intermediate)]
  // Head.
  std::vector<float> head_normed;  // [hidden]
};

// Scratch of one layer-major chunk of C prompt rows (Model::forward_chunk): the stack walk's
// per-row vectors and the batched projections' inputs and outputs, [rows][...] each. Grown by
// reserve() on the first chunk of a size and reused (a decode step never touches it).
struct ChunkWorkspace {
  size_t rows = 0;  // rows the buffers hold
  // Stack walk.
  std::vector<float> blocks;   // [rows][num_blocks][hidden]
  std::vector<float> partial, mixed, normed, branch;  // [rows][hidden] each
  // KDA.
  std::vector<float> kda_q, kda_k, kda_v, kda_gate, kda_decay, kda_out;  // [rows][kda_projection]
  std::vector<float> kda_decay_low;  // [rows][kda_head_dim]
  std::vector<float> kda_beta;       // [rows][kda_num_heads]
  // MLA.
  std::vector<float> mla_cq;    // [rows][q_lora_rank]
  std::vector<float> mla_q;     // [rows][heads][qk_head_dim]
  std::vector<float> mla_ckv;   // [rows][kv_lora_rank + qk_rope_head_dim]
  std::vector<float> mla_gate, mla_ctx;  // [rows][heads][v_head_dim]
  // MoE (router logits, latent z and its q8 form, routed sums) and SiTU MLPs.
  std::vector<float> moe_logits;                  // [rows][num_experts]
  std::vector<float> moe_z, moe_acc;              // [rows][routed_expert_hidden_size]
  std::vector<int8_t> moe_z_q8;                   // [rows][routed_expert_hidden_size]
  std::vector<float> moe_z_d;                     // [rows][routed_expert_hidden_size / 32]
  std::vector<float> moe_routed;                  // [rows][hidden]
  std::vector<RoutingResult> routing;             // [rows]
  // One expert's rows of the chunk, gathered: inputs, gate/up, SiTU output, down.
  std::vector<float> ex_z, ex_down;               // [rows][routed_expert_hidden_size]
  std::vector<int8_t> ex_z_q8;                    // [rows][routed_expert_hidden_size]
  std::vector<float> ex_z_d;                      // [rows][routed_expert_hidden_size / 32]
  std::vector<float> ex_gate, ex_up;              // [rows][moe_intermediate_size]
  std::vector<int8_t> ex_h_q8;                    // [rows][moe_intermediate_size]
  std::vector<float> ex_h_d;                      // [rows][moe_intermediate_size / 32]
  std::vector<float> mlp_gate, mlp_up;            // [rows][max(intermediate, shared_intermediate)]

  // Sizes every buffer for `rows` rows of `config` (no-op when already that large).
  void reserve(const K3Config& config, size_t rows);
};

struct ModelState {
  int64_t position = 0;   // tokens fed so far
  int64_t capacity = 0;   // positions the MLA caches can hold
  std::vector<KdaState> kda;  // [layers]; empty entries for MLA layers
  std::vector<MlaCache> mla;  // [layers]; empty entries for KDA layers
  StageStats stats;
  Workspace work;
  ChunkWorkspace chunk;
  // Polled before every layer of a forward pass; when it reads true the pass throws Interrupted
  // and leaves the state part-advanced (the owner restores a photo or resets). nullptr = never.
  const std::atomic<bool>* interrupt = nullptr;

  // Zeroed state for `num_layers` layers of `config` holding up to `capacity` positions.
  ModelState(const K3Config& config, int64_t num_layers, int64_t capacity);
  void reset();
};

}  // namespace k3

// model/state.h — per-sequence state of the stack: KDA conv windows and recurrent matrices, the
// MLA latent cache, the position, stage timers, and the scratch buffers of a forward pass
// (allocated once, so a decode step allocates nothing). Owned by a Session; the model reads and
// advances it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/compute.h"
#include "model/config.h"
#include "util/uninit_vector.h"

namespace k3 {

struct KdaState {
  // The last (short_conv_kernel_size - 1) inputs of each conv stream, oldest first; zero at the
  // sequence start.
  std::vector<float> q_window, k_window, v_window;  // [short_conv_kernel_size - 1][kda_projection]
  std::vector<float> recurrent;  // [kda_num_heads][kda_head_dim (key)][kda_head_dim (value)]
};

// Sized for the whole context but not written ahead (UninitVector, util/uninit_vector.h): a row
// is written when its position is fed and only rows below the position are read, so the memory
// behind the rows not reached yet is never touched (not resident).
struct MlaCache {
  UninitVector<float> latent;  // [capacity][kv_lora_rank]   normalised c_t
  UninitVector<float> rope;    // [capacity][qk_rope_head_dim] raw k_pe_t
};

// The experts a MoE layer chose for one token.
struct RoutingResult {
  std::vector<int64_t> ids;    // [num_experts_per_token], ascending
  std::vector<float> weights;  // [num_experts_per_token], aligned with ids
};

// A MoE layer's picks for a step of n rows: every (expert, row) pair of the rows' choices in
// ascending expert id (rows ascending within an expert), the distinct experts, and where each
// expert's run of pairs starts.
// Rows of expert outputs a MoE step keeps while it computes experts ahead of an earlier one that
// is still being read (at least; a pass of more rows keeps as many as it has rows).
constexpr size_t kMoeAheadRows = 64;

struct ModelState;

// One row of a forward pass: the sequence it belongs to and its position there. A chunk's rows
// are one sequence at consecutive positions; a batched decode step's rows are one per sequence.
struct SequenceRow {
  ModelState* state = nullptr;
  int64_t position = 0;
};

struct MoePick {
  int64_t expert;
  size_t row;
  float weight;
};

// Scratch of one forward pass over up to `rows` consecutive tokens (Model::forward), sized from
// the config (and the capacity for MLA scores): the per-row buffers are [rows][...]; the rest is
// per-token scratch of the sequential parts. Grown by reserve() for a larger pass and reused, so a
// decode step (one row) allocates nothing.
//
// A layer's attention (KDA or MLA) and its feed-forward run one after the other
// (Model::forward_rows), and none of their per-row scratch outlives its call: those buffers are
// views into one arena, each phase's laid out from its start, so the arena is as large as the
// largest phase instead of the sum (the release's dimensions: 0.76 instead of 1.23 MB a row).
// The views point into the arena, so a Workspace stays where it was made: no copy, no move.
struct Workspace {
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  size_t rows = 0;                         // rows the per-row buffers hold
  std::vector<SequenceRow> sequence_rows;  // [rows] whose row each one of a pass is
  // Stack walk.
  std::vector<uint8_t> embed_bytes;  // [hidden * stored element size] the embedding row as stored
  std::vector<float> blocks;         // [rows][num_blocks][hidden]
  std::vector<float> partial, mixed, normed, branch;  // [rows][hidden] each
  std::vector<const float*> sources;                  // [num_blocks + 1]
  std::vector<float> mix_weights;                     // [num_blocks + 1]
  // The phase arena: [the largest phase's per-row bytes x rows], 64-byte aligned views. Bytes, so
  // the float and int8 views' objects live in storage that may hold any type.
  std::vector<std::byte> phase_arena;
  // KDA (the attention phase of a KDA layer).
  std::span<float> kda_q, kda_k, kda_v, kda_gate, kda_decay, kda_out;  // [rows][kda_projection]
  std::span<float> kda_decay_low;                                      // [rows][kda_head_dim]
  std::span<float> kda_beta;                                           // [rows][kda_num_heads]
  std::vector<float> kda_u;  // [kda_num_heads][kda_head_dim]
  // [threads][kda_chunk_scratch_floats]: the chunk form's scratch (K3_KDA_CHUNKED), sized by a
  // prompt chunk that takes it and given back with the rows (release_rows); never touched by
  // decode.
  std::vector<float> kda_chunk;
  // MLA (the attention phase of an MLA layer).
  std::span<float> mla_cq;             // [rows][q_lora_rank]
  std::span<float> mla_q;              // [rows][heads][qk_head_dim]
  std::span<float> mla_ckv;            // [rows][kv_lora_rank + qk_rope_head_dim]
  std::span<float> mla_gate, mla_ctx;  // [rows][heads][v_head_dim]
  std::vector<float> mla_qabs;         // [heads][kv_lora_rank]
  std::vector<float> mla_lat;          // [heads][kv_lora_rank]
  UninitVector<float> mla_scores;      // [heads][capacity], [0, T) written before read
  size_t score_heads = 0;              // heads of mla_scores
  // MoE: routing.
  std::vector<float> moe_logits;              // [rows][num_experts] router logits
  std::vector<float> moe_scores, moe_choice;  // [num_experts]
  std::vector<int64_t> moe_order;             // [num_experts]
  std::vector<int64_t> moe_by_weight;         // [num_experts_per_token] (K3_TOPP)
  std::vector<RoutingResult> routing;         // [rows]
  std::vector<uint32_t> predict_count;  // [num_experts]: predicted picks per expert (read-ahead)
  std::vector<int64_t> predict_order;   // [<= num_experts]: the predicted experts
  RoutingResult predicted;              // the next MoE layer's predicted choice of one row
  // MoE: the step's picks (see MoePick), [rows * num_experts_per_token] at most.
  std::vector<MoePick> picks;
  std::vector<int64_t> pick_ids;    // the distinct experts, ascending
  std::vector<size_t> pick_starts;  // [distinct + 1]: each expert's first pick
  // The routed sum's state per distinct expert (latent_moe.cpp, OrderedSum): pending, reserved
  // or waiting in moe_ahead (pick_ahead: its first row there), or waiting in an executor's buffer
  // (pick_rows); the executor computing it (pick_owner, model/expert_executor.h).
  std::vector<uint8_t> pick_state;      // [distinct]
  std::vector<size_t> pick_ahead;       // [distinct]
  std::vector<const float*> pick_rows;  // [distinct]
  std::vector<uint8_t> pick_owner;      // [distinct]
  std::vector<size_t> cpu_groups;       // [distinct]: the CPU executor's share of the step
  std::vector<int64_t> cpu_ids;         // [distinct]: their expert ids
  std::vector<float> moe_routed;        // [rows][hidden]
  // The feed-forward phase (views into phase_arena). MoE: latent z and its q8 form, routed sums.
  std::span<float> moe_z, moe_acc;  // [rows][routed_expert_hidden_size]
  std::span<int8_t> moe_z_q8;       // [rows][routed_expert_hidden_size]
  std::span<float> moe_z_d;         // [rows][routed_expert_hidden_size / 32]
  // One expert's rows of the step, gathered: inputs, gate/up, SiTU output, down.
  std::span<float> ex_z, ex_down;   // [rows][routed_expert_hidden_size]
  std::span<int8_t> ex_z_q8;        // [rows][routed_expert_hidden_size]
  std::span<float> ex_z_d;          // [rows][routed_expert_hidden_size / 32]
  std::span<float> ex_gate, ex_up;  // [rows][moe_intermediate_size]
  std::span<int8_t> ex_h_q8;        // [rows][moe_intermediate_size]
  std::span<float> ex_h_d;          // [rows][moe_intermediate_size / 32]
  // SiTU MLP (dense layers and shared experts).
  std::span<float> mlp_gate, mlp_up;  // [rows][max(intermediate, shared_intermediate)]
  // Down rows of experts computed ahead of an earlier one still being read (summed in id order);
  // a vector of its own, as it grows during a step (latent_moe.cpp).
  std::vector<float> moe_ahead;  // [ahead_rows][routed_expert_hidden_size]
  size_t ahead_rows = 0;
  // Head.
  std::vector<float> head_normed;  // [hidden]

  // Sizes the per-token scratch for sequences of up to `capacity` positions (MLA scores); a
  // larger capacity later grows it.
  void init(const K3Config& config, int64_t capacity);
  // Sizes every per-row buffer for `rows` rows of `config` (no-op when already that large).
  void reserve(const K3Config& config, size_t rows);
  // Gives back what a prompt chunk grew: every per-row buffer back to one row (a decode step's),
  // and the chunk form's KDA scratch. The next chunk grows them again. False when there was
  // nothing to give back.
  bool release_rows(const K3Config& config);
  // Bytes of the buffers above, sized for `config` (allocated; mla_scores counted for `positions`
  // of its capacity, the part a pass over those positions touches).
  uint64_t bytes(const K3Config& config, int64_t positions) const;
  // Bytes reserve() takes per row of `config` (K3_CHUNK=auto sizes chunks from it).
  static uint64_t row_bytes(const K3Config& config);

 private:
  template <class W, class Visit>
  static void per_row_buffers(W& w, const K3Config& config, Visit&& visit);
  template <class W, class Visit>
  static void pick_buffers(W& w, Visit&& visit);
  enum Phase { kKdaPhase, kMlaPhase, kFeedForwardPhase, kPhases };
  template <class W, class Visit>
  static void phase_views(W& w, const K3Config& config, Visit&& visit);
};

// K3_CHUNK=auto: the prefill chunk for `available_bytes` of free memory after the weights: the
// largest power of two in [32, 4096] whose workspace (Workspace::row_bytes per row) takes at most
// a sixteenth of it; 32 when even that does not fit or the memory is unknown (0).
int64_t auto_prefill_chunk(const K3Config& config, uint64_t available_bytes);

struct ModelState {
  int64_t position = 0;       // tokens fed so far
  int64_t capacity = 0;       // positions the MLA caches can hold
  std::vector<KdaState> kda;  // [layers]; empty entries for MLA layers
  std::vector<MlaCache> mla;  // [layers]; empty entries for KDA layers
  StageStats stats;
  Workspace work;
  // Polled before every layer of a forward pass; when it reads true the pass throws Interrupted
  // and leaves the state part-advanced (the owner restores a saved state or resets). nullptr =
  // never.
  const std::atomic<bool>* interrupt = nullptr;

  // Zeroed state for `num_layers` layers of `config` holding up to `capacity` positions, its
  // workspace sized for passes of `rows` rows (one: decode).
  ModelState(const K3Config& config, int64_t num_layers, int64_t capacity, size_t rows = 1);
  void reset();
  // The floats the constructor allocates per position of `capacity`: every MLA layer's latent and
  // rope rows, plus one attention score per head (a context's cost, known before any weight).
  static uint64_t floats_per_position(const K3Config& config, int64_t num_layers);
  // The floats it allocates whatever the capacity: every KDA layer's conv windows and matrix
  // state (what a checkpoint saves).
  static uint64_t fixed_floats(const K3Config& config, int64_t num_layers);
  // Bytes of the KDA state, and of the MLA rows written so far (positions [0, position) of every
  // MLA layer: what is resident of the caches).
  uint64_t kda_bytes() const;
  uint64_t mla_bytes() const;
};

}  // namespace k3

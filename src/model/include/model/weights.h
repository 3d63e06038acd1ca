// model/weights.h — the resident (non-routed) weights of the text model, widened to f32, and
// the loader that binds them from a ModelFiles with every shape and dtype checked.
// Owns: Matrix, per-layer weight structs, the embedding row reader. Does not own: routed
// experts (experts/ExpertStore) or the math (one file per layer kind).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "experts/expert_store.h"
#include "io/model_files.h"
#include "kernels/isa.h"
#include "kernels/quant.h"
#include "model/config.h"
#include "options/options.h"

namespace k3 {

// Dense matrices are WeightMatrix (kernels/quant.h): f32, int8 per row or int4 group-64, chosen
// per class at load (LoadOptions bits, mla_bits, head_bits: 4, 8 or 32). Matrices named "f32" below
// always stay f32.
using Matrix = WeightMatrix;

// Bits per class of dense matrix (docs/quant_formats.md §2); 32 keeps f32.
struct KdaWeights {
  Matrix q_proj, k_proj, v_proj;              // [kda_projection][hidden]
  std::vector<float> q_conv, k_conv, v_conv;  // [kda_projection][short_conv_kernel_size]
  Matrix f_a_proj;                            // [kda_head_dim][hidden] f32
  Matrix f_b_proj;                            // [kda_projection][kda_head_dim] f32
  Matrix b_proj;                              // [kda_num_heads][hidden] f32
  std::vector<float> a_exp;                   // [kda_num_heads] exp(A_log[h])
  std::vector<float> dt_bias;                 // [kda_projection]
  Matrix g_proj;                              // [kda_projection][hidden]
  std::vector<float> o_norm;                  // [kda_head_dim]
  Matrix o_proj;                              // [hidden][kda_projection]
};

struct MlaWeights {
  Matrix q_a_proj;               // [q_lora_rank][hidden]
  std::vector<float> q_a_norm;   // [q_lora_rank]
  Matrix q_b_proj;               // [heads * qk_head_dim][q_lora_rank]
  Matrix kv_a_proj;              // [kv_lora_rank + qk_rope_head_dim][hidden]
  std::vector<float> kv_a_norm;  // [kv_lora_rank]
  Matrix kv_b_proj;              // [heads * (qk_nope_head_dim + v_head_dim)][kv_lora_rank]
  Matrix g_proj;                 // [heads * v_head_dim][hidden]
  Matrix o_proj;                 // [hidden][heads * v_head_dim]
};

struct DenseMlpWeights {
  Matrix gate_proj, up_proj;  // [intermediate_size][hidden]
  Matrix down_proj;           // [hidden][intermediate_size]
};

struct MoeWeights {
  Matrix router;                   // [num_experts][hidden] f32
  std::vector<float> router_bias;  // [num_experts] e_score_correction_bias (selection only)
  Matrix latent_down;              // [routed_expert_hidden_size][hidden]
  std::vector<float> latent_norm;  // [routed_expert_hidden_size]
  Matrix latent_up;                // [hidden][routed_expert_hidden_size]
  Matrix shared_gate, shared_up;   // [shared_intermediate][hidden]
  Matrix shared_down;              // [hidden][shared_intermediate]
};

struct LayerWeights {
  std::vector<float> input_norm;      // [hidden]
  std::vector<float> post_attn_norm;  // [hidden]
  std::vector<float>
      attn_res_query;  // [hidden] self_attention_res_norm ⊙ self_attention_res_proj[0]
  std::vector<float> mlp_res_query;  // [hidden] mlp_res_norm ⊙ mlp_res_proj[0]
  std::optional<KdaWeights> kda;
  std::optional<MlaWeights> mla;
  std::optional<DenseMlpWeights> dense;
  std::optional<MoeWeights> moe;
};

// Reads one embedding row per token straight from the shard (the table is not resident, so it is
// not scanned at load: each row is checked for non-finite values when it is converted).
class EmbeddingReader {
 public:
  EmbeddingReader(LocatedTensor table, int64_t vocab_size, int64_t hidden_size)
      : table_(table), vocab_size_(vocab_size), hidden_size_(hidden_size) {}
  // out[hidden]; `scratch` holds the stored row bytes (reused across calls, so a decode step
  // allocates nothing). Throws k3::Error for an id outside the vocabulary, a read error or a
  // non-finite value in the row (naming the tensor and the element).
  void row(int64_t token_id, float* out, std::vector<uint8_t>& scratch) const;

 private:
  LocatedTensor table_;
  int64_t vocab_size_;
  int64_t hidden_size_;
};

struct ModelWeights {
  std::vector<LayerWeights> layers;          // [layers run]
  std::optional<EmbeddingReader> embedding;  // absent in partial snapshots (use K3_X0)
  std::optional<Matrix> lm_head;             // [vocab][hidden]; absent -> no logits
  std::vector<float> final_norm;             // [hidden]
  std::vector<float> output_res_query;       // [hidden]
  std::unique_ptr<ExpertStore> experts;
  uint64_t file_bytes = 0;  // bytes of the files read or mapped at load (routed experts aside)
};

// The width each class of dense matrix is loaded at: the requested one, except that a repacked
// container keeps its stored width for every class the user did not choose (docs/container.md §5).
struct ClassWidths {
  int bits = 0, mla_bits = 0, head_bits = 0;
};
ClassWidths effective_widths(const LoadOptions& load, const ContainerInfo& container);

// Binds every resident weight of layers [0, num_layers) and the globals. `num_layers` <=
// config.num_hidden_layers (K3_LAYERS). Throws k3::Error naming the tensor and the expected and
// actual shape or dtype.
// Dense matrices are quantised to `load`'s bits (KDA, latent, shared-expert and dense matrices),
// mla_bits (MLA projections) and head_bits (lm_head) as they are loaded with `kernels`' row
// quantisers (the same bytes on every ISA), into their final buffers in blocks of rows on all
// threads: no f32 copy of a matrix. The blocks are read through the engine's read queue
// (io/read_queue.h: io_uring, O_DIRECT unless load.cache.direct is off), each thread keeping its
// next blocks in flight while it converts one; the threads' rings of block buffers are the only
// overhead. `on_progress` (optional) sees the finished fraction of the bytes to read as they are
// read (block by block, quantisation counted), rising, and 1 once at the end. `cancel`
// (optional) is polled before every tensor and every block: when it reads true the load stops
// and throws k3::Interrupted (util/error.h), so a signal during a long load is acted on within a
// block's read.
ModelWeights load_weights(const ModelFiles& files, const K3Config& config, int64_t num_layers,
                          const LoadOptions& load, const KernelTable& kernels,
                          const std::function<void(double)>& on_progress = {},
                          const std::atomic<bool>* cancel = nullptr);

// The routed experts of the first `num_layers` layers, and nothing else: where each expert's
// tensors are (checked for dtype and shape; no byte is read). What an expert-parallel worker rank
// loads (docs/scale-out.md §2). Throws k3::Error naming the tensor.
std::unique_ptr<ExpertStore> load_expert_store(const ModelFiles& files, const K3Config& config,
                                               int64_t num_layers);

// Every dense matrix of the loaded layers and the head, in a fixed order (for passes over all
// of them: byte counts, load-time flags).
void for_each_matrix(const ModelWeights& weights, const std::function<void(const Matrix&)>& visit);
void for_each_matrix(ModelWeights& weights, const std::function<void(Matrix&)>& visit);

}  // namespace k3

// model/model.h — the Kimi K3 text stack: embedding, AttnRes bookkeeping around each layer's
// attention (KDA or MLA) and feed-forward (dense or LatentMoE), the output mix and the head.
// Owns: the per-token walk over layers (docs/architecture.md §3.3):
//
//   a_in  = (no blocks yet) ? partial : Mix(blocks + [partial], w_attn[i])
//   if i % attn_res_block_size == 0: blocks.append(partial)        (the block is closed before
//   attention) att   = Attention_i(RMSNorm(a_in, input_layernorm[i])) partial = block start ? att :
//   partial + att m_in  = Mix(blocks + [partial], w_mlp[i]) partial += FFN_i(RMSNorm(m_in,
//   post_attention_layernorm[i])) final_hidden = Mix(blocks + [partial], w_out) ; logits = lm_head
//   RMSNorm(final_hidden, norm)
//
// Thread-safety: a Model is read-only after construction; one ModelState per sequence.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "experts/expert_cache.h"
#include "io/model_files.h"
#include "kernels/isa.h"
#include "model/compute.h"
#include "model/config.h"
#include "model/expert_executor.h"
#include "model/latent_moe.h"
#include "model/state.h"
#include "model/vk_tier.h"
#include "model/weights.h"
#include "options/options.h"

namespace k3 {

// Receives intermediate tensors of the forward passes (validation traces). For each (layer,
// site) the calls come in position order; a chunked prefill makes them layer-major inside a
// chunk (all rows of layer l, then layer l + 1), so an observer must key by layer and site.
class ForwardObserver {
 public:
  enum class Site { kAttnIn, kAttnOut, kMlpIn, kMlpOut, kLayerOut, kFinalHidden };
  virtual ~ForwardObserver() = default;
  // `layer` is -1 for kFinalHidden. data: [hidden].
  virtual void on_tensor(int64_t layer, Site site, const float* data) = 0;
  virtual void on_routing(int64_t layer, const RoutingResult& routing) = 0;
};

// What the model is given beside the user's LoadOptions: the kernel variant chosen for this CPU
// (from LoadOptions::isa) and an optional load-progress callback.
struct ModelSetup {
  Isa isa = Isa::kScalar;
  std::function<void(double fraction)> on_load_progress;  // after each loaded layer
  // Polled between tensors (and between 8 MB pieces of a large one) while the weights load;
  // when it reads true the constructor throws Interrupted. nullptr = never cancelled.
  const std::atomic<bool>* cancel = nullptr;
  // Expert executors asked for a MoE step's experts before the RAM cache + CPU kernels, in this
  // order (model/expert_executor.h: a device tier, remote ranks). Shared with the caller, which
  // may keep a handle for their reports.
  std::vector<std::shared_ptr<ExpertExecutor>> executors;
  // Bytes held back for the sessions the caller will allocate (coli serve --parallel): the expert
  // cache sizes itself in the memory left after them (ExpertCacheSetup::reserved_bytes).
  uint64_t session_reserve_bytes = 0;
};

class Model {
 public:
  // Binds the weights (quantised per `load`: bits, mla_bits, head_bits, idot) and builds the
  // routed-expert cache over them (load.cache). `files` must outlive the model. Throws
  // k3::Error.
  Model(const ModelFiles& files, const K3Config& config, const LoadOptions& load,
        const ModelSetup& setup);
  ~Model();

  const K3Config& config() const { return config_; }
  const LoadOptions& load_options() const { return load_; }
  Isa isa() const { return compute_.kernels->isa; }
  // The routed experts (counters, history, run-time switches). Thread-safe.
  ExpertCache& experts() const { return *experts_; }
  // The Vulkan expert tier (COLI_VULKAN), or nullptr.
  const VkTier* vk_tier() const { return vk_tier_.get(); }
  VkTier* vk_tier() { return vk_tier_.get(); }
  // Bytes of resident weights (dense matrices in their RAM formats and vectors).
  uint64_t resident_bytes() const;
  // Bytes of the model's files read (or mapped) by the load: every resident tensor as stored.
  uint64_t load_file_bytes() const { return weights_.file_bytes; }
  // Bytes of dense matrices used in place from file mappings (K3_MMAP=1; 0 otherwise).
  uint64_t mapped_bytes() const;
  // The repacked container's record (present false for a Hugging Face snapshot).
  const ContainerInfo& container() const { return container_; }
  int64_t num_layers() const { return static_cast<int64_t>(weights_.layers.size()); }
  bool has_embedding() const { return weights_.embedding.has_value(); }
  bool has_head() const { return weights_.lm_head.has_value(); }

  // A fresh sequence state holding `capacity` positions, its scratch sized for forward passes of
  // `rows` rows (larger passes grow it once).
  ModelState new_state(int64_t capacity, size_t rows = 1) const {
    return ModelState(config_, num_layers(), capacity, rows);
  }

  // Embedding row of `token_id` into out[hidden]. Throws k3::Error when the model has none.
  void embed(ModelState& state, int64_t token_id, float* out) const;

  // Runs n consecutive tokens whose input rows are x0 [n][hidden] (positions state.position + t;
  // n = 1 in decode) layer-major: every layer for all n rows, then the next; dense matrices,
  // router, latent projections and shared experts batched over the rows, each distinct routed
  // expert asked for once for all its rows, the sequential state (KDA, MLA cache, AttnRes)
  // advanced token by token in order. Advances the state and writes the output AttnRes mix to
  // final_hidden [n][hidden]. Every row is bit-identical for every n. The per-layer trace goes
  // to `observer`; stage times to state.stats. Polls state.interrupt before every layer.
  // Allocates nothing once the state has held n rows. Throws k3::Error when the n rows do not
  // fit the context capacity.
  void forward(ModelState& state, const float* x0, size_t n, float* final_hidden,
               ForwardObserver* observer) const;

  // One decode step of several sequences in one pass: row i of x0 [n][hidden] (n =
  // states.size()) is the next token of *states[i], at that sequence's position. The same walk as
  // forward() over n rows (dense matrices stream once for all rows, each distinct routed expert
  // is asked for once for the rows that chose it), with each row's KDA state, MLA rows and
  // position its own sequence's; each row's final_hidden [n][hidden] is bit-identical to a
  // forward() of that sequence alone. Scratch in `work` (grown once for n rows and the longest
  // context), stage times to `stats`. Polls `interrupt` (not the sequences' own flags: one
  // sequence's cancellation must not stop the others) before every layer; Interrupted leaves
  // every sequence part-advanced. Advances every position by one. Throws k3::Error when a
  // sequence is full or appears twice.
  void forward_batch(std::span<ModelState* const> states, Workspace& work, StageStats& stats,
                     const std::atomic<bool>* interrupt, const float* x0,
                     float* final_hidden) const;

  // logits[vocab] = lm_head RMSNorm(final_hidden, model.norm). With `only` (sorted, disjoint
  // vocabulary ranges: a grammar's allowed ids, engine/engine.cpp), the logits of those ranges,
  // each bit-identical to the full head's, and -infinity elsewhere. REQUIRES has_head().
  void head(ModelState& state, const float* final_hidden, float* logits,
            const std::vector<RowRange>* only = nullptr) const;
  // The head on n rows at once (lm_head streams once): logits [n][vocab], each row bit-identical
  // to head() of that row; `only` as for head(), for every row, unless the dense executor (the
  // Vulkan tier) takes the n rows: then the whole head. Scratch: work.normed (grown to n rows).
  // REQUIRES has_head().
  void head_rows(Workspace& work, StageStats& stats, const float* final_hidden, size_t n,
                 float* logits, const std::vector<RowRange>* only = nullptr) const;

 private:
  // The layer walk of forward() and forward_batch() over the n rows of work.sequence_rows, with
  // `compute` (forward(): the dense executor for prompt chunks; forward_batch(): none).
  void forward_rows(const Compute& compute, Workspace& work, StageStats& stats,
                    const std::atomic<bool>* interrupt, const float* x0, size_t n,
                    float* final_hidden, ForwardObserver* observer) const;
  // The MoE layer after `layer` (whose experts a read-ahead guesses), or none.
  NextMoe next_moe(int64_t layer) const;

  const ModelFiles& files_;
  K3Config config_;
  LoadOptions load_;
  Compute compute_;  // dense = null: forward() adds the device's dense executor (COLI_VK_DENSE)
  ModelWeights weights_;
  ContainerInfo container_;
  std::unique_ptr<ExpertCache> experts_;
  std::shared_ptr<VkTier> vk_tier_;                         // COLI_VULKAN: the device tier
  std::vector<std::shared_ptr<ExpertExecutor>> executors_;  // owned with the caller
  std::vector<ExpertExecutor*> executor_list_;              // what compute_.executors views
};

}  // namespace k3

// model/model.h — the Kimi K3 text stack: embedding, AttnRes bookkeeping around each layer's
// attention (KDA or MLA) and feed-forward (dense or LatentMoE), the output mix and the head.
// Owns: the per-token walk over layers (ARCHITECTURE.md §3.3):
//
//   a_in  = (no blocks yet) ? partial : Mix(blocks + [partial], w_attn[i])
//   if i % attn_res_block_size == 0: blocks.append(partial)        (snapshot before attention)
//   att   = Attention_i(RMSNorm(a_in, input_layernorm[i]))
//   partial = block start ? att : partial + att
//   m_in  = Mix(blocks + [partial], w_mlp[i])
//   partial += FFN_i(RMSNorm(m_in, post_attention_layernorm[i]))
//   final_hidden = Mix(blocks + [partial], w_out) ; logits = lm_head RMSNorm(final_hidden, norm)
//
// Thread-safety: a Model is read-only after construction; one ModelState per sequence.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/snapshot.h"
#include "model/config.h"
#include "model/compute.h"
#include "model/latent_moe.h"
#include "model/state.h"
#include "model/weights.h"

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

// How the model is loaded and computed (typed sub-options; built by the engine from Options).
struct ModelOptions {
  int64_t layers = 0;       // run only the first N layers (0 = all)
  LoadPrecision precision;  // dense-matrix formats (32 = f32)
  bool idot = false;        // MXFP4 experts and int4 matrices on the integer-dot path (q8 activations)
  double expert_top_p = 0;  // K3_TOPP: routed experts kept up to this cumulative weight (0 = all)
  Isa isa = Isa::kScalar;   // kernel variant (callers pass best_isa() unless forced)
  bool experts_in_memory = false;  // read every routed expert into RAM at load
  // The routed-expert cache (budget, O_DIRECT, history). all_resident, history_layers and
  // model_identity are filled in by the model.
  ExpertCacheOptions cache;
  int64_t chunk = 32;       // prompt tokens per layer-major prefill chunk (1 = token at a time)
  // K3_PREFETCH: while a MoE layer runs, read ahead the experts the next MoE layer's router picks
  // for this layer's input (timing only: the real router decides).
  bool prefetch = false;
  std::function<void(double fraction)> on_load_progress;  // optional: after each loaded layer
};

class Model {
 public:
  // Binds the weights (quantised per `options.precision`). `snapshot` must outlive the model.
  // Throws k3::Error.
  Model(const Snapshot& snapshot, const K3Config& config, const ModelOptions& options);

  const K3Config& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  // The routed experts (counters, history). Thread-safe.
  ExpertCache& experts() const { return *experts_; }
  // The read-ahead target of MoE layer `layer`: the next MoE layer, when prefetch is on.
  NextMoe next_moe(int64_t layer) const;
  // K3_PREFETCH at run time (benchmarks compare both in one process).
  void set_prefetch(bool on) const { prefetch_.store(on, std::memory_order_relaxed); }
  // Bytes of resident weights (dense matrices in their RAM formats and vectors).
  uint64_t resident_bytes() const;
  int64_t num_layers() const { return static_cast<int64_t>(weights_.layers.size()); }
  bool has_embedding() const { return weights_.embedding.has_value(); }
  bool has_head() const { return weights_.lm_head.has_value(); }

  ModelState new_state(int64_t capacity) const { return ModelState(config_, num_layers(), capacity); }

  // Embedding row of `token_id` into out[hidden].
  void embed(ModelState& state, int64_t token_id, float* out) const;
  // The per-layer trace of a forward pass is routed through `observer`; stage times go to
  // state.stats.

  // Runs one token whose input row is x0[hidden] at state.position, advances the state and
  // writes the output AttnRes mix to final_hidden[hidden]. Throws k3::Error when the state is full.
  void forward(ModelState& state, const float* x0, float* final_hidden,
               ForwardObserver* observer) const;

  // Runs n consecutive tokens (rows x0 [n][hidden], positions state.position + t) layer-major:
  // every layer for all n rows, then the next; dense matrices, router, latent projections and
  // shared experts batched over the rows, each distinct routed expert read once for all its
  // rows, the sequential state (KDA, MLA cache, AttnRes) advanced token by token in order.
  // Writes final_hidden [n][hidden]. Every row bit-identical to n calls of forward(). Polls
  // state.interrupt before every layer. Throws k3::Error when the n rows do not fit.
  void forward_chunk(ModelState& state, const float* x0, size_t n, float* final_hidden,
                     ForwardObserver* observer) const;

  // logits[vocab] = lm_head RMSNorm(final_hidden, model.norm). REQUIRES has_head().
  void head(ModelState& state, const float* final_hidden, float* logits) const;

 private:
  const Snapshot& snapshot_;
  K3Config config_;
  mutable std::atomic<bool> prefetch_{false};
  ModelOptions options_;
  Compute compute_;
  ModelWeights weights_;
  std::unique_ptr<ExpertCache> experts_;
};

}  // namespace k3

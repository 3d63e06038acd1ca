#include "model/model.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "experts/expert_cache.h"
#include "kernels/vec.h"
#include "model/attn_res.h"
#include "model/dense_mlp.h"
#include "model/kda.h"
#include "model/mla.h"
#include "model/tensor_names.h"
#include "model/vk_tier.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3 {

namespace {

// The history file's identity of a model: its geometry (another checkpoint of the same shape
// shares it; a different shape never does).
std::string model_identity(const K3Config& c) {
  return "kimi_k3 layers " + std::to_string(c.num_hidden_layers) + " experts " +
         std::to_string(c.num_experts) + " top " + std::to_string(c.num_experts_per_token) +
         " hidden " + std::to_string(c.hidden_size) + " routed " +
         std::to_string(c.routed_expert_hidden_size) + " inter " +
         std::to_string(c.moe_intermediate_size);
}

}  // namespace

Model::Model(const ModelFiles& files, const K3Config& config, const LoadOptions& load,
             const ModelSetup& setup)
    : files_(files), config_(config), load_(load) {
  compute_.kernels = &kernel_table(setup.isa);
  compute_.idot = load_.idot;
  compute_.expert_top_p = load_.expert_top_p;
  compute_.kda_chunked = load_.kda_chunked;
  int64_t num_layers = load_.layers;
  if (num_layers <= 0 || num_layers > config_.num_hidden_layers)
    num_layers = config_.num_hidden_layers;
  weights_ = load_weights(files_, config_, num_layers, load_, *compute_.kernels,
                          setup.on_load_progress, setup.cancel);
  container_ = files_.container();
  if (load_.chunk <= 0) load_.chunk = auto_prefill_chunk(config_, available_memory_bytes());
  // K3_IDOT: int4 and int8 matrices take the integer-dot kernels on q8 activations, like the
  // experts (int8 needs whole 32-column blocks of activations).
  for_each_matrix(weights_, [&](Matrix& m) {
    m.int8_activations = load_.idot && (m.format == WeightFormat::kInt4G64 ||
                                        (m.format == WeightFormat::kInt8Row && m.cols % 32 == 0));
  });
  if (load_.experts_in_memory && !weights_.experts->load_all(setup.cancel)) throw Interrupted();
  ExpertCacheSetup cache;
  for (int64_t l = 0; l < num_layers; ++l)
    if (weights_.layers[static_cast<size_t>(l)].moe) cache.moe_layers.push_back(l);
  cache.num_experts = config_.num_experts;
  cache.all_resident = load_.experts_in_memory;
  cache.reserved_bytes = setup.session_reserve_bytes;
  cache.history_layers = config_.num_hidden_layers;
  cache.model_identity = model_identity(config_);
  locate_history(load_.cache, files_.dir(), &cache);
  const std::vector<int64_t> moe_layers = cache.moe_layers;
  experts_ = std::make_unique<ExpertCache>(*weights_.experts, load_.cache, std::move(cache));
  if (load_.vulkan.enabled) {
    // The device tier goes first (docs/vulkan.md §5); the RAM cache gives up what it holds.
    const auto note = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    // Candidates for COLI_VK_DENSE: every dense matrix but the head (one row per prompt) and the
    // routers (routing stays with the CPU's kernels).
    std::vector<const Matrix*> dense;
    std::vector<const Matrix*> skip;
    if (weights_.lm_head) skip.push_back(&*weights_.lm_head);
    for (const LayerWeights& l : weights_.layers)
      if (l.moe) skip.push_back(&l.moe->router);
    for_each_matrix(static_cast<const ModelWeights&>(weights_), [&](const Matrix& m) {
      if (std::find(skip.begin(), skip.end(), &m) == skip.end()) dense.push_back(&m);
    });
    vk_tier_ = std::make_shared<VkTier>(config_, load_.vulkan, *experts_, moe_layers, note, dense);
    if (load_.idot)
      note(
          "Vulkan tier: the device computes its experts in f32 (the K3_IDOT=0 numerics); with "
          "K3_IDOT=1 the CPU's differ in the last bits, so tokens may drift from a CPU-only run");
    VkTier* tier = vk_tier_.get();
    experts_->set_held_elsewhere([tier](int64_t l, int64_t e) { return tier->holds(l, e); });
    executor_list_.push_back(tier);
  }
  if (setup.executors.size() >= kUnowned)
    throw Error(std::to_string(setup.executors.size()) + " expert executors: at most " +
                std::to_string(kUnowned - 1) + " beside the CPU");
  executors_ = setup.executors;
  for (const auto& e : executors_) executor_list_.push_back(e.get());
  compute_.executors = executor_list_;
}

Model::~Model() {
  if (experts_) experts_->set_held_elsewhere(nullptr);
}

uint64_t Model::mapped_bytes() const {
  uint64_t total = 0;
  for_each_matrix(weights_, [&](const Matrix& m) { total += m.mapped_bytes(); });
  return total;
}

uint64_t Model::resident_bytes() const {
  uint64_t total = 0;
  auto vec = [&](const std::vector<float>& v) { total += v.size() * sizeof(float); };
  for_each_matrix(weights_, [&](const Matrix& m) { total += m.bytes(); });
  for (const LayerWeights& l : weights_.layers) {
    for (const auto* v : {&l.input_norm, &l.post_attn_norm, &l.attn_res_query, &l.mlp_res_query})
      vec(*v);
    if (l.kda)
      for (const auto* v : {&l.kda->q_conv, &l.kda->k_conv, &l.kda->v_conv, &l.kda->a_exp,
                            &l.kda->dt_bias, &l.kda->o_norm})
        vec(*v);
    if (l.mla) {
      vec(l.mla->q_a_norm);
      vec(l.mla->kv_a_norm);
    }
    if (l.moe) {
      vec(l.moe->router_bias);
      vec(l.moe->latent_norm);
    }
  }
  if (load_.experts_in_memory) total += weights_.experts->total_bytes();
  vec(weights_.final_norm);
  vec(weights_.output_res_query);
  return total;
}

void Model::embed(ModelState& state, int64_t token_id, float* out) const {
  StageTimer timer(state.stats, Stage::kEmbed);
  if (!weights_.embedding)
    throw Error(files_.dir() + ": the model has no embedding table (" + files_.prefix() +
                names::kEmbedTokens + "); the input rows must be given instead of token ids");
  weights_.embedding->row(token_id, out, state.work.embed_bytes);
}

void Model::forward(ModelState& state, const float* x0, size_t n, float* final_hidden,
                    ForwardObserver* observer) const {
  if (state.position + static_cast<int64_t>(n) > state.capacity)
    throw Error("context is full: " + std::to_string(n) + " more rows at position " +
                std::to_string(state.position) + " exceed the context capacity of " +
                std::to_string(state.capacity) + " positions");
  Workspace& ws = state.work;
  ws.reserve(config_, n);
  for (size_t t = 0; t < n; ++t)
    ws.sequence_rows[t] = SequenceRow{&state, state.position + static_cast<int64_t>(t)};
  Compute compute = compute_;
  compute.dense = vk_tier_ ? vk_tier_->dense_executor() : nullptr;
  forward_rows(compute, ws, state.stats, state.interrupt, x0, n, final_hidden, observer);
  state.position += static_cast<int64_t>(n);
}

void Model::forward_batch(std::span<ModelState* const> states, Workspace& ws, StageStats& stats,
                          const std::atomic<bool>* interrupt, const float* x0,
                          float* final_hidden) const {
  const size_t n = states.size();
  for (size_t i = 0; i < n; ++i) {
    const ModelState& s = *states[i];
    if (s.position + 1 > s.capacity)
      throw Error("context is full: sequence " + std::to_string(i) + " of the batch is at " +
                  std::to_string(s.position) + " of its " + std::to_string(s.capacity) +
                  " positions");
    for (size_t j = 0; j < i; ++j)
      if (states[j] == states[i])
        throw Error("a batched step holds sequence " + std::to_string(j) + " twice (also as " +
                    std::to_string(i) + "): each sequence gives one row");
  }
  ws.reserve(config_, n);
  for (size_t i = 0; i < n; ++i) {
    ws.init(config_, states[i]->capacity);  // MLA scores for the longest context
    ws.sequence_rows[i] = SequenceRow{states[i], states[i]->position};
  }
  forward_rows(compute_, ws, stats, interrupt, x0, n, final_hidden, nullptr);
  for (ModelState* s : states) ++s->position;
}

void Model::forward_rows(const Compute& compute, Workspace& ws, StageStats& stats,
                         const std::atomic<bool>* interrupt, const float* x0, size_t n,
                         float* final_hidden, ForwardObserver* observer) const {
  const size_t D = static_cast<size_t>(config_.hidden_size);
  const size_t NB = static_cast<size_t>(config_.num_blocks());
  const double eps = config_.rms_norm_eps;
  const int64_t L = num_layers();
  const SequenceRow* seq_rows = ws.sequence_rows.data();

  size_t num_blocks = 0;               // blocks appended so far (the same for every row)
  float* partial = ws.partial.data();  // [n][hidden] running sum inside the current block
  float* mixed = ws.mixed.data();      // [n][hidden]
  float* normed = ws.normed.data();    // [n][hidden]
  float* branch = ws.branch.data();    // [n][hidden]
  auto block = [&](size_t t, size_t b) {
    return ws.blocks.data() + (t * NB + b) * D;
  };  // row t's block b
  std::copy(x0, x0 + n * D, partial);

  // mixed[t] = Mix(blocks of row t + [partial[t]], query), row by row.
  auto mix = [&](const std::vector<float>& query) {
    StageTimer timer(stats, Stage::kAttnRes);
    for (size_t t = 0; t < n; ++t) {
      for (size_t b = 0; b < num_blocks; ++b) ws.sources[b] = block(t, b);
      ws.sources[num_blocks] = partial + t * D;
      attn_res_mix(ws.sources.data(), num_blocks + 1, query.data(), D, eps, ws.mix_weights.data(),
                   mixed + t * D);
    }
  };
  auto observe = [&](int64_t layer, ForwardObserver::Site site, const float* rows) {
    if (observer)
      for (size_t t = 0; t < n; ++t) observer->on_tensor(layer, site, rows + t * D);
  };

  for (int64_t l = 0; l < L; ++l) {
    if (interrupt && interrupt->load(std::memory_order_relaxed)) throw Interrupted();
    const LayerWeights& lw = weights_.layers[static_cast<size_t>(l)];
    // Attention.
    if (num_blocks == 0)
      std::copy(partial, partial + n * D, mixed);
    else
      mix(lw.attn_res_query);
    observe(l, ForwardObserver::Site::kAttnIn, mixed);
    const bool block_start = config_.is_block_start(l);
    if (block_start) {
      for (size_t t = 0; t < n; ++t)
        std::copy(partial + t * D, partial + (t + 1) * D, block(t, num_blocks));
      ++num_blocks;
    }
    for (size_t t = 0; t < n; ++t)
      rmsnorm(mixed + t * D, lw.input_norm.data(), D, eps, normed + t * D);
    if (lw.kda) {
      StageTimer timer(stats, Stage::kKda);
      kda_forward(config_, compute, *lw.kda, static_cast<size_t>(l), seq_rows, ws, normed, n,
                  branch);
    } else {
      StageTimer timer(stats, Stage::kMla);
      mla_forward(config_, compute, *lw.mla, static_cast<size_t>(l), seq_rows, ws, normed, n,
                  branch);
    }
    observe(l, ForwardObserver::Site::kAttnOut, branch);
    if (block_start)
      std::copy(branch, branch + n * D, partial);
    else
      for (size_t i = 0; i < n * D; ++i) partial[i] += branch[i];
    // Feed-forward.
    mix(lw.mlp_res_query);
    observe(l, ForwardObserver::Site::kMlpIn, mixed);
    for (size_t t = 0; t < n; ++t)
      rmsnorm(mixed + t * D, lw.post_attn_norm.data(), D, eps, normed + t * D);
    if (lw.dense) {
      StageTimer timer(stats, Stage::kDense);
      situ_mlp_forward(config_, compute, lw.dense->gate_proj, lw.dense->up_proj,
                       lw.dense->down_proj, ws, normed, n, branch);
    } else {
      latent_moe_forward(config_, compute, *lw.moe, *experts_, l, ws, stats, normed, n, branch,
                         next_moe(l));
      if (observer)
        for (size_t t = 0; t < n; ++t) observer->on_routing(l, ws.routing[t]);
    }
    observe(l, ForwardObserver::Site::kMlpOut, branch);
    for (size_t i = 0; i < n * D; ++i) partial[i] += branch[i];
    observe(l, ForwardObserver::Site::kLayerOut, partial);
  }
  if (weights_.output_res_query.empty()) {
    std::copy(partial, partial + n * D, final_hidden);
  } else {
    mix(weights_.output_res_query);
    std::copy(mixed, mixed + n * D, final_hidden);
  }
  observe(-1, ForwardObserver::Site::kFinalHidden, final_hidden);
}

NextMoe Model::next_moe(int64_t layer) const {
  for (int64_t l = layer + 1; l < num_layers(); ++l)
    if (const auto& moe = weights_.layers[static_cast<size_t>(l)].moe) return {&*moe, l};
  return {};
}

void Model::head(ModelState& state, const float* final_hidden, float* logits,
                 const std::vector<RowRange>* only) const {
  StageTimer timer(state.stats, Stage::kHead);
  const size_t D = static_cast<size_t>(config_.hidden_size);
  float* normed = state.work.head_normed.data();  // [hidden]
  rmsnorm(final_hidden, weights_.final_norm.data(), D, config_.rms_norm_eps, normed);
  const WeightMatrix& W = *weights_.lm_head;
  if (!only) {
    matmul(*compute_.kernels, W, normed, 1, logits);
    return;
  }
  std::fill_n(logits, static_cast<size_t>(W.rows), -std::numeric_limits<float>::infinity());
  matmul_row_ranges(*compute_.kernels, W, normed, 1, *only, logits);
}

void Model::head_rows(Workspace& ws, StageStats& stats, const float* final_hidden, size_t n,
                      float* logits, const std::vector<RowRange>* only) const {
  StageTimer timer(stats, Stage::kHead);
  const size_t D = static_cast<size_t>(config_.hidden_size);
  ws.reserve(config_, n);
  float* normed = ws.normed.data();  // [n][hidden], free once the walk is done
  for (size_t t = 0; t < n; ++t)
    rmsnorm(final_hidden + t * D, weights_.final_norm.data(), D, config_.rms_norm_eps,
            normed + t * D);
  if (only)
    std::fill_n(logits, n * static_cast<size_t>(weights_.lm_head->rows),
                -std::numeric_limits<float>::infinity());
  matmul_chunk(compute_, *weights_.lm_head, normed, n, logits, only);
}

}  // namespace k3

#include "model/model.h"

#include <algorithm>

#include "kernels/vec.h"
#include "model/attn_res.h"
#include "model/dense_mlp.h"
#include "model/kda.h"
#include "model/mla.h"
#include "model/tensor_names.h"
#include "util/error.h"

namespace k3 {

Model::Model(const Snapshot& snapshot, const K3Config& config, int64_t num_layers)
    : snapshot_(snapshot), config_(config) {
  if (num_layers <= 0 || num_layers > config_.num_hidden_layers) num_layers = config_.num_hidden_layers;
  weights_ = load_weights(snapshot_, config_, num_layers);
}

void Model::embed(int64_t token_id, float* out) const {
  if (!weights_.embedding)
    throw Error(snapshot_.dir() + ": the snapshot has no embedding table (" + snapshot_.prefix() +
                names::kEmbedTokens + "); supply input rows with K3_X0");
  weights_.embedding->row(token_id, out);
}

void Model::forward(ModelState& state, const float* x0, float* final_hidden,
                    ForwardObserver* observer) const {
  if (state.position >= state.capacity)
    throw Error("context is full: " + std::to_string(state.capacity) +
                " positions (raise K3_MAXT / --maxt)");
  const size_t D = static_cast<size_t>(config_.hidden_size);
  const double eps = config_.rms_norm_eps;
  const int64_t L = num_layers();

  std::vector<std::vector<float>> blocks;  // [appended][hidden]
  blocks.reserve(static_cast<size_t>(config_.num_blocks()));
  std::vector<float> partial(x0, x0 + D);  // [hidden] running sum inside the current block
  std::vector<float> mixed(D), normed(D), branch(D);  // [hidden] each
  std::vector<const float*> sources;
  RoutingResult routing;

  auto mix = [&](const std::vector<float>& query) {
    sources.clear();
    for (const auto& b : blocks) sources.push_back(b.data());
    sources.push_back(partial.data());
    attn_res_mix(sources.data(), sources.size(), query.data(), D, eps, mixed.data());
  };
  auto observe = [&](int64_t layer, ForwardObserver::Site site, const float* data) {
    if (observer) observer->on_tensor(layer, site, data);
  };

  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& lw = weights_.layers[static_cast<size_t>(l)];
    // Attention.
    if (blocks.empty())
      mixed = partial;
    else
      mix(lw.attn_res_query);
    observe(l, ForwardObserver::Site::kAttnIn, mixed.data());
    const bool block_start = config_.is_block_start(l);
    if (block_start) blocks.push_back(partial);
    rmsnorm(mixed.data(), lw.input_norm.data(), D, eps, normed.data());
    if (lw.kda)
      kda_forward(config_, *lw.kda, state.kda[static_cast<size_t>(l)], normed.data(), branch.data());
    else
      mla_forward(config_, *lw.mla, state.mla[static_cast<size_t>(l)], state.position, normed.data(), branch.data());
    observe(l, ForwardObserver::Site::kAttnOut, branch.data());
    if (block_start)
      partial = branch;
    else
      for (size_t i = 0; i < D; ++i) partial[i] += branch[i];
    // Feed-forward.
    mix(lw.mlp_res_query);
    observe(l, ForwardObserver::Site::kMlpIn, mixed.data());
    rmsnorm(mixed.data(), lw.post_attn_norm.data(), D, eps, normed.data());
    if (lw.dense) {
      situ_mlp_forward(config_, lw.dense->gate_proj, lw.dense->up_proj, lw.dense->down_proj, normed.data(), branch.data());
    } else {
      latent_moe_forward(config_, *lw.moe, *weights_.experts, l, normed.data(), branch.data(), &routing);
      if (observer) observer->on_routing(l, routing);
    }
    observe(l, ForwardObserver::Site::kMlpOut, branch.data());
    for (size_t i = 0; i < D; ++i) partial[i] += branch[i];
    observe(l, ForwardObserver::Site::kLayerOut, partial.data());
  }
  if (weights_.output_res_query.empty()) {
    std::copy(partial.begin(), partial.end(), final_hidden);
  } else {
    mix(weights_.output_res_query);
    std::copy(mixed.begin(), mixed.end(), final_hidden);
  }
  observe(-1, ForwardObserver::Site::kFinalHidden, final_hidden);
  ++state.position;
}

void Model::head(const float* final_hidden, float* logits) const {
  const size_t D = static_cast<size_t>(config_.hidden_size);
  std::vector<float> normed(D);  // [hidden]
  rmsnorm(final_hidden, weights_.final_norm.data(), D, config_.rms_norm_eps, normed.data());
  weights_.lm_head->apply(normed.data(), logits);
}

}  // namespace k3

#include "engine/engine.h"

#include "util/error.h"
#include "util/sys.h"

namespace k3 {

Engine::Engine(const std::string& model_dir, const LoadOptions& load) {
  const double start = now_seconds();
  snapshot_ = std::make_unique<Snapshot>(model_dir);
  config_ = parse_k3_config(snapshot_->config_root(), model_dir + "/config.json");
  if (load.layers > config_.num_hidden_layers)
    throw Error("K3_LAYERS=" + std::to_string(load.layers) + " exceeds the model's " +
                std::to_string(config_.num_hidden_layers) + " layers");
  model_ = std::make_unique<Model>(*snapshot_, config_, load.layers);
  load_seconds_ = now_seconds() - start;
}

Session::Session(const Engine& engine, int64_t capacity)
    : engine_(engine), state_(engine.model().new_state(capacity)) {}

void Session::set_input_rows(std::vector<float> x0) {
  const size_t D = static_cast<size_t>(engine_.config().hidden_size);
  if (x0.size() % D != 0)
    throw Error("input rows: " + std::to_string(x0.size()) + " floats is not a multiple of hidden_size " +
                std::to_string(D));
  x0_ = std::move(x0);
}

void Session::feed(int64_t id, float* final_hidden, ForwardObserver* observer) {
  const Model& model = engine_.model();
  const size_t D = static_cast<size_t>(engine_.config().hidden_size);
  if (id < 0 || id >= engine_.config().vocab_size)
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                std::to_string(engine_.config().vocab_size) + ")");
  std::vector<float> x0(D);  // [hidden]
  const size_t pos = static_cast<size_t>(state_.position);
  if (!x0_.empty()) {
    if ((pos + 1) * D > x0_.size())
      throw Error("K3_X0 holds " + std::to_string(x0_.size() / D) + " rows but position " +
                  std::to_string(pos) + " was processed");
    std::copy(x0_.begin() + static_cast<std::ptrdiff_t>(pos * D),
              x0_.begin() + static_cast<std::ptrdiff_t>((pos + 1) * D), x0.begin());
  } else {
    model.embed(id, x0.data());
  }
  model.forward(state_, x0.data(), final_hidden, observer);
  tokens_.push_back(id);
}

std::vector<float> Session::prefill(std::span<const int64_t> ids, const PrefillHooks& hooks) {
  const Model& model = engine_.model();
  const size_t D = static_cast<size_t>(engine_.config().hidden_size);
  const size_t V = static_cast<size_t>(engine_.config().vocab_size);
  if (state_.position + static_cast<int64_t>(ids.size()) > state_.capacity)
    throw Error("prompt of " + std::to_string(ids.size()) + " tokens does not fit: " +
                std::to_string(state_.position) + " of " + std::to_string(state_.capacity) +
                " positions used (raise K3_MAXT / --maxt)");
  std::vector<float> hidden(D), logits;  // [hidden], [vocab]
  if (hooks.all_logits) hooks.all_logits->clear();
  for (size_t t = 0; t < ids.size(); ++t) {
    feed(ids[t], hidden.data(), hooks.observer);
    const bool last = t + 1 == ids.size();
    if (model.has_head() && (last || hooks.all_logits)) {
      logits.assign(V, 0.0f);
      model.head(hidden.data(), logits.data());
      if (hooks.all_logits) hooks.all_logits->insert(hooks.all_logits->end(), logits.begin(), logits.end());
    }
  }
  return logits;
}

std::vector<float> Session::step(int64_t id) {
  const int64_t one[1] = {id};
  return prefill(one);
}

void Session::reset() {
  state_.reset();
  tokens_.clear();
}

}  // namespace k3

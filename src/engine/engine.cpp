#include "engine/engine.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "experts/expert_cache.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3 {
namespace {

// The kernel variant K3_ISA asks for, checked against this CPU.
Isa chosen_isa(const std::string& name) {
  Isa isa = Isa::kScalar;
  if (name == "auto") return best_isa();
  if (!parse_isa(name, &isa)) throw Error("K3_ISA: unknown kernel variant \"" + name + "\"");
  if (!isa_supported(isa)) throw Error("K3_ISA=" + name + ": this CPU cannot run the " + name + " kernels");
  return isa;
}

}  // namespace

Engine::Engine(const std::string& model_dir, const LoadOptions& load,
               const std::function<void(double)>& on_progress) {
  const double start = now_seconds();
  snapshot_ = std::make_unique<Snapshot>(model_dir, load.extra_dirs);
  config_ = parse_k3_config(snapshot_->config_root(), model_dir + "/config.json");
  if (load.layers > config_.num_hidden_layers)
    throw Error("K3_LAYERS=" + std::to_string(load.layers) + " exceeds the model's " +
                std::to_string(config_.num_hidden_layers) + " layers");
  // The tokenizer first: a broken tiktoken.model fails in a second, not after the weights.
  if (text::Tokenizer::available(model_dir)) {
    tokenizer_ = std::make_unique<text::Tokenizer>(text::Tokenizer::load(model_dir));
    if (tokenizer_->vocab_size() > config_.vocab_size)
      throw Error(model_dir + "/tiktoken.model: the tokenizer has " + std::to_string(tokenizer_->vocab_size()) +
                  " ids but config.json vocab_size is " + std::to_string(config_.vocab_size));
  }
  ModelSetup setup;
  setup.isa = chosen_isa(load.isa);
  setup.on_load_progress = on_progress;
  model_ = std::make_unique<Model>(*snapshot_, config_, load, setup);
  load_seconds_ = now_seconds() - start;
}

std::string Engine::describe() const {
  const LoadOptions& o = model_->load_options();
  char buf[160];
  std::snprintf(buf, sizeof buf, "isa %s | bits %d/%d/%d | idot %d | resident %.1f MB", isa_name(model_->isa()),
                o.bits, o.mla_bits, o.head_bits, o.idot ? 1 : 0,
                static_cast<double>(model_->resident_bytes()) / 1e6);
  return buf;
}

std::string Engine::describe_experts() const {
  const ExpertCacheStats s = model_->experts().stats();
  char buf[360];
  int n = std::snprintf(buf, sizeof buf,
                        "experts: %llu hits / %llu misses (%.1f%% hit) | %.2f GB read at %.2f GB/s busy | wait %.2f s",
                        static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.misses),
                        100.0 * s.hit_ratio(), static_cast<double>(s.bytes_read) / 1e9,
                        s.busy_seconds > 0 ? static_cast<double>(s.drive_bytes) / 1e9 / s.busy_seconds : 0.0, s.wait_seconds);
  if (s.prefetch_issued > 0 && n > 0 && static_cast<size_t>(n) < sizeof buf)
    std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), " | prefetch %llu read, %.1f%% used, recall %.1f%%",
                  static_cast<unsigned long long>(s.prefetch_issued),
                  100.0 * static_cast<double>(s.prefetch_used) / static_cast<double>(s.prefetch_issued), 100.0 * s.recall());
  return buf;
}

void Engine::save_history() const {
  ExpertCache& cache = model_->experts();
  if (cache.history_total() == 0) return;
  cache.save_history();
}

Session::Session(const Engine& engine, int64_t capacity)
    : engine_(engine), state_(engine.model().new_state(capacity)), chunk_(engine.model().load_options().chunk) {
  tokens_.reserve(static_cast<size_t>(capacity));
  logits_.reserve(static_cast<size_t>(engine.config().vocab_size));
  // A step (one row) allocates nothing.
  chunk_x0_.resize(static_cast<size_t>(engine.config().hidden_size));
  chunk_hidden_.resize(static_cast<size_t>(engine.config().hidden_size));
}

void Session::set_input_rows(std::vector<float> x0) {
  const size_t D = static_cast<size_t>(engine_.config().hidden_size);
  if (x0.size() % D != 0)
    throw Error("input rows: " + std::to_string(x0.size()) + " floats is not a multiple of hidden_size " +
                std::to_string(D));
  x0_ = std::move(x0);
}

void Session::check_id(int64_t id) const {
  if (id < 0 || id >= engine_.config().vocab_size)
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                std::to_string(engine_.config().vocab_size) + ")");
}

void Session::input_row(int64_t id, size_t pos, float* x0) {
  const size_t D = static_cast<size_t>(engine_.config().hidden_size);
  if (!x0_.empty()) {
    if ((pos + 1) * D > x0_.size())
      throw Error("K3_X0 holds " + std::to_string(x0_.size() / D) + " rows but position " +
                  std::to_string(pos) + " was processed");
    std::copy(x0_.begin() + static_cast<std::ptrdiff_t>(pos * D),
              x0_.begin() + static_cast<std::ptrdiff_t>((pos + 1) * D), x0);
  } else {
    engine_.model().embed(state_, id, x0);
  }
}

void Session::feed_chunk(std::span<const int64_t> ids, ForwardObserver* observer) {
  const size_t D = static_cast<size_t>(engine_.config().hidden_size);
  const size_t n = ids.size();
  for (int64_t id : ids) check_id(id);
  chunk_x0_.resize(n * D);
  chunk_hidden_.resize(n * D);
  for (size_t t = 0; t < n; ++t) input_row(ids[t], static_cast<size_t>(state_.position) + t, chunk_x0_.data() + t * D);
  engine_.model().forward(state_, chunk_x0_.data(), n, chunk_hidden_.data(), observer);
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
}

const std::vector<float>& Session::prefill(std::span<const int64_t> ids, const PrefillHooks& hooks) {
  const Model& model = engine_.model();
  const size_t V = static_cast<size_t>(engine_.config().vocab_size);
  const size_t D = static_cast<size_t>(engine_.config().hidden_size);
  if (state_.position + static_cast<int64_t>(ids.size()) > state_.capacity)
    throw Error("prompt of " + std::to_string(ids.size()) + " tokens does not fit: " +
                std::to_string(state_.position) + " of " + std::to_string(state_.capacity) +
                " positions used (raise K3_MAXT / --maxt)");
  if (hooks.all_logits) hooks.all_logits->clear();
  logits_.clear();
  const size_t chunk = static_cast<size_t>(std::max<int64_t>(chunk_, 1));
  for (size_t t0 = 0; t0 < ids.size();) {
    const size_t n = std::min(chunk, ids.size() - t0);
    feed_chunk(ids.subspan(t0, n), hooks.observer);
    const float* hidden = chunk_hidden_.data();  // [n][hidden] final hidden rows of this chunk
    t0 += n;
    const bool last = t0 == ids.size();
    if (!model.has_head() || !(last || hooks.all_logits)) continue;
    // The head on the chunk's last row only, or on every row when all logits are asked for.
    for (size_t t = hooks.all_logits ? 0 : n - 1; t < n; ++t) {
      logits_.resize(V);
      model.head(state_, hidden + t * D, logits_.data());
      if (hooks.all_logits) hooks.all_logits->insert(hooks.all_logits->end(), logits_.begin(), logits_.end());
    }
  }
  return logits_;
}

const std::vector<float>& Session::step(int64_t id) {
  const int64_t one[1] = {id};
  return prefill(one);
}

size_t Session::photo_floats() const {
  size_t n = 0;
  for (const KdaState& k : state_.kda) n += k.q_window.size() + k.k_window.size() + k.v_window.size() + k.recurrent.size();
  return n;
}

void Session::take_photo(StatePhoto& out) const {
  out.position = state_.position;
  out.ids = tokens_;
  out.kda.resize(photo_floats());
  float* dst = out.kda.data();
  for (const KdaState& k : state_.kda)
    for (const std::vector<float>* v : {&k.q_window, &k.k_window, &k.v_window, &k.recurrent})
      dst = std::copy(v->begin(), v->end(), dst);
}

void Session::restore_photo(const StatePhoto& photo) {
  const size_t pos = static_cast<size_t>(photo.position);
  if (photo.kda.size() != photo_floats() || photo.ids.size() != pos || pos > tokens_.size() ||
      !std::equal(photo.ids.begin(), photo.ids.end(), tokens_.begin()))
    throw Error("state photo at position " + std::to_string(pos) + " does not match this session (" +
                std::to_string(photo.kda.size()) + " of " + std::to_string(photo_floats()) + " floats, " +
                std::to_string(tokens_.size()) + " ids fed)");
  const float* src = photo.kda.data();
  for (KdaState& k : state_.kda)
    for (std::vector<float>* v : {&k.q_window, &k.k_window, &k.v_window, &k.recurrent}) {
      std::copy(src, src + v->size(), v->begin());
      src += v->size();
    }
  state_.position = photo.position;
  tokens_.resize(pos);
}

void Session::reset() {
  state_.reset();
  state_.stats.reset();
  tokens_.clear();
}

}  // namespace k3

#include "engine/engine.h"

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "dist/expert_parallel.h"
#include "engine/internal.h"
#include "experts/expert_cache.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3 {
namespace {

// Bytes a float buffer holds (its capacity), for the memory split's activations.
int64_t floats(const std::vector<float>& v) {
  return static_cast<int64_t>(v.capacity() * sizeof(float));
}

// The kernel variant K3_ISA asks for, checked against this CPU.
Isa chosen_isa(const std::string& name) {
  Isa isa = Isa::kScalar;
  if (name == "auto") return best_isa();
  if (!parse_isa(name, &isa)) throw Error("K3_ISA: unknown kernel variant \"" + name + "\"");
  if (!isa_supported(isa))
    throw Error("K3_ISA=" + name + ": this CPU cannot run the " + name + " kernels");
  return isa;
}

// Hands the model's per-layer callbacks to an engine-level observer.
class ObserverAdapter : public ForwardObserver {
 public:
  explicit ObserverAdapter(LayerObserver& to) : to_(to) {}
  void on_tensor(int64_t layer, Site site, const float* data) override {
    to_.on_tensor(layer, static_cast<LayerObserver::Site>(static_cast<int>(site)), data);
  }
  void on_routing(int64_t layer, const RoutingResult& routing) override {
    to_.on_routing(layer, LayerObserver::Routing{routing.ids, routing.weights});
  }

 private:
  LayerObserver& to_;
};
static_assert(static_cast<int>(ForwardObserver::Site::kFinalHidden) ==
              static_cast<int>(LayerObserver::Site::kFinalHidden));

}  // namespace

Engine::Engine(const std::string& model_dir, const LoadOptions& load,
               const std::function<void(double)>& on_progress)
    : Engine([&] {
        EngineOptions o;
        o.model_dir = model_dir;
        o.load = load;
        o.on_progress = on_progress;
        return o;
      }()) {}

Engine::Engine(const EngineOptions& options) : impl_(std::make_unique<Impl>()) {
  const std::string& model_dir = options.model_dir;
  const LoadOptions& load = options.load;
  Impl& m = *impl_;
  const double start = now_seconds();
  m.files = std::make_unique<ModelFiles>(model_dir, load.extra_dirs);
  m.config = parse_k3_config(m.files->config_root(), model_dir + "/config.json");
  const K3Config& config = m.config;
  if (load.layers > config.num_hidden_layers)
    throw Error("K3_LAYERS=" + std::to_string(load.layers) + " exceeds the model's " +
                std::to_string(config.num_hidden_layers) + " layers");
  // Everything that needs no weight comes first, so a broken tokenizer or an impossible context
  // fails in a second, not after the load (docs/tokenizer.md §1.4).
  if (text::Tokenizer::available(model_dir)) {
    m.tokenizer = std::make_unique<text::Tokenizer>(text::Tokenizer::load(model_dir));
    text::check_model_tokenizer(*m.tokenizer, model_dir, config.vocab_size);
  } else if (options.require_tokenizer) {
    throw Error(model_dir + " has no tiktoken.model, so text cannot be tokenized: pass token ids " +
                "with --ids, or use a snapshot with its tokenizer files");
  }
  EngineInfo& info = m.info;
  info.hidden_size = config.hidden_size;
  info.vocab_size = config.vocab_size;
  info.num_hidden_layers = config.num_hidden_layers;
  info.num_experts = config.num_experts;
  info.num_experts_per_token = config.num_experts_per_token;
  info.first_k_dense_replace = config.first_k_dense_replace;
  info.eos_token_ids = config.eos_token_ids;
  const int sessions = std::max(1, options.sessions);
  if (options.context > 0) {
    // A session's state, as the session will allocate it: the per-position rows, the KDA state,
    // the token record and the logits.
    const int64_t layers = load.layers > 0 ? std::min(load.layers, config.num_hidden_layers)
                                           : config.num_hidden_layers;
    const uint64_t positions = static_cast<uint64_t>(options.context);
    info.session_bytes =
        (ModelState::floats_per_position(config, layers) * positions +
         ModelState::fixed_floats(config, layers) + static_cast<uint64_t>(config.vocab_size)) *
            sizeof(float) +
        positions * sizeof(int64_t);
    const uint64_t need = info.session_bytes * static_cast<uint64_t>(sessions);
    const uint64_t available = available_memory_bytes();
    if (available > 0 && need > available) {
      if (sessions == 1)
        throw Error(options.context_name + "=" + std::to_string(options.context) +
                    ": the context state alone needs " + std::to_string(need >> 20) +
                    " MiB, more than the " + std::to_string(available >> 20) +
                    " MiB of memory available");
      throw Error(options.sessions_name + "=" + std::to_string(sessions) + ": " +
                  std::to_string(sessions) + " sessions of " + std::to_string(options.context) +
                  " positions need " + std::to_string(info.session_bytes >> 20) + " MiB each (" +
                  std::to_string(info.session_bytes) + " bytes), " + std::to_string(need >> 20) +
                  " MiB in all, more than the " + std::to_string(available >> 20) +
                  " MiB of memory available: lower " + options.sessions_name + " or " +
                  options.context_name);
    }
  }
  if (m.tokenizer)
    if (const auto end_of_message = m.tokenizer->special_id("<|end_of_msg|>"))
      info.end_of_message_id = *end_of_message;
  if (options.before_weights) options.before_weights(info, m.tokenizer.get());
  if (!options.keep_tokenizer) m.tokenizer.reset();  // its pages go back with the malloc_trim below
  ModelSetup setup;
  setup.isa = chosen_isa(load.isa);
  setup.on_load_progress = options.on_progress;
  setup.cancel = options.cancel;
  if (sessions > 1)
    setup.session_reserve_bytes = info.session_bytes * static_cast<uint64_t>(sessions);
  // --expert-parallel under mpirun: the other ranks compute the experts they own
  // (docs/scale-out.md §2); after the start-up check, before any weight is read.
  if (load.expert_parallel && dist::world().size > 1)
    setup.executors.push_back(dist::remote_executor(*m.files, config, load, setup.isa));
  m.model = std::make_unique<Model>(*m.files, config, load, setup);
  info.num_layers = m.model->num_layers();
  info.has_embedding = m.model->has_embedding();
  info.has_head = m.model->has_head();
  info.resident_bytes = m.model->resident_bytes();
  info.load_file_bytes = m.model->load_file_bytes();
  info.tensor_prefix = m.files->prefix();
  m.load_seconds = now_seconds() - start;
  // The load's transients (the tokenizer file's text, the shard headers, the loader threads'
  // scratch) are freed by now, but glibc keeps freed pages in each thread's arena: give them back,
  // so the resident set after the load is what the engine holds (k3-mini: -0.8 MB of its peak,
  // docs/streaming.md §1.11).
  ::malloc_trim(0);
}

Result<std::unique_ptr<Engine>> Engine::load(const EngineOptions& options) {
  try {
    return std::make_unique<Engine>(options);
  } catch (const Interrupted&) {
    return Status(Status::Code::cancelled, "the load of " + options.model_dir + " was cancelled");
  }
}

Engine::~Engine() = default;

const EngineInfo& Engine::info() const {
  return impl_->info;
}
const text::Tokenizer* Engine::tokenizer() const {
  return impl_->tokenizer.get();
}
double Engine::load_seconds() const {
  return impl_->load_seconds;
}

std::string Engine::describe() const {
  const Model& model = *impl_->model;
  const LoadOptions& o = model.load_options();
  const ContainerInfo& box = model.container();
  const ClassWidths widths = effective_widths(o, box);
  char buf[256];
  std::snprintf(buf, sizeof buf, "isa %s | bits %d/%d/%d%s | idot %d | resident %.1f MB",
                isa_name(model.isa()), widths.bits, widths.mla_bits, widths.head_bits,
                box.present ? (" (container, " + box.layout + " layout)").c_str() : "",
                o.idot ? 1 : 0, static_cast<double>(model.resident_bytes()) / 1e6);
  std::string text = buf;
  if (o.mmap) {
    const MemoryUse use = memory_use();
    std::snprintf(buf, sizeof buf, " | mapped %.1f MB",
                  static_cast<double>(model.mapped_bytes()) / 1e6);
    text += buf;
    if (use.known) {
      std::snprintf(buf, sizeof buf, " | anon %.1f MB, file-backed %.1f MB",
                    static_cast<double>(use.anonymous_bytes) / 1e6,
                    static_cast<double>(use.file_backed_bytes) / 1e6);
      text += buf;
    }
  }
  return text;
}

ExpertStats Engine::expert_stats() const {
  const ExpertCacheStats c = impl_->model->experts().stats();
  ExpertStats s;
  s.hits = c.hits;
  s.misses = c.misses;
  s.bytes_read = c.bytes_read;
  s.drive_bytes = c.drive_bytes;
  s.transient = c.transient;
  s.wait_seconds = c.wait_seconds;
  s.busy_seconds = c.busy_seconds;
  s.prefetch_issued = c.prefetch_issued;
  s.prefetch_used = c.prefetch_used;
  s.predicted_hits = c.predicted_hits;
  s.predicted_total = c.predicted_total;
  s.io_engine = c.io_engine ? c.io_engine : "";
  return s;
}

std::string Engine::describe_experts() const {
  const ExpertStats s = expert_stats();
  char buf[360];
  int n = std::snprintf(
      buf, sizeof buf,
      "experts: %llu hits / %llu misses (%.1f%% hit) | %.2f GB read at %.2f GB/s busy | wait %.2f "
      "s",
      static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.misses),
      100.0 * s.hit_ratio(), static_cast<double>(s.bytes_read) / 1e9,
      s.busy_seconds > 0 ? static_cast<double>(s.drive_bytes) / 1e9 / s.busy_seconds : 0.0,
      s.wait_seconds);
  if (s.prefetch_issued > 0 && n > 0 && static_cast<size_t>(n) < sizeof buf)
    std::snprintf(
        buf + n, sizeof buf - static_cast<size_t>(n),
        " | prefetch %llu read, %.1f%% used, recall %.1f%%",
        static_cast<unsigned long long>(s.prefetch_issued),
        100.0 * static_cast<double>(s.prefetch_used) / static_cast<double>(s.prefetch_issued),
        100.0 * s.recall());
  return buf;
}

std::string Engine::describe_expert_parallel(int64_t tokens) const {
  return dist::describe(tokens, impl_->model->experts().stats());
}

ExpertParallelStats Engine::expert_parallel_stats() const {
  const dist::ExchangeFigures f = dist::figures(impl_->model->experts().stats());
  ExpertParallelStats s;
  s.ranks = f.ranks;
  s.exchange_seconds = f.exchange_seconds;
  s.bytes_sent = f.bytes_sent;
  s.bytes_received = f.bytes_received;
  for (const dist::RankFigures& r : f.per_rank)
    s.per_rank.push_back(
        {r.rank, r.pairs, r.hits, r.misses, r.bytes_read, r.drive_bytes, r.busy_seconds});
  return s;
}

DeviceStats DeviceStats::since(const DeviceStats& before) const {
  DeviceStats d = *this;
  d.pairs_served -= before.pairs_served;
  d.pairs_total -= before.pairs_total;
  d.uploads -= before.uploads;
  d.evictions -= before.evictions;
  d.refused -= before.refused;
  d.skipped -= before.skipped;
  d.streamed_pairs -= before.streamed_pairs;
  d.join_wait_seconds -= before.join_wait_seconds;
  d.dense_matmuls -= before.dense_matmuls;
  d.dense_rows -= before.dense_rows;
  d.dense_seconds -= before.dense_seconds;
  return d;
}

DeviceStats Engine::device_stats() const {
  DeviceStats d;
  const VkTier* tier = impl_->model->vk_tier();
  if (!tier) return d;
  const VkTierStats s = tier->stats();
  d.on = true;
  d.device = s.device;
  d.off = s.off;
  d.pairs_served = s.pairs_served;
  d.pairs_total = s.pairs_total;
  d.residents = s.residents;
  d.budget = s.budget;
  d.uploads = s.uploads;
  d.evictions = s.evictions;
  d.refused = s.refused;
  d.skipped = s.skipped;
  d.join_wait_seconds = s.join_wait_s;
  d.budget_source = s.budget_source;
  d.streamed_pairs = s.streamed_pairs;
  d.dense_matrices = s.dense_matrices;
  d.dense_bytes = s.dense_bytes;
  d.dense_matmuls = s.dense_matmuls;
  d.dense_rows = s.dense_rows;
  d.dense_seconds = s.dense_s;
  return d;
}

std::string Engine::describe_device() const {
  const DeviceStats s = device_stats();
  if (!s.on) return "";
  char buf[600];
  std::snprintf(
      buf, sizeof buf,
      "[VK] %s%s | %llu of %llu routed pairs on the device (%.1f%%) | residents %llu / "
      "%llu (%s) | uploads %llu, evictions %llu, refused %llu, skipped %llu | streamed %llu "
      "prompt pairs | join wait %.3f s",
      s.device.c_str(), s.off ? " (off: the device was lost)" : "",
      static_cast<unsigned long long>(s.pairs_served),
      static_cast<unsigned long long>(s.pairs_total), 100.0 * s.served_share(),
      static_cast<unsigned long long>(s.residents), static_cast<unsigned long long>(s.budget),
      s.budget_source.c_str(), static_cast<unsigned long long>(s.uploads),
      static_cast<unsigned long long>(s.evictions), static_cast<unsigned long long>(s.refused),
      static_cast<unsigned long long>(s.skipped), static_cast<unsigned long long>(s.streamed_pairs),
      s.join_wait_seconds);
  std::string line = buf;
  if (s.dense_matrices > 0) {
    std::snprintf(buf, sizeof buf,
                  " | dense %llu matrices (%.1f MiB): %llu prompt matmuls, %llu rows, %.3f s",
                  static_cast<unsigned long long>(s.dense_matrices),
                  static_cast<double>(s.dense_bytes) / (1 << 20),
                  static_cast<unsigned long long>(s.dense_matmuls),
                  static_cast<unsigned long long>(s.dense_rows), s.dense_seconds);
    line += buf;
  }
  return line;
}

void Engine::save_history() const {
  ExpertCache& cache = impl_->model->experts();
  if (cache.history_total() == 0) return;
  cache.save_history();
}

uint64_t MemorySplit::accounted() const {
  return dense_weights + mapped_weights + expert_cache + kda_state + mla_cache + activations +
         io_buffers;
}

std::string describe_memory(const MemorySplit& m) {
  const auto size = [](uint64_t bytes) {
    char buf[32];
    if (bytes >= 1'000'000'000)
      std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(bytes) / 1e9);
    else
      std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
    return std::string(buf);
  };
  std::string text = "dense " + size(m.dense_weights);
  if (m.mapped_weights > 0) text += " (+ mapped " + size(m.mapped_weights) + ")";
  text += ", experts " + size(m.expert_cache) + " (" + std::to_string(m.expert_slots_used) + "/" +
          std::to_string(m.expert_slots_budget) + " slots), KDA " + size(m.kda_state) + ", MLA " +
          size(m.mla_cache) + ", activations " + size(m.activations) + ", I/O " +
          size(m.io_buffers);
  if (m.process_known)
    text += "; anon " + size(m.anonymous) + ", file-backed " + size(m.file_backed);
  return text;
}

MemorySplit Engine::memory() const {
  const Impl& m = *impl_;
  const Model& model = *m.model;
  MemorySplit s;
  const ExpertCacheMemory experts = model.experts().memory();
  const uint64_t resident_experts = model.load_options().experts_in_memory ? experts.slot_bytes : 0;
  s.dense_weights = model.resident_bytes() - std::min(model.resident_bytes(), resident_experts);
  s.mapped_weights = model.mapped_bytes();
  s.expert_cache = experts.slot_bytes;
  s.expert_slots_used = experts.slots_used;
  s.expert_slots_budget = experts.slots_budget;
  s.io_buffers = experts.read_buffer_bytes;
  const auto load = [](const std::atomic<int64_t>& v) {
    return static_cast<uint64_t>(std::max<int64_t>(0, v.load(std::memory_order_relaxed)));
  };
  s.kda_state = load(m.kda_bytes);
  s.mla_cache = load(m.mla_bytes);
  s.activations = load(m.activation_bytes);
  const MemoryUse use = memory_use();
  s.process_known = use.known;
  s.anonymous = use.anonymous_bytes;
  s.file_backed = use.file_backed_bytes;
  s.rss = current_rss_bytes();
  s.peak_rss = peak_rss_bytes();
  return s;
}

Session::Impl::Impl(const Engine& e, int64_t capacity)
    : engine(e.impl()),
      state(engine.model->new_state(capacity)),
      chunk(engine.model->load_options().chunk) {
  tokens.reserve(static_cast<size_t>(capacity));
  logits.reserve(static_cast<size_t>(engine.config.vocab_size));
  // A step (one row) allocates nothing.
  chunk_x0.resize(static_cast<size_t>(engine.config.hidden_size));
  chunk_hidden.resize(static_cast<size_t>(engine.config.hidden_size));
  account();
}

Session::Impl::~Impl() {
  engine.kda_bytes -= accounted_kda;
  engine.mla_bytes -= accounted_mla;
  engine.activation_bytes -= accounted_activations;
}

void Session::Impl::account() {
  const int64_t kda = static_cast<int64_t>(state.kda_bytes());
  const int64_t mla = static_cast<int64_t>(state.mla_bytes());
  const int64_t activations =
      static_cast<int64_t>(state.work.bytes(engine.config, state.position)) + floats(logits) +
      floats(x0) + floats(chunk_x0) + floats(chunk_hidden);
  engine.kda_bytes += kda - accounted_kda;
  engine.mla_bytes += mla - accounted_mla;
  engine.activation_bytes += activations - accounted_activations;
  accounted_kda = kda;
  accounted_mla = mla;
  accounted_activations = activations;
}

Session::Session(const Engine& engine, int64_t capacity)
    : impl_(std::make_unique<Impl>(engine, capacity)) {}
Session::~Session() = default;

void Session::set_input_rows(std::vector<float> x0) {
  const size_t D = static_cast<size_t>(impl_->engine.config.hidden_size);
  if (x0.size() % D != 0)
    throw Error("input rows: " + std::to_string(x0.size()) +
                " floats is not a multiple of hidden_size " + std::to_string(D));
  impl_->x0 = std::move(x0);
}

void Session::Impl::check_id(int64_t id) const {
  if (id < 0 || id >= engine.config.vocab_size)
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                std::to_string(engine.config.vocab_size) + ")");
}

void Session::Impl::input_row(int64_t id, size_t pos, float* row) {
  const size_t D = static_cast<size_t>(engine.config.hidden_size);
  if (!x0.empty()) {
    if ((pos + 1) * D > x0.size())
      throw Error("K3_X0 holds " + std::to_string(x0.size() / D) + " rows but position " +
                  std::to_string(pos) + " was processed");
    std::copy(x0.begin() + static_cast<std::ptrdiff_t>(pos * D),
              x0.begin() + static_cast<std::ptrdiff_t>((pos + 1) * D), row);
  } else {
    engine.model->embed(state, id, row);
  }
}

namespace {

// The vocabulary ranges holding the ids set in `allowed` (bit id % 64 of word id / 64), in
// blocks of 16 ids, adjacent blocks merged, into `ranges`. False, and no ranges, when they cover
// more than half of the vocabulary: the whole head costs about as much then.
bool allowed_ranges(std::span<const uint64_t> allowed, size_t vocab,
                    std::vector<RowRange>& ranges) {
  constexpr size_t kBlock = 16;
  ranges.clear();
  size_t covered = 0;
  for (size_t w = 0; w < allowed.size() && w * 64 < vocab; ++w) {
    for (size_t b = 0; b < 64 / kBlock; ++b) {
      if (((allowed[w] >> (b * kBlock)) & ((uint64_t{1} << kBlock) - 1)) == 0) continue;
      const size_t begin = w * 64 + b * kBlock, end = std::min(begin + kBlock, vocab);
      if (begin >= end) continue;
      if (!ranges.empty() && ranges.back().end == begin)
        ranges.back().end = end;
      else
        ranges.push_back({begin, end});
      covered += end - begin;
    }
  }
  if (covered * 2 > vocab) {
    ranges.clear();
    return false;
  }
  return true;
}

}  // namespace

double restricted_head_share(std::span<const uint64_t> allowed, size_t vocab) {
  std::vector<RowRange> ranges;
  // An empty mask restricts nothing (Session::restrict_next_logits): the whole head.
  if (allowed.empty() || vocab == 0 || !allowed_ranges(allowed, vocab, ranges)) return 1.0;
  size_t rows = 0;
  for (const RowRange& r : ranges) rows += r.end - r.begin;
  return static_cast<double>(rows) / static_cast<double>(vocab);
}

void Session::restrict_next_logits(std::span<const uint64_t> allowed) {
  impl_->next_allowed.assign(allowed.begin(), allowed.end());
}

void Session::Impl::feed_chunk(std::span<const int64_t> ids, ForwardObserver* observer) {
  const size_t D = static_cast<size_t>(engine.config.hidden_size);
  const size_t n = ids.size();
  for (int64_t id : ids) check_id(id);
  chunk_x0.resize(n * D);
  chunk_hidden.resize(n * D);
  for (size_t t = 0; t < n; ++t)
    input_row(ids[t], static_cast<size_t>(state.position) + t, chunk_x0.data() + t * D);
  engine.model->forward(state, chunk_x0.data(), n, chunk_hidden.data(), observer);
  tokens.insert(tokens.end(), ids.begin(), ids.end());
}

const std::vector<float>& Session::prefill(std::span<const int64_t> ids,
                                           const PrefillHooks& hooks) {
  Impl& s = *impl_;
  const Model& model = *s.engine.model;
  const size_t V = static_cast<size_t>(s.engine.config.vocab_size);
  const size_t D = static_cast<size_t>(s.engine.config.hidden_size);
  // restrict_next_logits() lasts this feed, whatever happens in it (both keep their capacity).
  s.feed_allowed.swap(s.next_allowed);
  s.next_allowed.clear();
  if (s.state.position + static_cast<int64_t>(ids.size()) > s.state.capacity)
    throw Error("prompt of " + std::to_string(ids.size()) +
                " tokens does not fit: " + std::to_string(s.state.position) + " of " +
                std::to_string(s.state.capacity) + " positions used (raise K3_MAXT / --maxt)");
  std::optional<ObserverAdapter> adapter;
  if (hooks.observer) adapter.emplace(*hooks.observer);
  ForwardObserver* observer = adapter ? &*adapter : nullptr;
  if (hooks.all_logits) hooks.all_logits->clear();
  s.logits.clear();
  const size_t chunk = static_cast<size_t>(std::max<int64_t>(s.chunk, 1));
  for (size_t t0 = 0; t0 < ids.size();) {
    const size_t n = std::min(chunk, ids.size() - t0);
    s.feed_chunk(ids.subspan(t0, n), observer);
    const float* hidden = s.chunk_hidden.data();  // [n][hidden] final hidden rows of this chunk
    t0 += n;
    const bool last = t0 == ids.size();
    if (!model.has_head() || !(last || hooks.all_logits)) continue;
    // The head on the chunk's last row only, or on every row at once (the head streams once per
    // chunk; each row bit-identical to its own head()) when all logits are asked for.
    s.logits.resize(V);
    if (hooks.all_logits) {
      std::vector<float>& all = *hooks.all_logits;
      const size_t at = all.size();
      all.resize(at + n * V);
      model.head_rows(s.state.work, s.state.stats, hidden, n, all.data() + at);
      std::copy_n(all.data() + at + (n - 1) * V, V, s.logits.data());
    } else {
      const bool only = !s.feed_allowed.empty() && allowed_ranges(s.feed_allowed, V, s.head_ranges);
      model.head(s.state, hidden + (n - 1) * D, s.logits.data(), only ? &s.head_ranges : nullptr);
    }
  }
  s.account();
  return s.logits;
}

const std::vector<float>& Session::step(int64_t id) {
  const int64_t one[1] = {id};
  return prefill(one);
}

const std::vector<float>& Session::logits() const {
  return impl_->logits;
}

Batch::Impl::Impl(const Engine& e) : engine(e.impl()) {
  work.init(engine.config, 1);
  account();
}

Batch::Impl::~Impl() {
  engine.activation_bytes -= accounted_activations;
}

void Batch::Impl::account() {
  int64_t longest = 0;
  for (const ModelState* s : states) longest = std::max(longest, s->position);
  const int64_t activations = static_cast<int64_t>(work.bytes(engine.config, longest)) +
                              floats(x0) + floats(hidden) + floats(logits);
  engine.activation_bytes += activations - accounted_activations;
  accounted_activations = activations;
}

Batch::Batch(const Engine& engine) : impl_(std::make_unique<Impl>(engine)) {}
Batch::~Batch() = default;

void Batch::step(std::span<Session* const> sessions, std::span<const int64_t> ids) {
  Impl& b = *impl_;
  const Model& model = *b.engine.model;
  const size_t n = sessions.size();
  const size_t D = static_cast<size_t>(b.engine.config.hidden_size);
  const size_t V = static_cast<size_t>(b.engine.config.vocab_size);
  // The union of the sessions' restrict_next_logits(), when every session asked for one; each
  // lasts this step, whatever happens in it.
  b.allowed.assign(b.allowed.size(), 0);
  bool restricted = true;
  for (size_t i = 0; i < n; ++i) {
    std::vector<uint64_t>& allowed = sessions[i]->impl_->next_allowed;
    restricted = restricted && !allowed.empty();
    if (b.allowed.size() < allowed.size()) b.allowed.resize(allowed.size(), 0);
    for (size_t w = 0; w < allowed.size(); ++w) b.allowed[w] |= allowed[w];
    allowed.clear();
  }
  if (ids.size() != n)
    throw Error("batched step: " + std::to_string(n) + " sessions but " +
                std::to_string(ids.size()) + " token ids (one id per session)");
  if (n == 0) return;
  b.states.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Session::Impl& s = *sessions[i]->impl_;
    if (&s.engine != &b.engine)
      throw Error("batched step: session " + std::to_string(i) +
                  " belongs to another engine than the batch's");
    s.check_id(ids[i]);
    b.states[i] = &s.state;
  }
  b.x0.resize(n * D);
  b.hidden.resize(n * D);
  // Rows are built before the pass, so a bad input row throws before any state moves; the
  // pass's own checks (a full or repeated session) come before its first layer.
  for (size_t i = 0; i < n; ++i) {
    Session::Impl& s = *sessions[i]->impl_;
    s.input_row(ids[i], static_cast<size_t>(s.state.position), b.x0.data() + i * D);
  }
  model.forward_batch(b.states, b.work, b.stats, b.interrupt, b.x0.data(), b.hidden.data());
  const bool head = model.has_head();
  if (head) {
    const bool only = restricted && allowed_ranges(b.allowed, V, b.head_ranges);
    b.logits.resize(n * V);
    model.head_rows(b.work, b.stats, b.hidden.data(), n, b.logits.data(),
                    only ? &b.head_ranges : nullptr);
  }
  for (size_t i = 0; i < n; ++i) {
    Session::Impl& s = *sessions[i]->impl_;
    s.tokens.push_back(ids[i]);
    s.logits.clear();
    if (head)
      s.logits.assign(b.logits.begin() + static_cast<std::ptrdiff_t>(i * V),
                      b.logits.begin() + static_cast<std::ptrdiff_t>((i + 1) * V));
    s.account();
  }
  b.account();
}

void Batch::set_interrupt(const std::atomic<bool>* flag) {
  impl_->interrupt = flag;
}

SessionStats Batch::stats() const {
  const StageStats& st = impl_->stats;
  return SessionStats{st.total(), st.expert_reads, st.summary()};
}

void Session::release_prefill_buffers() {
  Impl& s = *impl_;
  const size_t D = static_cast<size_t>(s.engine.config.hidden_size);
  const bool released = s.state.work.release_rows(s.engine.config);
  if (!released && s.chunk_x0.size() <= D) return;
  std::vector<float>(D).swap(s.chunk_x0);
  std::vector<float>(D).swap(s.chunk_hidden);
  s.account();
  // Freed blocks below glibc's mmap threshold stay in the heap unless trimmed.
  ::malloc_trim(0);
}

int64_t Session::prefill_chunk() const {
  return impl_->chunk;
}
void Session::set_prefill_chunk(int64_t chunk) {
  impl_->chunk = chunk;
}
int64_t Session::position() const {
  return impl_->state.position;
}
int64_t Session::capacity() const {
  return impl_->state.capacity;
}
const std::vector<int64_t>& Session::tokens() const {
  return impl_->tokens;
}
void Session::set_interrupt(const std::atomic<bool>* flag) {
  impl_->state.interrupt = flag;
}

SessionStats Session::stats() const {
  const StageStats& st = impl_->state.stats;
  return SessionStats{st.total(), st.expert_reads, st.summary()};
}

size_t Session::state_floats() const {
  size_t n = 0;
  for (const KdaState& k : impl_->state.kda)
    n += k.q_window.size() + k.k_window.size() + k.v_window.size() + k.recurrent.size();
  return n;
}

size_t Session::row_floats() const {
  size_t n = 0;
  const size_t capacity = static_cast<size_t>(impl_->state.capacity);
  for (const MlaCache& m : impl_->state.mla)
    if (capacity > 0) n += (m.latent.size() + m.rope.size()) / capacity;
  return n;
}

void Session::save_state(SavedState& out, bool with_rows) const {
  out.position = impl_->state.position;
  out.ids = impl_->tokens;
  out.kda.resize(state_floats());
  float* dst = out.kda.data();
  for (const KdaState& k : impl_->state.kda)
    for (const std::vector<float>* v : {&k.q_window, &k.k_window, &k.v_window, &k.recurrent})
      dst = std::copy(v->begin(), v->end(), dst);
  out.rows.clear();
  if (!with_rows) return;
  const size_t pos = static_cast<size_t>(out.position);
  const size_t capacity = static_cast<size_t>(impl_->state.capacity);
  out.rows.resize(pos * row_floats());
  float* r = out.rows.data();
  for (const MlaCache& m : impl_->state.mla)
    for (const UninitVector<float>* v : {&m.latent, &m.rope})
      if (!v->empty())
        r = std::copy(v->begin(),
                      v->begin() + static_cast<std::ptrdiff_t>(pos * (v->size() / capacity)), r);
}

void Session::restore_state(const SavedState& saved) {
  Impl& s = *impl_;
  const size_t pos = static_cast<size_t>(saved.position);
  const size_t capacity = static_cast<size_t>(s.state.capacity);
  const bool rows = !saved.rows.empty();
  if (saved.kda.size() != state_floats() || saved.ids.size() != pos ||
      (rows ? pos > capacity || saved.rows.size() != pos * row_floats()
            : pos > s.tokens.size() ||
                  !std::equal(saved.ids.begin(), saved.ids.end(), s.tokens.begin())))
    throw Error("saved state at position " + std::to_string(pos) +
                " does not match this session (" + std::to_string(saved.kda.size()) + " of " +
                std::to_string(state_floats()) + " floats, " + std::to_string(s.tokens.size()) +
                " ids fed" +
                (rows ? ", " + std::to_string(saved.rows.size()) + " row floats of " +
                            std::to_string(pos * row_floats())
                      : std::string()) +
                ")");
  for (const int64_t id : saved.ids) s.check_id(id);
  const float* src = saved.kda.data();
  for (KdaState& k : s.state.kda)
    for (std::vector<float>* v : {&k.q_window, &k.k_window, &k.v_window, &k.recurrent}) {
      std::copy(src, src + v->size(), v->begin());
      src += v->size();
    }
  if (rows) {
    const float* r = saved.rows.data();
    for (MlaCache& m : s.state.mla)
      for (UninitVector<float>* v : {&m.latent, &m.rope})
        if (!v->empty()) {
          const size_t n = pos * (v->size() / capacity);
          std::copy(r, r + n, v->begin());
          r += n;
        }
    s.tokens.assign(saved.ids.begin(), saved.ids.end());
  }
  s.state.position = saved.position;
  s.tokens.resize(pos);
  s.account();
}

void Session::reset() {
  impl_->state.reset();
  impl_->state.stats.reset();
  impl_->tokens.clear();
  impl_->next_allowed.clear();
  impl_->account();
}

}  // namespace k3

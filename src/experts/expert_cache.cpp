#include "experts/expert_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <tuple>
#include <unistd.h>

#include "io/file.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3 {

namespace {

constexpr int64_t kHistoryVersion = 1;
// Pins need this many recorded selections before any is seeded, and full confidence at
// kPinFullConfidence (a single prompt's history made decode slower than no pins at all).
constexpr double kPinMinHistory = 5000;
constexpr double kPinFullConfidence = 200000;

uint8_t* alloc_aligned(uint64_t bytes) {
  const uint64_t rounded = (bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  void* p = std::aligned_alloc(kDirectAlign, rounded);
  if (!p) throw Error("expert cache: cannot allocate " + std::to_string(rounded) + " bytes");
  return static_cast<uint8_t*>(p);
}

}  // namespace

uint32_t history_hash(const std::string& text) {
  uint32_t h = 2166136261u;
  for (unsigned char ch : text) h = (h ^ ch) * 16777619u;
  return h;
}

struct ExpertCache::Slot {
  int64_t expert = -1;
  uint8_t* buffer = nullptr;       // [store.slot_bytes()], kDirectAlign-aligned; lazily allocated
  const uint8_t* data = nullptr;   // the expert's bytes inside buffer
  uint64_t used = 0;               // the layer's clock at the last touch
  bool probation = false;          // admitted by a prefill chunk and not hit since
  bool pinned = false;
  int refs = 0;                    // running batches holding it
};

struct ExpertCache::Layer {
  mutable std::mutex mu;
  std::vector<Slot> slots;          // [slots_per_layer]
  std::vector<int32_t> index;       // [num_experts]: slot holding the expert, or -1
  std::vector<uint64_t> usage;      // [num_experts]: routing selections (history)
  uint64_t clock = 0;
};

ExpertCache::ExpertCache(const ExpertStore& store, std::vector<int64_t> moe_layers, int64_t num_experts,
                         ExpertCacheOptions options)
    : store_(store), options_(std::move(options)), num_experts_(num_experts), moe_layers_(std::move(moe_layers)) {
  const int64_t max_layer = moe_layers_.empty() ? -1 : *std::max_element(moe_layers_.begin(), moe_layers_.end());
  layers_.resize(static_cast<size_t>(max_layer + 1));
  for (int64_t l : moe_layers_) {
    auto layer = std::make_unique<Layer>();
    layer->index.assign(static_cast<size_t>(num_experts_), -1);
    layer->usage.assign(static_cast<size_t>(num_experts_), 0);
    layers_[static_cast<size_t>(l)] = std::move(layer);
  }
  if (options_.history_layers <= 0) options_.history_layers = max_layer + 1;
  if (options_.all_resident || moe_layers_.empty()) {
    load_history();
    return;
  }
  const uint64_t slot = store_.slot_bytes();
  const uint64_t per_slot_row = slot * moe_layers_.size();  // one slot in every layer
  const double wanted = std::floor(options_.expert_gb * 1e9 / static_cast<double>(per_slot_row));
  int64_t slots = std::clamp<int64_t>(static_cast<int64_t>(std::min(wanted, 1e12)), 1, num_experts_);
  int64_t limit = options_.memory_limit;
  if (limit < 0) {
    const double avail = static_cast<double>(available_memory_bytes());
    limit = avail > 0 ? static_cast<int64_t>(std::max(0.0, 0.9 * avail - 2e9)) : INT64_MAX;
  }
  const int64_t fit = static_cast<int64_t>(static_cast<uint64_t>(limit) / per_slot_row);
  if (fit < 1)
    throw Error("expert cache: one slot per MoE layer needs " + std::to_string(per_slot_row / 1000000) +
                " MB but only " + std::to_string(limit / 1000000) +
                " MB of memory is left after the resident weights; free memory or use a smaller model");
  if (fit < slots) {
    char line[200];
    std::snprintf(line, sizeof line,
                  "expert cache: K3_EXPERT_GB=%g does not fit the memory left (%.1f GB): %lld slots per layer instead of %lld",
                  options_.expert_gb, static_cast<double>(limit) / 1e9, static_cast<long long>(fit),
                  static_cast<long long>(slots));
    say(line);
    slots = fit;
  }
  slots_per_layer_ = slots;
  for (int64_t l : moe_layers_) layers_[static_cast<size_t>(l)]->slots.resize(static_cast<size_t>(slots));
  load_history();
  if (options_.pin) seed_pins();
}

ExpertCache::~ExpertCache() {
  for (auto& layer : layers_)
    if (layer)
      for (Slot& s : layer->slots) std::free(s.buffer);
  for (uint8_t* b : spare_) std::free(b);
}

void ExpertCache::say(const std::string& line) const {
  if (options_.note) options_.note(line);
  else std::fprintf(stderr, "%s\n", line.c_str());
}

ExpertCache::Layer* ExpertCache::layer_of(int64_t layer) const {
  if (layer < 0 || static_cast<size_t>(layer) >= layers_.size() || !layers_[static_cast<size_t>(layer)])
    throw Error("expert cache: layer " + std::to_string(layer) + " has no routed experts");
  return layers_[static_cast<size_t>(layer)].get();
}

uint8_t* ExpertCache::take_transient() {
  {
    std::lock_guard<std::mutex> lock(transient_mu_);
    if (!spare_.empty()) {
      uint8_t* b = spare_.back();
      spare_.pop_back();
      return b;
    }
  }
  return alloc_aligned(store_.slot_bytes());
}

void ExpertCache::read_batch(int64_t layer, std::span<const int64_t> ids, std::span<uint8_t* const> dst,
                             std::span<const uint8_t*> data) {
  // Disk-offset order: experts are not stored in id order inside a shard.
  std::vector<size_t> order(ids.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<ExpertStore::Location> where(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) where[i] = store_.location(layer, ids[i]);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(where[a].file, where[a].offset) < std::tie(where[b].file, where[b].offset);
  });
  if (!options_.direct)
    for (size_t i : order) store_.advise(layer, ids[i]);
  const double start = now_seconds();
  for (size_t i : order) data[i] = store_.read_into(layer, ids[i], dst[i], options_.direct);
  read_ns_ += static_cast<uint64_t>((now_seconds() - start) * 1e9);
  misses_ += ids.size();
  bytes_ += ids.size() * store_.geometry().expert_bytes();
}

void ExpertCache::acquire(int64_t layer, std::span<const int64_t> ids, Use use, ExpertBatch& batch) {
  batch.release();
  if (ids.size() > kMaxBatch)
    throw Error("expert cache: a batch of " + std::to_string(ids.size()) + " experts exceeds " + std::to_string(kMaxBatch));
  batch.cache_ = this;
  batch.layer_ = layer;
  batch.views_.resize(ids.size());
  batch.slots_.assign(ids.size(), -1);
  if (options_.all_resident) {
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint8_t* bytes = store_.resident(layer, ids[i]);
      if (!bytes) throw Error("expert " + std::to_string(ids[i]) + " of layer " + std::to_string(layer) + " is not resident");
      batch.views_[i] = store_.view(bytes);
    }
    hits_ += ids.size();
    return;
  }
  Layer& L = *layer_of(layer);
  for (int64_t e : ids)
    if (e < 0 || e >= num_experts_) throw Error("expert " + std::to_string(e) + " of layer " + std::to_string(layer) + " is out of range");
  // Misses: index into ids, the buffer they are read into, and where the bytes land.
  size_t miss_idx[kMaxBatch];
  uint8_t* miss_dst[kMaxBatch];
  const uint8_t* miss_data[kMaxBatch];
  size_t misses = 0;
  std::unique_lock<std::mutex> lock(L.mu);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t e = ids[i];
    const int32_t s = L.index[static_cast<size_t>(e)];
    if (s >= 0) {
      Slot& slot = L.slots[static_cast<size_t>(s)];
      ++slot.refs;
      slot.used = ++L.clock;
      slot.probation = false;
      batch.slots_[i] = s;
      batch.views_[i] = store_.view(slot.data);
      ++hits_;
    } else {
      miss_idx[misses++] = i;
    }
  }
  // Targets for the misses, in the batch's order (the first misses win the slots).
  for (size_t m = 0; m < misses; ++m) {
    const size_t i = miss_idx[m];
    int32_t victim = -1;
    for (size_t s = 0; s < L.slots.size() && victim < 0; ++s)
      if (L.slots[s].expert < 0 && L.slots[s].refs == 0) victim = static_cast<int32_t>(s);
    // Oldest evictable slot of a segment (probation or protected).
    const auto oldest = [&](bool probation) {
      int32_t best = -1;
      for (size_t s = 0; s < L.slots.size(); ++s) {
        const Slot& c = L.slots[s];
        if (c.pinned || c.refs > 0 || c.probation != probation) continue;
        if (best < 0 || c.used < L.slots[static_cast<size_t>(best)].used) best = static_cast<int32_t>(s);
      }
      return best;
    };
    if (victim < 0) victim = oldest(true);
    if (victim < 0 && use == Use::kToken) victim = oldest(false);
    if (victim >= 0) {
      Slot& slot = L.slots[static_cast<size_t>(victim)];
      if (slot.expert >= 0) L.index[static_cast<size_t>(slot.expert)] = -1;
      if (!slot.buffer) slot.buffer = alloc_aligned(store_.slot_bytes());
      slot.expert = -1;  // filled after the read succeeds
      slot.data = nullptr;
      slot.refs = 1;
      slot.pinned = false;
      batch.slots_[i] = victim;
      miss_dst[m] = slot.buffer;
    } else {
      uint8_t* b = take_transient();
      batch.transient_.push_back(b);
      miss_dst[m] = b;
      ++transient_count_;
    }
  }
  if (misses > 0) {
    int64_t miss_ids[kMaxBatch];
    for (size_t m = 0; m < misses; ++m) miss_ids[m] = ids[miss_idx[m]];
    try {
      // The layer stays locked while reading: another session needing this layer waits rather
      // than reading the same experts twice.
      read_batch(layer, {miss_ids, misses}, {miss_dst, misses}, {miss_data, misses});
    } catch (...) {
      lock.unlock();
      batch.release();
      throw;
    }
    for (size_t m = 0; m < misses; ++m) {
      const size_t i = miss_idx[m];
      batch.views_[i] = store_.view(miss_data[m]);
      const int32_t s = batch.slots_[i];
      if (s < 0) continue;
      Slot& slot = L.slots[static_cast<size_t>(s)];
      slot.expert = ids[i];
      slot.data = miss_data[m];
      slot.used = ++L.clock;
      slot.probation = use == Use::kChunk;
      L.index[static_cast<size_t>(ids[i])] = s;
    }
  }
}

void ExpertBatch::release() {
  if (cache_) cache_->release(*this);
  cache_ = nullptr;
  views_.clear();
  slots_.clear();
  transient_.clear();
}

void ExpertCache::release(ExpertBatch& batch) {
  if (!options_.all_resident && batch.layer_ >= 0) {
    Layer& L = *layer_of(batch.layer_);
    std::lock_guard<std::mutex> lock(L.mu);
    for (int32_t s : batch.slots_) {
      if (s < 0) continue;
      Slot& slot = L.slots[static_cast<size_t>(s)];
      --slot.refs;
      if (slot.expert < 0) slot.data = nullptr;  // a failed read: the slot stays free
    }
  }
  std::lock_guard<std::mutex> lock(transient_mu_);
  for (uint8_t* b : batch.transient_) {
    if (spare_.size() < kSpareTransients) spare_.push_back(b);
    else std::free(b);
  }
}

void ExpertCache::record(int64_t layer, std::span<const int64_t> ids) {
  Layer& L = *layer_of(layer);
  std::lock_guard<std::mutex> lock(L.mu);
  for (int64_t e : ids)
    if (e >= 0 && e < num_experts_) ++L.usage[static_cast<size_t>(e)];
}

ExpertCacheStats ExpertCache::stats() const {
  ExpertCacheStats s;
  s.hits = hits_.load();
  s.misses = misses_.load();
  s.bytes_read = bytes_.load();
  s.read_seconds = static_cast<double>(read_ns_.load()) / 1e9;
  s.transient = transient_count_.load();
  return s;
}

int64_t ExpertCache::pinned(int64_t layer) const {
  const Layer& L = *layer_of(layer);
  std::lock_guard<std::mutex> lock(L.mu);
  return std::count_if(L.slots.begin(), L.slots.end(), [](const Slot& s) { return s.pinned; });
}

std::vector<int64_t> ExpertCache::cached(int64_t layer) const {
  const Layer& L = *layer_of(layer);
  std::lock_guard<std::mutex> lock(L.mu);
  std::vector<const Slot*> live;
  for (const Slot& s : L.slots)
    if (s.expert >= 0) live.push_back(&s);
  std::sort(live.begin(), live.end(), [](const Slot* a, const Slot* b) {
    return a->probation != b->probation ? !a->probation : a->used > b->used;
  });
  std::vector<int64_t> out;
  for (const Slot* s : live) out.push_back(s->expert);
  return out;
}

uint64_t ExpertCache::history_total() const {
  uint64_t total = 0;
  for (const auto& layer : layers_) {
    if (!layer) continue;
    std::lock_guard<std::mutex> lock(layer->mu);
    for (uint64_t c : layer->usage) total += c;
  }
  return total;
}

void ExpertCache::load_history() {
  const std::string& path = options_.history_path;
  if (path.empty() || ::access(path.c_str(), F_OK) != 0) return;
  std::string text;
  try {
    text = read_text_file(path);
  } catch (const Error& e) {
    say(std::string("routing history ignored: ") + e.what());
    return;
  }
  const uint32_t hash = history_hash(options_.model_identity);
  std::istringstream in(text);
  std::string line;
  size_t bad = 0, line_no = 0;
  bool geometry_seen = false;
  std::vector<std::tuple<int64_t, int64_t, uint64_t>> records;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::istringstream fields(line);
    long long a = 0, b = 0, c = 0;
    std::string extra;
    if (!(fields >> a >> b >> c) || (fields >> extra)) {
      ++bad;
      continue;
    }
    if (a == -1) {
      geometry_seen = true;
      if (b != options_.history_layers || c != num_experts_) {
        say(path + ": routing history refused: written for " + std::to_string(b) + " layers x " + std::to_string(c) +
            " experts, this model has " + std::to_string(options_.history_layers) + " x " + std::to_string(num_experts_) +
            " (another model's file; it is left as it is)");
        history_refused_ = true;
        return;
      }
    } else if (a == -2) {
      if (b != kHistoryVersion || static_cast<uint32_t>(c) != hash) {
        say(path + ": routing history refused: written by another model or format (version " + std::to_string(b) +
            ", identity " + std::to_string(c) + "; this model is " + std::to_string(hash) + "); it is left as it is");
        history_refused_ = true;
        return;
      }
    } else if (a < 0) {
      continue;  // a header record of a later format: skipped, as old readers do
    } else if (a >= static_cast<long long>(layers_.size()) || !layers_[static_cast<size_t>(a)] || b < 0 ||
               b >= num_experts_ || c < 0) {
      ++bad;
    } else {
      records.emplace_back(a, b, static_cast<uint64_t>(c));
    }
  }
  if (!geometry_seen && !records.empty()) {
    say(path + ": routing history refused: no geometry record (-1 <layers> <experts>); it is left as it is");
    history_refused_ = true;
    return;
  }
  for (const auto& [l, e, c] : records) layers_[static_cast<size_t>(l)]->usage[static_cast<size_t>(e)] += c;
  if (bad > 0) say(path + ": " + std::to_string(bad) + " malformed routing-history line(s) skipped");
}

void ExpertCache::seed_pins() {
  const double total = static_cast<double>(history_total());
  if (total < kPinMinHistory) return;
  const double confidence = std::min(1.0, total / kPinFullConfidence);
  const int64_t quota = std::min<int64_t>(static_cast<int64_t>(std::floor(static_cast<double>(slots_per_layer_) * 0.5 * confidence)),
                                          slots_per_layer_ / 2);
  if (quota <= 0) return;
  for (int64_t l : moe_layers_) {
    Layer& L = *layers_[static_cast<size_t>(l)];
    std::vector<int64_t> order;
    for (int64_t e = 0; e < num_experts_; ++e)
      if (L.usage[static_cast<size_t>(e)] > 0 && store_.has(l, e)) order.push_back(e);
    const size_t n = std::min<size_t>(static_cast<size_t>(quota), order.size());
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(), [&](int64_t a, int64_t b) {
      const uint64_t ca = L.usage[static_cast<size_t>(a)], cb = L.usage[static_cast<size_t>(b)];
      return ca != cb ? ca > cb : a < b;
    });
    order.resize(n);
    std::vector<uint8_t*> dst(n);
    std::vector<const uint8_t*> data(n);
    for (size_t i = 0; i < n; ++i) {
      Slot& slot = L.slots[i];
      slot.buffer = alloc_aligned(store_.slot_bytes());
      dst[i] = slot.buffer;
    }
    read_batch(l, order, dst, data);
    for (size_t i = 0; i < n; ++i) {
      Slot& slot = L.slots[i];
      slot.expert = order[i];
      slot.data = data[i];
      slot.pinned = true;
      L.index[static_cast<size_t>(order[i])] = static_cast<int32_t>(i);
    }
  }
  // Start-up reads are not the run's misses.
  misses_ = 0;
  bytes_ = 0;
  read_ns_ = 0;
}

bool ExpertCache::save_history() {
  if (options_.history_save_path.empty()) return false;
  if (history_refused_) {
    say(options_.history_save_path + ": routing history not saved (the file there belongs to another model)");
    return false;
  }
  std::ostringstream out;
  out << "-1 " << options_.history_layers << ' ' << num_experts_ << '\n';
  out << "-2 " << kHistoryVersion << ' ' << history_hash(options_.model_identity) << '\n';
  for (int64_t l : moe_layers_) {
    const Layer& L = *layers_[static_cast<size_t>(l)];
    std::lock_guard<std::mutex> lock(L.mu);
    for (int64_t e = 0; e < num_experts_; ++e)
      if (L.usage[static_cast<size_t>(e)] > 0) out << l << ' ' << e << ' ' << L.usage[static_cast<size_t>(e)] << '\n';
  }
  const std::string text = out.str();
  try {
    write_file_atomic(options_.history_save_path, text.data(), text.size());
  } catch (const Error& e) {
    say(std::string("routing history not saved: ") + e.what());
    return false;
  }
  return true;
}

}  // namespace k3

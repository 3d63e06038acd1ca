#include "experts/expert_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <sstream>
#include <tuple>

#include "io/file.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/sys.h"

namespace k3 {

namespace {

constexpr int64_t kHistoryVersion = 1;
// Pins need this many recorded selections before any is seeded, and full confidence at
// kPinFullConfidence (a single prompt's history made decode slower than no pins at all).
constexpr double kPinMinHistory = 5000;
constexpr double kPinFullConfidence = 200000;

}  // namespace

uint64_t decayed(uint64_t count, double decay) {
  if (count == 0 || decay >= 1.0) return count;
  return std::max<uint64_t>(
      1, static_cast<uint64_t>(std::llround(static_cast<double>(count) * decay)));
}

uint32_t history_hash(const std::string& text) {
  return fnv1a_32(text);
}

ReadQueueOptions read_queue_options(const CacheOptions& options) {
  ReadQueueOptions io;
  io.threads = options.load_threads;
  io.engine = options.io_engine == "uring"     ? ReadQueueOptions::Engine::kUring
              : options.io_engine == "threads" ? ReadQueueOptions::Engine::kThreads
                                               : ReadQueueOptions::Engine::kAuto;
  return io;
}

namespace {

std::string mode_text(mode_t mode) {
  char m[8];
  std::snprintf(m, sizeof m, "%04o", static_cast<unsigned>(mode & 07777));
  return m;
}

// The directory the histories are saved in, given the state directory `dir` (see
// locate_history), or "" with `why` saying why nothing can be saved there. `dir` is created 0700
// when missing; an existing one is never chmod-ed (it may be shared, like /tmp: a chmod would lock
// every other user out). One owned by us or root that nobody else may write to is used as it is;
// one others may write to gets our own subdirectory "kimi_k3-<uid>" (created 0700, and checked to
// be a real directory of ours that nobody else can enter) when it is sticky, where nobody else can
// rename or remove it, and is refused otherwise, as is one owned by another user.
std::string history_directory(const std::string& dir, std::string* why) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (::mkdir(dir.c_str(), 0700) == 0) return dir;
  if (errno != EEXIST) {
    *why = dir + ": cannot create the state directory: " + std::strerror(errno);
    return "";
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *why = dir + " is not a directory";
    return "";
  }
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    *why = dir + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
           std::to_string(me) + "); use a state directory of your own";
    return "";
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) == 0) return dir;
  if ((st.st_mode & S_ISVTX) == 0) {
    *why = dir + " is writable by other users (mode " + mode_text(st.st_mode) +
           ") and not sticky, so they could swap the files kept there; use a private directory "
           "(it is never chmod-ed for you)";
    return "";
  }
  const std::string own = dir + "/kimi_k3-" + std::to_string(me);
  if (::mkdir(own.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = own + ": cannot create the private state subdirectory: " + std::strerror(errno);
    return "";
  }
  struct stat sub {};
  if (::lstat(own.c_str(), &sub) != 0 || !S_ISDIR(sub.st_mode) || sub.st_uid != me ||
      (sub.st_mode & 0077) != 0) {
    *why = own + " (the private subdirectory of the shared state directory " + dir +
           ") is not a directory of this user closed to others (mode " + mode_text(sub.st_mode) +
           "); remove it or use another state directory";
    return "";
  }
  return own;
}

}  // namespace

void locate_history(const CacheOptions& options, const std::string& model_dir,
                    ExpertCacheSetup* setup) {
  const std::string beside_model = model_dir + "/.coli_usage";
  setup->history_save_path.clear();
  setup->history_unsaved.clear();
  std::string path;
  if (!options.state_dir.empty()) {
    const std::string dir = history_directory(options.state_dir, &setup->history_unsaved);
    if (!dir.empty()) {
      char* real = ::realpath(model_dir.c_str(), nullptr);
      const std::string key = real ? real : model_dir;
      std::free(real);
      // FNV-1a 64 from the offset the first release used (FNV's, one digit short), so that the
      // history files already written keep their names.
      const uint64_t h = fnv1a_64(key, 1469598103934665603ull);
      char name[64];
      std::snprintf(name, sizeof name, "/usage-%016llx.coli_usage",
                    static_cast<unsigned long long>(h));
      path = dir + name;
      if (::access(dir.c_str(), W_OK) == 0)
        setup->history_save_path = path;
      else
        setup->history_unsaved = dir + " is not writable (set K3_STATE_DIR / --state-dir)";
    }
  }
  // No state directory: the history is read-only this run (silently: it is a cache).
  setup->history_path = !path.empty() && ::access(path.c_str(), F_OK) == 0 ? path : beside_model;
}

struct ExpertCache::Slot {
  int64_t expert = -1;
  uint8_t* buffer = nullptr;      // [store.slot_bytes()], kDirectAlign-aligned; lazily allocated
  const uint8_t* data = nullptr;  // the expert's bytes inside buffer
  uint64_t used = 0;              // the layer's clock at the last touch
  bool probation = false;         // admitted by a prefill chunk and not hit since
  bool pinned = false;
  int refs = 0;  // running batches holding it
};

struct ExpertCache::Layer {
  mutable std::mutex mu;
  std::vector<Slot> slots;      // [slots_per_layer]
  std::vector<int32_t> index;   // [num_experts]: slot holding the expert, or -1
  std::vector<uint64_t> usage;  // [num_experts]: routing selections (history)
  uint64_t clock = 0;
  uint64_t predicted_hits = 0, predicted_total = 0;  // read-ahead recall (under ws_mu_)
};

// A working-set entry: one expert read in flight or arrived, beyond the budget.
struct ExpertCache::Entry {
  ReadTicket ticket;
  uint8_t* buffer = nullptr;  // [store.slot_bytes()], aligned; swapped with a slot's on promotion
  const uint8_t* data = nullptr;    // the expert's bytes inside buffer
  int64_t layer = -1, expert = -1;  // what it holds or reads (-1: free)
  int refs = 0;                     // batches holding it
  bool staged = false;              // read ahead on a prediction, not yet taken
  bool checked = false;             // the read ended and was validated (error set on failure)
  std::string error;
  bool free() const { return refs == 0 && !staged; }
};

ExpertCache::ExpertCache(const ExpertStore& store, const CacheOptions& options,
                         ExpertCacheSetup setup)
    : store_(store),
      options_(options),
      setup_(std::move(setup)),
      prefetch_(options.prefetch),
      num_experts_(setup_.num_experts),
      moe_layers_(setup_.moe_layers) {
  const int64_t max_layer =
      moe_layers_.empty() ? -1 : *std::max_element(moe_layers_.begin(), moe_layers_.end());
  layers_.resize(static_cast<size_t>(max_layer + 1));
  predicted_.resize(layers_.size());
  for (int64_t l : moe_layers_) {
    auto layer = std::make_unique<Layer>();
    layer->index.assign(static_cast<size_t>(num_experts_), -1);
    layer->usage.assign(static_cast<size_t>(num_experts_), 0);
    layers_[static_cast<size_t>(l)] = std::move(layer);
  }
  if (setup_.history_layers <= 0) setup_.history_layers = max_layer + 1;
  if (setup_.all_resident || moe_layers_.empty()) {
    load_history();
    return;
  }
  ReadQueueOptions io = read_queue_options(options_);
  if (setup_.read_extent_bytes > 0) io.extent_bytes = setup_.read_extent_bytes;
  queue_ = make_read_queue(io);
  const uint64_t slot = store_.slot_bytes();
  const uint64_t per_slot_row = slot * moe_layers_.size();  // one slot in every layer
  const double wanted = std::floor(options_.expert_gb * 1e9 / static_cast<double>(per_slot_row));
  int64_t slots =
      std::clamp<int64_t>(static_cast<int64_t>(std::min(wanted, 1e12)), 1, num_experts_);
  int64_t limit = setup_.memory_limit;
  if (limit < 0) {
    const double avail = static_cast<double>(available_memory_bytes());
    limit = avail > 0 ? static_cast<int64_t>(std::max(
                            0.0, 0.9 * avail - 2e9 - static_cast<double>(setup_.reserved_bytes)))
                      : INT64_MAX;
  }
  const int64_t fit = static_cast<int64_t>(static_cast<uint64_t>(limit) / per_slot_row);
  if (fit < 1)
    throw Error(
        "expert cache: one slot per MoE layer needs " + std::to_string(per_slot_row / 1000000) +
        " MB but only " + std::to_string(limit / 1000000) +
        " MB of memory is left after the resident weights" +
        (setup_.reserved_bytes > 0 ? " and the " + std::to_string(setup_.reserved_bytes / 1000000) +
                                         " MB held for the sessions (lower --parallel or --ctx)"
                                   : std::string()) +
        "; free memory or use a smaller model");
  if (fit < slots) {
    char line[200];
    std::snprintf(line, sizeof line,
                  "expert cache: K3_EXPERT_GB=%g does not fit the memory left (%.1f GB): %lld "
                  "slots per layer instead of %lld",
                  options_.expert_gb, static_cast<double>(limit) / 1e9, static_cast<long long>(fit),
                  static_cast<long long>(slots));
    say(line);
    slots = fit;
  }
  slots_per_layer_ = slots;
  for (int64_t l : moe_layers_)
    layers_[static_cast<size_t>(l)]->slots.resize(static_cast<size_t>(slots));
  load_history();
  if (options_.pin) seed_pins();
}

ExpertCache::~ExpertCache() {
  for (auto& e : entries_) {
    e->ticket.wait();  // a dropped prefetch may still be reading into its buffer
    free_direct_buffer(e->buffer);
  }
  for (auto& layer : layers_)
    if (layer)
      for (Slot& s : layer->slots) free_direct_buffer(s.buffer);
}

void ExpertCache::say(const std::string& line) const {
  if (setup_.note)
    setup_.note(line);
  else
    std::fprintf(stderr, "%s\n", line.c_str());
}

ExpertCache::Layer* ExpertCache::layer_of(int64_t layer) const {
  if (layer < 0 || static_cast<size_t>(layer) >= layers_.size() ||
      !layers_[static_cast<size_t>(layer)])
    throw Error("expert cache: layer " + std::to_string(layer) + " has no routed experts");
  return layers_[static_cast<size_t>(layer)].get();
}

ExpertCache::Entry* ExpertCache::take_entry(bool staged) {
  if (staged) {
    const size_t n = static_cast<size_t>(
        std::count_if(entries_.begin(), entries_.end(), [](const auto& e) { return e->staged; }));
    if (n >= kMaxStaged) return nullptr;
  }
  Entry* found = nullptr;
  for (auto& e : entries_)
    if (e->free() && e->ticket.done()) {
      found = e.get();
      break;
    }
  if (!found) {
    entries_.push_back(std::make_unique<Entry>());
    found = entries_.back().get();
  }
  if (!found->buffer) found->buffer = allocate_direct_buffer(store_.slot_bytes());
  found->data = nullptr;
  found->checked = false;
  found->error.clear();
  found->staged = staged;
  found->refs = 0;
  return found;
}

void ExpertCache::submit_reads(int64_t layer, std::span<Entry* const> entries) {
  // Disk-offset order: experts are not stored in id order inside a shard.
  std::vector<std::pair<ExpertStore::Location, Entry*>> order;
  order.reserve(entries.size());
  for (Entry* e : entries) order.emplace_back(store_.location(layer, e->expert), e);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first.file, a.first.offset) < std::tie(b.first.file, b.first.offset);
  });
  for (auto& [where, e] : order) {
    const ExpertStore::ReadPlan plan =
        store_.plan_read(layer, e->expert, e->buffer, options_.direct);
    if (!options_.direct) store_.advise(layer, e->expert);
    e->data = plan.data;
    queue_->submit(e->ticket, {plan.requests.data(), plan.count});
  }
  misses_ += entries.size();
  bytes_ += entries.size() * store_.geometry().expert_bytes();
}

void ExpertCache::complete(Entry& entry) {
  const double waited = entry.ticket.wait();
  wait_ns_ += static_cast<uint64_t>(waited * 1e9);
  std::lock_guard<std::mutex> lock(ws_mu_);
  check(entry);
  if (!entry.error.empty()) throw Error(entry.error);
}

void ExpertCache::check(Entry& entry) const {
  if (entry.checked) return;
  try {
    store_.finish_read(entry.layer, entry.expert, entry.data, entry.ticket.error());
  } catch (const Error& e) {
    entry.error = e.what();
  }
  entry.checked = true;
}

ExpertCache::Entry* ExpertCache::in_flight(int64_t layer, int64_t expert) const {
  for (const auto& en : entries_)
    if (en->layer == layer && en->expert == expert && !en->free()) return en.get();
  return nullptr;
}

void ExpertCache::acquire(int64_t layer, std::span<const int64_t> ids, Use use,
                          ExpertBatch& batch) {
  batch.release();
  if (ids.size() > kMaxBatch)
    throw Error("expert cache: a batch of " + std::to_string(ids.size()) + " experts exceeds " +
                std::to_string(kMaxBatch));
  // Checked before the batch is touched: a refused batch holds nothing.
  if (!setup_.all_resident) layer_of(layer);
  for (int64_t e : ids)
    if (e < 0 || e >= num_experts_)
      throw Error("expert " + std::to_string(e) + " of layer " + std::to_string(layer) +
                  " is out of range");
  batch.cache_ = this;
  batch.layer_ = layer;
  batch.use_ = static_cast<int>(use);
  for (size_t i = 0; i < ids.size(); ++i) batch.items_[i] = ExpertBatch::Item{};
  batch.count_ = ids.size();
  if (setup_.all_resident) {
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint8_t* bytes = store_.resident(layer, ids[i]);
      if (!bytes)
        throw Error("expert " + std::to_string(ids[i]) + " of layer " + std::to_string(layer) +
                    " is not resident");
      batch.items_[i].view = store_.view(bytes);
      batch.items_[i].ready = true;
    }
    hits_ += ids.size();
    return;
  }
  Layer& L = *layer_of(layer);
  {
    std::lock_guard<std::mutex> lock(L.mu);
    std::lock_guard<std::mutex> ws_lock(ws_mu_);
    Entry* fresh[kMaxBatch];
    size_t reads = 0;
    try {
      for (size_t i = 0; i < ids.size(); ++i) {
        ExpertBatch::Item& item = batch.items_[i];
        const int64_t e = ids[i];
        const int32_t s = L.index[static_cast<size_t>(e)];
        if (s >= 0) {
          Slot& slot = L.slots[static_cast<size_t>(s)];
          ++slot.refs;
          slot.used = ++L.clock;
          slot.probation = false;
          item.slot = s;
          item.view = store_.view(slot.data);
          item.ready = true;
          ++hits_;
          continue;
        }
        // In flight already: staged by a prediction, or held by another running batch (unless
        // that read failed: this batch reads afresh).
        Entry* entry = in_flight(layer, e);
        if (entry && !entry->error.empty()) entry = nullptr;
        if (entry && entry->staged) {
          entry->staged = false;
          ++prefetch_used_;
        }
        if (!entry) {
          entry = take_entry(false);
          entry->layer = layer;
          entry->expert = e;
          fresh[reads++] = entry;
        }
        ++entry->refs;
        item.entry = entry;
      }
      submit_reads(layer, {fresh, reads});
    } catch (...) {
      // Out of memory for a buffer, or the queue refused: undo, so no entry is left claimed
      // without a read and the batch holds nothing.
      for (size_t r = 0; r < reads; ++r) fresh[r]->layer = fresh[r]->expert = -1;
      for (ExpertBatch::Item& item : batch.items()) {
        if (item.slot >= 0) --L.slots[static_cast<size_t>(item.slot)].refs;
        if (item.entry) {
          Entry& en = *static_cast<Entry*>(item.entry);
          if (--en.refs == 0) en.layer = en.expert = -1;
        }
      }
      batch.count_ = 0;
      batch.layer_ = -1;
      batch.cache_ = nullptr;
      throw;
    }
  }
  if (!options_.pipe) {
    try {
      for (size_t i = 0; i < batch.count_; ++i) batch.view(i);
    } catch (...) {
      batch.release();
      throw;
    }
  }
}

void ExpertCache::run(int64_t layer, std::span<const int64_t> ids, ExpertUse use,
                      ExpertWork& work) {
  routed(layer, ids);
  ExpertBatch batch;
  for (size_t g0 = 0; g0 < ids.size(); g0 += kMaxBatch) {
    const size_t m = std::min(kMaxBatch, ids.size() - g0);
    acquire(layer, ids.subspan(g0, m), use, batch);
    if (g0 + m == ids.size() && prefetch_.load(std::memory_order_relaxed) && !setup_.all_resident) {
      // This layer's misses are queued; the next layer's likely experts go behind them.
      int64_t next = -1;
      const std::span<const int64_t> guess = work.read_ahead(&next);
      if (!guess.empty()) prefetch(next, guess);
    }
    // Experts computed as their reads land: the first one not computed yet when it is here,
    // else the next one here that the work may take ahead of it, else the first (waiting).
    bool done[kMaxBatch] = {};
    size_t first = 0;
    for (size_t left = m; left > 0; --left) {
      while (done[first]) ++first;
      size_t pick = first;
      if (!batch.ready(first))
        for (size_t j = first + 1; j < m; ++j)
          if (!done[j] && batch.ready(j) && work.ahead(g0 + j)) {
            pick = j;
            break;
          }
      done[pick] = true;
      work.apply(g0 + pick, batch.view(pick));
    }
    batch.release();
  }
  finish_layer(layer);
}

const ExpertView& ExpertBatch::view(size_t i) {
  Item& item = items_[i];
  if (!item.ready) cache_->wait_item(*this, i);
  return item.view;
}

bool ExpertBatch::ready(size_t i) const {
  const Item& item = items_[i];
  return item.ready || cache_->arrived(item.entry);
}

bool ExpertCache::arrived(const void* entry) const {
  return static_cast<const Entry*>(entry)->ticket.done();
}

void ExpertCache::wait_item(ExpertBatch& batch, size_t i) {
  ExpertBatch::Item& item = batch.items_[i];
  Entry& entry = *static_cast<Entry*>(item.entry);
  complete(entry);
  item.view = store_.view(entry.data);
  item.ready = true;
}

void ExpertBatch::release() {
  if (cache_) cache_->release(*this);
  cache_ = nullptr;
  layer_ = -1;
  count_ = 0;
}

void ExpertCache::release(ExpertBatch& batch) {
  if (setup_.all_resident || batch.layer_ < 0) return;
  Layer& L = *layer_of(batch.layer_);
  std::lock_guard<std::mutex> lock(L.mu);
  std::lock_guard<std::mutex> ws_lock(ws_mu_);
  for (const ExpertBatch::Item& item : batch.items())
    if (item.slot >= 0) --L.slots[static_cast<size_t>(item.slot)].refs;
  // Promote the arrived misses. A slot promoted by this release is never the victim of another
  // (one token's sixteen misses must not churn a four-slot layer).
  const uint64_t before = L.clock;
  const bool token = batch.use_ == static_cast<int>(Use::kToken);
  for (const ExpertBatch::Item& item : batch.items()) {
    if (!item.entry) continue;
    Entry& en = *static_cast<Entry*>(item.entry);
    if (--en.refs > 0 || en.staged) continue;
    bool kept = false;
    if (en.ticket.done()) {
      check(en);
      if (en.error.empty() && L.index[static_cast<size_t>(en.expert)] < 0) {
        int32_t victim = -1;
        for (size_t s = 0; s < L.slots.size() && victim < 0; ++s)
          if (L.slots[s].expert < 0 && L.slots[s].refs == 0) victim = static_cast<int32_t>(s);
        // Oldest evictable slot of a segment (probation or protected).
        const auto oldest = [&](bool probation) {
          int32_t best = -1;
          for (size_t s = 0; s < L.slots.size(); ++s) {
            const Slot& c = L.slots[s];
            if (c.pinned || c.refs > 0 || c.probation != probation || c.used > before) continue;
            if (best < 0 || c.used < L.slots[static_cast<size_t>(best)].used)
              best = static_cast<int32_t>(s);
          }
          return best;
        };
        // An expert another holder (the device tier) has is given up first.
        for (size_t s = 0; s < L.slots.size() && victim < 0 && held_elsewhere_; ++s) {
          const Slot& c = L.slots[s];
          if (c.expert >= 0 && !c.pinned && c.refs == 0 && c.used <= before &&
              (token || c.probation) && held_elsewhere_(batch.layer_, c.expert))
            victim = static_cast<int32_t>(s);
        }
        if (victim < 0) victim = oldest(true);
        if (victim < 0 && token) victim = oldest(false);
        if (victim >= 0) {
          Slot& slot = L.slots[static_cast<size_t>(victim)];
          if (slot.expert >= 0) L.index[static_cast<size_t>(slot.expert)] = -1;
          std::swap(slot.buffer, en.buffer);
          slot.data = en.data;
          slot.expert = en.expert;
          slot.used = ++L.clock;
          slot.probation = !token;
          slot.pinned = false;
          L.index[static_cast<size_t>(en.expert)] = victim;
          kept = true;
        }
      }
    }
    if (!kept && en.error.empty()) ++transient_count_;
    en.layer = en.expert = -1;
    en.data = nullptr;
  }
  // Working-set entries beyond kWorkingSet are given back once free and idle.
  for (size_t i = entries_.size(); i-- > 0 && entries_.size() > kWorkingSet;) {
    Entry& en = *entries_[i];
    if (!en.free() || !en.ticket.done()) continue;
    free_direct_buffer(en.buffer);
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

void ExpertCache::drop_staged(int64_t layer, std::span<const int64_t> keep) {
  for (auto& en : entries_)
    if (en->staged && en->layer == layer &&
        !std::binary_search(keep.begin(), keep.end(), en->expert)) {
      en->staged = false;
      queue_->cancel(en->ticket);
      if (en->refs == 0) en->layer = en->expert = -1;
    }
}

void ExpertCache::routed(int64_t layer, std::span<const int64_t> ids) {
  if (setup_.all_resident) return;
  Layer& L = *layer_of(layer);
  std::lock_guard<std::mutex> ws_lock(ws_mu_);
  std::vector<int64_t>& predicted = predicted_[static_cast<size_t>(layer)];
  if (predicted.empty()) return;
  // A step's ids come sorted and distinct (no copy then).
  std::vector<int64_t> copy;
  std::span<const int64_t> sorted = ids;
  if (std::adjacent_find(ids.begin(), ids.end(), std::greater_equal<int64_t>()) != ids.end()) {
    copy.assign(ids.begin(), ids.end());
    std::sort(copy.begin(), copy.end());
    copy.erase(std::unique(copy.begin(), copy.end()), copy.end());
    sorted = copy;
  }
  uint64_t found = 0;
  for (int64_t e : sorted)
    found += std::binary_search(predicted.begin(), predicted.end(), e) ? 1 : 0;
  predicted_total_ += sorted.size();
  predicted_hits_ += found;
  L.predicted_total += sorted.size();
  L.predicted_hits += found;
  predicted.clear();
  drop_staged(layer, sorted);
}

void ExpertCache::prefetch(int64_t layer, std::span<const int64_t> ids) {
  if (setup_.all_resident) return;
  Layer& L = *layer_of(layer);
  std::lock_guard<std::mutex> lock(L.mu);
  std::lock_guard<std::mutex> ws_lock(ws_mu_);
  drop_staged(layer);
  std::vector<int64_t>& predicted = predicted_[static_cast<size_t>(layer)];
  predicted.assign(ids.begin(), ids.end());
  std::sort(predicted.begin(), predicted.end());
  Entry* fresh[kMaxStaged];
  size_t reads = 0;
  try {
    for (int64_t e : ids) {
      if (reads == kMaxStaged) break;
      if (e < 0 || e >= num_experts_ || L.index[static_cast<size_t>(e)] >= 0) continue;
      if (in_flight(layer, e)) continue;
      Entry* entry = take_entry(true);
      if (!entry) break;
      entry->layer = layer;
      entry->expert = e;
      fresh[reads++] = entry;
    }
    submit_reads(layer, {fresh, reads});
  } catch (...) {
    for (size_t r = 0; r < reads; ++r) {  // nothing staged is left without its read
      fresh[r]->staged = false;
      fresh[r]->layer = fresh[r]->expert = -1;
    }
    predicted.clear();
    throw;
  }
  prefetch_issued_ += reads;
}

void ExpertCache::finish_layer(int64_t layer) {
  if (setup_.all_resident) return;
  layer_of(layer);
  std::lock_guard<std::mutex> ws_lock(ws_mu_);
  drop_staged(layer);
  predicted_[static_cast<size_t>(layer)].clear();
}

void ExpertCache::record(int64_t layer, std::span<const int64_t> ids) {
  Layer& L = *layer_of(layer);
  std::lock_guard<std::mutex> lock(L.mu);
  for (int64_t e : ids)
    if (e >= 0 && e < num_experts_) ++L.usage[static_cast<size_t>(e)];
}

ExpertCacheMemory ExpertCache::memory() const {
  ExpertCacheMemory m;
  const uint64_t each = store_.slot_bytes();
  if (setup_.all_resident) {
    m.slot_bytes = store_.total_bytes();
    m.slots_used = m.slots_budget = store_.total_bytes() / std::max<uint64_t>(1, each);
    return m;
  }
  for (int64_t l : moe_layers_) {
    const Layer& L = *layers_[static_cast<size_t>(l)];
    std::lock_guard<std::mutex> lock(L.mu);
    m.slots_budget += L.slots.size();
    for (const Slot& s : L.slots) {
      if (s.buffer != nullptr) m.slot_bytes += each;
      if (s.expert >= 0) ++m.slots_used;
    }
  }
  std::lock_guard<std::mutex> lock(ws_mu_);
  for (const auto& e : entries_)
    if (e->buffer != nullptr) m.read_buffer_bytes += each;
  return m;
}

ExpertCacheStats ExpertCache::stats() const {
  ExpertCacheStats s;
  s.hits = hits_.load();
  s.misses = misses_.load();
  s.bytes_read = bytes_.load();
  s.transient = transient_count_.load();
  s.wait_seconds = static_cast<double>(wait_ns_.load()) / 1e9;
  s.prefetch_issued = prefetch_issued_.load();
  s.prefetch_used = prefetch_used_.load();
  s.predicted_hits = predicted_hits_.load();
  s.predicted_total = predicted_total_.load();
  if (queue_) {
    const ReadQueueStats q = queue_->stats();
    s.busy_seconds = q.busy_seconds;
    s.drive_bytes = q.bytes;
    s.io_engine = queue_->engine();
  }
  return s;
}

std::vector<ExpertCache::LayerRecall> ExpertCache::recall_by_layer() const {
  std::vector<LayerRecall> out;
  std::lock_guard<std::mutex> lock(ws_mu_);
  for (int64_t l : moe_layers_) {
    const Layer& L = *layers_[static_cast<size_t>(l)];
    if (L.predicted_total > 0) out.push_back({l, L.predicted_hits, L.predicted_total});
  }
  return out;
}

void ExpertCache::clear() {
  for (auto& layer : layers_) {
    if (!layer) continue;
    std::lock_guard<std::mutex> lock(layer->mu);
    for (Slot& slot : layer->slots)
      if (slot.expert >= 0 && !slot.pinned && slot.refs == 0) {
        layer->index[static_cast<size_t>(slot.expert)] = -1;
        slot.expert = -1;
        slot.data = nullptr;
      }
  }
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

std::vector<uint64_t> ExpertCache::usage(int64_t layer) const {
  const Layer& L = *layer_of(layer);
  std::lock_guard<std::mutex> lock(L.mu);
  return L.usage;
}

void ExpertCache::set_held_elsewhere(std::function<bool(int64_t, int64_t)> held) {
  held_elsewhere_ = std::move(held);
}

void ExpertCache::load_history() {
  const std::string& path = setup_.history_path;
  if (path.empty() || ::access(path.c_str(), F_OK) != 0) return;
  std::string text;
  try {
    text = read_text_file(path);
  } catch (const Error& e) {
    say(std::string("routing history ignored: ") + e.what());
    return;
  }
  const uint32_t hash = history_hash(setup_.model_identity);
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
      if (b != setup_.history_layers || c != num_experts_) {
        say(path + ": routing history refused: written for " + std::to_string(b) + " layers x " +
            std::to_string(c) + " experts, this model has " +
            std::to_string(setup_.history_layers) + " x " + std::to_string(num_experts_) +
            " (another model's file; it is left as it is)");
        history_refused_ = true;
        return;
      }
    } else if (a == -2) {
      if (b != kHistoryVersion || static_cast<uint32_t>(c) != hash) {
        say(path + ": routing history refused: written by another model or format (version " +
            std::to_string(b) + ", identity " + std::to_string(c) + "; this model is " +
            std::to_string(hash) + "); it is left as it is");
        history_refused_ = true;
        return;
      }
    } else if (a < 0) {
      continue;  // a header record of a later format: skipped, as old readers do
    } else if (a >= static_cast<long long>(layers_.size()) || !layers_[static_cast<size_t>(a)] ||
               b < 0 || b >= num_experts_ || c < 0) {
      ++bad;
    } else {
      records.emplace_back(a, b, static_cast<uint64_t>(c));
    }
  }
  if (!geometry_seen && !records.empty()) {
    say(path +
        ": routing history refused: no geometry record (-1 <layers> <experts>); it is left as it "
        "is");
    history_refused_ = true;
    return;
  }
  for (const auto& [l, e, c] : records)
    layers_[static_cast<size_t>(l)]->usage[static_cast<size_t>(e)] += c;
  if (bad > 0)
    say(path + ": " + std::to_string(bad) + " malformed routing-history line(s) skipped");
}

void ExpertCache::seed_pins() {
  const double total = static_cast<double>(history_total());
  if (total < kPinMinHistory) return;
  const double confidence = std::min(1.0, total / kPinFullConfidence);
  const int64_t quota = std::min<int64_t>(
      static_cast<int64_t>(std::floor(static_cast<double>(slots_per_layer_) * 0.5 * confidence)),
      slots_per_layer_ / 2);
  if (quota <= 0) return;
  for (int64_t l : moe_layers_) {
    Layer& L = *layers_[static_cast<size_t>(l)];
    std::vector<int64_t> order;
    for (int64_t e = 0; e < num_experts_; ++e)
      if (L.usage[static_cast<size_t>(e)] > 0 && store_.has(l, e)) order.push_back(e);
    const size_t n = std::min<size_t>(static_cast<size_t>(quota), order.size());
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                      [&](int64_t a, int64_t b) {
                        const uint64_t ca = L.usage[static_cast<size_t>(a)],
                                       cb = L.usage[static_cast<size_t>(b)];
                        return ca != cb ? ca > cb : a < b;
                      });
    order.resize(n);
    // Read in parallel through the queue, straight into the pinned slots.
    std::vector<std::unique_ptr<ReadTicket>> tickets;
    std::vector<const uint8_t*> data(n);
    for (size_t i = 0; i < n; ++i) {
      Slot& slot = L.slots[i];
      slot.buffer = allocate_direct_buffer(store_.slot_bytes());
      const ExpertStore::ReadPlan plan =
          store_.plan_read(l, order[i], slot.buffer, options_.direct);
      data[i] = plan.data;
      tickets.push_back(std::make_unique<ReadTicket>());
      queue_->submit(*tickets.back(), {plan.requests.data(), plan.count});
    }
    for (size_t i = 0; i < n; ++i) {
      tickets[i]->wait();
      store_.finish_read(l, order[i], data[i], tickets[i]->error());
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
}

bool ExpertCache::save_history() {
  if (setup_.history_save_path.empty()) {
    if (!setup_.history_unsaved.empty())
      say("routing history not saved: " + setup_.history_unsaved);
    return false;
  }
  if (history_refused_) {
    say(setup_.history_save_path +
        ": routing history not saved (the file there belongs to another model)");
    return false;
  }
  std::ostringstream out;
  out << "-1 " << setup_.history_layers << ' ' << num_experts_ << '\n';
  out << "-2 " << kHistoryVersion << ' ' << history_hash(setup_.model_identity) << '\n';
  for (int64_t l : moe_layers_) {
    const Layer& L = *layers_[static_cast<size_t>(l)];
    std::lock_guard<std::mutex> lock(L.mu);
    for (int64_t e = 0; e < num_experts_; ++e)
      if (const uint64_t c = L.usage[static_cast<size_t>(e)]; c > 0)
        out << l << ' ' << e << ' ' << decayed(c, options_.usage_decay) << '\n';
  }
  const std::string text = out.str();
  try {
    write_file_atomic(setup_.history_save_path, {ByteSpan{text.data(), text.size()}}, 0600, true);
  } catch (const Error& e) {
    say(std::string("routing history not saved: ") + e.what());
    return false;
  }
  return true;
}

}  // namespace k3

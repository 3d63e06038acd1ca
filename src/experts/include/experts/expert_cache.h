// experts/expert_cache.h — the routed experts the MoE layers compute with: a RAM cache over
// ExpertStore with a global budget split per MoE layer, LRU within a layer, history-seeded pins,
// and a working set that keeps a batch's experts valid while it runs.
// The ExpertSource a MoE layer asks for its experts' bytes (run(): one layer step, batches,
// read-ahead, compute as reads land).
// Owns: slots and their aligned buffers, replacement, the RAM clamp, the routing history file
// (.coli_usage), hit/miss/byte counters. Configured by CacheOptions (options/options.h) and the
// model's facts (ExpertCacheSetup). Does not own: where experts are on disk or how one is read
// (ExpertStore), or the routing (model/latent_moe).
//
// Budget: slots per layer = floor(expert_gb · 1e9 / (expert_bytes · MoE layers)), at least 1,
// at most num_experts; lowered (one stderr note) when the memory left after the resident weights
// cannot hold it; refused only when one slot per layer would not fit. A batch (one token's
// experts, or up to kMaxBatch of a prefill chunk's) may need more slots than a layer has: its
// misses live in the working set (entries beyond the budget, kWorkingSet kept for reuse so a
// decode step allocates nothing) until the batch is released.
//
// Replacement per layer (segmented LRU): a hit moves the expert to the protected segment's
// head. A miss of a token batch (decode) takes a free slot, else evicts the probation segment's
// oldest, else the protected segment's oldest unpinned slot not held by a running batch. A miss
// of a chunk batch (prefill) enters probation (the LRU tail) and may only take a free slot or
// evict another probation entry, so one-off prefill experts never flush the decode working set;
// a later hit promotes it. Pinned slots (seeded from the history) are never evicted, at most
// half of a layer's slots.
//
// Reads (io/read_queue: io_uring, else a thread pool) land in working-set entries beyond the
// budget, issued in disk-offset order (file, offset). With `pipe` (K3_PIPE, default) acquire()
// returns as soon as the misses are submitted and each view waits for its own read
// (ExpertBatch::view), so compute on the first experts overlaps the reads of the rest; without
// it acquire() waits for every read (still in parallel). A read error surfaces as k3::Error on
// the thread asking for the view. When a batch is released, its misses that arrived are promoted
// into the layer's slots (buffers swapped, no copy) by the replacement rule above (never evicting a
// slot promoted by the same release); the rest are counted as transient.
//
// Prefetch: prefetch(layer, ids) starts reads of experts predicted for a layer (staged in the
// working set, never evicting anything); a later acquire() of that layer takes a staged read as
// its own (waiting only for what is left of it). Once the layer's real routing is known
// (routed()), staged reads it does not need are cancelled; the rest are dropped at
// finish_layer() or at the next prediction for that layer. Recall (predicted ∩ used / used) and
// use of the reads are counted.
//
// Routing history decay (COLI_USAGE_DECAY = d in (0, 1]): counters are multiplied by d before
// saving, rounded, a count of 1 never dropping to 0.
//
// Thread-safety: acquire/release/record/stats may be called from several threads (one mutex per
// layer); a batch's views stay valid until it is released.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "experts/expert_source.h"
#include "experts/expert_store.h"
#include "io/read_queue.h"
#include "options/options.h"

namespace k3 {

// What the cache needs beside the user's CacheOptions: facts about the model and where its
// routing history is kept (derived by the model, never option fields).
struct ExpertCacheSetup {
  std::vector<int64_t> moe_layers;  // the layer indices holding routed experts (all in the store)
  int64_t num_experts = 0;
  bool all_resident = false;      // every expert read into RAM at load (ExpertStore::load_all)
  int64_t history_layers = 0;     // the model's full layer count (the file's geometry record)
  std::string model_identity;     // hashed into the file's identity record
  std::string history_path;       // .coli_usage read at start ("" = no history)
  std::string history_save_path;  // where save_history() writes ("" = nowhere)
  std::string history_unsaved;    // why there is nowhere to save ("" = not said)
  // Bytes the cache may occupy at most (the RAM clamp); < 0 = measure: 0.9 · MemAvailable (taken
  // after the resident weights are loaded, so they are already excluded) − 2 GB reserve for
  // activations and page cache.
  int64_t memory_limit = -1;
  // Bytes the caller holds back for its sessions (their state is allocated after the cache is
  // sized): taken off the measured limit, and named in the error when one slot no longer fits.
  uint64_t reserved_bytes = 0;
  uint64_t read_extent_bytes = 0;  // pieces reads are split into (0 = the read queue's default)
  std::function<void(const std::string&)> note;  // one-line notes (default: stderr)
};

// Where the routing history of the model at `model_dir` is read and saved: in
// options.state_dir (one file per model, mode 0600, named by a hash of the model's real path),
// never written into the model directory (it may be read-only, and a served model's files stay
// untouched). A missing state directory is created 0700; an existing one is never chmod-ed: it is
// used as it is when only its owner (this user or root) may write to it, a shared sticky one
// (like /tmp) gets a private subdirectory "kimi_k3-<uid>" (0700), and one other users may write
// to without the sticky bit, or that belongs to another user, is refused (history_unsaved says
// why; nothing is saved). A `.coli_usage` beside the model is read while the state directory has
// none yet. Fills setup's history_path, history_save_path and history_unsaved.
void locate_history(const CacheOptions& options, const std::string& model_dir,
                    ExpertCacheSetup* setup);

struct ExpertCacheStats {
  uint64_t hits = 0;         // experts found in a slot (or resident)
  uint64_t misses = 0;       // experts read from disk (read-ahead included, even when cancelled)
  uint64_t bytes_read = 0;   // bytes of those reads (as asked; see drive_bytes)
  uint64_t drive_bytes = 0;  // bytes that came from the drive (cancelled read-ahead left out)
  uint64_t transient = 0;    // misses not kept in a slot after their batch
  double wait_seconds = 0;   // compute thread blocked on reads (un-hidden I/O wait)
  double busy_seconds = 0;   // wall time with at least one read in flight (drive busy)
  uint64_t prefetch_issued = 0;  // experts read ahead on a prediction
  uint64_t prefetch_used = 0;    // of those, taken by the layer's acquire()
  uint64_t predicted_hits = 0;  // selections that were in the layer's prediction (recall numerator)
  uint64_t predicted_total =
      0;  // distinct experts of layer steps that had a prediction (recall denominator)
  const char* io_engine = "";  // "io_uring" or "threads"
  double recall() const {
    return predicted_total
               ? static_cast<double>(predicted_hits) / static_cast<double>(predicted_total)
               : 0;
  }
  double hit_ratio() const {
    return hits + misses ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0;
  }
};

// The memory an ExpertCache holds (ExpertCache::memory()): slot buffers allocated, slots holding
// an expert of the budget (over all MoE layers; every expert when all are resident), and the
// working set's read buffers (misses in flight or just arrived, kept up to kWorkingSet).
struct ExpertCacheMemory {
  uint64_t slot_bytes = 0;
  uint64_t slots_used = 0, slots_budget = 0;
  uint64_t read_buffer_bytes = 0;
};

class ExpertCache;

// The experts of one acquire(): view(i) in the order asked for, valid until release() (or the
// next acquire into the same batch, or destruction). Reused across calls without allocating.
class ExpertBatch {
 public:
  static constexpr size_t kMaxBatch = 64;  // experts one acquire() takes at most
  ExpertBatch() = default;
  // A batch lives only inside one forward call: copying or moving one (a workspace being
  // copied) yields an empty batch.
  ExpertBatch(const ExpertBatch&) {}
  ExpertBatch& operator=(const ExpertBatch&) {
    release();
    return *this;
  }
  ~ExpertBatch() { release(); }
  size_t size() const { return count_; }
  // The i-th expert's bytes, waiting for its read first. Throws k3::Error naming the file,
  // layer and expert when that read failed.
  const ExpertView& view(size_t i);
  // True when view(i) would not wait.
  bool ready(size_t i) const;
  void release();

 private:
  friend class ExpertCache;
  struct Item {
    ExpertView view;
    int32_t slot = -1;      // slot held (a hit), or -1
    void* entry = nullptr;  // working-set entry held (a miss), or nullptr
    bool ready = false;
  };
  ExpertCache* cache_ = nullptr;
  int64_t layer_ = -1;
  int use_ = 0;                        // ExpertCache::Use of the acquire
  std::array<Item, kMaxBatch> items_;  // [count_] used (fixed: an acquire allocates nothing)
  size_t count_ = 0;
  std::span<Item> items() { return {items_.data(), count_}; }
};

class ExpertCache final : public ExpertSource {
 public:
  using Use = ExpertUse;
  // Largest batch one acquire() takes (bounds the transient buffers).
  static constexpr size_t kMaxBatch = ExpertBatch::kMaxBatch;
  // Working-set entries kept allocated between batches, and staged (prefetched) reads at most.
  static constexpr size_t kWorkingSet = 64;
  static constexpr size_t kMaxStaged = 64;

  // Over the experts of `store` in setup.moe_layers. Throws k3::Error when one slot per layer
  // does not fit the memory limit, or when a pinned expert cannot be read.
  ExpertCache(const ExpertStore& store, const CacheOptions& options, ExpertCacheSetup setup);
  ~ExpertCache() override;
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // ExpertSource: a MoE layer's step. The ids go through acquire() in batches of kMaxBatch; after
  // the last batch's misses are queued, the work's read-ahead guess (K3_PREFETCH, when on) is
  // prefetch()ed; each batch's experts are applied as their reads land.
  void run(int64_t layer, std::span<const int64_t> ids, ExpertUse use, ExpertWork& work) override;

  // The protocol run() drives (public for tests and benchmarks).
  // Makes the experts `ids` (distinct, at most kMaxBatch) of `layer` available in `batch`
  // (releasing what it held). Throws k3::Error naming the file, layer and expert on a read
  // error; the batch then holds nothing.
  void acquire(int64_t layer, std::span<const int64_t> ids, Use use, ExpertBatch& batch);
  // Starts reads of `ids` (most likely first) predicted for `layer`, replacing its previous
  // prediction. Never evicts; skips experts already cached or in flight. Returns at once.
  void prefetch(int64_t layer, std::span<const int64_t> ids);
  // The layer's real choice is known: `ids` are every expert its step will acquire. Staged reads
  // outside them are cancelled (what has not reached the drive yet never will, so the real
  // misses do not queue behind wrong guesses) and the prediction's recall is counted.
  void routed(int64_t layer, std::span<const int64_t> ids);
  // The layer's step is over: its unused staged reads are dropped and cancelled (buffers
  // reclaimed when their in-flight pieces end).
  void finish_layer(int64_t layer);
  // Counts one routing selection of each of `ids` in the history.
  void record(int64_t layer, std::span<const int64_t> ids) override;

  ExpertCacheStats stats() const;
  // What the cache holds in memory now. Thread-safe (takes each layer's lock, then the working
  // set's, one at a time).
  ExpertCacheMemory memory() const;
  // Per MoE layer: {layer, selections predicted, selections} of the read-ahead (recall).
  struct LayerRecall {
    int64_t layer;
    uint64_t predicted_hits, predicted_total;
  };
  std::vector<LayerRecall> recall_by_layer() const;
  // Empties every unpinned slot not held by a batch (benchmarks start cold).
  void clear();
  // K3_PIPE at run time (benchmarks compare both in one process). Not during an acquire().
  void set_pipe(bool pipe) { options_.pipe = pipe; }
  // K3_PREFETCH at run time (benchmarks compare both in one process).
  void set_prefetch(bool on) { prefetch_.store(on, std::memory_order_relaxed); }
  int64_t slots_per_layer() const { return slots_per_layer_; }
  int64_t pinned(int64_t layer) const;
  // The experts in `layer`'s slots, most recently used first (probation after protected).
  std::vector<int64_t> cached(int64_t layer) const;
  bool all_resident() const { return setup_.all_resident; }
  // Total selections in the history (loaded plus recorded).
  uint64_t history_total() const;
  // A MoE layer's selections per expert in the history (loaded plus recorded) [num_experts].
  std::vector<uint64_t> usage(int64_t layer) const;
  // Exclusive caching with another holder of experts (a device tier, docs/vulkan.md §5): when a
  // slot must be given up, one whose expert `held(layer, expert)` says is held there goes first.
  // `held` is called under the layer's lock and must not call back into the cache. nullptr: none.
  void set_held_elsewhere(std::function<bool(int64_t layer, int64_t expert)> held);

  // Writes the history to history_save_path atomically. Returns false (with a note when the
  // setup said why, or the write failed) when there is nowhere to write; never throws.
  bool save_history();

 private:
  friend class ExpertBatch;
  struct Slot;
  struct Layer;
  struct Entry;
  Layer* layer_of(int64_t layer) const;
  void release(ExpertBatch& batch);
  void wait_item(ExpertBatch& batch, size_t i);
  bool arrived(const void* entry) const;
  // A free working-set entry (allocated when none), or nullptr when `staged` and kMaxStaged are
  // staged already. REQUIRES: ws_mu_ held.
  Entry* take_entry(bool staged);
  // Submits the reads of `entries` (of `layer`) in disk-offset order. REQUIRES: ws_mu_ held.
  void submit_reads(int64_t layer, std::span<Entry* const> entries);
  // Waits for an entry's read and validates it once; throws its error. REQUIRES: ws_mu_ not held.
  void complete(Entry& entry);
  // Validates an arrived entry once, keeping a failure in entry.error. REQUIRES: ws_mu_ held,
  // the entry's read done.
  void check(Entry& entry) const;
  // The entry holding or reading (layer, expert) for a batch or a prediction, or nullptr.
  // REQUIRES: ws_mu_ held.
  Entry* in_flight(int64_t layer, int64_t expert) const;
  // Drops (and cancels) the staged reads of `layer` whose expert is not in `keep` (sorted).
  // REQUIRES: ws_mu_ held.
  void drop_staged(int64_t layer, std::span<const int64_t> keep = {});
  void load_history();
  void seed_pins();
  void say(const std::string& line) const;

  const ExpertStore& store_;
  CacheOptions options_;
  ExpertCacheSetup setup_;
  std::atomic<bool> prefetch_{false};
  int64_t num_experts_;
  int64_t slots_per_layer_ = 0;
  std::vector<int64_t> moe_layers_;
  std::vector<std::unique_ptr<Layer>> layers_;  // [model layer] (nullptr for dense layers)
  std::unique_ptr<ReadQueue> queue_;
  mutable std::mutex ws_mu_;                     // guards the working set and predictions
  std::vector<std::unique_ptr<Entry>> entries_;  // the working set
  std::vector<std::vector<int64_t>> predicted_;  // [model layer]: the latest prediction, sorted
  std::atomic<uint64_t> hits_{0}, misses_{0}, bytes_{0}, transient_count_{0};
  std::atomic<uint64_t> wait_ns_{0}, prefetch_issued_{0}, prefetch_used_{0}, predicted_hits_{0},
      predicted_total_{0};
  bool history_refused_ = false;
  std::function<bool(int64_t, int64_t)> held_elsewhere_;  // set_held_elsewhere (before any step)
};

// A history counter after decay d (COLI_USAGE_DECAY): round(count · d), never 1 → 0.
uint64_t decayed(uint64_t count, double decay);

// 32-bit FNV-1a of `text` (the history's model identity).
uint32_t history_hash(const std::string& text);

// The read queue CacheOptions asks for (K3_IO_ENGINE, K3_LOAD_THREADS).
ReadQueueOptions read_queue_options(const CacheOptions& options);

}  // namespace k3

// experts/expert_cache.h — the routed experts the MoE layers compute with: a RAM cache over
// ExpertStore with a global budget split per MoE layer, LRU within a layer, history-seeded pins,
// and a working set that keeps a batch's experts valid while it runs.
// Owns: slots and their aligned buffers, replacement, the RAM clamp, the routing history file
// (.coli_usage), hit/miss/byte counters. Does not own: where experts are on disk or how one is
// read (ExpertStore), or the routing (model/latent_moe).
//
// Budget: slots per layer = floor(expert_gb · 1e9 / (expert_bytes · MoE layers)), at least 1,
// at most num_experts; lowered (one stderr note) when the memory left after the resident weights
// cannot hold it; refused only when one slot per layer would not fit. A batch (one token's
// experts, or up to max_batch() of a prefill chunk's) may need more slots than a layer has, or
// find them all held by another batch: those experts are read into transient buffers, beyond
// the budget, returned when the batch is released (up to kSpareTransients are kept for reuse, so
// a decode step allocates nothing).
//
// Replacement per layer (segmented LRU): a hit moves the expert to the protected segment's
// head. A miss of a token batch (decode) takes a free slot, else evicts the probation segment's
// oldest, else the protected segment's oldest unpinned slot not held by a running batch. A miss
// of a chunk batch (prefill) enters probation (the LRU tail) and may only take a free slot or
// evict another probation entry, so one-off prefill experts never flush the decode working set;
// a later hit promotes it. Pinned slots (seeded from the history) are never evicted, at most
// half of a layer's slots.
//
// Misses of a batch are read in disk-offset order (file, offset), one expert after another on
// the calling thread; read_batch() is the seam for overlapped I/O (io_uring) and prefetch.
//
// Routing history: every selection counts one for its (layer, expert). The file has three
// numeric fields per line: `-1 <n_layers> <n_experts>` (geometry), `-2 <version> <model hash>`
// (identity), then `<layer> <expert> <count>` for non-zero counts. A file written by another
// model (geometry or hash differ) is refused with a note and never overwritten; malformed lines
// are skipped with a note. save_history() writes it atomically (temp + rename).
//
// Thread-safety: acquire/release/record/stats may be called from several threads (one mutex per
// layer); a batch's views stay valid until it is released.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "experts/expert_store.h"

namespace k3 {

struct ExpertCacheOptions {
  double expert_gb = 8;          // K3_EXPERT_GB: budget of all layers' slots, GB (1e9 bytes)
  bool direct = true;            // K3_DIRECT: O_DIRECT reads (0 = buffered + read-ahead advice)
  bool all_resident = false;     // --experts-in-memory: every expert read into RAM at start
  bool pin = true;               // K3_PIN: seed pinned slots from the routing history
  // Bytes the cache may occupy at most (the RAM clamp); < 0 = measure: 0.9 · MemAvailable (taken
  // after the resident weights are loaded, so they are already excluded) − 2 GB reserve for
  // activations and page cache.
  int64_t memory_limit = -1;
  std::string history_path;      // .coli_usage read at start ("" = no history)
  std::string history_save_path; // where save_history() writes ("" = nowhere)
  int64_t history_layers = 0;    // the model's full layer count (the file's geometry record)
  std::string model_identity;    // hashed into the file's identity record
  std::function<void(const std::string&)> note;  // one-line notes (default: stderr)
};

struct ExpertCacheStats {
  uint64_t hits = 0;         // experts found in a slot (or resident)
  uint64_t misses = 0;       // experts read from disk
  uint64_t bytes_read = 0;   // bytes of those reads
  double read_seconds = 0;   // wall time spent reading (on the compute thread)
  uint64_t transient = 0;    // misses served from transient buffers (not kept)
  double hit_ratio() const { return hits + misses ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0; }
};

class ExpertCache;

// The experts of one acquire(): views in the order asked for, valid until release() (or the
// next acquire into the same batch, or destruction). Reused across calls without allocating.
class ExpertBatch {
 public:
  ExpertBatch() = default;
  // A batch lives only inside one forward call: copying or moving one (a workspace being
  // copied) yields an empty batch.
  ExpertBatch(const ExpertBatch&) {}
  ExpertBatch& operator=(const ExpertBatch&) {
    release();
    return *this;
  }
  ~ExpertBatch() { release(); }
  size_t size() const { return views_.size(); }
  const ExpertView& operator[](size_t i) const { return views_[i]; }
  void release();

 private:
  friend class ExpertCache;
  ExpertCache* cache_ = nullptr;
  int64_t layer_ = -1;
  std::vector<ExpertView> views_;
  std::vector<int32_t> slots_;     // per view: slot index held, or -1
  std::vector<uint8_t*> transient_;  // transient buffers held
};

class ExpertCache {
 public:
  enum class Use { kToken, kChunk };  // decode (one token) or a prefill chunk
  // Largest batch one acquire() takes (bounds the transient buffers).
  static constexpr size_t kMaxBatch = 64;
  static constexpr size_t kSpareTransients = 16;

  // `moe_layers`: the layer indices holding routed experts (all registered in `store`).
  // Throws k3::Error when one slot per layer does not fit the memory limit, or when a pinned
  // expert cannot be read.
  ExpertCache(const ExpertStore& store, std::vector<int64_t> moe_layers, int64_t num_experts,
              ExpertCacheOptions options);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // Makes the experts `ids` (distinct, at most kMaxBatch) of `layer` available in `batch`
  // (releasing what it held). Throws k3::Error naming the file, layer and expert on a read
  // error; the batch then holds nothing.
  void acquire(int64_t layer, std::span<const int64_t> ids, Use use, ExpertBatch& batch);
  // Counts one routing selection of each of `ids` in the history.
  void record(int64_t layer, std::span<const int64_t> ids);

  ExpertCacheStats stats() const;
  int64_t slots_per_layer() const { return slots_per_layer_; }
  int64_t pinned(int64_t layer) const;
  // The experts in `layer`'s slots, most recently used first (probation after protected).
  std::vector<int64_t> cached(int64_t layer) const;
  bool all_resident() const { return options_.all_resident; }
  // Total selections in the history (loaded plus recorded).
  uint64_t history_total() const;

  // Writes the history to history_save_path atomically. Returns false (with a note) when there
  // is nowhere to write or the write failed; never throws.
  bool save_history();

 private:
  friend class ExpertBatch;
  struct Slot;
  struct Layer;
  Layer* layer_of(int64_t layer) const;
  void release(ExpertBatch& batch);
  // Reads the experts `ids` of `layer` into `dst` (one slot buffer each) in disk-offset order.
  void read_batch(int64_t layer, std::span<const int64_t> ids, std::span<uint8_t* const> dst,
                  std::span<const uint8_t*> data);
  uint8_t* take_transient();
  void load_history();
  void seed_pins();
  void say(const std::string& line) const;

  const ExpertStore& store_;
  ExpertCacheOptions options_;
  int64_t num_experts_;
  int64_t slots_per_layer_ = 0;
  std::vector<int64_t> moe_layers_;
  std::vector<std::unique_ptr<Layer>> layers_;  // [model layer] (nullptr for dense layers)
  std::mutex transient_mu_;
  std::vector<uint8_t*> spare_;                  // transient buffers kept for reuse
  std::atomic<uint64_t> hits_{0}, misses_{0}, bytes_{0}, transient_count_{0};
  std::atomic<uint64_t> read_ns_{0};
  bool history_refused_ = false;
};

// 32-bit FNV-1a of `text` (the history's model identity).
uint32_t history_hash(const std::string& text);

}  // namespace k3

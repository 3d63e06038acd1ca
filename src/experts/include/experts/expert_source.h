// experts/expert_source.h — what a MoE layer asks of the routed experts: their bytes, one layer
// step at a time. The layer says which experts its rows chose and computes with each expert's
// bytes as they arrive; everything about where the bytes come from (RAM slots, LRU, pins, reads,
// read-ahead, the routing history) is the source's (experts/expert_cache.h implements it,
// make_expert_source builds it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "experts/expert_store.h"

namespace k3 {

// What a step is for: decode (one token) or a prefill chunk (its one-off experts must not flush
// the decode working set).
enum class ExpertUse { kToken, kChunk };

// The computation of one layer step, called back by ExpertSource::run.
class ExpertWork {
 public:
  // May ids[g] be computed now, ahead of an id before it that is not computed yet (its bytes are
  // here, the earlier one's are not)? A yes reserves whatever computing it out of order needs.
  virtual bool ahead(size_t g) = 0;
  // Computes with ids[g]'s bytes. Called exactly once per id.
  virtual void apply(size_t g, const ExpertView& view) = 0;
  // Called once, after the step's own reads are queued: the experts to read ahead for the MoE
  // layer `*layer` (most likely first; empty = none). The real routing of that layer decides
  // later; this only moves reads earlier.
  virtual std::span<const int64_t> read_ahead(int64_t* layer) = 0;

 protected:
  ~ExpertWork() = default;
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // Counts one routing selection of each of `ids` (one row's choice) in the routing history.
  virtual void record(int64_t layer, std::span<const int64_t> ids) = 0;
  // One step of MoE layer `layer` over `ids` (distinct, ascending: every expert the step's rows
  // chose): calls work.apply once per id, those whose bytes are already here first, otherwise in
  // id order, each with the expert's bytes (valid during the call). Throws k3::Error naming the
  // file, layer and expert when a read fails. Allocates nothing in the steady state.
  virtual void run(int64_t layer, std::span<const int64_t> ids, ExpertUse use,
                   ExpertWork& work) = 0;
};

}  // namespace k3

// experts/expert_store.h — where each routed expert's bytes live, and reading them.
// Owns: per (layer, expert) the six MXFP4 tensors' locations taken from the shard headers (never
// computed from the id; the table is indexed directly by layer and expert, no search), the
// contiguity check (one read per expert, six otherwise), byte counts checked against the geometry,
// exponent-byte validation, the O_DIRECT read with its 4 KiB alignment at both ends. Does not own:
// caching (ExpertCache), background I/O or the tensor names (model/tensor_names).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "io/model_files.h"
#include "io/read_queue.h"
#include "util/uninit_vector.h"

namespace k3 {

// Shapes of one routed expert (all MXFP4, group 32).
struct ExpertGeometry {
  int64_t hidden = 0;        // routed_expert_hidden_size: input of gate/up, output of down
  int64_t intermediate = 0;  // moe_intermediate_size: output of gate/up, input of down
  uint64_t gate_packed_bytes() const { return uint64_t(intermediate) * uint64_t(hidden) / 2; }
  uint64_t gate_scale_bytes() const { return uint64_t(intermediate) * uint64_t(hidden) / 32; }
  uint64_t down_packed_bytes() const { return uint64_t(hidden) * uint64_t(intermediate) / 2; }
  uint64_t down_scale_bytes() const { return uint64_t(hidden) * uint64_t(intermediate) / 32; }
  uint64_t expert_bytes() const {
    return 2 * (gate_packed_bytes() + gate_scale_bytes()) + down_packed_bytes() +
           down_scale_bytes();
  }
};

// Pointers into an expert's bytes. gate = w1, up = w3: packed [intermediate][hidden/2], scale
// [intermediate][hidden/32]; down = w2: packed [hidden][intermediate/2], scale
// [hidden][intermediate/32].
struct ExpertView {
  const uint8_t* gate_packed = nullptr;
  const uint8_t* gate_scale = nullptr;
  const uint8_t* down_packed = nullptr;
  const uint8_t* down_scale = nullptr;
  const uint8_t* up_packed = nullptr;
  const uint8_t* up_scale = nullptr;
};

// The six tensors of one expert in on-disk name order: w1 packed, w1 scale, w2 packed, w2 scale,
// w3 packed, w3 scale.
using ExpertTensors = std::array<LocatedTensor, 6>;

class ExpertStore {
 public:
  explicit ExpertStore(ExpertGeometry geometry) : geometry_(geometry) {}

  const ExpertGeometry& geometry() const { return geometry_; }

  // Registers an expert. Throws k3::Error when a tensor's byte count disagrees with the geometry.
  void add(int64_t layer, int64_t expert, const ExpertTensors& tensors);

  // True when the expert's six tensors are back to back in one file (one read).
  bool contiguous(int64_t layer, int64_t expert) const;

  // Where an expert starts on disk (its first tensor), for issuing a batch in disk order.
  struct Location {
    const File* file = nullptr;
    uint64_t offset = 0;
  };
  Location location(int64_t layer, int64_t expert) const;

  // Bytes of a slot an expert is read into: the expert plus one alignment block at each end.
  uint64_t slot_bytes() const { return window_bytes(geometry_.expert_bytes()); }
  // The read of an expert into `slot` (REQUIRES for `direct`: kDirectAlign-aligned, slot_bytes()
  // long) as requests for a ReadQueue, and where its bytes will start inside the slot. `direct`:
  // a contiguous expert is read with O_DIRECT from the enclosing aligned window (offset rounded
  // down, end rounded up, or down to the last whole block before end of file with the tail read
  // buffered), no copy. Otherwise one buffered read (six when the tensors are not contiguous;
  // read-ahead advice is the caller's, via advise()).
  struct ReadPlan {
    std::array<ReadRequest, 7> requests;
    size_t count = 0;
    const uint8_t* data = nullptr;
  };
  ReadPlan plan_read(int64_t layer, int64_t expert, uint8_t* slot, bool direct) const;
  // Completes a planned read: `error` (the ticket's, "" when none) becomes a k3::Error naming the
  // file, layer and expert; then the bytes at `data` are checked for an exponent byte of 255
  // (NaN in OCP MXFP4), an error naming the tensor, layer and expert.
  void finish_read(int64_t layer, int64_t expert, const uint8_t* data,
                   const std::string& error) const;
  // Read-ahead advice for a buffered read of the expert soon.
  void advise(int64_t layer, int64_t expert) const;
  // Views of an expert whose bytes start at `bytes`.
  ExpertView view(const uint8_t* bytes) const;
  // The resident copy's views after load_all() (nullptr bytes otherwise).
  const uint8_t* resident(int64_t layer, int64_t expert) const {
    return entry(layer, expert).resident;
  }

  // Reads every registered expert into RAM once (validated); later reads copy nothing. For
  // models whose routed experts fit in memory (tests, benchmarks, small checkpoints).
  // `cancel` (optional) is polled before each expert: false when it stopped the load (the
  // resident copy is then incomplete and must not be used).
  bool load_all(const std::atomic<bool>* cancel = nullptr);
  // Bytes of all registered experts.
  uint64_t total_bytes() const { return geometry_.expert_bytes() * registered_; }
  bool has(int64_t layer, int64_t expert) const;

 private:
  struct Entry {
    ExpertTensors tensors;
    bool registered = false;
    bool contiguous = false;
    const uint8_t* resident = nullptr;  // into arena_ after load_all()
  };
  const Entry& entry(int64_t layer, int64_t expert) const;
  void validate(const Entry& e, const uint8_t* bytes, int64_t layer, int64_t expert) const;

  ExpertGeometry geometry_;
  // [layer][expert], indexed directly (no search on the read path); unregistered holes allowed.
  std::vector<std::vector<Entry>> entries_;
  uint64_t registered_ = 0;
  UninitVector<uint8_t> arena_;  // [experts][expert_bytes] after load_all() (written once)
};

}  // namespace k3

// engine/checkpoints.h — recurrent-state checkpoints (saved KDA state, docs/serving.md §3.10.2,
// §3.10): a few slots holding a session's KDA state at prompt boundaries and at the end of replies,
// so that an edited or re-rendered conversation resumes from the deepest checkpoint that still
// matches instead of re-prefilling everything.
//
// Slot policy: an identical (position, ids) checkpoint only refreshes its LRU stamp; otherwise the
// first empty slot, else the least recently used one. Restore: the deepest checkpoint with
// 1 <= pos <= live (the live common prefix of the session's record and the new prompt, which
// proves the MLA rows below pos are still valid) whose ids equal prompt[0, pos).
//
// RAM mode keeps the floats in memory. Disk mode writes one file per slot, `k3_ckpt_<slot>.bin`,
// in a 0700 directory, mode 0600, through a temp file and a rename; the header (magic "3CKP",
// version, position, float count, FNV-1a of the payload) is checked on load and a checkpoint that
// fails the check is dropped, never restored. Metadata (ids, position, stamp) stays in memory:
// checkpoints never outlive the process (the MLA rows do not). Files are removed when the store is
// destroyed unless `keep_files`.
//
// Failures to save (allocation, I/O) drop the checkpoint and never fail a request. Not thread-safe:
// the engine worker owns the store.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace k3 {

struct CheckpointPolicy {
  int slots = 0;            // 0 = off
  std::string dir;          // empty = RAM checkpoints
  bool keep_files = false;  // leave the disk checkpoints behind on exit
};

struct CheckpointCounters {
  int64_t saves = 0, restores = 0,
          rejected = 0;  // rejected: disk checkpoints that failed the check
  double restore_seconds = 0;
};

class CheckpointStore {
 public:
  // Creates the directory (0700) in disk mode. Throws k3::Error when it cannot.
  explicit CheckpointStore(const CheckpointPolicy& policy);
  ~CheckpointStore();
  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  bool enabled() const { return !slots_.empty(); }
  // "off", "ram, 2 slots", "disk /path, 2 slots".
  std::string describe() const;
  const CheckpointPolicy& policy() const { return policy_; }

  // Saves a checkpoint of `session` at its position (nothing below position 1). Returns false when
  // the checkpoint was dropped (an error is written to stderr) or the store is off.
  bool save(const Session& session);
  // True when a checkpoint of exactly (position, ids) is held.
  bool holds(int64_t position, std::span<const int64_t> ids) const;
  // Restores the deepest usable checkpoint into `session` (see above) and returns its position, or
  // 0 when none fits (the session is then untouched).
  int64_t restore_best(Session& session, std::span<const int64_t> prompt, int64_t live);
  // Drops every checkpoint (RAM and files).
  void clear();

  struct SlotInfo {
    int slot;
    int64_t position;
    double age_seconds;
  };
  std::vector<SlotInfo> list() const;
  int used() const;
  const CheckpointCounters& counters() const { return counters_; }
  // The file of `slot` in disk mode (tests corrupt it).
  std::string slot_path(int slot) const;

 private:
  struct Slot {
    bool used = false;
    int64_t position = 0;
    std::vector<int64_t> ids;  // [position]
    std::vector<float> kda;    // RAM mode only
    uint64_t stamp = 0;        // LRU clock value of the last save or restore
    double saved_at = 0;       // now_seconds() of the save
  };
  bool write_file(int slot, const SavedState& saved);
  bool read_file(int slot, size_t floats, SavedState& saved);

  CheckpointPolicy policy_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
  CheckpointCounters counters_;
  SavedState scratch_;  // the one bounce buffer (disk mode) / staging checkpoint
};

}  // namespace k3

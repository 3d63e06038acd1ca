// engine/checkpoints.h — recurrent-state checkpoints (saved KDA state, docs/serving.md §3.10.2,
// §3.10): a few slots holding a session's KDA state at prompt boundaries and at the end of replies,
// so that an edited or re-rendered conversation resumes from the deepest checkpoint that still
// matches instead of re-prefilling everything.
//
// Slot policy: an identical (position, ids) checkpoint only refreshes its LRU stamp; otherwise the
// first empty slot, else the least recently used one among those not kept (protect()), else, for a
// kept checkpoint only, the least recently used kept one (a checkpoint not kept never evicts a kept
// one: it is dropped instead). Restore: the deepest checkpoint with
// 1 <= pos <= live (the live common prefix of the session's record and the new prompt, which
// proves the MLA rows below pos are still valid) whose ids equal prompt[0, pos).
//
// RAM mode keeps the floats in memory. Disk mode writes one file per slot, `k3_ckpt_<slot>.bin`,
// mode 0600, through a temp file and a rename, into a private subdirectory that the store creates
// inside the policy's directory (mkdtemp, 0700, a new name every start; the directory itself is
// never chmod-ed, and one other users may write to is refused unless sticky: docs/serving.md
// §3.10.4). The header (magic "3CKP", version, position, float count) ends with a SipHash-2-4 tag
// (util/siphash.h) under a key drawn at random when the store is made and kept only in memory; the
// tag covers the slot, the save's serial, the position, the ids and the payload, so a file changed
// or swapped in (from another slot, another save or another server) is rejected, never restored.
// Metadata (ids, position, stamp) stays in memory: checkpoints never outlive the process (the MLA
// rows do not). Files and the subdirectory are removed when the store is destroyed unless
// `keep_files`.
//
// Failures to save (allocation, I/O) drop the checkpoint and never fail a request. Not thread-safe:
// the engine worker owns the store.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "util/siphash.h"

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
  // Disk mode: creates the private subdirectory (see above) and draws the key. Throws k3::Error
  // naming the directory when it cannot, or when the directory is not safe to use.
  explicit CheckpointStore(const CheckpointPolicy& policy);
  ~CheckpointStore();
  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  bool enabled() const { return !slots_.empty(); }
  // "off", "ram, 2 slots", "disk /path/k3-ckpt-XXXXXX, 2 slots".
  std::string describe() const;
  const CheckpointPolicy& policy() const { return policy_; }

  // Saves a checkpoint of `session` at its position (nothing below position 1). Returns false when
  // the checkpoint was dropped (an error is written to stderr), when it is not kept and every slot
  // holds a kept one, or when the store is off.
  bool save(const Session& session);
  // True when a checkpoint of exactly (position, ids) is held.
  bool holds(int64_t position, std::span<const int64_t> ids) const;
  // The checkpoints to keep over the others from now on: those at `positions` whose ids are
  // prompt[0, position), held now or saved later (positions outside [1, prompt] are ignored).
  // Replaces the previous set; an empty `positions` makes every slot plain LRU again.
  void protect(std::span<const int64_t> positions, std::span<const int64_t> prompt);
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
  // The file of `slot` in disk mode (tests corrupt it), inside files_dir().
  std::string slot_path(int slot) const;
  // The private subdirectory holding the files ("" in RAM mode).
  const std::string& files_dir() const { return files_dir_; }

 private:
  struct Slot {
    bool used = false;
    int64_t position = 0;
    std::vector<int64_t> ids;  // [position]
    std::vector<float> kda;    // RAM mode only
    uint64_t stamp = 0;        // LRU clock value of the last save or restore
    uint64_t serial = 0;       // which save wrote the slot's file (part of its tag)
    double saved_at = 0;       // now_seconds() of the save
  };
  struct FileHeaderFields {
    uint64_t position, float_count;
  };
  uint64_t tag_of(int slot, const Slot& meta, const FileHeaderFields& fields,
                  const float* payload) const;
  bool write_file(int slot, const SavedState& saved);
  bool kept(int64_t position, std::span<const int64_t> ids) const;
  bool read_file(int slot, size_t floats, SavedState& saved);

  CheckpointPolicy policy_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
  uint64_t serial_ = 0;    // saves so far
  SipKey key_{};           // disk mode: random per store, never written anywhere
  std::string files_dir_;  // disk mode: the private subdirectory
  CheckpointCounters counters_;
  SavedState scratch_;                   // the one bounce buffer (disk mode) / staging checkpoint
  std::vector<int64_t> kept_positions_;  // protect(): ascending
  std::vector<int64_t> kept_ids_;        // protect(): prompt[0, the last kept position)
};

}  // namespace k3

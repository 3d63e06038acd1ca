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

// The prefix cache on disk (coli serve --cache-dir, bounded by --cache-gb, least recently used
// out): prompt-boundary states that stand alone (SavedState with its MLA rows and ids), so a
// conversation or an agent's system prompt resumes after a restart from the deepest entry whose ids
// are a prefix of its prompt. The file format is the checkpoints' ("3CKP", the same atomic writer
// and keyed SipHash-2-4 tag) at version 3, whose payload adds the ids and the MLA rows:
//   header {magic, version 3, position, kda float count, row float count, identity, tag}
//   ids [position] int64, kda floats, rows floats
// The key is 16 random bytes in `<dir>/k3_prefix.key`, created 0600 on first use and refused when
// it is not a regular 0600 file of this user; `identity` is the tag of the engine's identity (the
// model directory and what it computes with) under that key, so a file of another model or another
// cache never matches. The directory must be this user's and not writable by others. Every file is
// checked in full (size, identity, tag) before it is restored; a damaged, truncated or foreign one
// is refused and removed, never trusted. Entries are found by their ids (read at start from every
// file's head); the name is k3_prefix_<tag of the ids>.bin. Not thread-safe: the worker owns it.
class PrefixCache {
 public:
  // Throws k3::Error naming the directory or the key file when they cannot be used.
  PrefixCache(const std::string& dir, uint64_t max_bytes, const std::string& identity);

  // "disk /dir, 3 entries, 1.2 of 4.0 GB".
  std::string describe() const;
  // Writes the session's state at its position (with its rows) unless an entry of exactly these
  // ids exists (then it is only marked used); evicts the least recently used entries beyond the
  // bound. False when nothing was written (an error went to stderr; serving goes on).
  bool save(const Session& session);
  // Restores the deepest entry whose ids are a prefix of `prompt` and deeper than `deeper_than`
  // (at most prompt.size() - 1: a token is left to feed) into `session`, and returns its position;
  // 0 when none fits (the session is then untouched).
  int64_t restore_best(Session& session, std::span<const int64_t> prompt, int64_t deeper_than);

  struct Counters {
    int64_t saves = 0, restores = 0, rejected = 0, evicted = 0;
  };
  const Counters& counters() const { return counters_; }
  size_t entries() const { return entries_.size(); }
  uint64_t bytes() const;
  const std::string& dir() const { return dir_; }

 private:
  struct Entry {
    std::string path;
    std::vector<int64_t> ids;
    uint64_t bytes = 0;
    uint64_t stamp = 0;  // LRU clock (files found at start: by modification time)
  };
  void scan();
  void evict();
  void drop(size_t index, const char* why);
  bool read(const Entry& entry, size_t kda_floats, size_t row_floats, SavedState& out,
            std::string& why) const;

  std::string dir_;
  uint64_t max_bytes_;
  SipKey key_{};
  uint64_t identity_ = 0;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
  Counters counters_;
  SavedState scratch_;
};

}  // namespace k3

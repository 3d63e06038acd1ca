// engine/engine.h — the narrow interface to running Kimi K3: an Engine (loaded weights,
// read-only, shareable) and Sessions (one sequence's state each) with prefill and step.
// Both are opaque (the model, its expert cache and its kernels stay behind this header); what a
// caller may know about them comes back as plain structs (EngineInfo, ExpertStats, SessionStats).
// Thread-safety: an Engine may be used by several Sessions, one thread per Session.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "options/options.h"
#include "text/tokenizer.h"
#include "util/status.h"

namespace k3 {

struct EngineInfo;

// What an Engine is built from: the model directory, how to load it, and an optional observer
// of the load (the loaded fraction in [0, 1] as the layers come in).
//
// Everything that can be checked without the weights is checked before they are read, so a bad
// tokenizer or context fails in about a second instead of after the load (docs/tokenizer.md §1.4):
// config.json, the tokenizer against config.json's vocab_size and the chat format's specials,
// `require_tokenizer`, `context`, then `before_weights`.
struct EngineOptions {
  std::string model_dir;
  LoadOptions load;
  std::function<void(double fraction)> on_progress;
  // Polled between tensors while the weights load (and between pieces of a large tensor): when
  // it reads true the load stops; Engine::load then returns Status::Code::cancelled. The caller
  // sets it (a signal handler, a shutdown); the engine never reads signals itself.
  const std::atomic<bool>* cancel = nullptr;
  // Refuse a snapshot without tiktoken.model before the weights (text prompts, serving).
  bool require_tokenizer = false;
  // false: the tokenizer is still read and checked (a broken one fails before the weights) and
  // handed to `before_weights`, then freed before the weights load, so Engine::tokenizer() is
  // nullptr; EngineInfo::end_of_message_id keeps the stop it gives. An ids-in, ids-out run holds
  // no vocabulary (2.8 MB for the release's 163,840 tokens, docs/streaming.md §1.11).
  bool keep_tokenizer = true;
  // Positions the caller's session will hold (0 = not checked): refused before the weights when
  // its state alone would not fit in the memory available now. `context_name` names the setting
  // in that error ("--ctx / K3_MAXT").
  int64_t context = 0;
  std::string context_name = "--ctx / K3_MAXT";
  // Sessions of `context` positions the caller will hold at once (coli serve --parallel): all of
  // them must fit in the memory available before the weights load (the error gives one session's
  // bytes), and the expert cache sizes itself in what is left after them.
  int sessions = 1;
  std::string sessions_name = "--parallel / COLI_PARALLEL";
  // Runs once config.json and the tokenizer are read and checked, before any weight: the caller
  // checks what depends on them (a prompt that must fit the context). `info` has config.json's
  // fields (num_layers, resident_bytes and has_* are not known yet); `tokenizer` may be nullptr.
  // Throwing k3::Error stops the load with that error.
  std::function<void(const EngineInfo& info, const text::Tokenizer* tokenizer)> before_weights;
};

// Facts about the loaded model: config.json's dimensions and what was loaded.
struct EngineInfo {
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t num_hidden_layers = 0;  // in config.json
  int64_t num_layers = 0;         // loaded (K3_LAYERS may run fewer)
  int64_t num_experts = 0;
  int64_t num_experts_per_token = 0;
  int64_t first_k_dense_replace = 0;
  std::vector<int64_t> eos_token_ids;
  // The tokenizer's <|end_of_msg|> (docs/tokenizer.md §1.3), read before the weights whether or
  // not the tokenizer is kept; empty without a tokenizer.
  std::optional<int64_t> end_of_message_id;
  bool has_embedding = false;
  bool has_head = false;         // false: prefill returns no logits
  uint64_t resident_bytes = 0;   // weights held in memory
  uint64_t load_file_bytes = 0;  // bytes of the files the load read (or mapped), as stored
  // One session's state at EngineOptions::context positions (MLA rows, scores, KDA state, the
  // token record); 0 when no context was given.
  uint64_t session_bytes = 0;
  std::string tensor_prefix;  // "language_model." in the release layout
};

// The routed-expert cache's counters since load.
struct ExpertStats {
  uint64_t hits = 0;         // experts found in a slot (or resident)
  uint64_t misses = 0;       // experts read from disk
  uint64_t bytes_read = 0;   // bytes of those reads (as asked)
  uint64_t drive_bytes = 0;  // bytes that came from the drive
  uint64_t transient = 0;    // misses not kept in a slot after their batch
  double wait_seconds = 0;   // compute thread blocked on reads
  double busy_seconds = 0;   // wall time with at least one read in flight
  uint64_t prefetch_issued = 0, prefetch_used = 0;
  uint64_t predicted_hits = 0, predicted_total = 0;
  std::string io_engine;  // "io_uring" or "threads"
  double recall() const {
    return predicted_total
               ? static_cast<double>(predicted_hits) / static_cast<double>(predicted_total)
               : 0;
  }
  double hit_ratio() const {
    return hits + misses ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0;
  }
};

// The Vulkan expert tier's counters since load (docs/vulkan.md §8); on is false when the tier
// is not on (COLI_VULKAN).
struct DeviceStats {
  bool on = false;
  std::string device;                  // "llvmpipe (LLVM 15.0.6, 256 bits)"
  bool off = false;                    // turned off after the device was lost
  uint64_t pairs_served = 0;           // routed (row, expert) pairs computed on the device
  uint64_t pairs_total = 0;            // routed pairs of every MoE step
  uint64_t residents = 0, budget = 0;  // experts resident / the budget in experts
  uint64_t uploads = 0, evictions = 0, refused = 0, skipped = 0;
  double join_wait_seconds = 0;  // the compute thread waiting for the device's batches
  uint64_t streamed_pairs = 0;   // prompt pairs computed through staging slots
  std::string budget_source;     // what sized the budget (docs/vulkan.md §5)
  // COLI_VK_DENSE (docs/vulkan.md §6): dense matrices held on the device and their bytes; the
  // prompt-chunk matmuls computed there, their rows and the seconds they took.
  uint64_t dense_matrices = 0, dense_bytes = 0;
  uint64_t dense_matmuls = 0, dense_rows = 0;
  double dense_seconds = 0;
  double served_share() const {
    return pairs_total ? static_cast<double>(pairs_served) / static_cast<double>(pairs_total) : 0;
  }
  // The counters since `before` (residents and budget as now): one request's or run's share.
  DeviceStats since(const DeviceStats& before) const;
};

// Expert parallelism's figures for /metrics (docs/scale-out.md §2): ranks == 1 without it. Each
// rank's counters are those its latest answer carried (rank 0's: its own expert cache).
struct ExpertParallelStats {
  struct Rank {
    int rank = 0;
    double pairs = 0, hits = 0, misses = 0, bytes_read = 0, drive_bytes = 0, busy_seconds = 0;
  };
  int ranks = 1;
  double exchange_seconds = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  std::vector<Rank> per_rank;
};

// Resident memory by use, in bytes (Engine::memory()): what the summary line and /metrics split
// the process's memory into. The session parts sum over the engine's live sessions and batches.
struct MemorySplit {
  uint64_t dense_weights = 0;   // resident dense matrices and vectors (heap)
  uint64_t mapped_weights = 0;  // dense matrices used in place from file mappings (K3_MMAP)
  uint64_t expert_cache = 0;    // routed-expert slot buffers (every expert when all are resident)
  uint64_t expert_slots_used = 0, expert_slots_budget = 0;  // over all MoE layers
  uint64_t kda_state = 0;                                   // KDA conv windows and matrix states
  uint64_t mla_cache = 0;    // MLA rows written (positions fed; the rest is never touched)
  uint64_t activations = 0;  // forward-pass scratch, input rows and logits
  uint64_t io_buffers = 0;   // expert reads in flight or just arrived (the working set)
  // The process, from /proc (process_known false when it cannot be read): resident now, split by
  // backing (anonymous: heap and stacks; file-backed: mapped files, clean page cache), and the
  // peak resident size since start.
  bool process_known = false;
  uint64_t rss = 0, anonymous = 0, file_backed = 0, peak_rss = 0;
  // The parts above the process figures (dense + mapped + experts + KDA + MLA + activations +
  // I/O).
  uint64_t accounted() const;
};

// "dense 2.91 GB, experts 0.84 GB (48/192 slots), KDA 4.7 MB, MLA 0.1 MB, activations 1.2 MB,
// I/O 0.0 MB; anon 3.83 GB, file-backed 7.5 MB": the split for a summary line.
std::string describe_memory(const MemorySplit& split);

// The share of the head's rows a step restricted to `allowed` (as Session::restrict_next_logits
// takes it) computes over a vocabulary of `vocab` ids: the blocks of 16 ids holding an allowed
// one, or 1 where those cover over half of the vocabulary or the mask is empty (the whole head is
// computed then). A bit past the vocabulary counts only for its block's ids inside it; a mask
// shorter than the vocabulary's words allows none of the ids past its end.
double restricted_head_share(std::span<const uint64_t> allowed, size_t vocab);

class Engine {
 public:
  // Opens the model directory and loads the resident weights. Throws k3::Error; a load stopped
  // through options.cancel throws k3::Interrupted (prefer load(), which returns it as a Status).
  explicit Engine(const EngineOptions& options);
  // The same, with a cancelled load returned as Status::Code::cancelled ("the load was
  // cancelled"), nothing left behind. Failures still throw k3::Error naming the file.
  static Result<std::unique_ptr<Engine>> load(const EngineOptions& options);
  Engine(const std::string& model_dir, const LoadOptions& load,
         const std::function<void(double fraction)>& on_progress = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineInfo& info() const;
  // The model's tokenizer (tiktoken.model + tokenizer_config.json); nullptr when it has none
  // (the engine then runs on token ids only).
  const text::Tokenizer* tokenizer() const;
  double load_seconds() const;
  // "isa avx512 | bits 4/8/8 | idot 1 | resident 123.4 MB": what the engine computes with.
  std::string describe() const;
  // "experts: 12 hits / 34 misses (26.1% hit) | 0.60 GB read at 2.31 GB/s": the expert cache's
  // counters since load.
  std::string describe_experts() const;
  // "[VK] llvmpipe (...) | 1773 of 2128 routed pairs on the device (83.3%) | residents 108 /
  // 512 | uploads 108, evictions 0, refused 0, skipped 0": the Vulkan tier's counters since load
  // (docs/vulkan.md §5); "" when the tier is not on (COLI_VULKAN).
  std::string describe_device() const;
  DeviceStats device_stats() const;
  // "expert-parallel: 3 ranks | exchange 1.2 ms/token (…) | rank 0: 12 hits / 30 misses, 1.0 MB
  // read at 1.20 GB/s | rank 1: 40 pairs, 10 hits / 30 misses, 1.0 MB read at … | rank 2: …": the
  // exchange time per token over `tokens` tokens and every rank's expert counters
  // (docs/scale-out.md §2); "" without --expert-parallel under mpirun.
  std::string describe_expert_parallel(int64_t tokens) const;
  // The same figures as numbers, without any exchange with the ranks (any thread).
  ExpertParallelStats expert_parallel_stats() const;
  ExpertStats expert_stats() const;
  // Resident memory by use now (MemorySplit). Thread-safe; reads /proc/self for the process
  // figures.
  MemorySplit memory() const;
  // Saves the routing history (.coli_usage, atomically) where K3_STATE_DIR or the model
  // directory allows; notes on stderr when it cannot. Never throws. Call at exit.
  void save_history() const;

  struct Impl;  // engine/internal.h
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Validation hook: sees every fed position's per-layer tensors and routing (copies only; a
// computed value never changes).
class LayerObserver {
 public:
  enum class Site { kAttnIn, kAttnOut, kMlpIn, kMlpOut, kLayerOut, kFinalHidden };
  struct Routing {
    std::span<const int64_t> ids;    // [<= num_experts_per_token], ascending
    std::span<const float> weights;  // aligned with ids
  };
  virtual ~LayerObserver() = default;
  // `layer` is -1 for kFinalHidden. data: [hidden].
  virtual void on_tensor(int64_t layer, Site site, const float* data) = 0;
  virtual void on_routing(int64_t layer, const Routing& routing) = 0;
};

// Optional observers of a prefill (validation hooks).
struct PrefillHooks {
  LayerObserver* observer = nullptr;         // per-layer tensors of every position
  std::vector<float>* all_logits = nullptr;  // receives [T][vocab] logits of every position
};

// A copy of a session's recurrent state: every KDA layer's three conv windows and matrix state,
// flattened, plus the ids fed so far. With the MLA rows still in the live cache for positions
// below `position`, restoring it resumes the sequence there (docs/serving.md §3.10.2).
// With the MLA rows too (`rows`, save_state(out, true)) it stands alone: restoring it into any
// session of the same engine resumes the sequence there (the disk prefix cache, coli serve
// --cache-dir).
struct SavedState {
  int64_t position = 0;
  std::vector<int64_t> ids;  // [position]
  std::vector<float> kda;    // [Session::state_floats()]
  std::vector<float> rows;   // [position][Session::row_floats()] or empty (layer by layer, latent
                             // then rope)
};

// Seconds per compute stage and routed-expert applications since a session started.
struct SessionStats {
  double total_seconds = 0;
  uint64_t expert_reads = 0;  // routed experts applied (a chunk applies each distinct expert once)
  std::string summary;        // "attention(KDA) 1.23 s 40% | MLA ... "
};

class Session {
 public:
  // A fresh sequence that can hold `capacity` positions.
  Session(const Engine& engine, int64_t capacity);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Replaces the embedding of absolute positions [0, rows) by `x0` ([rows][hidden]); a position
  // past the table is an error.
  void set_input_rows(std::vector<float> x0);

  // Feeds `ids` in order and returns the logits of the last one ([vocab]; empty when the
  // model has no head). The reference stays valid until the next prefill/step. Throws
  // k3::Error (context full, bad id); the state is then undefined: call reset().
  // The ids go through the model in layer-major chunks of prefill_chunk() tokens (decode is a
  // chunk of one); the logits are bit-identical for every chunk size.
  const std::vector<float>& prefill(std::span<const int64_t> ids, const PrefillHooks& hooks = {});
  // Tokens per prefill chunk: the engine's K3_CHUNK unless overridden (values < 1 mean 1).
  int64_t prefill_chunk() const;
  void set_prefill_chunk(int64_t chunk);
  // Gives back what the prompt's chunks grew (scratch for prefill_chunk() rows, 0.76 MB a row at
  // the release's dimensions): call once the whole prompt is in, since decode steps use one row.
  // The next prefill grows it again. The logits stay.
  void release_prefill_buffers();
  // Feeds one token (a chunk of one) and returns its logits (same lifetime rule). Allocates
  // nothing.
  const std::vector<float>& step(int64_t id);
  // The logits of the last token fed (by prefill, step or a Batch step); empty before any.
  const std::vector<float>& logits() const;
  // The next prefill, step or Batch step computes only the logits the caller can use: those of
  // the ids set in `allowed` (bit id % 64 of word id / 64, a grammar's mask:
  // engine/constraint.h), each bit-identical to the full head's, and -infinity for the others
  // (an id in a block of 16 with an allowed one may keep its value). A grammar's next token
  // rarely has more than a few hundred choices among 163,840 ids, so the head reads a few
  // percent of its rows. A Batch step restricts its head when every session of the step has
  // asked. Lasts one feed; the logits of a prefill's other positions (all_logits) are always
  // whole.
  // (restricted_head_share says what share of the head's rows such a step computes.)
  void restrict_next_logits(std::span<const uint64_t> allowed);
  SessionStats stats() const;

  int64_t position() const;
  int64_t capacity() const;
  // The fed-token record: exactly the ids fed, at their positions.
  const std::vector<int64_t>& tokens() const;
  void reset();

  // Floats in a SavedState's `kda` (the same for every saved state of this engine).
  size_t state_floats() const;
  // Floats of one position's MLA rows over every MLA layer (a SavedState's `rows` per position).
  size_t row_floats() const;
  // `with_rows`: the MLA rows of positions [0, position) too.
  void save_state(SavedState& out, bool with_rows = false) const;
  // Puts the saved recurrent state back and truncates the record to its position.
  // REQUIRES: saved.ids == tokens()[0, saved.position) (the MLA rows below it are then valid);
  // throws k3::Error otherwise. With rows (saved.rows not empty) the rows are put back too and the
  // record becomes saved.ids whatever it held (REQUIRES: rows of position x row_floats() floats,
  // position within the capacity).
  void restore_state(const SavedState& saved);
  // While set, every forward pass polls `flag` before each layer and throws Interrupted when it
  // reads true; the state is then part-advanced (restore a saved state or reset). nullptr = off.
  void set_interrupt(const std::atomic<bool>* flag);

  struct Impl;  // engine/internal.h
  const Impl& impl() const { return *impl_; }

 private:
  friend class Batch;
  std::unique_ptr<Impl> impl_;
};

// Batched decode: one forward pass feeds one token to each of several sessions of one engine, so
// every dense matrix streams once per step and each distinct routed expert is read once for all
// the rows that chose it; each row keeps its session's KDA state, MLA rows and position. Each
// session's logits are bit-identical to a step() of that session alone, whatever the other rows
// (docs/architecture.md §3.11). Sessions join and leave between steps freely. One thread at a time
// per Batch and its sessions.
class Batch {
 public:
  explicit Batch(const Engine& engine);
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // Feeds ids[i] to *sessions[i] (distinct sessions of this batch's engine); afterwards
  // sessions[i]->logits() holds its logits. Throws k3::Error before anything runs when the sizes
  // differ, an id is outside the vocabulary, a session is full, appears twice or belongs to
  // another engine. The sessions' own interrupt flags are not polled (a cancelled session leaves
  // the batch between steps; the others go on); the batch's flag (set_interrupt) throws
  // Interrupted and leaves every session of the step part-advanced (restore saved states or
  // reset, as after an interrupted prefill). Allocates nothing once a step of as many sessions
  // has run.
  void step(std::span<Session* const> sessions, std::span<const int64_t> ids);
  // While set, every step polls `flag` before each layer (a shutdown). nullptr = off.
  void set_interrupt(const std::atomic<bool>* flag);
  // Stage times and expert applications of this batch's steps (a step applies each distinct
  // expert once, for all its rows).
  SessionStats stats() const;

  struct Impl;  // engine/internal.h

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3

// engine/engine.h — the narrow interface to running Kimi K3: an Engine (loaded weights,
// read-only, shareable) and Sessions (one sequence's state each) with prefill and step.
// Thread-safety: an Engine may be used by several Sessions, one thread per Session.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/snapshot.h"
#include "model/config.h"
#include "model/model.h"
#include "options/options.h"
#include "text/tokenizer.h"

namespace k3 {

class Engine {
 public:
  // Opens the snapshot at `model_dir` and loads the resident weights. Throws k3::Error.
  // `on_progress` (optional) sees the loaded fraction in [0, 1] as the layers come in.
  Engine(const std::string& model_dir, const LoadOptions& load,
         const std::function<void(double fraction)>& on_progress = {});

  const K3Config& config() const { return config_; }
  const Model& model() const { return *model_; }
  const Snapshot& snapshot() const { return *snapshot_; }
  // The snapshot's tokenizer (tiktoken.model + tokenizer_config.json); nullptr when it has none
  // (the engine then runs on token ids only).
  const text::Tokenizer* tokenizer() const { return tokenizer_.get(); }
  double load_seconds() const { return load_seconds_; }
  // "isa avx512 | bits 4/8/8 | idot 1 | resident 123.4 MB": what the engine computes with.
  std::string describe() const;
  // "experts: 12 hits / 34 misses (26.1% hit) | 0.60 GB read at 2.31 GB/s": the expert cache's
  // counters since load.
  std::string describe_experts() const;
  // Saves the routing history (.coli_usage, atomically) where K3_STATE_DIR or the model
  // directory allows; notes on stderr when it cannot. Never throws. Call at exit.
  void save_history() const;

 private:
  std::unique_ptr<Snapshot> snapshot_;
  K3Config config_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  double load_seconds_ = 0;
};

// Optional observers of a prefill (validation hooks).
struct PrefillHooks {
  ForwardObserver* observer = nullptr;   // per-layer tensors of every position
  std::vector<float>* all_logits = nullptr;  // receives [T][vocab] logits of every position
};

// A photo of a session's recurrent state: every KDA layer's three conv windows and matrix state,
// flattened, plus the ids fed so far. With the MLA rows still in the live cache for positions
// below `position`, restoring it resumes the sequence there (SERVING.md §1.9.2).
struct StatePhoto {
  int64_t position = 0;
  std::vector<int64_t> ids;  // [position]
  std::vector<float> kda;    // [Session::photo_floats()]
};

class Session {
 public:
  // A fresh sequence that can hold `capacity` positions.
  Session(const Engine& engine, int64_t capacity);

  // Replaces the embedding of absolute positions [0, rows) by `x0` ([rows][hidden]); a position
  // past the table is an error (K3_X0).
  void set_input_rows(std::vector<float> x0);

  // Feeds `ids` in order and returns the logits of the last one ([vocab]; empty when the
  // snapshot has no head). The reference stays valid until the next prefill/step. Throws
  // k3::Error (context full, bad id); the state is then undefined: call reset().
  // The ids go through the model in layer-major chunks of prefill_chunk() tokens
  // (Model::forward; decode is a chunk of one); the logits are bit-identical for every chunk
  // size.
  const std::vector<float>& prefill(std::span<const int64_t> ids, const PrefillHooks& hooks = {});
  // Tokens per prefill chunk: the engine's K3_CHUNK unless overridden (values < 1 mean 1).
  int64_t prefill_chunk() const { return chunk_; }
  void set_prefill_chunk(int64_t chunk) { chunk_ = chunk; }
  // Feeds one token (a chunk of one) and returns its logits (same lifetime rule).
  // Allocates nothing.
  const std::vector<float>& step(int64_t id);
  // Seconds per stage since the session started (or the last reset).
  const StageStats& stats() const { return state_.stats; }

  int64_t position() const { return state_.position; }
  int64_t capacity() const { return state_.capacity; }
  // The fed-token record: exactly the ids fed, at their positions.
  const std::vector<int64_t>& tokens() const { return tokens_; }
  void reset();

  // Floats in a photo's `kda` (the same for every photo of this engine).
  size_t photo_floats() const;
  void take_photo(StatePhoto& out) const;
  // Puts the photo's recurrent state back and truncates the record to its position.
  // REQUIRES: photo.ids == tokens()[0, photo.position) (the MLA rows below it are then valid);
  // throws k3::Error otherwise.
  void restore_photo(const StatePhoto& photo);
  // While set, every forward pass polls `flag` before each layer and throws Interrupted when it
  // reads true; the state is then part-advanced (restore a photo or reset). nullptr = off.
  void set_interrupt(const std::atomic<bool>* flag) { state_.interrupt = flag; }

 private:
  void check_id(int64_t id) const;
  // x0[hidden] = the input row of `id` at absolute position `pos` (embedding or K3_X0 row).
  void input_row(int64_t id, size_t pos, float* x0);
  void feed_chunk(std::span<const int64_t> ids, ForwardObserver* observer);

  const Engine& engine_;
  ModelState state_;
  std::vector<int64_t> tokens_;
  std::vector<float> logits_;  // [vocab]
  std::vector<float> x0_;  // [rows][hidden], optional
  int64_t chunk_ = 1;      // tokens per prefill chunk
  std::vector<float> chunk_x0_, chunk_hidden_;  // [chunk][hidden] input rows and final hidden rows
};

}  // namespace k3

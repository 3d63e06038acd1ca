// engine/internal.h — what is behind engine.h's opaque Engine and Session: the model files, the
// parsed config, the model and one sequence's model state. For the engine's own files and for
// the tests and benchmarks that drive the model directly (they link k3_model and add
// src/engine/internal to their include path); never for the server or the apps.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "grammar/matcher.h"
#include "io/model_files.h"
#include "model/config.h"
#include "model/model.h"

namespace k3 {

struct Engine::Impl {
  std::unique_ptr<ModelFiles> files;  // the model directory's shards
  K3Config config;
  std::unique_ptr<Model> model;
  std::unique_ptr<text::Tokenizer> tokenizer;
  EngineInfo info;
  double load_seconds = 0;
  // What the live sessions and batches hold (MemorySplit's session parts), kept current by each
  // one's account() after every pass.
  mutable std::atomic<int64_t> kda_bytes{0}, mla_bytes{0}, activation_bytes{0};
  // The vocabulary as the grammar matcher's byte trie, built on first use (engine/constraint.h).
  mutable std::once_flag vocabulary_once;
  mutable std::shared_ptr<const grammar::Vocabulary> vocabulary;
};

struct Session::Impl {
  Impl(const Engine& engine, int64_t capacity);
  void check_id(int64_t id) const;
  // x0[hidden] = the input row of `id` at absolute position `pos` (embedding or input row).
  void input_row(int64_t id, size_t pos, float* x0);
  void feed_chunk(std::span<const int64_t> ids, ForwardObserver* observer);
  // Brings the engine's session figures (Engine::Impl::kda_bytes...) up to this session's state.
  void account();
  ~Impl();

  const Engine::Impl& engine;
  ModelState state;
  std::vector<int64_t> tokens;
  std::vector<float> logits;  // [vocab]
  // restrict_next_logits(): the ids whose logits the next feed computes ([vocab / 64] words);
  // empty = all of them.
  std::vector<uint64_t> next_allowed;
  std::vector<uint64_t> feed_allowed;         // next_allowed, taken by the feed running now
  std::vector<RowRange> head_ranges;          // the head's rows for them
  std::vector<float> x0;                      // [rows][hidden], optional
  int64_t chunk = 1;                          // tokens per prefill chunk
  std::vector<float> chunk_x0, chunk_hidden;  // [chunk][hidden] input rows and final hidden rows
  int64_t accounted_kda = 0, accounted_mla = 0, accounted_activations = 0;  // what account() added
};

struct Batch::Impl {
  explicit Impl(const Engine& engine);
  const Engine::Impl& engine;
  Workspace work;                                // the pass's scratch ([sessions] rows)
  StageStats stats;                              // of every step
  const std::atomic<bool>* interrupt = nullptr;  // Batch::set_interrupt
  std::vector<ModelState*> states;               // [sessions]
  std::vector<float> x0, hidden;                 // [sessions][hidden] input and final hidden rows
  std::vector<float> logits;                     // [sessions][vocab]
  std::vector<uint64_t> allowed;                 // the step's sessions' restrictions, or'ed
  std::vector<RowRange> head_ranges;             // the head's rows for them
  int64_t accounted_activations = 0;             // what account() added to the engine's figures
  void account();
  ~Impl();
};

namespace internal {
inline const Model& model(const Engine& engine) {
  return *engine.impl().model;
}
inline const K3Config& config(const Engine& engine) {
  return engine.impl().config;
}
inline const ModelFiles& model_files(const Engine& engine) {
  return *engine.impl().files;
}
inline const StageStats& stage_stats(const Session& session) {
  return session.impl().state.stats;
}
}  // namespace internal

}  // namespace k3

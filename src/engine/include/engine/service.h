// engine/service.h — one engine, one worker thread, N sessions, many requests (docs/serving.md
// §3.1, §3.9, §3.10, §3.11).
//
// The worker thread loads the model, then owns N sessions (ServiceOptions::parallel; each its own
// KDA state, MLA rows, fed-token record and checkpoint store) and one k3::Batch. Callers (HTTP
// threads, the terminal chat) never touch them: they submit a ServiceRequest (rendered prompt ids +
// settings) and read typed ServiceEvents from the RequestHandle they get back:
//
//   accepted{prompt_tokens, cached_tokens, reuse, session}  progress{processed, total}*
//   (reasoning | content | tool_call)*  done{stats}            — or error{error, message}
//
// Session choice: a queued request goes to the idle session whose record shares the longest prefix
// with its prompt, provided that prefix is at least half of that record (so an unrelated side
// request does not throw away a conversation's state for a shared template head); otherwise to
// the least recently used idle session.
//
// Order of business for one request, on its session:
//   1. reuse: the record is a strict prefix of the prompt → prefill the tail ("live"); else the
//      deepest matching checkpoint is restored ("checkpoint"); else the state is reset ("none");
//      then, with a prefix cache on disk (cache_dir), its deepest entry of the prompt when that is
//      deeper ("disk"; entries are written at the anchor and at the prompt's end).
//   2. before prefilling from p > 0 a checkpoint is held at p (checkpoints on), so a cancelled
//      prefill rolls back to p instead of losing everything; without one it rolls back to the
//      deepest checkpoint of the prompt below p, else resets.
//   3. prefill the tail in pieces (cancellation polled before every layer), a checkpoint at the
//      anchor (the start of the last message: an edited or regenerated turn resumes there), at
//      each position the request keeps (ServiceRequest::keep), and at the prompt's end. With 2
//      slots and nothing kept, the checkpoints left are the last anchor and the last prompt's end,
//      which serve the follow-up, the edit and the regenerate cases alike.
//   4. decode: sample, demux (text::OutputParser), stop strings matched per channel on decoded
//      text and withheld, stop ids never fed; cancel polled between tokens; a checkpoint at the
//      end. The loop is engine/generate.cpp's, one token per scheduling round.
// Scheduling round: every decoding session samples its next token and all of them are fed in one
// k3::Batch::step (bit-identical to each alone, docs/architecture.md §3.11); then one prefill piece
// of one prefilling session, in turn: while others decode, at most min(progress_every, the
// session's prefill chunk K3_CHUNK) tokens, so a running stream gets a token at least that often;
// alone, max(progress_every, K3_CHUNK) (a long prompt in whole chunks). Every answer is the one
// its request gets alone: same state, same sampler, same logits.
// A reused prefix gives the same tokens as a cold run: the state is exactly what feeding the
// same ids from zero produces.
//
// Admission: at most N generations at once; behind them a bounded FIFO (max_queue waiters beyond
// the idle sessions); a cancelled waiter leaves the queue at once. Engine faults fail the
// request(s) of that forward with ServiceError::engine_error and reset their sessions.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/checkpoints.h"
#include "engine/constraint.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "options/options.h"
#include "text/output_parser.h"
#include "util/status.h"

namespace k3 {

// disk: restored from the prefix cache on disk (ServiceOptions::cache_dir).
enum class ReuseKind { none, live, checkpoint, disk };
const char* reuse_kind_name(ReuseKind kind);  // "none", "live", "checkpoint", "disk"

struct ServiceRequest {
  std::vector<int64_t> prompt;    // rendered chat prompt ids
  bool starts_in_think = true;    // the prompt opened the think channel
  bool raw = false;               // plain completion: output bytes as content, no XTML channels
  SamplingOptions sampling;       // seed used as given
  Penalties penalties;            // off unless set
  int64_t max_tokens = 16;        // clamped to the context room
  std::vector<std::string> stop;  // stop strings (withheld from the output)
  bool cache_prompt = true;       // false: ignore reusable state
  int64_t progress_every = 32;    // a progress event every N prefilled tokens (every chunk when a
                                  // session prefills alone with a larger K3_CHUNK; and at the end)
  // A position worth a checkpoint inside the prompt: the start of the last message, where an edited
  // or regenerated last turn diverges (0 = none: the checkpoint is taken at the prompt's end).
  int64_t anchor = 0;
  // Positions whose checkpoints the caller wants kept (CheckpointStore::protect): each one in the
  // prefilled tail is saved when the prefill reaches it, and the checkpoints at these positions
  // (saved now or by an earlier request of the same prefix) are kept over the others until the
  // next request names its own. coli chat keeps the start and the end of the last user message (an
  // edit, a regenerate) and the start of the first reply (a switch of /think).
  std::vector<int64_t> keep;
  // Log-probabilities of the content tokens (docs/serving.md §3.15): -1 = none; 0..20 = the
  // chosen token's and this many alternatives', on the content events.
  int top_logprobs = -1;
  // A grammar the answer must match (structured output; docs/structured_output.md).
  std::optional<ConstraintSpec> constraint;
};

struct GenerationStats {
  FinishReason finish = FinishReason::length;
  std::string stop_sequence;  // the stop string that ended the reply ("" = none)
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // positions reused (live or restored)
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;
  ReuseKind reuse = ReuseKind::none;
  int64_t restored_at = -1;  // checkpoint position, -1 when none was restored
  double queue_wait_ms = 0, prefill_ms = 0, decode_ms = 0;
  int tool_calls = 0;
  DeviceStats device;  // the Vulkan tier's counters during this request (device.on: the tier is on)
  // The grammar's masks of this request (ServiceRequest::constraint) and their time.
  uint64_t grammar_masks = 0;
  double grammar_ms = 0;
  // Its decode steps that asked for a head of the grammar's allowed ids only
  // (Session::restrict_next_logits; the engine computes the whole head where they cover over half
  // of the vocabulary).
  uint64_t restricted_heads = 0;
  int session = -1;       // the session (0..parallel-1) that ran it
  int64_t batch_max = 0;  // the most sessions of a decode step it was part of
  double batch_mean = 0;  // the mean sessions per decode step it was part of (0: no step)
};

// Why the service failed a request (the server maps each to an HTTP status and error code).
enum class ServiceError { none, engine_error, shutting_down, cancelled };
const char* service_error_name(
    ServiceError error);  // "", "engine_error", "shutting_down", "cancelled"

// Why a prompt does not fit, in numbers a user can act on: `subject` ("the prompt", "the
// conversation") has `tokens` ids, the reply needs `reply` more positions (at least 1 where the
// reply budget is clamped to the room left, as the server does; kimi_k3's --ngen, named by
// `reply_setting`, otherwise), and the context holds `context`; the fix names the setting and
// the value it needs, e.g. "the prompt has 300 tokens and the reply needs at least 1 more, 301
// in all, but the context holds 256 (--ctx / COLI_CTX): raise --ctx to 301 or more, or shorten
// the prompt".
std::string context_overflow_message(std::string_view subject, int64_t tokens, int64_t context,
                                     int64_t reply = 1, std::string_view reply_setting = {});

struct ServiceEvent {
  enum class Kind { accepted, progress, reasoning, content, tool_call, done, error };
  Kind kind = Kind::done;
  std::string text;                         // reasoning / content delta; error message
  text::ToolCallOut call;                   // tool_call
  int64_t processed = 0, total = 0;         // progress (prompt positions, cached ones included)
  double elapsed_ms = 0;                    // progress: since prefill start
  GenerationStats stats;                    // accepted (prompt, cached, reuse) and done
  ServiceError error = ServiceError::none;  // error
  // content, with ServiceRequest::top_logprobs >= 0: the content tokens generated since the last
  // content event, in order (the text of some may be withheld, e.g. by a stop string; then an
  // event may carry only these, with empty text). Reasoning and tool-call tokens have none.
  std::vector<TokenLogprobs> logprobs;
};

class EngineService;

// One request's side of the conversation with the worker. Shared by the caller and the service.
class RequestHandle {
 public:
  // Waits up to `timeout` for the next event. False on timeout.
  bool next(ServiceEvent& out, std::chrono::milliseconds timeout);
  // Finish after the current token with FinishReason::stop (the caller saw enough).
  void stop() { stop_.store(true); }
  bool cancelled() const { return cancel_.load(); }
  const ServiceRequest& request() const { return request_; }
  double submitted_at() const { return submitted_at_; }

 private:
  friend class EngineService;
  void push(ServiceEvent event);

  ServiceRequest request_;
  double submitted_at_ = 0;
  std::atomic<bool> cancel_{false};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<ServiceEvent> events_;
};

struct ServiceOptions {
  std::string model_dir;
  int parallel = 1;  // sessions: generations at once (coli serve --parallel)
  LoadOptions load;
  int64_t context = 0;   // positions (0 = 8192)
  int ckpt_slots = -1;   // checkpoint slots; -1 = auto (2 on disk in ckpt_dir when it is set, else
                         // auto_slots in RAM when memory allows, else 2, else off)
  int auto_slots = 2;    // what auto asks for in RAM first (coli chat: 4, for ServiceRequest::keep)
  std::string ckpt_dir;  // disk checkpoints here (checked before the weights load)
  // The prefix cache on disk that survives restarts (engine/checkpoints.h PrefixCache): the
  // directory ("" = off; checked before the weights load) and its bound in GB.
  std::string cache_dir;
  double cache_gb = 8;
  bool ckpt_keep = false;
  size_t max_queue = 8;     // waiters behind the active request
  int token_delay_ms = 0;   // debug: sleep after every generated token and prefill piece
  bool prefix_log = false;  // K3_PREFIX_LOG lines on stderr
  int threads = 0;          // OpenMP threads of the worker (0 = default)
  // Tests: generated ids are taken from this script (in order, then the sampler) instead of
  // sampled, so tool calls and stop paths can be driven through a random-weight model.
  std::vector<int64_t> scripted_tokens;
};

// A consistent copy of the service's counters and state for /health, /metrics and the chat
// status line.
struct ServiceStats {
  enum class State { loading, ready, failed, stopping };
  State state = State::loading;
  double load_progress = 0;  // [0, 1]
  double load_elapsed_s = 0;
  std::string load_error;
  // What failed, as the start of the line an app prints before load_error: "cannot load <model
  // dir>", or "checkpoint directory (--ckpt-dir)" when the directory was refused (not a load
  // failure: nothing was loaded).
  std::string failed_step;
  int64_t context_capacity = 0;
  int parallel = 1;            // sessions
  uint64_t session_bytes = 0;  // one session's state (EngineInfo::session_bytes)
  // One session each, for /slots.
  struct SessionInfo {
    int id = 0;
    std::string state = "idle";  // idle, prefill, decode
    int64_t fed_tokens = 0;      // positions its record holds
    int64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;  // its latest request
    int64_t requests = 0;
    double last_used = 0;  // now_seconds() when its latest request started (0 = never used)
    int ckpt_used = 0;
    std::vector<CheckpointStore::SlotInfo> ckpt_list;
  };
  std::vector<SessionInfo> sessions;
  // Decode steps and the rows they fed: rows / steps is the mean batch; last_batch the latest.
  int64_t decode_steps = 0, decode_rows = 0, last_batch = 0;
  std::string checkpoints;  // CheckpointStore::describe() (of session 0; the others alike)
  int ckpt_slots = 0, ckpt_used = 0;
  std::vector<CheckpointStore::SlotInfo> ckpt_list;
  std::string phase = "idle";  // idle, prefill, decode (prefill when any session prefills)
  int64_t fed_tokens = 0;      // the record of the session that ran the latest request
  size_t active = 0, queued = 0, max_queue = 0;  // active: busy sessions
  int64_t admitted = 0, completed = 0, rejected = 0, failed = 0;
  // Generations that failed in a row since the last one that ended normally (/health: degraded).
  int64_t failed_in_a_row = 0;
  std::string last_failure;  // the engine's message of the most recent failure
  int64_t cancelled_queue = 0, cancelled_prefill = 0, cancelled_decode = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t reuse_live = 0, reuse_checkpoint = 0, reuse_none = 0;
  CheckpointCounters ckpt;           // over every session's store
  std::string prefix_cache = "off";  // PrefixCache::describe() (--cache-dir)
  PrefixCache::Counters prefix;
  int64_t reuse_disk = 0;
  double active_started = 0;  // now_seconds() of the oldest running request's acceptance
  ExpertStats experts;        // the routed-expert cache's counters (zero while loading)
  DeviceStats device;         // the Vulkan tier's counters (device.on false when it is off)
  ExpertParallelStats expert_parallel;  // --expert-parallel's exchange and per-rank counters
  MemorySplit memory;                   // resident memory by use (zero parts while loading)
};

class EngineService {
 public:
  // Starts the worker, which loads the model (progress in stats()).
  explicit EngineService(ServiceOptions options);
  // Cancels whatever runs, fails the waiters, joins the worker.
  ~EngineService();
  EngineService(const EngineService&) = delete;
  EngineService& operator=(const EngineService&) = delete;

  // Queues a request. Errors: unavailable (loading, failed, shutting down), resource_exhausted
  // (queue full), invalid_argument (the prompt does not fit the context).
  Result<std::shared_ptr<RequestHandle>> submit(ServiceRequest request);
  // The caller is gone: a waiter leaves the queue at once (an error event ServiceError::cancelled
  // is pushed), the active request stops within one layer (prefill) or one token (decode).
  void cancel(const std::shared_ptr<RequestHandle>& handle);
  // Stop admitting (submit → unavailable) and fail the waiters with shutting_down; a model still
  // loading stops loading within one tensor (stats().state stays stopping, never ready).
  void begin_shutdown();
  // Cancels the running requests (the drain timeout ran out).
  void cancel_active();
  // Waits until nothing is active or queued; false on timeout.
  bool wait_idle(double timeout_seconds);
  // Drops reusable state: every idle session's record and checkpoints (runs on the worker).
  void erase_state();

  ServiceStats stats() const;
  // The loaded engine (nullptr until ready). Its tokenizer is safe to use from any thread.
  const Engine* engine() const { return ready_.load() ? engine_.get() : nullptr; }
  int64_t context_capacity() const { return context_.load(); }
  const std::string& model_dir() const { return options_.model_dir; }

 private:
  struct Slot;  // one session and what runs on it (service.cpp)
  void run();
  void load();
  void refuse_before_load(const char* step, const std::string& why);
  // The idle session for `req` (see the header comment). REQUIRES: mutex_ held, one is idle.
  Slot* choose(const ServiceRequest& req);
  // Steps 1 and 2 on the chosen session, then the accepted event.
  void start(Slot& slot, std::shared_ptr<RequestHandle> handle);
  // Steps 1 and 2 of a request: reuses what the session or a checkpoint holds of the prompt
  // (resetting otherwise) and returns the position prefilling starts from.
  int64_t reuse(Slot& slot, const ServiceRequest& req, GenerationStats& stats);
  // One scheduling round (see the header comment). False when nothing ran.
  bool round();
  // The next token of a decoding session: false when its request ended here.
  bool sample(Slot& slot, int64_t& next);
  void prefill_piece(Slot& slot);
  // The ways a started request ends, each with its counters, checkpoint and terminal event: an
  // engine fault (the session is reset), a prefill cancelled (rolled back to the deepest checkpoint
  // of the prompt at or below its start, normally the one at the start, else reset), a generation
  // that ran (stop, length, tool calls or a cancelled decode).
  void end_with_fault(Slot& slot, bool decoding, const char* what);
  void end_cancelled_prefill(Slot& slot);
  void end_generation(Slot& slot);
  void release(Slot& slot);
  void fail_waiters(ServiceError error, const std::string& message);
  // Copies the sessions' and stores' state into stats_ (before a terminal event, so a caller that
  // saw `done` reads fresh numbers).
  void publish_state();

  ServiceOptions options_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Batch> batch_;
  std::unique_ptr<PrefixCache> prefix_cache_;  // --cache-dir (null = off)
  std::vector<std::unique_ptr<Slot>> slots_;   // [parallel]; a Slot's job is the worker's
  std::vector<int64_t> stop_ids_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> load_cancel_{false};  // set by begin_shutdown / the destructor: stop loading
  std::atomic<int64_t> context_{0};
  size_t prefill_turn_ = 0;  // round-robin cursor over prefilling sessions
  int last_slot_ = 0;        // the session of the latest request (stats fed_tokens)

  mutable std::mutex mutex_;      // guards everything below
  std::condition_variable wake_;  // worker: a request or a control job arrived
  std::condition_variable idle_;  // wait_idle
  std::deque<std::shared_ptr<RequestHandle>> queue_;
  std::vector<std::shared_ptr<RequestHandle>> active_;  // [parallel]: the running request or null
  size_t busy_ = 0;                                     // non-null entries of active_
  bool shutting_down_ = false, exiting_ = false, erase_requested_ = false;
  ServiceStats stats_;
  double load_started_ = 0;
  std::thread worker_;
};

}  // namespace k3

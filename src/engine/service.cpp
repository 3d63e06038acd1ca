#include "engine/service.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>

#include "engine/generate.h"
#include "engine/sampler.h"
#include "io/file.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3 {
namespace {

// Withholds the tail of a channel's text that could still grow into a stop string; reports the
// first stop string found (the text before it is released, the rest dropped).
class StopMatcher {
 public:
  explicit StopMatcher(const std::vector<std::string>& stops) : stops_(stops) {}

  // Appends `delta`; returns the text that can be released now. Sets `matched` on a stop.
  std::string push(const std::string& delta, bool& matched) {
    if (stops_.empty()) return delta;
    pending_ += delta;
    size_t first = std::string::npos;
    for (const std::string& s : stops_) {
      const size_t at = pending_.find(s);
      if (at < first) first = at;
    }
    if (first != std::string::npos) {
      matched = true;
      for (const std::string& st : stops_)
        if (pending_.compare(first, st.size(), st) == 0) {
          matched_ = st;  // the first listed of those starting there
          break;
        }
      std::string out = pending_.substr(0, first);
      pending_.clear();
      return out;
    }
    size_t hold = 0;  // the longest suffix of pending_ that is a proper prefix of a stop string
    for (const std::string& s : stops_)
      for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n)
        if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
          hold = n;
          break;
        }
    std::string out = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return out;
  }
  std::string flush() { return std::exchange(pending_, {}); }
  const std::string& matched() const { return matched_; }

 private:
  const std::vector<std::string>& stops_;
  std::string pending_;
  std::string matched_;  // the stop string found ("" = none yet)
};

// The output side of one request: generated ids → XTML channels (text::OutputParser) or, for a
// raw completion, the bytes of every id but a stop id as content; stop strings matched per
// channel on the decoded text and withheld; the resulting events pushed to the handle.
class OutputDemux {
 public:
  OutputDemux(const text::Tokenizer& tokenizer, const ServiceRequest& req, GenerationStats& stats,
              const std::function<void(ServiceEvent)>& push)
      : tokenizer_(tokenizer),
        raw_(req.raw),
        parser_(tokenizer, req.starts_in_think),
        reasoning_stop_(req.stop),
        content_stop_(req.stop),
        in_reasoning_(req.starts_in_think),
        stats_(stats),
        push_(push) {}

  // Whether `id`, generated next, is a content token: its bytes go to the content channel (a raw
  // completion: every id but a stop id). Decided before token() is called with it.
  bool content_token(int64_t id, bool is_stop_id) const {
    return !is_stop_id && (raw_ || parser_.writes_content(static_cast<int32_t>(id)));
  }

  // One generated id, with its log-probabilities when asked for (content tokens only). True when
  // a stop string has matched (the reply ends here).
  bool token(int64_t id, bool is_stop_id, const TokenLogprobs* logprobs) {
    if (logprobs) pending_logprobs_.push_back(*logprobs);
    if (!raw_)
      parser_.push(static_cast<int32_t>(id), events_);
    else if (!is_stop_id)
      raw_event(raw_decoder_.push(tokenizer_.token_bytes(static_cast<int32_t>(id))));
    if (in_reasoning_) ++stats_.reasoning_tokens;
    emit();
    return stopped_by_string_;
  }
  // The end of the reply (not after a cancel): flushes the parser and the withheld text.
  void finish() {
    if (!raw_)
      parser_.finish(events_);
    else
      raw_event(raw_decoder_.finish());
    emit();
    if (!stopped_by_string_)
      for (auto [kind, matcher] : {std::pair{ServiceEvent::Kind::reasoning, &reasoning_stop_},
                                   std::pair{ServiceEvent::Kind::content, &content_stop_}}) {
        ServiceEvent e;
        e.kind = kind;
        e.text = matcher->flush();
        if (kind == ServiceEvent::Kind::content && !e.text.empty())
          e.logprobs = std::exchange(pending_logprobs_, {});
        if (!e.text.empty()) push_(std::move(e));
      }
    if (!pending_logprobs_.empty()) {  // tokens whose text was withheld or produced none
      ServiceEvent e;
      e.kind = ServiceEvent::Kind::content;
      e.logprobs = std::exchange(pending_logprobs_, {});
      push_(std::move(e));
    }
  }
  bool stopped_by_string() const { return stopped_by_string_; }
  // The stop string that ended the reply ("" = none).
  const std::string& matched_stop() const {
    return reasoning_stop_.matched().empty() ? content_stop_.matched() : reasoning_stop_.matched();
  }

 private:
  void raw_event(std::string text) {
    if (text.empty()) return;
    text::OutputEvent ev;
    ev.kind = text::OutputEvent::Kind::content;
    ev.text = std::move(text);
    events_.push_back(std::move(ev));
  }
  void emit() {
    for (text::OutputEvent& ev : events_) {
      if (stopped_by_string_) break;
      ServiceEvent e;
      if (ev.kind == text::OutputEvent::Kind::reasoning ||
          ev.kind == text::OutputEvent::Kind::content) {
        const bool reasoning = ev.kind == text::OutputEvent::Kind::reasoning;
        in_reasoning_ = reasoning;
        e.kind = reasoning ? ServiceEvent::Kind::reasoning : ServiceEvent::Kind::content;
        e.text = (reasoning ? reasoning_stop_ : content_stop_).push(ev.text, stopped_by_string_);
        if (e.text.empty()) continue;
        if (!reasoning) e.logprobs = std::exchange(pending_logprobs_, {});
      } else if (ev.kind == text::OutputEvent::Kind::tool_call) {
        in_reasoning_ = false;
        e.kind = ServiceEvent::Kind::tool_call;
        e.call = std::move(ev.call);
        ++stats_.tool_calls;
      } else {
        continue;  // end_of_message: the stop id ends the loop anyway
      }
      push_(std::move(e));
    }
    events_.clear();
  }

  const text::Tokenizer& tokenizer_;
  const bool raw_;
  text::OutputParser parser_;
  text::Utf8StreamDecoder raw_decoder_;
  std::vector<text::OutputEvent> events_;
  std::vector<TokenLogprobs> pending_logprobs_;  // content tokens not yet on a content event
  StopMatcher reasoning_stop_, content_stop_;
  bool stopped_by_string_ = false, in_reasoning_;
  GenerationStats& stats_;
  const std::function<void(ServiceEvent)>& push_;
};

}  // namespace

const char* service_error_name(ServiceError error) {
  switch (error) {
    case ServiceError::none:
      return "";
    case ServiceError::engine_error:
      return "engine_error";
    case ServiceError::shutting_down:
      return "shutting_down";
    case ServiceError::cancelled:
      return "cancelled";
  }
  return "?";
}

std::string context_overflow_message(std::string_view subject, int64_t tokens, int64_t context,
                                     int64_t reply, std::string_view reply_setting) {
  // The largest --ctx the option table takes (src/options/options.cpp).
  constexpr int64_t kMaxContext = int64_t{1} << 24;
  const int64_t needed = tokens + reply;
  std::string out = std::string(subject) + " has " + std::to_string(tokens) +
                    " tokens and the reply needs " + (reply_setting.empty() ? "at least " : "") +
                    std::to_string(reply) + " more";
  if (!reply_setting.empty()) out += " (" + std::string(reply_setting) + ")";
  out += ", " + std::to_string(needed) + " in all, but the context holds " +
         std::to_string(context) + " (--ctx / COLI_CTX): ";
  if (needed <= kMaxContext)
    out +=
        "raise --ctx to " + std::to_string(needed) + " or more, or shorten " + std::string(subject);
  else
    out += "shorten " + std::string(subject) + " (--ctx goes up to " + std::to_string(kMaxContext) +
           ")";
  return out;
}

const char* reuse_kind_name(ReuseKind kind) {
  switch (kind) {
    case ReuseKind::none:
      return "none";
    case ReuseKind::live:
      return "live";
    case ReuseKind::checkpoint:
      return "checkpoint";
    case ReuseKind::disk:
      return "disk";
  }
  return "?";
}

bool RequestHandle::next(ServiceEvent& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  out = std::move(events_.front());
  events_.pop_front();
  return true;
}

void RequestHandle::push(ServiceEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(event));
  }
  ready_.notify_all();
}

// One session, its checkpoints, and the request running on it (the worker's only).
struct EngineService::Slot {
  struct Job {
    Job(const text::Tokenizer& tokenizer, std::shared_ptr<RequestHandle> h)
        : handle(std::move(h)),
          req(handle->request_),
          push([this](ServiceEvent e) { handle->push(std::move(e)); }),
          demux(tokenizer, req, stats, push),
          sampler(req.sampling, req.sampling.seed, req.penalties) {}
    std::shared_ptr<RequestHandle> handle;
    const ServiceRequest& req;
    GenerationStats stats;
    const std::function<void(ServiceEvent)> push;
    OutputDemux demux;
    Sampler sampler;
    int64_t start = 0;           // where the prefill started (the reused positions)
    int64_t fed = 0;             // prompt positions fed so far
    std::vector<int64_t> saves;  // positions of the tail worth a checkpoint, ascending
    bool decoding = false;
    int64_t generated = 0;
    int64_t batch_rows = 0;  // sessions over the decode steps this request was in
    int64_t batch_steps = 0;
    std::optional<TokenLogprobs> logprobs;
    std::unique_ptr<OutputConstraint> constraint;  // the answer's grammar (the sampler's)
    FinishReason finish = FinishReason::length;
    double t0 = 0, t1 = 0;  // prefill start, decode start (now_seconds)
    double prefill_seconds = 0;
  };
  int id = 0;
  std::unique_ptr<Session> session;
  std::unique_ptr<CheckpointStore> checkpoints;
  std::unique_ptr<Job> job;  // null when idle
  double last_used = 0;
  int64_t requests = 0;
};

EngineService::EngineService(ServiceOptions options) : options_(std::move(options)) {
  options_.parallel = std::max(1, options_.parallel);
  load_started_ = now_seconds();
  stats_.max_queue = options_.max_queue;
  stats_.parallel = options_.parallel;
  active_.resize(static_cast<size_t>(options_.parallel));
  worker_ = std::thread([this] { run(); });
}

EngineService::~EngineService() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exiting_ = true;
    shutting_down_ = true;
    load_cancel_.store(true);  // a load still running stops within one tensor
    for (const auto& h : active_)
      if (h) h->cancel_.store(true);
  }
  fail_waiters(ServiceError::shutting_down, "the server is shutting down");
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void EngineService::fail_waiters(ServiceError error, const std::string& message) {
  std::deque<std::shared_ptr<RequestHandle>> waiters;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waiters.swap(queue_);
    stats_.queued = 0;
  }
  for (const auto& h : waiters) {
    ServiceEvent e;
    e.kind = ServiceEvent::Kind::error;
    e.error = error;
    e.text = message;
    h->push(std::move(e));
  }
  idle_.notify_all();
}

Result<std::shared_ptr<RequestHandle>> EngineService::submit(ServiceRequest request) {
  const int64_t capacity = context_.load();
  if (!ready_.load()) {
    std::lock_guard<std::mutex> lock(mutex_);
    return Status(Status::Code::unavailable, stats_.state == ServiceStats::State::failed
                                                 ? "the model failed to load"
                                                 : "the model is still loading");
  }
  if (request.prompt.empty()) return Status::invalid("the prompt is empty");
  if (static_cast<int64_t>(request.prompt.size()) >= capacity)
    return Status::invalid(context_overflow_message(
        "the prompt", static_cast<int64_t>(request.prompt.size()), capacity));
  const int64_t room = capacity - static_cast<int64_t>(request.prompt.size());
  request.max_tokens = std::clamp<int64_t>(request.max_tokens, 1, room);
  auto handle = std::make_shared<RequestHandle>();
  handle->request_ = std::move(request);
  handle->submitted_at_ = now_seconds();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shutting_down_) return Status(Status::Code::unavailable, "the server is shutting down");
    // The queued requests take the idle sessions first; beyond them at most max_queue wait.
    const size_t idle = active_.size() - busy_;
    const size_t waiting = queue_.size() > idle ? queue_.size() - idle : 0;
    if (queue_.size() >= idle && waiting >= options_.max_queue) {
      ++stats_.rejected;
      const std::string running = options_.parallel == 1
                                      ? std::string("the running request")
                                      : "the " + std::to_string(options_.parallel) +
                                            " running requests (--parallel / COLI_PARALLEL)";
      return Status(Status::Code::resource_exhausted,
                    "the queue is full: " + std::to_string(waiting) + " waiting behind " + running +
                        ", the limit (--max-queue / COLI_MAX_QUEUE)");
    }
    queue_.push_back(handle);
    stats_.queued = queue_.size();
  }
  wake_.notify_all();
  return handle;
}

void EngineService::cancel(const std::shared_ptr<RequestHandle>& handle) {
  handle->cancel_.store(true);
  bool removed = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find(queue_.begin(), queue_.end(), handle);
    if (it != queue_.end()) {
      queue_.erase(it);
      stats_.queued = queue_.size();
      ++stats_.cancelled_queue;
      removed = true;
    }
  }
  if (removed) {
    ServiceEvent e;
    e.kind = ServiceEvent::Kind::error;
    e.error = ServiceError::cancelled;
    e.text = "cancelled while queued";
    handle->push(std::move(e));
    idle_.notify_all();
  }
}

void EngineService::begin_shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutting_down_ = true;
    stats_.state = ServiceStats::State::stopping;
    // A server that drains before its model is loaded will never serve it: the load stops
    // within one tensor instead of running to the end (issue 16: 35 s on an 8.9 GB slice).
    load_cancel_.store(true);
  }
  fail_waiters(ServiceError::shutting_down, "the server is shutting down");
}

void EngineService::cancel_active() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& h : active_)
    if (h) h->cancel_.store(true);
}

bool EngineService::wait_idle(double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  return idle_.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                        [&] { return busy_ == 0 && queue_.empty(); });
}

void EngineService::erase_state() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    erase_requested_ = true;
  }
  wake_.notify_all();
}

ServiceStats EngineService::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ServiceStats s = stats_;
  if (s.state == ServiceStats::State::loading) s.load_elapsed_s = now_seconds() - load_started_;
  s.active = busy_;
  s.queued = queue_.size();
  if (const Engine* e = engine()) {
    s.experts = e->expert_stats();
    s.device = e->device_stats();
    s.expert_parallel = e->expert_parallel_stats();
    s.memory = e->memory();
  }
  return s;
}

// A directory refused before the weights load: the service fails with `step` and `why` (not a
// load failure: nothing was loaded).
void EngineService::refuse_before_load(const char* step, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.state = ServiceStats::State::failed;
  stats_.failed_step = step;
  stats_.load_error = why;
  stats_.load_elapsed_s = now_seconds() - load_started_;
}

void EngineService::load() {
  const int n = options_.parallel;
  slots_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    slots_[static_cast<size_t>(i)] = std::make_unique<Slot>();
    slots_[static_cast<size_t>(i)]->id = i;
  }
  // Disk checkpoints (--ckpt-dir, with --ckpt auto or N > 0) are set up before the weights load,
  // so a directory that is refused stops the start at once; that is not a load failure. Each
  // session has its own store (its own private subdirectory).
  if (!options_.ckpt_dir.empty() && options_.ckpt_slots != 0) {
    CheckpointPolicy policy;
    policy.dir = options_.ckpt_dir;
    policy.keep_files = options_.ckpt_keep;
    policy.slots = options_.ckpt_slots > 0 ? options_.ckpt_slots : 2;
    try {
      for (auto& slot : slots_) slot->checkpoints = std::make_unique<CheckpointStore>(policy);
    } catch (const std::exception& e) {
      for (auto& slot : slots_) slot->checkpoints.reset();
      return refuse_before_load("checkpoint directory (--ckpt-dir)", e.what());
    }
  }
  // The prefix cache on disk is checked before the weights too; its identity names the model and
  // what the engine computes with, so a file written by another model or setting never matches.
  if (!options_.cache_dir.empty()) {
    try {
      const LoadOptions& lo = options_.load;
      std::error_code ec;
      const std::string model = std::filesystem::canonical(options_.model_dir, ec).string();
      std::string identity =
          model + "\n" + read_text_file(options_.model_dir + "/config.json") + "\n";
      identity += "bits " + std::to_string(lo.bits) + "/" + std::to_string(lo.mla_bits) + "/" +
                  std::to_string(lo.head_bits) + " idot " + std::to_string(lo.idot) + " isa " +
                  lo.isa + " layers " + std::to_string(lo.layers) + " topp " +
                  std::to_string(lo.expert_top_p) + " cpu " + cpu_model_name();
      // Named only when on, so the identity of every cache written without it is unchanged.
      if (lo.kda_chunked) identity += " kda_chunked";
      prefix_cache_ = std::make_unique<PrefixCache>(
          options_.cache_dir, static_cast<uint64_t>(std::max(0.0, options_.cache_gb) * 1e9),
          identity);
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.prefix_cache = prefix_cache_->describe();
      stats_.prefix = prefix_cache_->counters();
    } catch (const std::exception& e) {
      return refuse_before_load("prefix cache directory (--cache-dir)", e.what());
    }
  }
  try {
    if (options_.threads > 0) omp_set_num_threads(options_.threads);
    const int64_t capacity =
        options_.context > 0 ? options_.context : 8192;  // NoPE MLA: no table limit
    EngineOptions eo;
    eo.model_dir = options_.model_dir;
    eo.load = options_.load;
    eo.on_progress = [this](double fraction) {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.load_progress = fraction;
    };
    eo.cancel = &load_cancel_;
    eo.require_tokenizer = true;  // checked before the weights, not after them
    eo.context = capacity;
    eo.sessions = n;  // every session's state must fit, checked before the weights
    Result<std::unique_ptr<Engine>> loaded = Engine::load(eo);
    if (!loaded.ok()) {  // cancelled by a shutdown: nothing failed, the server is stopping
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.state = ServiceStats::State::stopping;
      stats_.load_error = loaded.status().message();
      stats_.load_elapsed_s = now_seconds() - load_started_;
      return;
    }
    engine_ = std::move(loaded).value();
    if (!engine_->info().has_head || !engine_->info().has_embedding || !engine_->tokenizer())
      throw Error(options_.model_dir +
                  ": serving needs the embedding, the lm_head and tiktoken.model");
    // Every session is allocated now (the memory for all of them is taken at start).
    for (auto& slot : slots_) slot->session = std::make_unique<Session>(*engine_, capacity);
    batch_ = std::make_unique<Batch>(*engine_);
    stop_ids_ = stop_ids(*engine_);
    if (!slots_[0]->checkpoints) {  // RAM checkpoints: N, or auto: auto_slots (else 2) when they
                                    // leave 1 GiB free for every session, else off
      CheckpointPolicy policy;
      if (options_.ckpt_slots >= 0) {
        policy.slots = options_.ckpt_slots;
      } else {
        const uint64_t state_bytes =
            slots_[0]->session->state_floats() * sizeof(float) * static_cast<uint64_t>(n);
        const uint64_t available = available_memory_bytes();
        const uint64_t wanted = static_cast<uint64_t>(std::clamp(options_.auto_slots, 2, 8));
        policy.slots = available > wanted * state_bytes + (uint64_t{1} << 30)
                           ? static_cast<int>(wanted)
                       : available > 2 * state_bytes + (uint64_t{1} << 30) ? 2
                                                                           : 0;
      }
      for (auto& slot : slots_) slot->checkpoints = std::make_unique<CheckpointStore>(policy);
    }
    const int ckpt_slots = slots_[0]->checkpoints->policy().slots;
    context_.store(capacity);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.context_capacity = capacity;
    stats_.session_bytes = engine_->info().session_bytes;
    stats_.checkpoints = slots_[0]->checkpoints->describe();
    stats_.ckpt_slots = ckpt_slots;
    stats_.load_progress = 1.0;
    stats_.load_elapsed_s = now_seconds() - load_started_;
    stats_.state = shutting_down_ ? ServiceStats::State::stopping : ServiceStats::State::ready;
    ready_.store(true);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.state = ServiceStats::State::failed;
    stats_.failed_step = "cannot load " + options_.model_dir;
    stats_.load_error = e.what();
    stats_.load_elapsed_s = now_seconds() - load_started_;
  }
}

EngineService::Slot* EngineService::choose(const ServiceRequest& req) {
  Slot* best = nullptr;  // the longest shared prefix worth keeping
  int64_t best_common = 0;
  Slot* lru = nullptr;
  for (auto& s : slots_) {
    if (active_[static_cast<size_t>(s->id)]) continue;
    if (!lru || s->last_used < lru->last_used) lru = s.get();
    if (!req.cache_prompt) continue;
    const std::vector<int64_t>& record = s->session->tokens();
    const size_t most = std::min(record.size(), req.prompt.size());
    const int64_t common = static_cast<int64_t>(
        std::mismatch(record.begin(), record.begin() + static_cast<std::ptrdiff_t>(most),
                      req.prompt.begin())
            .first -
        record.begin());
    // Worth it when it keeps at least half of what the session holds: a shared template head
    // alone does not evict a conversation.
    if (common > 0 && 2 * common >= static_cast<int64_t>(record.size()) && common > best_common) {
      best = s.get();
      best_common = common;
    }
  }
  return best ? best : lru;
}

void EngineService::run() {
  load();
  std::vector<std::pair<Slot*, std::shared_ptr<RequestHandle>>> starting;
  for (;;) {
    starting.clear();
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] {
        return (exiting_ && busy_ == 0) || erase_requested_ || busy_ > 0 ||
               (!queue_.empty() && ready_.load());
      });
      if (exiting_ && busy_ == 0) break;
      if (erase_requested_ && ready_.load()) {
        erase_requested_ = false;
        for (auto& s : slots_)
          if (!active_[static_cast<size_t>(s->id)]) {
            s->session->reset();
            s->checkpoints->clear();
          }
      } else {
        erase_requested_ = false;
      }
      while (ready_.load() && !exiting_ && !queue_.empty() && busy_ < active_.size()) {
        std::shared_ptr<RequestHandle> handle = queue_.front();
        queue_.pop_front();
        Slot* slot = choose(handle->request_);
        active_[static_cast<size_t>(slot->id)] = handle;
        ++busy_;
        ++stats_.admitted;
        starting.emplace_back(slot, std::move(handle));
      }
      stats_.queued = queue_.size();
    }
    for (auto& [slot, handle] : starting) start(*slot, std::move(handle));
    if (!round()) publish_state();
  }
}

void EngineService::publish_state() {
  std::lock_guard<std::mutex> lock(mutex_);
  bool prefill = false, decode = false;
  stats_.sessions.resize(slots_.size());
  stats_.ckpt = {};
  stats_.ckpt_used = 0;
  stats_.ckpt_list.clear();
  double oldest = 0;
  for (auto& s : slots_) {
    ServiceStats::SessionInfo& info = stats_.sessions[static_cast<size_t>(s->id)];
    info.id = s->id;
    info.state = !s->job ? "idle" : s->job->decoding ? "decode" : "prefill";
    if (s->job) (s->job->decoding ? decode : prefill) = true;
    info.fed_tokens = s->session ? s->session->position() : 0;
    info.last_used = s->last_used;
    info.requests = s->requests;
    if (s->job) {
      info.prompt_tokens = s->job->stats.prompt_tokens;
      info.cached_tokens = s->job->stats.cached_tokens;
      info.generated_tokens = s->job->generated;
      if (oldest == 0 || s->last_used < oldest) oldest = s->last_used;
    }
    if (s->checkpoints) {
      info.ckpt_used = s->checkpoints->used();
      info.ckpt_list = s->checkpoints->list();
      stats_.ckpt_used += info.ckpt_used;
      if (s->id == last_slot_) stats_.ckpt_list = info.ckpt_list;
      const CheckpointCounters& c = s->checkpoints->counters();
      stats_.ckpt.saves += c.saves;
      stats_.ckpt.restores += c.restores;
      stats_.ckpt.rejected += c.rejected;
      stats_.ckpt.restore_seconds += c.restore_seconds;
    }
  }
  stats_.phase = prefill ? "prefill" : decode ? "decode" : "idle";
  if (prefix_cache_) {
    stats_.prefix_cache = prefix_cache_->describe();
    stats_.prefix = prefix_cache_->counters();
  }
  stats_.active_started = oldest;
  stats_.fed_tokens = slots_.empty() || !slots_[static_cast<size_t>(last_slot_)]->session
                          ? 0
                          : slots_[static_cast<size_t>(last_slot_)]->session->position();
}

int64_t EngineService::reuse(Slot& slot, const ServiceRequest& req, GenerationStats& stats) {
  Session& session = *slot.session;
  CheckpointStore& checkpoints = *slot.checkpoints;
  const std::span<const int64_t> prompt(req.prompt);
  const int64_t n = static_cast<int64_t>(prompt.size());
  checkpoints.protect(req.keep, prompt);
  // 1. Reuse.
  const std::vector<int64_t>& record = session.tokens();
  const int64_t held = static_cast<int64_t>(record.size());
  int64_t start = 0;
  if (req.cache_prompt && held > 0 && held < n &&
      std::equal(record.begin(), record.end(), prompt.begin())) {
    stats.reuse = ReuseKind::live;
    start = held;
  } else {
    int64_t live = 0;
    if (req.cache_prompt)
      while (live < std::min(held, n - 1) &&
             record[static_cast<size_t>(live)] == prompt[static_cast<size_t>(live)])
        ++live;
    const int64_t restored = req.cache_prompt ? checkpoints.restore_best(session, prompt, live) : 0;
    if (restored > 0) {
      stats.reuse = ReuseKind::checkpoint;
      stats.restored_at = restored;
      start = restored;
    } else {
      session.reset();
    }
    if (options_.prefix_log)
      std::fprintf(
          stderr, "[PREFIX] session %d: no live reuse: held=%lld prompt=%lld common=%lld%s\n",
          slot.id, static_cast<long long>(held), static_cast<long long>(n),
          static_cast<long long>(live),
          restored > 0 ? (" -> restored checkpoint @" + std::to_string(restored)).c_str() : "");
  }
  // The prefix cache on disk, when it holds more of the prompt.
  if (prefix_cache_ && req.cache_prompt) {
    const int64_t restored = prefix_cache_->restore_best(session, prompt, start);
    if (restored > 0) {
      stats.reuse = ReuseKind::disk;
      stats.restored_at = restored;
      start = restored;
      if (options_.prefix_log)
        std::fprintf(stderr, "[PREFIX] session %d: restored %lld of %lld from the disk cache\n",
                     slot.id, static_cast<long long>(start), static_cast<long long>(n));
    }
  }
  if (options_.prefix_log && stats.reuse == ReuseKind::live)
    std::fprintf(stderr, "[PREFIX] session %d: reusing %lld of %lld prompt tokens\n", slot.id,
                 static_cast<long long>(start), static_cast<long long>(n));
  stats.cached_tokens = start;
  // 2. A checkpoint at the rollback point.
  if (start > 0 && !checkpoints.holds(start, prompt.first(static_cast<size_t>(start))))
    checkpoints.save(session);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.prompt_tokens += n;
    stats_.cached_tokens += start;
    (stats.reuse == ReuseKind::live         ? stats_.reuse_live
     : stats.reuse == ReuseKind::checkpoint ? stats_.reuse_checkpoint
     : stats.reuse == ReuseKind::disk       ? stats_.reuse_disk
                                            : stats_.reuse_none)++;
  }
  return start;
}

void EngineService::start(Slot& slot, std::shared_ptr<RequestHandle> handle) {
  slot.job = std::make_unique<Slot::Job>(*engine_->tokenizer(), std::move(handle));
  Slot::Job& job = *slot.job;
  const ServiceRequest& req = job.req;
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  slot.last_used = now_seconds();
  ++slot.requests;
  last_slot_ = slot.id;
  job.stats.prompt_tokens = n;
  job.stats.session = slot.id;
  job.stats.queue_wait_ms = (slot.last_used - job.handle->submitted_at_) * 1e3;
  job.start = reuse(slot, req, job.stats);
  job.fed = job.start;
  for (int64_t p : req.keep)
    if (p > job.start && p < n) job.saves.push_back(p);
  if (req.anchor > job.start && req.anchor < n) job.saves.push_back(req.anchor);
  std::sort(job.saves.begin(), job.saves.end());
  job.saves.erase(std::unique(job.saves.begin(), job.saves.end()), job.saves.end());
  job.sampler.set_context(req.prompt);  // the repeat penalty's window reaches into the prompt
  job.stats.device = engine_->device_stats();  // end_generation() turns it into this turn's share
  if (req.constraint) {
    // The server checked the grammar; a failure here is the engine's.
    auto made = OutputConstraint::create(*engine_, *req.constraint);
    if (!made.ok()) return end_with_fault(slot, false, made.status().message().c_str());
    job.constraint = std::move(made).value();
    job.sampler.set_constraint(job.constraint.get());
  }
  job.t0 = now_seconds();
  publish_state();
  ServiceEvent e;
  e.kind = ServiceEvent::Kind::accepted;
  e.stats = job.stats;
  job.handle->push(std::move(e));
}

void EngineService::prefill_piece(Slot& slot) {
  Slot::Job& job = *slot.job;
  Session& session = *slot.session;
  const ServiceRequest& req = job.req;
  const std::span<const int64_t> prompt(req.prompt);
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (job.handle->cancel_.load()) return end_cancelled_prefill(slot);
  // A piece: while other sessions decode, up to progress_every ids and no more than a chunk, so
  // they get a step at least every min(progress_every, K3_CHUNK) prefill rows; alone, a whole
  // chunk when that is more (a long prompt's experts are read once per chunk: K3_CHUNK=auto);
  // a kept position ends a piece.
  const int64_t chunk = std::max<int64_t>(1, session.prefill_chunk());
  const int64_t every = std::max<int64_t>(1, req.progress_every);
  int64_t piece = std::max(every, chunk);
  for (const auto& other : slots_)
    if (other.get() != &slot && other->job && other->job->decoding) {
      piece = std::min(every, chunk);
      break;
    }
  int64_t end = std::min(n, job.fed + piece);
  for (int64_t p : job.saves)
    if (p > job.fed && p < end) end = p;
  const double t = now_seconds();
  try {
    session.set_interrupt(&job.handle->cancel_);
    session.prefill(
        prompt.subspan(static_cast<size_t>(job.fed), static_cast<size_t>(end - job.fed)));
    session.set_interrupt(nullptr);
  } catch (const Interrupted&) {
    session.set_interrupt(nullptr);
    job.prefill_seconds += now_seconds() - t;
    return end_cancelled_prefill(slot);
  } catch (const std::exception& e) {
    session.set_interrupt(nullptr);
    return end_with_fault(slot, false, e.what());
  }
  job.prefill_seconds += now_seconds() - t;
  job.fed = end;
  // The test hook's delay between prefill pieces makes a prefill long enough to cut; a cut lands
  // in the next piece (Session::set_interrupt).
  if (options_.token_delay_ms > 0 && end < n)
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.token_delay_ms));
  if (std::binary_search(job.saves.begin(), job.saves.end(), end)) slot.checkpoints->save(session);
  if (prefix_cache_ && req.cache_prompt && end == req.anchor) prefix_cache_->save(session);
  ServiceEvent e;
  e.kind = ServiceEvent::Kind::progress;
  e.processed = end;
  e.total = n;
  e.elapsed_ms = (now_seconds() - job.t0) * 1e3;
  job.handle->push(std::move(e));
  if (end < n) return;
  // The prompt's end is always checkpointed: a follow-up whose history is re-rendered differently
  // (the reply retokenised, reasoning dropped) resumes there.
  slot.checkpoints->save(session);
  if (prefix_cache_ && req.cache_prompt) prefix_cache_->save(session);
  // Batched decode steps run in the batch's workspace: this session's prompt scratch is idle until
  // its next request (N idle sessions held N chunks' worth).
  session.release_prefill_buffers();
  job.decoding = true;
  job.t1 = now_seconds();
  publish_state();
}

bool EngineService::sample(Slot& slot, int64_t& next) {
  Slot::Job& job = *slot.job;
  const ServiceRequest& req = job.req;
  const std::vector<float>& logits = slot.session->logits();
  const size_t j = static_cast<size_t>(job.generated);
  const int64_t id = j < options_.scripted_tokens.size() ? options_.scripted_tokens[j]
                                                         : job.sampler.sample(logits);
  job.sampler.accept(id);
  const bool is_stop_id = std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
  // Log-probabilities only when asked for, and only of content tokens: one pass over the logits.
  if (req.top_logprobs >= 0) {
    if (job.demux.content_token(id, is_stop_id))
      job.logprobs = token_logprobs(logits, id, req.top_logprobs);
    else
      job.logprobs.reset();
  }
  ++job.generated;
  const bool stop_string = job.demux.token(id, is_stop_id, job.logprobs ? &*job.logprobs : nullptr);
  if (is_stop_id || stop_string || job.handle->stop_.load()) {
    job.finish = FinishReason::stop;
  } else if (job.handle->cancel_.load()) {
    job.finish = FinishReason::cancelled;
  } else if (job.generated >= req.max_tokens) {
    job.finish = FinishReason::length;  // the budget is spent: no wasted step
  } else {
    next = id;
    return true;
  }
  end_generation(slot);
  return false;
}

bool EngineService::round() {
  std::vector<Session*> rows;
  std::vector<int64_t> ids;
  std::vector<Slot*> fed;
  for (auto& s : slots_) {
    if (!s || !s->job || !s->job->decoding) continue;
    int64_t next = 0;
    if (sample(*s, next)) {
      rows.push_back(s->session.get());
      ids.push_back(next);
      fed.push_back(s.get());
    }
  }
  bool ran = false;
  if (!rows.empty()) {
    if (options_.token_delay_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.token_delay_ms));
    // Between tokens: a request cancelled meanwhile ends before its next step.
    for (size_t i = 0; i < fed.size();) {
      if (fed[i]->job->handle->cancel_.load()) {
        fed[i]->job->finish = FinishReason::cancelled;
        end_generation(*fed[i]);
        fed.erase(fed.begin() + static_cast<std::ptrdiff_t>(i));
        rows.erase(rows.begin() + static_cast<std::ptrdiff_t>(i));
        ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  if (!rows.empty()) {
    ran = true;
    // Under a grammar a row's head computes only the ids the grammar allows next (the sampler
    // masks the rest anyway), unless log-probabilities, which need every logit, are asked for, or
    // a scripted token may leave the grammar. Set here, for the rows this step feeds: a
    // restriction set on a row that leaves the step would reach that session's next feed.
    for (Slot* s : fed) {
      Slot::Job& job = *s->job;
      if (job.constraint && job.req.top_logprobs < 0 && options_.scripted_tokens.empty())
        if (const std::vector<uint64_t>* allowed = job.constraint->allowed_next()) {
          s->session->restrict_next_logits(*allowed);
          ++job.stats.restricted_heads;
        }
    }
    try {
      batch_->step(rows, ids);
    } catch (const std::exception& e) {
      for (Slot* s : fed) end_with_fault(*s, true, e.what());
      fed.clear();
    }
    const int64_t size = static_cast<int64_t>(fed.size());
    for (Slot* s : fed) {
      s->job->batch_rows += size;
      ++s->job->batch_steps;
      s->job->stats.batch_max = std::max(s->job->stats.batch_max, size);
    }
    if (size > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.decode_steps;
      stats_.decode_rows += size;
      stats_.last_batch = size;
    }
  }
  // One prefill piece, of the next prefilling session in turn.
  const size_t n = slots_.size();
  for (size_t k = 0; k < n; ++k) {
    Slot& s = *slots_[(prefill_turn_ + k) % n];
    if (!s.job || s.job->decoding) continue;
    prefill_turn_ = (prefill_turn_ + k + 1) % n;
    prefill_piece(s);
    ran = true;
    break;
  }
  return ran;
}

void EngineService::release(Slot& slot) {
  slot.job.reset();
  // A prompt cut by a cancel or a fault ends here without reaching the decode: its scratch too.
  slot.session->release_prefill_buffers();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    active_[static_cast<size_t>(slot.id)].reset();
    --busy_;
  }
  publish_state();
  idle_.notify_all();
}

void EngineService::end_with_fault(Slot& slot, bool decoding, const char* what) {
  slot.session->reset();
  std::fprintf(stderr, "[engine] session %d: %s failed: %s\n", slot.id,
               decoding ? "decode" : "prefill", what);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.failed;
    ++stats_.failed_in_a_row;
    stats_.last_failure = what;
  }
  ServiceEvent e;
  e.kind = ServiceEvent::Kind::error;
  e.error = ServiceError::engine_error;
  // The engine's message (e.g. the damaged tensor an expert read found), as /health's last_error
  // shows it to the same clients.
  e.text =
      std::string(decoding ? "engine failure during decode: " : "engine failure during prefill: ") +
      what;
  std::shared_ptr<RequestHandle> handle = slot.job->handle;
  release(slot);
  handle->push(std::move(e));
}

void EngineService::end_cancelled_prefill(Slot& slot) {
  Slot::Job& job = *slot.job;
  const std::span<const int64_t> prompt(job.req.prompt);
  const int64_t start = job.start;
  // Roll back to the state before this request's prefill: the checkpoint at `start` (step 2), or
  // the deepest one below it when that one could not be saved (every slot kept), or nothing. The
  // MLA rows below `start` are untouched by the cancelled prefill, so any of them is valid.
  if (start == 0 || slot.checkpoints->restore_best(
                        *slot.session, prompt.first(static_cast<size_t>(start)), start) == 0)
    slot.session->reset();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.cancelled_prefill;
    stats_.prefill_seconds += job.prefill_seconds;
  }
  job.stats.prefill_ms = job.prefill_seconds * 1e3;
  job.stats.finish = FinishReason::cancelled;
  ServiceEvent e;
  e.kind = ServiceEvent::Kind::done;
  e.stats = job.stats;
  std::shared_ptr<RequestHandle> handle = job.handle;
  release(slot);
  handle->push(std::move(e));
}

void EngineService::end_generation(Slot& slot) {
  Slot::Job& job = *slot.job;
  const ServiceRequest& req = job.req;
  GenerationStats& stats = job.stats;
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  const double decode_seconds = now_seconds() - job.t1;
  stats.prefill_ms = job.prefill_seconds * 1e3;
  stats.decode_ms = decode_seconds * 1e3;
  stats.completion_tokens = job.generated;
  if (job.batch_steps > 0)
    stats.batch_mean = static_cast<double>(job.batch_rows) / static_cast<double>(job.batch_steps);
  if (job.finish != FinishReason::cancelled) job.demux.finish();
  stats.finish = job.finish;
  stats.stop_sequence = job.demux.matched_stop();
  if (stats.finish == FinishReason::stop && stats.tool_calls > 0 && !job.demux.stopped_by_string())
    stats.finish = FinishReason::tool_calls;
  // The Vulkan tier's share of the time this request ran (with --parallel, that of the requests
  // decoded beside it too) and the grammar's masks.
  stats.device = engine_->device_stats().since(stats.device);
  if (job.constraint) {
    stats.grammar_masks = job.constraint->masks();
    stats.grammar_ms = job.constraint->mask_seconds() * 1e3;
  }
  // The end of the reply, unless that would evict the anchor checkpoint: with 2 slots and an
  // anchor, the anchor (an edited or regenerated last message) and the prompt's end (a follow-up)
  // are kept; the reply's end is the live record, checkpointed when the next request extends it.
  if (!(req.anchor > 0 && req.anchor < n) || slot.checkpoints->policy().slots >= 3)
    slot.checkpoints->save(*slot.session);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.generated_tokens += stats.completion_tokens;
    stats_.prefill_seconds += job.prefill_seconds;
    stats_.decode_seconds += decode_seconds;
    if (stats.finish == FinishReason::cancelled)
      ++stats_.cancelled_decode;
    else
      ++stats_.completed;
    stats_.failed_in_a_row = 0;
  }
  ServiceEvent e;
  e.kind = ServiceEvent::Kind::done;
  e.stats = stats;
  std::shared_ptr<RequestHandle> handle = job.handle;
  release(slot);
  handle->push(std::move(e));
}

}  // namespace k3

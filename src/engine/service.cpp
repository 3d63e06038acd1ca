#include "engine/service.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>

#include "engine/generate.h"
#include "engine/sampler.h"
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

EngineService::EngineService(ServiceOptions options) : options_(std::move(options)) {
  load_started_ = now_seconds();
  stats_.max_queue = options_.max_queue;
  worker_ = std::thread([this] { run(); });
}

EngineService::~EngineService() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exiting_ = true;
    shutting_down_ = true;
    load_cancel_.store(true);  // a load still running stops within one tensor
    if (active_) active_->cancel_.store(true);
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
    if (queue_.size() >= options_.max_queue && (active_ || !queue_.empty())) {
      ++stats_.rejected;
      return Status(Status::Code::resource_exhausted,
                    "the queue is full: " + std::to_string(queue_.size()) +
                        " waiting behind the running request, the limit (--max-queue / "
                        "COLI_MAX_QUEUE)");
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
  if (active_) active_->cancel_.store(true);
}

bool EngineService::wait_idle(double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  return idle_.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                        [&] { return !active_ && queue_.empty(); });
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
  s.active = active_ ? 1 : 0;
  s.queued = queue_.size();
  if (const Engine* e = engine()) {
    s.experts = e->expert_stats();
    s.device = e->device_stats();
  }
  return s;
}

void EngineService::load() {
  // Disk checkpoints (--ckpt-dir, with --ckpt auto or N > 0) are set up before the weights load,
  // so a directory that is refused stops the start at once; that is not a load failure.
  if (!options_.ckpt_dir.empty() && options_.ckpt_slots != 0) {
    CheckpointPolicy policy;
    policy.dir = options_.ckpt_dir;
    policy.keep_files = options_.ckpt_keep;
    policy.slots = options_.ckpt_slots > 0 ? options_.ckpt_slots : 2;
    try {
      checkpoints_ = std::make_unique<CheckpointStore>(policy);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.state = ServiceStats::State::failed;
      stats_.failed_step = "checkpoint directory (--ckpt-dir)";
      stats_.load_error = e.what();
      stats_.load_elapsed_s = now_seconds() - load_started_;
      return;
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
    session_ = std::make_unique<Session>(*engine_, capacity);
    stop_ids_ = stop_ids(*engine_);
    if (!checkpoints_) {  // RAM checkpoints: N, or auto: auto_slots (else 2) when they leave 1 GiB
                          // free, else off
      CheckpointPolicy policy;
      if (options_.ckpt_slots >= 0) {
        policy.slots = options_.ckpt_slots;
      } else {
        const uint64_t state_bytes = session_->state_floats() * sizeof(float);
        const uint64_t available = available_memory_bytes();
        const uint64_t wanted = static_cast<uint64_t>(std::clamp(options_.auto_slots, 2, 8));
        policy.slots = available > wanted * state_bytes + (uint64_t{1} << 30)
                           ? static_cast<int>(wanted)
                       : available > 2 * state_bytes + (uint64_t{1} << 30) ? 2
                                                                           : 0;
      }
      checkpoints_ = std::make_unique<CheckpointStore>(policy);
    }
    const int slots = checkpoints_->policy().slots;
    context_.store(capacity);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.context_capacity = capacity;
    stats_.checkpoints = checkpoints_->describe();
    stats_.ckpt_slots = slots;
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

void EngineService::run() {
  load();
  for (;;) {
    std::shared_ptr<RequestHandle> handle;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(
          lock, [&] { return exiting_ || erase_requested_ || (!queue_.empty() && ready_.load()); });
      if (exiting_) break;
      if (erase_requested_) {
        erase_requested_ = false;
        lock.unlock();
        if (session_) session_->reset();
        if (checkpoints_) checkpoints_->clear();
        publish_state();
        continue;
      }
      handle = queue_.front();
      queue_.pop_front();
      active_ = handle;
      stats_.queued = queue_.size();
      ++stats_.admitted;
      stats_.active_started = now_seconds();
    }
    serve(handle);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      active_.reset();
    }
    idle_.notify_all();
  }
}

void EngineService::publish_state() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.phase = "idle";
  stats_.fed_tokens = session_ ? session_->position() : 0;
  if (checkpoints_) {
    stats_.ckpt_used = checkpoints_->used();
    stats_.ckpt_list = checkpoints_->list();
    stats_.ckpt = checkpoints_->counters();
  }
}

int64_t EngineService::reuse(const ServiceRequest& req, GenerationStats& stats) {
  Session& session = *session_;
  const std::span<const int64_t> prompt(req.prompt);
  const int64_t n = static_cast<int64_t>(prompt.size());
  checkpoints_->protect(req.keep, prompt);
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
    const int64_t restored =
        req.cache_prompt ? checkpoints_->restore_best(session, prompt, live) : 0;
    if (restored > 0) {
      stats.reuse = ReuseKind::checkpoint;
      stats.restored_at = restored;
      start = restored;
    } else {
      session.reset();
    }
    if (options_.prefix_log)
      std::fprintf(
          stderr, "[PREFIX] no live reuse: held=%lld prompt=%lld common=%lld%s\n",
          static_cast<long long>(held), static_cast<long long>(n), static_cast<long long>(live),
          restored > 0 ? (" -> restored checkpoint @" + std::to_string(restored)).c_str() : "");
  }
  if (options_.prefix_log && stats.reuse == ReuseKind::live)
    std::fprintf(stderr, "[PREFIX] reusing %lld of %lld prompt tokens\n",
                 static_cast<long long>(start), static_cast<long long>(n));
  stats.cached_tokens = start;
  // 2. A checkpoint at the rollback point.
  if (start > 0 && !checkpoints_->holds(start, prompt.first(static_cast<size_t>(start))))
    checkpoints_->save(session);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.prompt_tokens += n;
    stats_.cached_tokens += start;
    (stats.reuse == ReuseKind::live         ? stats_.reuse_live
     : stats.reuse == ReuseKind::checkpoint ? stats_.reuse_checkpoint
                                            : stats_.reuse_none)++;
    stats_.phase = "prefill";
  }
  return start;
}

void EngineService::serve(const std::shared_ptr<RequestHandle>& handle) {
  const ServiceRequest& req = handle->request_;
  Session& session = *session_;
  const text::Tokenizer& tokenizer = *engine_->tokenizer();
  const std::span<const int64_t> prompt(req.prompt);
  const int64_t n = static_cast<int64_t>(prompt.size());
  GenerationStats stats;
  stats.prompt_tokens = n;
  stats.queue_wait_ms = (now_seconds() - handle->submitted_at_) * 1e3;
  stats.device = engine_->device_stats();  // end_generation() turns it into this turn's share
  auto set_phase = [&](const char* phase) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.phase = phase;
  };

  // 1 and 2: reuse, and a checkpoint at the rollback point.
  const int64_t start = reuse(req, stats);
  {
    ServiceEvent e;
    e.kind = ServiceEvent::Kind::accepted;
    e.stats = stats;
    handle->push(std::move(e));
  }

  // 3 and 4: the generation loop over the tail, with this request's hooks.
  GenerateSettings settings;
  settings.max_new_tokens = req.max_tokens;
  settings.stop_ids = stop_ids_;
  settings.prefill_piece = std::max<int64_t>(1, req.progress_every);
  // The positions of the tail worth a checkpoint: the anchor and the kept ones.
  std::vector<int64_t> saves;
  for (int64_t p : req.keep)
    if (p > start && p < n) saves.push_back(p);
  if (req.anchor > start && req.anchor < n) saves.push_back(req.anchor);
  std::sort(saves.begin(), saves.end());
  saves.erase(std::unique(saves.begin(), saves.end()), saves.end());
  for (int64_t p : saves) settings.splits.push_back(p - start);
  settings.cancel = &handle->cancel_;
  settings.scripted = options_.scripted_tokens;

  const std::function<void(ServiceEvent)> push = [&](ServiceEvent e) {
    handle->push(std::move(e));
  };
  OutputDemux demux(tokenizer, req, stats, push);

  const double t0 = now_seconds();
  bool decoding = false;
  GenerateHooks hooks;
  hooks.on_prefilled = [&](int64_t fed) {
    const int64_t p = start + fed;
    // The test hook's delay between prefill pieces makes a prefill long enough to cut; a cut
    // lands in the next piece (Session::set_interrupt).
    if (options_.token_delay_ms > 0 && p < n)
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.token_delay_ms));
    if (std::binary_search(saves.begin(), saves.end(), p)) checkpoints_->save(session);
    ServiceEvent e;
    e.kind = ServiceEvent::Kind::progress;
    e.processed = p;
    e.total = n;
    e.elapsed_ms = (now_seconds() - t0) * 1e3;
    handle->push(std::move(e));
  };
  hooks.on_prefill_done = [&] {
    // The prompt's end is always checkpointed: a follow-up whose history is re-rendered
    // differently (the reply retokenised, reasoning dropped) resumes there.
    checkpoints_->save(session);
    set_phase("decode");
    decoding = true;
  };
  // Log-probabilities only when asked for, and only of content tokens: one pass over the logits.
  std::optional<TokenLogprobs> logprobs;
  if (req.top_logprobs >= 0)
    hooks.on_logits = [&](int64_t id, std::span<const float> logits) {
      const bool is_stop_id = std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
      if (demux.content_token(id, is_stop_id))
        logprobs = token_logprobs(logits, id, req.top_logprobs);
      else
        logprobs.reset();
    };
  hooks.on_token = [&](int64_t id) {
    const bool is_stop_id = std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
    if (demux.token(id, is_stop_id, logprobs ? &*logprobs : nullptr) || handle->stop_.load())
      return TokenVerdict::stop;
    return handle->cancel_.load() ? TokenVerdict::cancel : TokenVerdict::next;
  };
  if (options_.token_delay_ms > 0)
    hooks.between_tokens = [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.token_delay_ms));
    };

  Sampler sampler(req.sampling, req.sampling.seed, req.penalties);
  sampler.set_context(prompt);  // the repeat penalty's window reaches into the whole prompt
  std::unique_ptr<OutputConstraint> constraint;
  if (req.constraint) {
    // The server checked the grammar; a failure here is the engine's.
    auto made = OutputConstraint::create(*engine_, *req.constraint);
    if (!made.ok()) {
      end_with_fault(*handle, false, made.status().message().c_str());
      return;
    }
    constraint = std::move(made).value();
    sampler.set_constraint(constraint.get());
  }
  GenerateResult result;
  try {
    result =
        generate(session, prompt.subspan(static_cast<size_t>(start)), sampler, settings, hooks);
  } catch (const std::exception& e) {
    end_with_fault(*handle, decoding, e.what());
    return;
  }
  stats.prefill_ms = result.prefill_seconds * 1e3;
  if (result.cancelled_in_prefill) {
    end_cancelled_prefill(*handle, stats, start, result.prefill_seconds);
    return;
  }
  stats.completion_tokens = static_cast<int64_t>(result.tokens.size());
  if (constraint) {
    stats.grammar_masks = constraint->masks();
    stats.grammar_ms = constraint->mask_seconds() * 1e3;
  }
  if (result.finish != FinishReason::cancelled) demux.finish();
  stats.finish = result.finish;
  stats.stop_sequence = demux.matched_stop();
  if (stats.finish == FinishReason::stop && stats.tool_calls > 0 && !demux.stopped_by_string())
    stats.finish = FinishReason::tool_calls;
  end_generation(*handle, stats, result);
}

void EngineService::end_with_fault(RequestHandle& handle, bool decoding, const char* what) {
  session_->reset();
  std::fprintf(stderr, "[engine] %s failed: %s\n", decoding ? "decode" : "prefill", what);
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
  publish_state();
  handle.push(std::move(e));
}

void EngineService::end_cancelled_prefill(RequestHandle& handle, GenerationStats& stats,
                                          int64_t start, double prefill_seconds) {
  const std::span<const int64_t> prompt(handle.request_.prompt);
  // Roll back to the state before this request's prefill: the checkpoint at `start` (step 2), or
  // the deepest one below it when that one could not be saved (every slot kept), or nothing. The
  // MLA rows below `start` are untouched by the cancelled prefill, so any of them is valid.
  if (start == 0 ||
      checkpoints_->restore_best(*session_, prompt.first(static_cast<size_t>(start)), start) == 0)
    session_->reset();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.cancelled_prefill;
    stats_.prefill_seconds += prefill_seconds;
  }
  stats.finish = FinishReason::cancelled;
  ServiceEvent e;
  e.kind = ServiceEvent::Kind::done;
  e.stats = stats;
  publish_state();
  handle.push(std::move(e));
}

void EngineService::end_generation(RequestHandle& handle, GenerationStats& stats,
                                   const GenerateResult& result) {
  const ServiceRequest& req = handle.request_;
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  stats.decode_ms = result.decode_seconds * 1e3;
  stats.device = engine_->device_stats().since(stats.device);
  // The end of the reply, unless that would evict the anchor checkpoint: with 2 slots and an
  // anchor, the anchor (an edited or regenerated last message) and the prompt's end (a follow-up)
  // are kept; the reply's end is the live record, checkpointed when the next request extends it.
  if (!(req.anchor > 0 && req.anchor < n) || checkpoints_->policy().slots >= 3)
    checkpoints_->save(*session_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.generated_tokens += stats.completion_tokens;
    stats_.prefill_seconds += result.prefill_seconds;
    stats_.decode_seconds += result.decode_seconds;
    if (stats.finish == FinishReason::cancelled)
      ++stats_.cancelled_decode;
    else
      ++stats_.completed;
    stats_.failed_in_a_row = 0;
  }
  ServiceEvent e;
  e.kind = ServiceEvent::Kind::done;
  e.stats = stats;
  publish_state();
  handle.push(std::move(e));
}

}  // namespace k3

// io/read_queue.cpp — the asynchronous read engines behind io/read_queue.h.
// Owns: ReadTicket's waiting and completion, the split of requests into extents, the io_uring
// engine (one ring, a reaper thread that issues every read and reaps every completion, a FIFO
// of the extents beyond `depth`), the thread-pool engine (pread workers over a FIFO), the
// per-extent error rules shared by both (retry, O_DIRECT refusal, short reads), the busy clock,
// and the choice between engines. Does not own: what is read or where it goes (experts/), nor
// alignment planning (callers hand in aligned direct requests).
#include "io/read_queue.h"

#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "util/error.h"

namespace k3 {

using Clock = std::chrono::steady_clock;

double ReadTicket::wait() {
  // Always under mu_, even when already done: finish_one decrements and notifies while holding
  // mu_, so once this returns no engine thread touches the ticket any more and the caller may
  // destroy it (the destructor waits too).
  std::unique_lock<std::mutex> lock(mu_);
  if (pending_.load(std::memory_order_acquire) == 0) return 0;
  const auto start = Clock::now();
  cv_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void ReadTicket::finish_one(const std::string& error) {
  // The error is written before the release decrement: a reader that sees done() sees it.
  std::lock_guard<std::mutex> lock(mu_);
  if (!error.empty() && error_.empty()) error_ = error;
  if (pending_.fetch_sub(1, std::memory_order_release) == 1) cv_.notify_all();
}

namespace {

// One piece of a request: at most extent_bytes, read (and retried) on its own.
struct Extent {
  ReadTicket* ticket = nullptr;
  const File* file = nullptr;
  uint8_t* dst = nullptr;  // where the extent's first byte goes
  uint64_t offset = 0;     // file offset of the extent's first byte
  uint64_t length = 0;
  uint64_t done = 0;    // bytes read so far
  bool direct = false;  // O_DIRECT; cleared when the filesystem refuses it
};

// A ticket and the message its extent finished with ("" on success), delivered outside the
// engine's lock.
using Finished = std::vector<std::pair<ReadTicket*, std::string>>;

void deliver(const Finished& finished) {
  for (const auto& [ticket, error] : finished) ticket->finish_one(error);
}

std::string read_failed(const Extent& e, int err) {
  return e.file->path() + ": read failed at offset " + std::to_string(e.offset + e.done) + ": " +
         std::strerror(err);
}

std::string short_read(const Extent& e) {
  return e.file->path() + ": short read: wanted " + std::to_string(e.length) + " bytes at offset " +
         std::to_string(e.offset) + ", got " + std::to_string(e.done) + " (file truncated?)";
}

// The descriptor for the extent's next read: the O_DIRECT one while the file still accepts
// direct reads, else the buffered one (the extent then stays buffered).
int pick_descriptor(Extent& e) {
  if (e.direct) {
    const int fd = e.file->descriptor(true);
    if (fd >= 0) return fd;
    e.direct = false;
  }
  return e.file->descriptor(false);
}

enum class Step { kDone, kRetry, kFailed };

// What one read of the extent's remainder returning `got` (bytes, or -errno) means. kRetry: read
// the (new) remainder again; kFailed: `error` says why.
Step settle(Extent& e, int64_t got, std::string& error) {
  if (got < 0) {
    const int err = static_cast<int>(-got);
    if (err == EINTR || err == EAGAIN) return Step::kRetry;
    if (err == EINVAL && e.direct) {
      // The filesystem accepted O_DIRECT at open but refuses the read (tmpfs, some FUSE and
      // overlay mounts): buffered from here on, for this file.
      e.file->refuse_direct();
      e.direct = false;
      return Step::kRetry;
    }
    error = read_failed(e, err);
    return Step::kFailed;
  }
  if (got == 0) {
    error = short_read(e);
    return Step::kFailed;
  }
  e.done += static_cast<uint64_t>(got);
  if (e.done >= e.length) return Step::kDone;
  if (e.direct && static_cast<uint64_t>(got) % kDirectAlign != 0) {
    // A partial block only happens at end of file: the file is shorter than at open.
    error = short_read(e);
    return Step::kFailed;
  }
  return Step::kRetry;
}

// The counters behind ReadQueueStats; used under the engine's mutex.
class Meter {
 public:
  void start_one() {
    if (in_flight_++ == 0) busy_since_ = Clock::now();
    stats_.max_in_flight = std::max(stats_.max_in_flight, in_flight_);
  }
  void end_one() {
    if (--in_flight_ == 0)
      stats_.busy_seconds += std::chrono::duration<double>(Clock::now() - busy_since_).count();
  }
  void count(uint64_t bytes) {
    stats_.bytes += bytes;
    ++stats_.extents;
  }
  void cancelled(uint64_t n) { stats_.cancelled += n; }
  int in_flight() const { return in_flight_; }
  ReadQueueStats snapshot() const {
    ReadQueueStats s = stats_;
    if (in_flight_ > 0)
      s.busy_seconds += std::chrono::duration<double>(Clock::now() - busy_since_).count();
    return s;
  }

 private:
  ReadQueueStats stats_;
  int in_flight_ = 0;
  Clock::time_point busy_since_;
};

// What both engines share: splitting requests into extents, the ticket's pending count, reads of
// files without a descriptor on the calling thread, and the stats.
class QueueBase : public ReadQueue {
 public:
  explicit QueueBase(const ReadQueueOptions& options) {
    const uint64_t piece = std::clamp<uint64_t>(options.extent_bytes, 1, kMaxReadPiece);
    buffered_piece_ = piece;
    direct_piece_ = std::max(kDirectAlign, piece / kDirectAlign * kDirectAlign);
  }

  void submit(ReadTicket& ticket, std::span<const ReadRequest> requests) final {
    if (!ticket.done()) throw Error("read queue: submit on a ticket that is still in flight");
    for (const ReadRequest& r : requests)
      if (r.length > 0 && (r.file == nullptr || r.dst == nullptr))
        throw Error("read queue: a request without a file or a destination");
    ticket.reset();
    std::vector<Extent> extents;
    int here = 0;
    for (const ReadRequest& r : requests) {
      if (r.length == 0) continue;
      if (served_here(r)) {
        ++here;
        continue;
      }
      const uint64_t piece = r.direct ? direct_piece_ : buffered_piece_;
      auto* dst = static_cast<uint8_t*>(r.dst);
      for (uint64_t at = 0; at < r.length; at += piece)
        extents.push_back({&ticket, r.file, dst + at, r.offset + at, std::min(piece, r.length - at),
                           0, r.direct});
    }
    // Every extent counted before any is issued: the ticket cannot reach zero early.
    const size_t total = extents.size() + static_cast<size_t>(here);
    if (total == 0) return;
    ticket.add_pending(static_cast<int>(total));
    if (!extents.empty()) enqueue(std::move(extents));
    for (const ReadRequest& r : requests)
      if (r.length > 0 && served_here(r)) read_here(ticket, r);
  }

  ReadQueueStats stats() const final {
    std::lock_guard<std::mutex> lock(mu_);
    return meter_.snapshot();
  }

  void cancel(ReadTicket& ticket) final {
    if (ticket.done()) return;
    size_t n = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      n = withdraw_locked(&ticket);
      meter_.cancelled(n);
    }
    for (size_t i = 0; i < n; ++i) ticket.finish_one("cancelled");
  }

 protected:
  // Removes the ticket's extents waiting in the engine's FIFO; returns how many. REQUIRES: mu_.
  virtual size_t withdraw_locked(const ReadTicket* ticket) = 0;
  // Starts `extents` (already counted in their tickets). Never throws: what cannot be queued
  // (out of memory) finishes with an error, so no ticket waits forever.
  virtual void enqueue(std::vector<Extent>&& extents) = 0;
  static void not_queued(const std::vector<Extent>& extents, size_t queued) {
    for (size_t i = queued; i < extents.size(); ++i)
      extents[i].ticket->finish_one("out of memory queuing a read");
  }

  mutable std::mutex mu_;  // the engine's state and meter_
  Meter meter_;

 private:
  static bool served_here(const ReadRequest& r) {
    return r.file->descriptor(r.direct) < 0 && r.file->descriptor(false) < 0;
  }

  void read_here(ReadTicket& ticket, const ReadRequest& r) {
    std::string error;
    try {
      r.file->read_exact(r.dst, r.length, r.offset, std::to_string(r.length) + " bytes");
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (error.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      meter_.count(r.length);
    }
    ticket.finish_one(error);
  }

  uint64_t buffered_piece_ = 0;
  uint64_t direct_piece_ = 0;
};

// --- io_uring -----------------------------------------------------------------------------------
//
// Every read is issued by the reaper thread, never by the thread calling submit(): io_uring runs
// the late stages of a request (a buffered read retried once its pages arrive) as task work of
// the thread that issued it, so a submitter that went on computing would be interrupted to copy
// pages, and one that exited would see its reads fail (EFAULT). A submitter only queues its
// extents and, when the reaper may be asleep, posts a NOP (completed inline) to wake it.

class UringQueue final : public QueueBase {
 public:
  explicit UringQueue(const ReadQueueOptions& options)
      : QueueBase(options), depth_(std::clamp(options.depth, 1, 4096)) {
    // Slots for depth_ reads, a wake NOP and the stop NOP; the completion queue is twice as deep.
    const int rc = io_uring_queue_init(static_cast<unsigned>(depth_ + 2), &ring_, 0);
    if (rc < 0) throw Error(std::string("io_uring unavailable: ") + std::strerror(-rc));
    io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
    const bool can_read = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_READ);
    if (probe != nullptr) io_uring_free_probe(probe);
    if (!can_read) {
      io_uring_queue_exit(&ring_);
      throw Error("io_uring unavailable: the kernel has no IORING_OP_READ");
    }
    try {
      reaper_ = std::thread([this] { reap(); });
    } catch (const std::exception& e) {
      io_uring_queue_exit(&ring_);
      throw Error(std::string("io_uring unavailable: cannot start the reaper: ") + e.what());
    }
  }

  ~UringQueue() override {
    // The stop NOP: the reaper leaves once every extent (queued or in the ring) is done, so
    // pending reads finish and their tickets hear of it.
    post_nop(kStopTag);
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }

  const char* engine() const override { return "io_uring"; }

 protected:
  size_t withdraw_locked(const ReadTicket* ticket) override {
    const size_t before = fifo_.size();
    std::erase_if(fifo_, [&](const std::unique_ptr<Extent>& e) { return e->ticket == ticket; });
    return before - fifo_.size();
  }

  void enqueue(std::vector<Extent>&& extents) override {
    size_t queued = 0;
    bool wake = false;
    try {
      std::vector<std::unique_ptr<Extent>> owned;
      owned.reserve(extents.size());
      for (Extent& e : extents) owned.push_back(std::make_unique<Extent>(e));
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& e : owned) {
        fifo_.push_back(std::move(e));
        ++queued;
      }
      // No wake needed while the reaper is issuing (it looks at the FIFO again afterwards), with
      // depth_ reads in flight (their completions wake it), or with a wake not yet reaped.
      if (!awake_ && !wake_posted_ && meter_.in_flight() < depth_) wake = wake_posted_ = true;
    } catch (...) {
      not_queued(extents, queued);
      wake = queued > 0;
    }
    if (wake) post_nop(kWakeTag);
  }

 private:
  // user_data of the NOPs; extents carry their address.
  static constexpr uint64_t kWakeTag = 1;
  static constexpr uint64_t kStopTag = 2;

  // An extent leaving the FIFO for the ring, with the descriptor it is read from.
  struct Issue {
    Extent* extent;
    int fd;
  };

  // Queues a NOP and submits it (from any thread: a NOP completes inside the submit call).
  void post_nop(uint64_t tag) {
    std::lock_guard<std::mutex> lock(sq_mu_);
    io_uring_sqe* sqe = next_sqe_sq_locked();
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, tag);
    flush_sq_locked();
  }

  io_uring_sqe* next_sqe_sq_locked() {
    // Never empty with depth_ + 2 slots, each submitted right away, but cheap to be sure.
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {
      flush_sq_locked();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  // Hands the prepared entries to the kernel.
  void flush_sq_locked() {
    while (io_uring_sq_ready(&ring_) > 0) {
      const int rc = io_uring_submit(&ring_);
      if (rc > 0) {
        submitted_.fetch_add(rc, std::memory_order_relaxed);
        continue;
      }
      if (rc == -EINTR) continue;
      // Out of resources for now (EAGAIN, EBUSY): the reaper flushes again after the next
      // completion; with nothing in the kernel to complete, wait a moment and retry here.
      if (submitted_.load(std::memory_order_relaxed) > 0) return;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void reap() {
    bool stopping = false;
    bool again = false;  // issued something last pass: look at the FIFO again before sleeping
    std::vector<Issue> issue;
    Finished finished;
    for (;;) {
      if (!again) {
        io_uring_cqe* cqe = nullptr;
        const int rc = io_uring_wait_cqe(&ring_, &cqe);
        if (rc < 0) {
          if (rc != -EINTR && rc != -EAGAIN)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
      }
      issue.clear();
      finished.clear();
      bool leave = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        io_uring_cqe* cqes[64];
        unsigned n = 0;
        while ((n = io_uring_peek_batch_cqe(&ring_, cqes, 64)) > 0) {
          for (unsigned i = 0; i < n; ++i) complete_locked(*cqes[i], finished, stopping);
          io_uring_cq_advance(&ring_, n);
        }
        while (!fifo_.empty() && meter_.in_flight() < depth_) {
          std::unique_ptr<Extent> e = std::move(fifo_.front());
          fifo_.pop_front();
          const int fd = pick_descriptor(*e);
          if (fd < 0) {
            finished.emplace_back(e->ticket, read_failed(*e, EBADF));
            continue;
          }
          meter_.start_one();
          issue.push_back({e.release(), fd});
        }
        awake_ = again = !issue.empty();
        leave = stopping && fifo_.empty() && meter_.in_flight() == 0;
      }
      deliver(finished);
      // Outside mu_: submitting a buffered read of cached pages copies them right here, and
      // submitters must not wait for that.
      {
        std::lock_guard<std::mutex> lock(sq_mu_);
        for (const Issue& i : issue) {
          Extent& e = *i.extent;
          io_uring_sqe* sqe = next_sqe_sq_locked();
          io_uring_prep_read(sqe, i.fd, e.dst + e.done, static_cast<unsigned>(e.length - e.done),
                             e.offset + e.done);
          io_uring_sqe_set_data(sqe, &e);
        }
        flush_sq_locked();  // also what an earlier flush left behind
      }
      if (leave) return;
    }
  }

  void complete_locked(const io_uring_cqe& cqe, Finished& finished, bool& stopping) {
    submitted_.fetch_sub(1, std::memory_order_relaxed);
    const uint64_t tag = io_uring_cqe_get_data64(&cqe);
    if (tag == kStopTag) {
      stopping = true;
      return;
    }
    if (tag == kWakeTag) {
      wake_posted_ = false;
      return;
    }
    std::unique_ptr<Extent> e(reinterpret_cast<Extent*>(static_cast<uintptr_t>(tag)));
    meter_.end_one();
    std::string error;
    switch (settle(*e, cqe.res, error)) {
      case Step::kRetry:
        fifo_.push_front(std::move(e));
        break;
      case Step::kDone:
        meter_.count(e->length);
        finished.emplace_back(e->ticket, std::string());
        break;
      case Step::kFailed:
        finished.emplace_back(e->ticket, std::move(error));
        break;
    }
  }

  const int depth_;
  io_uring ring_{};
  std::mutex sq_mu_;  // the submission side of ring_ (the reaper alone reads completions)
  // Under mu_: extents waiting for a slot (new, retried, the rest of a short read), whether the
  // reaper is issuing (and will look at the FIFO again), whether a wake NOP is on its way to it.
  std::deque<std::unique_ptr<Extent>> fifo_;
  bool awake_ = false;
  bool wake_posted_ = false;
  std::atomic<int> submitted_{0};  // entries handed to the kernel and not yet reaped
  std::thread reaper_;
};

// --- threads ------------------------------------------------------------------------------------

class ThreadQueue final : public QueueBase {
 public:
  explicit ThreadQueue(const ReadQueueOptions& options) : QueueBase(options) {
    const int n = std::clamp(options.threads, 1, 16);
    try {
      for (int i = 0; i < n; ++i) workers_.emplace_back([this] { work(); });
    } catch (const std::exception& e) {
      stop_and_join();
      throw Error(std::string("read queue: cannot start the reader threads: ") + e.what());
    }
  }
  ~ThreadQueue() override { stop_and_join(); }

  const char* engine() const override { return "threads"; }

 protected:
  size_t withdraw_locked(const ReadTicket* ticket) override {
    const size_t before = fifo_.size();
    std::erase_if(fifo_, [&](const Extent& e) { return e.ticket == ticket; });
    return before - fifo_.size();
  }

  void enqueue(std::vector<Extent>&& extents) override {
    size_t queued = 0;
    try {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Extent& e : extents) {
        fifo_.push_back(e);
        ++queued;
      }
    } catch (...) {
      not_queued(extents, queued);
    }
    if (queued == 1)
      cv_.notify_one();
    else if (queued > 1)
      cv_.notify_all();
  }

 private:
  // Workers drain the FIFO before they leave: pending reads finish.
  void stop_and_join() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !fifo_.empty(); });
      if (fifo_.empty()) return;
      Extent e = fifo_.front();
      fifo_.pop_front();
      meter_.start_one();
      lock.unlock();
      std::string error;
      const bool ok = read(e, error);
      lock.lock();
      meter_.end_one();
      if (ok) meter_.count(e.length);
      lock.unlock();
      e.ticket->finish_one(error);
      lock.lock();
    }
  }

  static bool read(Extent& e, std::string& error) {
    for (;;) {
      const int fd = pick_descriptor(e);
      if (fd < 0) {
        error = read_failed(e, EBADF);
        return false;
      }
      const ssize_t got =
          ::pread(fd, e.dst + e.done, e.length - e.done, static_cast<off_t>(e.offset + e.done));
      switch (settle(e, got < 0 ? -static_cast<int64_t>(errno) : got, error)) {
        case Step::kDone:
          return true;
        case Step::kFailed:
          return false;
        case Step::kRetry:
          break;
      }
    }
  }

  std::condition_variable cv_;
  std::deque<Extent> fifo_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

WindowPlan plan_window(const File& file, uint64_t offset, uint64_t length, uint8_t* buffer,
                       bool direct) {
  WindowPlan plan;
  plan.data = buffer;
  if (!direct) {
    plan.requests[plan.count++] = {&file, buffer, length, offset, false};
    return plan;
  }
  const uint64_t start = offset / kDirectAlign * kDirectAlign;
  const uint64_t pad = offset - start;
  const uint64_t want = pad + length;
  uint64_t window = (want + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  const uint64_t size = file.size();
  if (start + window > size)
    window = size > start ? (size - start) / kDirectAlign * kDirectAlign : 0;
  if (window > 0) plan.requests[plan.count++] = {&file, buffer, window, start, true};
  if (window < want) {
    const uint64_t from = std::max(window, pad);
    plan.requests[plan.count++] = {&file, buffer + from, want - from, start + from, false};
  }
  plan.data = buffer + pad;
  return plan;
}

uint8_t* allocate_direct_buffer(uint64_t bytes) {
  const uint64_t rounded = (bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  void* p = std::aligned_alloc(kDirectAlign, rounded);
  if (p == nullptr)
    throw Error("cannot allocate " + std::to_string(rounded) + " bytes for O_DIRECT reads");
  return static_cast<uint8_t*>(p);
}

void free_direct_buffer(uint8_t* p) noexcept {
  std::free(p);
}

std::unique_ptr<ReadQueue> make_read_queue(const ReadQueueOptions& options) {
  switch (options.engine) {
    case ReadQueueOptions::Engine::kUring:
      return std::make_unique<UringQueue>(options);
    case ReadQueueOptions::Engine::kThreads:
      return std::make_unique<ThreadQueue>(options);
    case ReadQueueOptions::Engine::kAuto:
      break;
  }
  try {
    return std::make_unique<UringQueue>(options);
  } catch (const Error&) {
    return std::make_unique<ThreadQueue>(options);
  }
}

}  // namespace k3

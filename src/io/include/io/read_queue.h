// io/read_queue.h — many file extents read at once in the background (expert streaming).
// Owns: the asynchronous read engines — io_uring (liburing: one ring, reads split into extents
// of at most ReadQueueOptions::extent_bytes, up to `depth` extents in flight, completions
// reaped by a background thread) and a pool of plain threads doing pread where io_uring is
// unavailable — plus the drive-busy clock (time with at least one read in flight). Does not own:
// what is read or where it goes (experts/), nor alignment planning (the caller's requests are
// already aligned when `direct`).
//
// A ReadTicket groups requests that complete together (one expert: its aligned O_DIRECT window
// and possibly a buffered tail, or six buffered tensor reads). The submitter waits on the ticket;
// errors (EIO, a short read past end of file, a direct read refused mid-way that also fails
// buffered) are recorded in the ticket as a message naming the file and offset, never thrown on
// the background thread. A direct read refused with EINVAL (filesystem without O_DIRECT support)
// is retried buffered.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "io/file.h"

namespace k3 {

struct ReadRequest {
  const File* file = nullptr;
  void* dst = nullptr;
  uint64_t length = 0;
  uint64_t offset = 0;
  // O_DIRECT (dst, length and offset multiples of kDirectAlign, offset + length <= size()).
  bool direct = false;
};

// One group of requests in flight. Not copyable or movable; must outlive its reads (the
// destructor waits for them).
class ReadTicket {
 public:
  ReadTicket() = default;
  ReadTicket(const ReadTicket&) = delete;
  ReadTicket& operator=(const ReadTicket&) = delete;
  ~ReadTicket() { wait(); }

  // True once every request finished (successfully or not).
  bool done() const { return pending_.load(std::memory_order_acquire) == 0; }
  // Blocks until done(); returns the seconds spent blocked (0 when already done).
  double wait();
  // "" when every request succeeded; else the first failure's message (file, offset, reason).
  // REQUIRES: done().
  const std::string& error() const { return error_; }

  // For the engines: `count` more extents outstanding / one extent finished (with `error` ""
  // or a message; the first message is kept).
  void add_pending(int count) { pending_.fetch_add(count, std::memory_order_relaxed); }
  void finish_one(const std::string& error);
  // For the submitter before reuse: clears the error. REQUIRES: done().
  void reset() { error_.clear(); }

 private:
  std::atomic<int> pending_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::string error_;
};

struct ReadQueueStats {
  uint64_t bytes = 0;       // bytes read (successful extents)
  uint64_t extents = 0;     // extents completed
  uint64_t cancelled = 0;   // extents withdrawn before reaching the drive
  double busy_seconds = 0;  // wall time with at least one extent in flight
  int max_in_flight = 0;    // deepest queue seen
};

struct ReadQueueOptions {
  enum class Engine { kAuto, kUring, kThreads };
  Engine engine = Engine::kAuto;  // auto: io_uring when the kernel allows it, else threads
  int threads = 4;                // K3_LOAD_THREADS: workers of the thread engine (1..16)
  int depth = 64;                 // extents in flight at most (io_uring)
  uint64_t extent_bytes = uint64_t{1} << 20;  // reads are split into pieces of at most this
};

class ReadQueue {
 public:
  virtual ~ReadQueue() = default;
  // Starts every request of `requests` as part of `ticket` (REQUIRES: ticket done(); it is reset)
  // and returns without waiting. Requests on files without a descriptor (in-memory fakes) are
  // served on the calling thread before returning. Thread-safe.
  virtual void submit(ReadTicket& ticket, std::span<const ReadRequest> requests) = 0;
  // Withdraws the ticket's extents that have not reached the drive yet (they finish with the
  // error "cancelled"); extents already in flight complete as usual. The ticket is done once
  // those have. Thread-safe; a no-op for a done ticket.
  virtual void cancel(ReadTicket& ticket) = 0;
  virtual ReadQueueStats stats() const = 0;
  // "io_uring" or "threads".
  virtual const char* engine() const = 0;
};

// The requests reading bytes [offset, offset + length) of `file` into `buffer`. With `direct`: one
// O_DIRECT window, its start rounded down to kDirectAlign and its end rounded up (or down to the
// last whole block inside the file, the rest read buffered as a second request); `buffer` must be
// kDirectAlign-aligned and hold window_bytes(length). Without: one buffered read into `buffer`.
// `data` is where the wanted bytes begin in `buffer` once the requests are done.
struct WindowPlan {
  ReadRequest requests[2];
  size_t count = 0;
  uint8_t* data = nullptr;
};
WindowPlan plan_window(const File& file, uint64_t offset, uint64_t length, uint8_t* buffer,
                       bool direct);
// The buffer plan_window needs for `length` bytes: the window's two partial blocks on top.
inline uint64_t window_bytes(uint64_t length) {
  return length + 2 * kDirectAlign;
}

// A buffer for plan_window's direct reads: `bytes` rounded up to whole kDirectAlign blocks,
// kDirectAlign-aligned, plain pages (huge-page-advised slots made the slice's O_DIRECT expert
// reads wait on compaction, 0.84 GB at 0.17 GB/s instead of 0.93 GB/s). Throws k3::Error naming
// the size when memory is short; free_direct_buffer gives it back.
uint8_t* allocate_direct_buffer(uint64_t bytes);
void free_direct_buffer(uint8_t* p) noexcept;

// Builds the engine `options` asks for; kAuto falls back to threads when io_uring cannot be set
// up (old kernel, seccomp). kUring throws k3::Error when io_uring is unavailable.
std::unique_ptr<ReadQueue> make_read_queue(const ReadQueueOptions& options);

}  // namespace k3

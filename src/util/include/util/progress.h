// util/progress.h — progress of long work (loading, writing checkpoints) on stderr: on a terminal a
// one-line bar with percent, elapsed time and, once bytes are reported, GB/s and an ETA; in a log
// (stderr not a terminal) one line every kLogEvery seconds with the same figures, and a closing
// line when at least one was written (a load of a few seconds writes nothing). Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace k3 {

class Progress {
 public:
  // `total` units of work (bytes, tensors, ...); `label` is printed before the bar. `observer`
  // (optional) sees the finished fraction after every advance, TTY or not (a server's /health).
  Progress(std::string label, uint64_t total, std::function<void(double fraction)> observer = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(uint64_t units);
  // The bytes moved so far (cumulative), for the GB/s figure; the ETA comes from the units.
  void set_bytes(uint64_t bytes) { bytes_.store(bytes, std::memory_order_relaxed); }
  void finish();

  static constexpr double kLogEvery = 5.0;  // seconds between log lines

 private:
  void draw(bool final_line);
  void log_line(bool final_line);
  std::string figures() const;  // "42.0% 3.10 GB 1.20 GB/s ETA 12 s"

  std::string label_;
  uint64_t total_;
  std::function<void(double)> observer_;
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> bytes_{0};
  bool logged_ = false;  // a log line was written
  bool enabled_;
  bool finished_ = false;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace k3

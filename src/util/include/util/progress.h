// util/progress.h — a one-line progress bar for long work (loading, writing checkpoints).
// Draws on stderr only when stderr is a terminal; silent otherwise. Thread-safe `advance`.
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
  void finish();

 private:
  void draw(bool final_line);

  std::string label_;
  uint64_t total_;
  std::function<void(double)> observer_;
  std::atomic<uint64_t> done_{0};
  bool enabled_;
  bool finished_ = false;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace k3

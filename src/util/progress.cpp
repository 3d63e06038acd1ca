#include "util/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace k3 {

Progress::Progress(std::string label, uint64_t total, std::function<void(double)> observer)
    : label_(std::move(label)),
      total_(total),
      observer_(std::move(observer)),
      enabled_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  finish();
}

void Progress::advance(uint64_t units) {
  const uint64_t done = done_.fetch_add(units, std::memory_order_relaxed) + units;
  if (observer_ && total_ > 0)
    observer_(std::min(1.0, static_cast<double>(done) / static_cast<double>(total_)));
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(false);
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  finished_ = true;
  if (enabled_) draw(true);
}

void Progress::draw(bool final_line) {
  const uint64_t done = done_.load(std::memory_order_relaxed);
  const double fraction = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  const int width = 30;
  const int filled = static_cast<int>(fraction * width + 0.5);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %6.1fs%s", label_.c_str(), bar.c_str(), fraction * 100.0,
               seconds, final_line ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace k3

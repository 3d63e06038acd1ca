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
  auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  if (!enabled_) {
    if (now - last_draw_ < std::chrono::duration<double>(kLogEvery)) return;
    last_draw_ = now;
    log_line(false);
    return;
  }
  if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(false);
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  finished_ = true;
  if (enabled_)
    draw(true);
  else if (logged_)
    log_line(true);
}

std::string Progress::figures() const {
  const uint64_t done = done_.load(std::memory_order_relaxed);
  const double fraction =
      total_ ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total_)) : 1.0;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double gb = static_cast<double>(bytes_.load(std::memory_order_relaxed)) / 1e9;
  char out[128];
  int n = std::snprintf(out, sizeof out, "%5.1f%% %6.1fs", fraction * 100.0, seconds);
  if (gb > 0 && seconds > 0)
    n += std::snprintf(out + n, sizeof out - static_cast<size_t>(n), " %.2f GB %.2f GB/s", gb,
                       gb / seconds);
  if (fraction > 0 && fraction < 1)
    std::snprintf(out + n, sizeof out - static_cast<size_t>(n), " ETA %.0f s",
                  seconds * (1 - fraction) / fraction);
  return out;
}

void Progress::log_line(bool final_line) {
  logged_ = true;
  std::fprintf(stderr, "%s: %s%s\n", label_.c_str(), figures().c_str(), final_line ? " done" : "");
  std::fflush(stderr);
}

void Progress::draw(bool final_line) {
  const uint64_t done = done_.load(std::memory_order_relaxed);
  const double fraction = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  const int width = 30;
  const int filled = static_cast<int>(std::min(1.0, fraction) * width + 0.5);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  // \x1b[K clears what a longer previous line left behind.
  std::fprintf(stderr, "\r%s [%s] %s\x1b[K%s", label_.c_str(), bar.c_str(), figures().c_str(),
               final_line ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace k3

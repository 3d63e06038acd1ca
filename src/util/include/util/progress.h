// util/progress.h — the one progress renderer of every program (loading, k3_repack, k3_synth):
// byte counts in, one line out. On a terminal one line redrawn in place ("\r", the line, clear to
// its end) that never takes the terminal's last column, so it never wraps: the label is
// shortened in the middle and figures are dropped by priority to fit. Off a terminal (a log) a
// plain line every kLogEvery seconds before 100%, and one closing line when any was written (a
// run of a few seconds leaves the log to the program's own summary). Exactly one ETA, from the
// bytes done.
// Does not own: what the bytes are (the caller's plan) or the terminal's other output (text
// printed while a bar is shown goes through print_above).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

namespace k3 {

// Where a Progress draws. The seam that lets tests render at any width, on or off a terminal,
// with a clock they move themselves.
struct ProgressSink {
  std::function<void(std::string_view)> write;  // one redraw or one whole line per call
  bool tty = false;                             // redraw in place (else plain lines)
  std::function<int()> columns;                 // the terminal's width, asked at each redraw
  std::function<double()> clock;                // seconds on a monotonic clock
};

// The process's stderr: tty from isatty, the width from ioctl(TIOCGWINSZ) at each redraw (80
// when it cannot be measured), the steady clock.
ProgressSink stderr_sink();

// Terminal columns UTF-8 text takes: East Asian wide and fullwidth characters 2, combining marks
// and zero-width characters 0, anything else (an invalid byte included) 1.
size_t display_width(std::string_view utf8);

// Thread-safe: advance may be called from many threads at once. The observer and print_above's
// `print` run under the Progress's lock, so they must not call back into it.
class Progress {
 public:
  // `total` bytes of work; `label` says what they are. `observer` (optional) sees the finished
  // fraction after every advance that raises it, TTY or not (a server's /health): never
  // decreasing, at most 1, and 1 exactly once (when the bytes reach the total, else at finish()).
  Progress(std::string label, uint64_t total, std::function<void(double fraction)> observer = {});
  Progress(std::string label, uint64_t total, ProgressSink sink,
           std::function<void(double fraction)> observer = {});
  // Without finish() (an error unwinding): a bar on screen keeps its last state on its own line;
  // no closing line, and the observer is not told 1.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `bytes` more are done (the running sum is clamped to the total for display).
  void advance(uint64_t bytes);
  // What is being worked on now (k3_repack: the shard being written); shown from the next redraw.
  void set_label(std::string label);
  // Runs `print` (which writes whole lines to the same terminal) with the bar taken off the
  // screen, then puts the bar back below what it printed.
  void print_above(const std::function<void()>& print);
  // The work is done: 100%, the closing line (TTY: the bar's final state; log: one line when
  // periodic lines were written), the observer told 1. Later calls do nothing.
  void finish();

  static constexpr double kLogEvery = 5.0;   // seconds between plain lines off a terminal
  static constexpr double kDrawEvery = 0.1;  // seconds between redraws on a terminal

 private:
  void notify_locked();
  void draw_locked(bool closing);
  void log_locked(bool closing);

  std::mutex mutex_;
  ProgressSink sink_;
  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  std::function<void(double)> observer_;
  double reported_ = -1;  // the last fraction the observer saw
  double start_;
  double last_draw_;
  double last_log_;
  bool shown_ = false;   // a bar is on the screen (TTY), the cursor at its end
  bool logged_ = false;  // a periodic line was written (log)
  bool finished_ = false;
};

}  // namespace k3

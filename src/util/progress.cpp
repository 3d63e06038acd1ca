#include "util/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

namespace k3 {
namespace {

constexpr size_t kBarMin = 10;    // bar cells, brackets excluded
constexpr size_t kBarMax = 30;    // a wider bar says nothing more
constexpr size_t kLabelMin = 12;  // the label is shortened to this before the bar goes
constexpr size_t kLabelKeep = 4;  // a label shorter than this is dropped rather than shown

// One decoded character of UTF-8 text: its bytes and its columns.
struct Glyph {
  size_t offset, length, columns;
};

size_t columns_of(char32_t c) {
  if (c == 0 || (c >= 0x0300 && c <= 0x036F) || (c >= 0x200B && c <= 0x200F) ||
      (c >= 0xFE00 && c <= 0xFE0F) || (c >= 0x20D0 && c <= 0x20FF))
    return 0;
  if ((c >= 0x1100 && c <= 0x115F) || (c >= 0x2E80 && c <= 0x303E) ||
      (c >= 0x3041 && c <= 0x33FF) || (c >= 0x3400 && c <= 0x4DBF) ||
      (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xA000 && c <= 0xA4CF) ||
      (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0xF900 && c <= 0xFAFF) ||
      (c >= 0xFE30 && c <= 0xFE4F) || (c >= 0xFF00 && c <= 0xFF60) ||
      (c >= 0xFFE0 && c <= 0xFFE6) || (c >= 0x1F300 && c <= 0x1F64F) ||
      (c >= 0x1F900 && c <= 0x1F9FF) || (c >= 0x20000 && c <= 0x3FFFD))
    return 2;
  return 1;
}

std::vector<Glyph> glyphs(std::string_view s) {
  std::vector<Glyph> out;
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    char32_t c = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const auto cont = i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0;
      if ((cont & 0xC0) != 0x80) {
        n = 0;
        break;
      }
      c = (c << 6) | (cont & 0x3F);
    }
    if (n == 0) {  // an invalid byte: one column, as a terminal's replacement character
      out.push_back({i, 1, 1});
      ++i;
      continue;
    }
    out.push_back({i, n, columns_of(c)});
    i += n;
  }
  return out;
}

// `s` in at most `width` columns: the middle replaced by "…" (a path keeps both ends).
std::string shorten(const std::string& s, size_t width) {
  if (display_width(s) <= width) return s;
  if (width == 0) return "";
  const std::vector<Glyph> g = glyphs(s);
  const size_t tail_cols = (width - 1) / 2, head_cols = width - 1 - tail_cols;
  size_t head_end = 0, used = 0;
  for (const Glyph& x : g) {
    if (used + x.columns > head_cols) break;
    used += x.columns;
    head_end = x.offset + x.length;
  }
  size_t tail_start = s.size();
  used = 0;
  for (auto it = g.rbegin(); it != g.rend() && it->offset >= head_end; ++it) {
    if (used + it->columns > tail_cols) break;
    used += it->columns;
    tail_start = it->offset;
  }
  return s.substr(0, head_end) + "\u2026" + s.substr(tail_start);
}

std::string format(const char* fmt, double a, double b = 0) {
  char out[64];
  std::snprintf(out, sizeof out, fmt, a, b);
  return out;
}

// The unit `bytes` is shown in and the decimals that give three significant digits.
struct ByteUnit {
  double scale;
  const char* name;
  int decimals;
};
ByteUnit unit_of(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  const double scale = b >= 1e12 ? 1e12 : b >= 1e9 ? 1e9 : b >= 1e6 ? 1e6 : b >= 1e3 ? 1e3 : 1;
  const char* name = scale == 1e12  ? "TB"
                     : scale == 1e9 ? "GB"
                     : scale == 1e6 ? "MB"
                     : scale == 1e3 ? "kB"
                                    : "B";
  const double v = b / scale;
  return {scale, name, scale == 1 || v >= 100 ? 0 : v >= 10 ? 1 : 2};
}

// "0.42/7.40 GB", "12.3/98.0 MB": both in the total's unit.
std::string bytes_pair(uint64_t done, uint64_t total) {
  const ByteUnit u = unit_of(total);
  char fmt[32];
  std::snprintf(fmt, sizeof fmt, "%%.%df/%%.%df %s", u.decimals, u.decimals, u.name);
  return format(fmt, static_cast<double>(done) / u.scale, static_cast<double>(total) / u.scale);
}

std::string bytes_one(uint64_t bytes) {
  const ByteUnit u = unit_of(bytes);
  char fmt[32];
  std::snprintf(fmt, sizeof fmt, "%%.%df %s", u.decimals, u.name);
  return format(fmt, static_cast<double>(bytes) / u.scale);
}

std::string rate_text(double bytes_per_s) {
  return bytes_one(static_cast<uint64_t>(std::max(0.0, bytes_per_s))) + "/s";
}

// "42.0%", rounded down: 100.0% only when done.
std::string percent_text(double fraction, const char* fmt = "%.1f%%") {
  return format(fmt, std::floor(std::clamp(fraction, 0.0, 1.0) * 1000.0) / 10.0);
}

// "2.7s", "42s", "3m05s", "2h07m".
std::string duration_text(double seconds) {
  if (seconds < 9.95) return format("%.1fs", std::max(0.0, seconds));
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char out[32];
  if (s < 60)
    std::snprintf(out, sizeof out, "%llds", static_cast<long long>(s));
  else if (s < 3600)
    std::snprintf(out, sizeof out, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  else
    std::snprintf(out, sizeof out, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  return out;
}

// "[█████▍    ]" with `cells` cells between the brackets, in eighths of a cell.
std::string bar_text(double fraction, size_t cells) {
  static const char* const kEighths[8] = {"",       "\u258F", "\u258E", "\u258D",
                                          "\u258C", "\u258B", "\u258A", "\u2589"};
  const auto eighths = static_cast<size_t>(std::clamp(fraction, 0.0, 1.0) * cells * 8);
  std::string out = "[";
  size_t used = 0;
  for (; used < eighths / 8; ++used) out += "\u2588";
  if (eighths % 8 != 0 && used < cells) {
    out += kEighths[eighths % 8];
    ++used;
  }
  out.append(cells - used, ' ');
  return out + "]";
}

// The figures of one line, in display order. `rank` orders what goes first when the line does
// not fit: lower ranks are dropped first.
struct Figure {
  std::string text;
  int rank;
};

// The label's and the bar's ranks among the figures' (elapsed time 0, rate 1, byte counts 2, ETA
// 6, percentage 9): the whole label outranks the figures that only describe the speed; it shrinks
// to kLabelMin before the bar goes and disappears only before the percentage.
constexpr int kLabelFullRank = 3, kBarRank = 5, kLabelRank = 7;

// One terminal line of at most width - 1 columns (the last column is never written, so no
// terminal wraps it): label, bar and figures, degraded by rank until they fit.
std::string fit_line(const std::string& label, double fraction, const std::vector<Figure>& figures,
                     int width) {
  const size_t avail = width > 1 ? static_cast<size_t>(width) - 1 : 0;
  const size_t label_cols = display_width(label);
  std::vector<bool> kept(figures.size(), true);
  bool bar = true;
  size_t label_min = label_cols;  // the label's columns before extra space is shared out
  const auto need = [&] {
    size_t cols = 0, items = 0;
    const auto add = [&](size_t c) {
      cols += c;
      ++items;
    };
    if (label_min > 0) add(label_min);
    if (bar) add(kBarMin + 2);
    for (size_t i = 0; i < figures.size(); ++i)
      if (kept[i]) add(display_width(figures[i].text));
    return cols + (items > 0 ? items - 1 : 0);
  };
  for (int rank = 0; need() > avail && rank < 9; ++rank) {  // the percentage always stays
    if (rank == kLabelFullRank) label_min = std::min(label_cols, kLabelMin);
    if (rank == kBarRank) bar = false;
    if (rank == kLabelRank) {
      label_min = 0;
      const size_t rest = need();
      const size_t room = avail > rest + 1 ? avail - rest - 1 : 0;
      label_min = std::min(label_cols, room);
      if (label_min < std::min(label_cols, kLabelKeep)) label_min = 0;
    }
    for (size_t i = 0; i < figures.size(); ++i)
      if (figures[i].rank == rank && need() > avail) kept[i] = false;
  }
  // Extra columns: the label back to its full length first, then a wider bar.
  size_t spare = avail > need() ? avail - need() : 0;
  size_t label_w = label_min;
  if (label_min > 0) {
    label_w = std::min(label_cols, label_min + spare);
    spare -= label_w - label_min;
  }
  std::string line;
  const auto put = [&](const std::string& piece) {
    if (!line.empty()) line += ' ';
    line += piece;
  };
  if (label_w > 0) put(shorten(label, label_w));
  if (bar) put(bar_text(fraction, kBarMin + std::min(spare, kBarMax - kBarMin)));
  for (size_t i = 0; i < figures.size(); ++i)
    if (kept[i]) put(figures[i].text);
  if (display_width(line) > avail) line = shorten(line, avail);  // under ~8 columns
  return line;
}

int stderr_columns() {
  winsize ws{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

size_t display_width(std::string_view utf8) {
  size_t cols = 0;
  for (const Glyph& g : glyphs(utf8)) cols += g.columns;
  return cols;
}

ProgressSink stderr_sink() {
  ProgressSink sink;
  sink.write = [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  };
  sink.tty = ::isatty(STDERR_FILENO) == 1;
  sink.columns = stderr_columns;
  sink.clock = steady_seconds;
  return sink;
}

Progress::Progress(std::string label, uint64_t total, std::function<void(double)> observer)
    : Progress(std::move(label), total, stderr_sink(), std::move(observer)) {}

Progress::Progress(std::string label, uint64_t total, ProgressSink sink,
                   std::function<void(double)> observer)
    : sink_(std::move(sink)),
      label_(std::move(label)),
      total_(total),
      observer_(std::move(observer)),
      start_(sink_.clock()),
      last_draw_(start_),
      last_log_(start_) {}

Progress::~Progress() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!finished_ && shown_) sink_.write("\n");
}

void Progress::advance(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  done_ += bytes;
  notify_locked();
  const double now = sink_.clock();
  if (sink_.tty) {
    if (now - last_draw_ >= kDrawEvery) draw_locked(false);
  } else if (now - last_log_ >= kLogEvery && done_ < total_) {  // 100% is the closing line's
    log_locked(false);
  }
}

void Progress::set_label(std::string label) {
  std::lock_guard<std::mutex> lock(mutex_);
  label_ = std::move(label);
}

void Progress::print_above(const std::function<void()>& print) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shown_) sink_.write("\r\x1b[K");
  shown_ = false;
  print();
  if (sink_.tty && !finished_) draw_locked(false);
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  done_ = std::max(done_, total_);
  notify_locked();
  if (sink_.tty)
    draw_locked(true);
  else if (logged_)
    log_locked(true);
  finished_ = true;
}

void Progress::notify_locked() {
  if (!observer_) return;
  const double f =
      total_ > 0 ? std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_)) : 1.0;
  if (f <= reported_) return;  // concurrent advances never make it go back
  reported_ = f;
  observer_(f);
}

void Progress::draw_locked(bool closing) {
  const double now = sink_.clock();
  const double elapsed = now - start_;
  const uint64_t done = std::min(done_, total_);
  const double fraction =
      total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_) : (closing ? 1.0 : 0.0);
  std::vector<Figure> figures;
  figures.push_back({percent_text(fraction, "%5.1f%%"), 9});
  if (closing) {
    figures.push_back({bytes_one(total_), 2});
    if (elapsed > 0) figures.push_back({rate_text(static_cast<double>(total_) / elapsed), 1});
    figures.push_back({std::string("in ").append(duration_text(elapsed)), 6});
  } else {
    figures.push_back({bytes_pair(done, total_), 2});
    if (done > 0 && elapsed > 0)
      figures.push_back({rate_text(static_cast<double>(done) / elapsed), 1});
    figures.push_back({duration_text(elapsed), 0});
    if (done > 0 && done < total_ && elapsed > 0)
      figures.push_back({"ETA " + duration_text(elapsed * static_cast<double>(total_ - done) /
                                                static_cast<double>(done)),
                         6});
  }
  const int width = sink_.columns ? sink_.columns() : 80;
  std::string redraw = "\r";
  redraw += fit_line(label_, fraction, figures, width);
  redraw += closing ? "\x1b[K\n" : "\x1b[K";
  sink_.write(redraw);
  shown_ = !closing;
  last_draw_ = now;
}

void Progress::log_locked(bool closing) {
  const double now = sink_.clock();
  const double elapsed = now - start_;
  std::string line = label_ + ": ";
  if (closing) {
    line += "100.0% " + bytes_one(total_) + " in " + duration_text(elapsed);
    if (elapsed > 0) line += " (" + rate_text(static_cast<double>(total_) / elapsed) + ")";
    line += ", done";
  } else {
    const uint64_t done = std::min(done_, total_);
    const double fraction =
        total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_) : 0.0;
    line += percent_text(fraction) + " " + bytes_pair(done, total_) + ", " + duration_text(elapsed);
    if (done > 0 && elapsed > 0) {
      line += ", " + rate_text(static_cast<double>(done) / elapsed);
      line += ", ETA " + duration_text(elapsed * static_cast<double>(total_ - done) /
                                       static_cast<double>(done));
    }
  }
  sink_.write(line + "\n");
  last_log_ = now;
  logged_ = true;
}

}  // namespace k3

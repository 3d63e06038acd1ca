// apps/coli_chat.cpp — `coli chat`: a terminal chat with the model loaded once, in process
// (docs/serving.md §3.4, run through EngineService instead of a private HTTP server).
//
//   * GNU readline for line editing and history (Alt-Enter inserts a newline, pastes keep their
//     newlines); without a terminal on stdin, lines are read as they come.
//   * Replies stream as they are generated: reasoning dimmed (or collapsed with /think hide),
//     content with light Markdown styling (--raw or no terminal: plain text).
//   * Ctrl-C during a reply cancels it (EngineService::cancel, within one layer or token) and keeps
//     the partial answer marked "[interrupted]"; Ctrl-C at the prompt clears the line, at an empty
//     prompt shows a hint, and a second one within 2 s quits (so does Ctrl-D or /exit). SIGTERM
//     exits 143 at once, the terminal's settings put back (apps/stop_signals.h, set up by
//     coli.cpp).
//   * The history keeps each assistant turn's content and reasoning exactly as streamed and sends
//     them back, so the next prompt starts with what the engine already fed (prefix reuse). Each
//     request names the checkpoints worth keeping (ServiceRequest::keep, Chat::keep_positions):
//     the start and the end of the last question (/undo, /edit; /retry) and, without an effort
//     message, the start of the first answer (/think on|off).
//   * After each reply a footer: `57 tok · 1.2 s · 47.5 tok/s · prompt 412 (cached 380)`.
//   * /set temp|top_p|top_k|min_p|seed|max_tokens, /show; /save and /load (the conversation and
//     the settings, as JSON); a notice when the conversation crosses 90 % of the context.
//   * The reply budget: max_tokens (--ngen when given, else --max-tokens, 16384; /set max_tokens)
//     and no more than the context's room (--ctx, 8192 by default); /stats says which applies.
// Not here: the engine (engine/service.h), the chat template (text/chat.h).
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "apps/coli_commands.h"
#include "engine/service.h"
#include "server/api.h"
#include "text/chat.h"
#include "text/prompt.h"
#include "text/pyjson.h"
#include "util/sys.h"

namespace coli {
namespace {

using k3::ServiceEvent;
using k3::text::PyValue;

std::atomic<bool> g_interrupt{false};
std::atomic<bool> g_resized{false};

extern "C" void on_sigint(int) {
  g_interrupt.store(true);
}
extern "C" void on_sigwinch(int) {
  g_resized.store(true);
}

const char* const kDim = "\x1b[2m";
const char* const kBold = "\x1b[1m";
const char* const kReset = "\x1b[0m";
const char* const kRed = "\x1b[31m";
const char* const kCyan = "\x1b[36m";

std::string format(const char* fmt, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, value);
  return buf;
}

std::string seconds_text(double s) {
  return s < 10 ? format("%.1f s", s) : format("%.0f s", s);
}

std::string trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return std::string(s.substr(a, b - a));
}

// stdout with the little the chat needs: whether the cursor is at a line start, an in-place
// status line (terminal only) that the next real output replaces.
class Screen {
 public:
  explicit Screen(bool tty) : tty_(tty) {}
  bool tty() const { return tty_; }

  void print(std::string_view text) {
    if (text.empty()) return;
    clear_status();
    std::fwrite(text.data(), 1, text.size(), stdout);
    // The last visible character decides line_start_ (SGR sequences "\x1b[...m" do not count).
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\x1b') {
        while (i < text.size() && !std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
        continue;
      }
      line_start_ = text[i] == '\n';
    }
    std::fflush(stdout);
  }
  void line(std::string_view text) {
    print(text);
    print("\n");
  }
  // Moves to a fresh line if the cursor is not at one.
  void end_line() {
    if (!line_start_) print("\n");
  }
  void status(const std::string& text) {
    if (!tty_ || !line_start_) return;
    std::string out = "\r\x1b[2K";
    out += kDim;
    out += text;
    out += kReset;
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    status_shown_ = true;
  }
  void clear_status() {
    if (!status_shown_) return;
    std::fputs("\r\x1b[2K", stdout);
    status_shown_ = false;
  }
  std::string dim(const std::string& s) const { return tty_ ? kDim + s + kReset : s; }
  std::string bold(const std::string& s) const { return tty_ ? kBold + s + kReset : s; }
  std::string red(const std::string& s) const { return tty_ ? kRed + s + kReset : s; }

 private:
  bool tty_;
  bool line_start_ = true;
  bool status_shown_ = false;
};

// Streaming Markdown for the terminal: ``` fences (cyan), `code` (cyan), **bold**, # headings
// (bold), "- " / "* " / "+ " bullets (•). A marker split across two deltas is held back until
// the next one decides it. Plain text when `styled` is false.
class Markdown {
 public:
  explicit Markdown(bool styled) : styled_(styled) {}

  std::string push(std::string_view text) {
    if (!styled_) return std::string(text);
    pending_ += text;
    return consume(false);
  }
  std::string finish() {
    if (!styled_) return {};
    std::string out = consume(true);
    if (current_ != kReset) out += kReset;
    fence_ = code_ = bold_ = heading_ = false;
    current_ = kReset;
    line_start_ = true;
    return out;
  }

 private:
  // The SGR sequence for the current state, or nothing when it is already in force.
  std::string style() {
    std::string s = kReset;
    if (fence_ || code_) s += kCyan;
    if (bold_ || heading_) s += kBold;
    if (s == current_) return {};
    current_ = s;
    return s;
  }

  std::string consume(bool final) {
    std::string out;
    size_t i = 0;
    const std::string& p = pending_;
    auto starts = [&](size_t at, std::string_view what) {
      return p.compare(at, what.size(), what) == 0;
    };
    // True when p[at..] is a proper prefix of `what` (more input could complete it).
    auto partial = [&](size_t at, std::string_view what) {
      return !final && p.size() - at < what.size() &&
             what.compare(0, p.size() - at, p, at, p.size() - at) == 0;
    };
    while (i < p.size()) {
      const char c = p[i];
      if (line_start_) {
        if (c == ' ' || c == '\t') {
          out += c;
          ++i;
          continue;
        }
        if (partial(i, "```")) break;
        if (starts(i, "```")) {  // the fence line itself is dimmed up to its newline
          fence_ = !fence_;
          code_ = false;
          out += kReset;
          out += kDim;
          current_ = std::string(kReset) + kDim;
          out += "```";
          i += 3;
          line_start_ = false;
          continue;
        }
        if (!fence_) {
          if (c == '#') {
            size_t j = i;
            while (j < p.size() && p[j] == '#') ++j;
            if (j == p.size() && !final) break;
            if (j < p.size() && p[j] == ' ' && j - i <= 6) {
              heading_ = true;
              out += style();
              i = j + 1;
              line_start_ = false;
              continue;
            }
          } else if (c == '-' || c == '*' || c == '+') {
            if (i + 1 == p.size() && !final) break;
            if (i + 1 < p.size() && p[i + 1] == ' ') {
              out += "• ";
              i += 2;
              line_start_ = false;
              continue;
            }
          }
        }
        line_start_ = false;
      }
      if (c == '\n') {
        heading_ = false;
        code_ = false;
        out += style();
        out += '\n';
        line_start_ = true;
        ++i;
        continue;
      }
      if (fence_) {
        out += c;
        ++i;
        continue;
      }
      if (c == '`') {
        code_ = !code_;
        out += style();
        ++i;
        continue;
      }
      if (c == '*') {
        if (i + 1 == p.size() && !final) break;
        if (i + 1 < p.size() && p[i + 1] == '*' && !code_) {
          bold_ = !bold_;
          out += style();
          i += 2;
          continue;
        }
      }
      out += c;
      ++i;
    }
    pending_.erase(0, i);
    return out;
  }

  bool styled_;
  std::string pending_;
  bool line_start_ = true, fence_ = false, code_ = false, bold_ = false, heading_ = false;
  std::string current_ = kReset;
};

// ---------------------------------------------------------------------------------------------
// Input: readline on a terminal (callback interface, so Ctrl-C is ours), plain lines otherwise.

struct LineState {
  bool done = false, eof = false;
  std::string line;
};
LineState g_line;

extern "C" void on_line(char* line) {
  if (!line) {
    g_line.eof = true;
  } else {
    g_line.line = line;
    std::free(line);
  }
  g_line.done = true;
  rl_callback_handler_remove();  // no prompt redisplay after the line
}

int insert_newline(int, int) {
  rl_insert_text("\n");
  return 0;
}

class Input {
 public:
  enum class Result { line, quit };

  Input(bool tty, Screen& screen) : tty_(tty), screen_(screen) {
    if (!tty_) return;
    rl_readline_name = "coli";
    rl_catch_signals = 0;   // our SIGINT handler; the loop below decides what Ctrl-C does
    rl_catch_sigwinch = 0;  // resized in the loop
    rl_outstream = stdout;
    rl_initialize();
    rl_bind_keyseq("\\e\\r", insert_newline);  // Alt-Enter
    rl_bind_keyseq("\\e\\n", insert_newline);
    rl_bind_key('\t', rl_insert);  // no file-name completion: a tab is a tab
    using_history();
    stifle_history(1000);
  }

  Result read(const std::string& prompt, std::string& out) {
    return tty_ ? read_tty(prompt, out) : read_plain(prompt, out);
  }

 private:
  // Ctrl-C at an empty prompt: a hint, or quit when a second one comes within 2 s.
  bool second_interrupt() {
    const double now = k3::now_seconds();
    if (now - last_interrupt_ < 2.0) return true;
    last_interrupt_ = now;
    return false;
  }
  static constexpr const char* kHint = "(Ctrl-C again within 2 s to quit; or Ctrl-D, /exit)";

  Result read_tty(const std::string& prompt, std::string& out) {
    g_line = LineState{};
    rl_callback_handler_install(prompt.c_str(), on_line);
    while (!g_line.done) {
      if (g_resized.exchange(false)) rl_resize_terminal();
      if (g_interrupt.exchange(false)) {
        if (rl_end > 0) {  // clear the line, like a shell
          rl_replace_line("", 0);
          rl_point = rl_end = 0;
          std::fputs("^C", stdout);
          rl_crlf();
          rl_on_new_line();
          rl_redisplay();
          last_interrupt_ = 0;
          continue;
        }
        if (second_interrupt()) {
          rl_callback_handler_remove();
          rl_crlf();
          std::fflush(stdout);
          return Result::quit;
        }
        rl_crlf();
        std::fputs(screen_.dim(kHint).c_str(), stdout);
        rl_crlf();
        rl_on_new_line();
        rl_redisplay();
        continue;
      }
      pollfd fd{STDIN_FILENO, POLLIN, 0};
      const int r = ::poll(&fd, 1, 200);
      if (r > 0) {
        if (fd.revents & POLLIN)
          rl_callback_read_char();
        else if (fd.revents & (POLLHUP | POLLERR | POLLNVAL)) {
          rl_callback_handler_remove();
          return Result::quit;
        }
      }
    }
    if (g_line.eof) {
      std::fputs("\n", stdout);
      std::fflush(stdout);
      return Result::quit;
    }
    out = std::move(g_line.line);
    if (!trim(out).empty()) add_history(out.c_str());
    return Result::line;
  }

  Result read_plain(const std::string& prompt, std::string& out) {
    for (;;) {
      const size_t nl = buffer_.find('\n');
      if (nl != std::string::npos || (eof_ && !buffer_.empty())) {
        out = buffer_.substr(0, nl);
        buffer_.erase(0, nl == std::string::npos ? buffer_.size() : nl + 1);
        if (!out.empty() && out.back() == '\r') out.pop_back();
        screen_.print(prompt + out + "\n");  // a readable transcript
        return Result::line;
      }
      if (eof_) return Result::quit;
      if (g_interrupt.exchange(false)) {
        if (second_interrupt()) return Result::quit;
        screen_.end_line();
        screen_.line(kHint);
        continue;
      }
      pollfd fd{STDIN_FILENO, POLLIN, 0};
      if (::poll(&fd, 1, 200) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
      if (n > 0)
        buffer_.append(chunk, static_cast<size_t>(n));
      else if (n == 0 || errno != EINTR)
        eof_ = true;
    }
  }

  bool tty_;
  Screen& screen_;
  double last_interrupt_ = 0;
  std::string buffer_;
  bool eof_ = false;
};

// No echo while a reply streams (keys typed meanwhile wait for the next prompt); Ctrl-C still
// raises SIGINT.
class QuietTerminal {
 public:
  explicit QuietTerminal(bool tty) {
    if (!tty || tcgetattr(STDIN_FILENO, &saved_) != 0) return;
    termios t = saved_;
    t.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    t.c_lflag |= ISIG;
    active_ = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
  }
  ~QuietTerminal() {
    if (active_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }

 private:
  termios saved_{};
  bool active_ = false;
};

// ---------------------------------------------------------------------------------------------

struct Message {
  std::string role;  // user, assistant
  std::string content, reasoning;
  std::vector<k3::text::ToolCallOut> tool_calls;
};

enum class FooterMode { compact, full, off };

// What a reply is made with (/set, /show, /save, /load).
struct Settings {
  bool think = true, show_think = true;
  std::string effort = "max";
  double temperature = 0.6, top_p = 0.95, min_p = 0;
  int64_t top_k = 0;
  std::optional<uint64_t> seed;  // nullopt: a random seed per reply; else seed, seed + 1, ...
  int64_t max_tokens = 16384;    // the reply budget before the context's room
};

// The names /set takes, in the order /show and /save list them.
const char* const kSettingNames[] = {"temp", "top_p", "top_k", "min_p", "seed", "max_tokens"};

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The whole of `s` as a finite number, or nothing.
std::optional<double> parse_real(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || errno == ERANGE || !std::isfinite(v)) return std::nullopt;
  return v;
}

// The whole of `s` as a whole number, or nothing.
std::optional<int64_t> parse_whole(const std::string& s) {
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-'))
    return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE) return std::nullopt;
  return static_cast<int64_t>(v);
}

// "temp", "temperature", "top-p", "TOP_P", "ngen" ... → the /set name ("" when unknown).
std::string setting_name(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) {
    return c == '-' ? '_' : static_cast<char>(std::tolower(c));
  });
  if (name == "temperature") return "temp";
  if (name == "ngen" || name == "num_predict") return "max_tokens";
  for (const char* n : kSettingNames)
    if (name == n) return name;
  return "";
}

// Sets `name` (a /set name) to `value` in `s`; the error names the value and the range.
// `ceiling` is the largest max_tokens (--max-tokens).
std::optional<std::string> set_setting(Settings& s, const std::string& name,
                                       const std::string& value, int64_t ceiling) {
  auto refuse = [&](const char* problem, const std::string& takes) {
    return name + " " + value + ": " + problem + "; " + name + " takes " + takes;
  };
  auto real = [&](double lo, bool above_lo, double hi, const char* meaning,
                  double& out) -> std::optional<std::string> {
    const std::string takes = std::string("a number in ") + (above_lo ? "(" : "[") +
                              number_text(lo) + ", " + number_text(hi) + "]" + meaning;
    const std::optional<double> v = parse_real(value);
    if (!v) return refuse("not a number", takes);
    if (*v > hi || *v < lo || (above_lo && *v == lo)) return refuse("out of range", takes);
    out = *v;
    return std::nullopt;
  };
  auto whole = [&](int64_t lo, int64_t hi, const std::string& meaning,
                   int64_t& out) -> std::optional<std::string> {
    const std::string takes =
        "a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]" + meaning;
    const std::optional<int64_t> v = parse_whole(value);
    if (!v) return refuse("not a whole number", takes);
    if (*v < lo || *v > hi) return refuse("out of range", takes);
    out = *v;
    return std::nullopt;
  };
  if (name == "temp") return real(0, false, 100, " (0 = greedy)", s.temperature);
  if (name == "top_p") return real(0, true, 1, " (1 = off)", s.top_p);
  if (name == "min_p") return real(0, false, 1, " (0 = off)", s.min_p);
  if (name == "top_k") return whole(0, int64_t{1} << 24, " (0 = off)", s.top_k);
  if (name == "max_tokens")
    return whole(1, ceiling, " (the ceiling is --max-tokens; the context's room applies too)",
                 s.max_tokens);
  if (name == "seed") {
    if (value == "random") {
      s.seed.reset();
      return std::nullopt;
    }
    int64_t seed = 0;
    if (auto e = whole(0, INT64_MAX, ", or random (a new seed each reply)", seed)) return e;
    s.seed = static_cast<uint64_t>(seed);
    return std::nullopt;
  }
  return "unknown setting \"" + name +
         "\"; one of temp, top_p, top_k, min_p, seed, max_tokens (/show lists them)";
}

std::string setting_text(const Settings& s, const std::string& name) {
  if (name == "temp") return number_text(s.temperature);
  if (name == "top_p") return number_text(s.top_p);
  if (name == "min_p") return number_text(s.min_p);
  if (name == "top_k") return std::to_string(s.top_k);
  if (name == "seed") return s.seed ? std::to_string(*s.seed) : "random";
  if (name == "max_tokens") return std::to_string(s.max_tokens);
  return "";
}

// Line and column (1-based) of byte `offset` of `text`.
std::pair<size_t, size_t> line_and_column(const std::string& text, size_t offset) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < std::min(offset, text.size()); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

class Chat {
 public:
  Chat(const k3::Options& opt, k3::EngineService& service, Screen& screen)
      : opt_(opt), service_(service), screen_(screen), api_(api_config(opt)) {
    system_ = opt.text.system;
    settings_.think = opt.text.think;
    settings_.show_think = opt.text.show_think;
    settings_.effort = opt.text.effort;
    settings_.temperature = api_.default_temperature;
    settings_.top_p = api_.default_top_p;
    settings_.top_k = api_.default_top_k;
    settings_.min_p = api_.default_min_p;
    if (opt.given("seed")) settings_.seed = opt.sampling.seed;
    settings_.max_tokens = opt.given("ngen") ? std::min<int64_t>(std::max<int64_t>(opt.ngen, 1),
                                                                 api_.max_tokens_ceiling)
                                             : api_.max_tokens_ceiling;
    styled_ = screen.tty() && !opt.serve.raw;
  }

  // Runs one command line (starting with / or :). False: quit.
  bool command(const std::string& input) {
    const std::string text = trim(input);
    const size_t space = text.find_first_of(" \t\n");
    std::string name = text.substr(1, space == std::string::npos ? std::string::npos : space - 1);
    const std::string arg = space == std::string::npos ? "" : trim(text.substr(space));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (name == "exit" || name == "quit" || name == "q") return false;
    if (name == "help" || name == "h" || name == "?") {
      help();
    } else if (name == "new" || name == "reset" || name == "clear") {
      history_.clear();
      retry_user_.reset();
      service_.erase_state();
      note("new conversation (the engine's cached state was dropped)");
    } else if (name == "system") {
      system(arg);
    } else if (name == "think") {
      think(arg);
    } else if (name == "hide-think" || name == "show-think") {
      settings_.show_think = name == "show-think" ? true : !settings_.show_think;
      note(std::string("reasoning ") + (settings_.show_think ? "shown" : "hidden"));
    } else if (name == "effort") {
      if (arg == "low" || arg == "high" || arg == "max" || arg == "none") {
        settings_.effort = arg;
        note("thinking effort " + settings_.effort);
      } else if (arg.empty()) {
        note("thinking effort " + settings_.effort + " (/effort low|high|max|none)");
      } else {
        error("usage: /effort low|high|max|none");
      }
    } else if (name == "set") {
      set(arg);
    } else if (name == "show") {
      show();
    } else if (name == "stats") {
      if (arg == "full")
        footer_ = FooterMode::full;
      else if (arg == "compact")
        footer_ = FooterMode::compact;
      else if (arg == "off")
        footer_ = FooterMode::off;
      else if (!arg.empty())
        return error("usage: /stats [full|compact|off]"), true;
      if (arg.empty())
        stats();
      else
        note("footer " + arg);
    } else if (name == "retry") {
      retry();
    } else if (name == "undo") {
      undo();
    } else if (name == "edit") {
      edit(arg);
    } else if (name == "save") {
      save(arg);
    } else if (name == "load") {
      load(arg);
    } else {
      error("unknown command /" + name +
            " (/help lists them; start a message with // to send a leading /)");
    }
    return true;
  }

  void say(const std::string& text) {
    history_.push_back({"user", text, {}, {}});
    retry_user_.reset();
    generate();
  }

  // Before each prompt: the context notice (once per crossing of 90 %), then the status line.
  void show_header() {
    const int64_t used = conversation_tokens(), capacity = service_.context_capacity();
    const bool near = capacity > 0 && used * 10 >= capacity * 9;
    if (near && !near_limit_noted_)
      note("the conversation uses " + std::to_string(used) + " of " + std::to_string(capacity) +
           " context tokens (" + format("%.0f%%", 100.0 * static_cast<double>(used) / capacity) +
           "): /clear starts over, or restart with a larger --ctx");
    near_limit_noted_ = near;
    std::string h = "think " + std::string(settings_.think ? "on" : "off");
    if (settings_.think) h += " · effort " + settings_.effort;
    if (!settings_.show_think) h += " (hidden)";
    if (!system_.empty()) h += " · system prompt";
    h += " · " + std::to_string(turns()) + (turns() == 1 ? " turn" : " turns");
    h += " · context " + std::to_string(used) + "/" + std::to_string(capacity);
    screen_.end_line();
    screen_.line(screen_.dim(h));
  }

 private:
  int turns() const {
    return static_cast<int>(std::count_if(history_.begin(), history_.end(),
                                          [](const Message& m) { return m.role == "user"; }));
  }
  void note(const std::string& text) {
    screen_.end_line();
    screen_.line(screen_.dim(text));
  }
  void error(const std::string& text) {
    screen_.end_line();
    screen_.line(screen_.red("error: " + text));
  }

  void help() {
    const char* lines[] = {
        "Type a message and press Enter (Alt-Enter: a newline; pasted text keeps its newlines).",
        "  /new                  start over (also /clear, /reset); drops the cached state",
        "  /retry                regenerate the last answer",
        "  /undo                 remove the last question and its answer",
        "  /edit TEXT            replace the last question by TEXT and answer it again",
        "  /system TEXT          set the system prompt (/system: show it; /system off: clear it)",
        "  /think on|off         thinking before answering",
        "  /think show|hide      show the reasoning dimmed, or hide it (also /hide-think)",
        "  /effort low|high|max|none   thinking effort",
        "  /set NAME VALUE       temp, top_p, top_k, min_p, seed (or random), max_tokens",
        "  /show                 the model, the context and every setting",
        "  /stats                session statistics; /stats full|compact|off: the footer",
        "  /save FILE            write the conversation and the settings as JSON",
        "  /load FILE            read back a conversation (and its settings) written by /save",
        "  /help                 this list (also /?)",
        "  /exit                 quit (also /quit, Ctrl-D, or Ctrl-C twice at an empty prompt)",
        "Ctrl-C during a reply stops it and keeps what was written. A reply may use max_tokens",
        "(--ngen when given, else --max-tokens; /set max_tokens) within the context's room "
        "(--ctx).",
        "Start a message with // to send it with a leading /.",
    };
    screen_.end_line();
    for (const char* l : lines) screen_.line(l);
  }

  void system(const std::string& arg) {
    if (arg.empty())
      return note(system_.empty()
                      ? "no system prompt (/system TEXT sets one, /system off clears it)"
                      : "system prompt: " + system_);
    system_ = arg == "off" || arg == "none" || arg == "clear" ? "" : arg;
    // The system prompt is the conversation's first message: a change re-reads all of it.
    note(std::string(system_.empty() ? "system prompt cleared" : "system prompt set") +
         "; it applies from the next reply" +
         (history_.empty() ? "" : ", which reads the conversation again (it comes first)"));
  }

  void think(const std::string& arg) {
    if (arg == "on" || arg == "off") {
      settings_.think = arg == "on";
      std::string n = std::string("thinking ") + arg;
      // Each earlier reply renders with or without its think block from now on, so the next
      // prompt diverges at the first reply (a kept checkpoint resumes there), or at the very
      // start when the effort message comes and goes with thinking.
      if (!history_.empty())
        n += settings_.effort == "none"
                 ? "; the next reply reads the conversation again from the first answer on"
                 : "; the next reply reads the whole conversation again: the effort message, "
                   "which leads the prompt only while thinking, comes or goes (with /effort none, "
                   "only the part from the first answer on)";
      note(n);
    } else if (arg == "show" || arg == "hide") {
      settings_.show_think = arg == "show";
      note(std::string("reasoning ") + (settings_.show_think ? "shown" : "hidden"));
    } else if (arg.empty()) {
      note(std::string("thinking ") + (settings_.think ? "on" : "off") + ", reasoning " +
           (settings_.show_think ? "shown" : "hidden") + " (/think on|off|show|hide)");
    } else {
      error("usage: /think on|off|show|hide");
    }
  }

  void set(const std::string& arg) {
    std::string rest = arg;
    auto word = [&] {
      const size_t sp = rest.find_first_of(" \t");
      std::string w = rest.substr(0, sp);
      rest = sp == std::string::npos ? "" : trim(rest.substr(sp));
      return w;
    };
    std::string first = word();
    if (first == "parameter") first = word();  // ollama's spelling: /set parameter temperature 0.3
    const std::string value = rest;
    if (first.empty())
      return error("usage: /set temp|top_p|top_k|min_p|seed|max_tokens VALUE (/show lists them)");
    const std::string name = setting_name(first);
    if (!name.empty() && value.empty())
      return note(name + " " + setting_text(settings_, name) + " (/set " + name + " VALUE)");
    if (name.empty())
      return error("/set " + first + ": unknown setting; one of temp, top_p, top_k, min_p, " +
                   "seed, max_tokens (/show lists them)");
    Settings next = settings_;
    if (auto e = set_setting(next, name, value, api_.max_tokens_ceiling))
      return error("/set " + *e);
    settings_ = next;
    if (name == "seed") seeded_replies_ = 0;
    note(name + " " + setting_text(settings_, name) + " (from the next reply)");
  }

  void show() {
    const k3::ServiceStats s = service_.stats();
    const int64_t used = conversation_tokens();
    std::vector<std::string> lines = {
        "model        " + opt_.model_dir + k3::model_note(opt_),
        "context      " + std::to_string(s.context_capacity) + " tokens (" + std::to_string(used) +
            " used; --ctx)",
        "think        " + std::string(settings_.think ? "on" : "off") + " · effort " +
            settings_.effort + " · reasoning " + (settings_.show_think ? "shown" : "hidden"),
        "system       " + (system_.empty() ? std::string("none") : system_),
    };
    for (const char* name : kSettingNames) {
      std::string l = name;
      l.resize(13, ' ');
      l += setting_text(settings_, name);
      lines.push_back(l);
    }
    lines.push_back("checkpoints  " + s.checkpoints);
    screen_.end_line();
    for (const std::string& l : lines) screen_.line(l);
  }

  // The reply budget for the next reply: max_tokens, or the context's room when that is smaller
  // (the service clamps it so: EngineService::submit), and which of the two applies.
  std::string budget_text(int64_t used, int64_t capacity) const {
    const int64_t room = std::max<int64_t>(capacity - used, 0);
    if (settings_.max_tokens <= room)
      return "reply budget " + std::to_string(settings_.max_tokens) +
             " tok (max_tokens; the context leaves " + std::to_string(room) + ")";
    return "reply budget " + std::to_string(room) +
           " tok (limited by the context: " + std::to_string(capacity) + " - " +
           std::to_string(used) + " used; max_tokens " + std::to_string(settings_.max_tokens) + ")";
  }

  void stats() {
    const k3::ServiceStats s = service_.stats();
    const double cached_pct = s.prompt_tokens > 0 ? 100.0 * static_cast<double>(s.cached_tokens) /
                                                        static_cast<double>(s.prompt_tokens)
                                                  : 0;
    auto rate = [](int64_t n, double sec) {
      return sec > 0 ? format("%.1f tok/s", static_cast<double>(n) / sec) : std::string("-");
    };
    const int64_t used = conversation_tokens();
    std::vector<std::string> lines = {
        "replies " + std::to_string(s.completed) + " (interrupted " +
            std::to_string(s.cancelled_decode + s.cancelled_prefill) + ", failed " +
            std::to_string(s.failed) + ")",
        "prompt " + std::to_string(s.prompt_tokens) + " tok, cached " +
            std::to_string(s.cached_tokens) + format(" (%.0f%%)", cached_pct) + " · prefill " +
            seconds_text(s.prefill_seconds) + " (" +
            rate(s.prompt_tokens - s.cached_tokens, s.prefill_seconds) + ")",
        "generated " + std::to_string(s.generated_tokens) + " tok · decode " +
            seconds_text(s.decode_seconds) + " (" + rate(s.generated_tokens, s.decode_seconds) +
            ")",
        "reuse: live " + std::to_string(s.reuse_live) + ", checkpoint " +
            std::to_string(s.reuse_checkpoint) + ", none " + std::to_string(s.reuse_none) +
            " · checkpoints " + s.checkpoints + " (" + std::to_string(s.ckpt_used) + "/" +
            std::to_string(s.ckpt_slots) + " used)",
        "context " + std::to_string(used) + "/" + std::to_string(s.context_capacity) + " tok · " +
            budget_text(used, s.context_capacity) + " · conversation " +
            std::to_string(history_.size()) + " messages",
    };
    if (s.device.on) {
      const k3::DeviceStats& d = s.device;
      char line[320];
      std::snprintf(
          line, sizeof line,
          "device %s%s · %llu of %llu routed pairs (%.0f%%) · residents %llu/%llu · "
          "uploads %llu, evictions %llu · join wait ",
          d.device.c_str(), d.off ? " (off: lost)" : "",
          static_cast<unsigned long long>(d.pairs_served),
          static_cast<unsigned long long>(d.pairs_total), 100.0 * d.served_share(),
          static_cast<unsigned long long>(d.residents), static_cast<unsigned long long>(d.budget),
          static_cast<unsigned long long>(d.uploads), static_cast<unsigned long long>(d.evictions));
      lines.push_back(line + seconds_text(d.join_wait_seconds) +
                      (d.dense_matrices ? " · dense matmuls " + std::to_string(d.dense_matmuls)
                                        : std::string()));
    }
    screen_.end_line();
    for (const std::string& l : lines) screen_.line(screen_.dim(l));
  }

  void retry() {
    if (!history_.empty() && history_.back().role == "assistant") {
      history_.pop_back();
    } else if (retry_user_) {
      history_.push_back({"user", *retry_user_, {}, {}});
      retry_user_.reset();
    } else if (history_.empty() || history_.back().role != "user") {
      return error("nothing to retry");
    }
    note("regenerating the last answer");
    generate();
  }

  // Drops the last question and its answer (or a question taken back); true when there was one.
  bool drop_last_turn() {
    if (retry_user_) {
      retry_user_.reset();
      return true;
    }
    if (!history_.empty() && history_.back().role == "assistant") history_.pop_back();
    if (history_.empty() || history_.back().role != "user") return false;
    history_.pop_back();
    return true;
  }

  void undo() {
    if (!drop_last_turn()) return error("nothing to undo");
    note("removed the last question and its answer (" + std::to_string(turns()) +
         (turns() == 1 ? " turn" : " turns") + " left)");
  }

  void edit(const std::string& text) {
    if (text.empty()) {
      if (retry_user_) return note("the last question: " + *retry_user_ + " (/edit TEXT)");
      for (auto it = history_.rbegin(); it != history_.rend(); ++it)
        if (it->role == "user") return note("the last question: " + it->content + " (/edit TEXT)");
      return error("nothing to edit");
    }
    if (!drop_last_turn()) return error("nothing to edit (type the question instead)");
    note("answering the edited question");
    say(text);
  }

  void save(const std::string& path) {
    if (path.empty()) return error("usage: /save FILE");
    k3::server::json doc = k3::server::json::object();
    doc["model"] = opt_.model_dir;
    k3::server::json settings = {{"think", settings_.think},
                                 {"effort", settings_.effort},
                                 {"show_think", settings_.show_think},
                                 {"temp", settings_.temperature},
                                 {"top_p", settings_.top_p},
                                 {"top_k", settings_.top_k},
                                 {"min_p", settings_.min_p}};
    if (settings_.seed)
      settings["seed"] = *settings_.seed;
    else
      settings["seed"] = "random";
    settings["max_tokens"] = settings_.max_tokens;
    doc["settings"] = std::move(settings);
    k3::server::json msgs = k3::server::json::array();
    if (!system_.empty()) msgs.push_back({{"role", "system"}, {"content", system_}});
    for (const Message& m : history_) {
      k3::server::json j = {{"role", m.role}, {"content", m.content}};
      if (!m.reasoning.empty()) j["reasoning_content"] = m.reasoning;
      if (!m.tool_calls.empty()) {
        k3::server::json calls = k3::server::json::array();
        for (const auto& c : m.tool_calls)
          calls.push_back({{"type", "function"},
                           {"function", {{"name", c.name}, {"arguments", c.arguments_json}}}});
        j["tool_calls"] = std::move(calls);
      }
      msgs.push_back(std::move(j));
    }
    if (retry_user_) msgs.push_back({{"role", "user"}, {"content", *retry_user_}});
    doc["messages"] = std::move(msgs);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << doc.dump(2, ' ', false, k3::server::json::error_handler_t::replace) << "\n";
    if (!out) return error("cannot write " + path + ": " + std::strerror(errno));
    note("saved " + std::to_string(history_.size()) + " messages and the settings to " + path +
         " (/load " + path + " reads them back)");
  }

  // /load: the conversation (and the settings, when the file has them) of a /save file. Nothing
  // changes unless the whole file is valid; errors name the file and the line or the field.
  void load(const std::string& path) {
    using k3::server::json;
    if (path.empty()) return error("usage: /load FILE (a file written by /save)");
    std::string text;
    {
      std::error_code ec;
      if (std::filesystem::is_directory(path, ec))
        return error("cannot read " + path + ": it is a directory (/load FILE)");
      std::ifstream in(path, std::ios::binary);
      if (!in) return error("cannot read " + path + ": " + std::strerror(errno));
      std::ostringstream all;
      all << in.rdbuf();
      if (in.bad()) return error("cannot read " + path);
      text = all.str();
    }
    json doc;
    try {
      doc = json::parse(text);
    } catch (const json::parse_error& e) {
      const auto [line, column] = line_and_column(text, e.byte > 0 ? e.byte - 1 : 0);
      std::string why = e.what();
      if (const size_t at = why.find("syntax error"); at != std::string::npos) why = why.substr(at);
      return error(path + ": line " + std::to_string(line) + ", column " + std::to_string(column) +
                   ": not valid JSON (" + why + ")");
    }
    const std::string where = path + ": ";
    if (!doc.is_object())
      return error(where + "expected a JSON object with \"messages\" (a file written by /save)");
    const auto msgs = doc.find("messages");
    if (msgs == doc.end() || !msgs->is_array())
      return error(where + "\"messages\" is " + (msgs == doc.end() ? "missing" : "not a list") +
                   " (a file written by /save has it)");
    std::string system;
    std::vector<Message> history;
    for (size_t i = 0; i < msgs->size(); ++i) {
      const json& m = (*msgs)[i];
      const std::string field = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return error(where + field + ": expected an object");
      const auto role = m.find("role");
      if (role == m.end() || !role->is_string())
        return error(where + field + ".role: missing or not a string");
      const std::string r = role->get<std::string>();
      const auto content = m.find("content");
      if (content != m.end() && !content->is_string() && !content->is_null())
        return error(where + field + ".content: expected a string");
      Message message{
          r,
          content != m.end() && content->is_string() ? content->get<std::string>() : std::string(),
          {},
          {}};
      if (r == "system") {
        if (i != 0) return error(where + field + ".role: \"system\" only as the first message");
        system = message.content;
        continue;
      }
      if (r != "user" && r != "assistant")
        return error(where + field + ".role: \"" + r + "\" is not system, user or assistant");
      const std::string expected =
          history.empty() || history.back().role == "assistant" ? "user" : "assistant";
      if (r != expected)
        return error(where + field + ".role: \"" + r + "\" where " +
                     (expected == "user" ? "a user" : "an assistant") +
                     " message belongs (the turns alternate, starting with user)");
      if (const auto reasoning = m.find("reasoning_content"); reasoning != m.end()) {
        if (!reasoning->is_string())
          return error(where + field + ".reasoning_content: expected a string");
        message.reasoning = reasoning->get<std::string>();
      }
      if (const auto calls = m.find("tool_calls"); calls != m.end()) {
        if (!calls->is_array()) return error(where + field + ".tool_calls: expected a list");
        for (size_t c = 0; c < calls->size(); ++c) {
          const std::string call_field = field + ".tool_calls[" + std::to_string(c) + "]";
          const json& call = (*calls)[c];
          const json* fn =
              call.is_object() && call.contains("function") ? &call["function"] : &call;
          if (!fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
            return error(where + call_field + ".function.name: missing or not a string");
          k3::text::ToolCallOut out;
          out.name = (*fn)["name"].get<std::string>();
          const auto args = fn->find("arguments");
          out.arguments_json = args == fn->end()   ? "{}"
                               : args->is_string() ? args->get<std::string>()
                                                   : args->dump();
          out.index = static_cast<int>(c);
          out.complete = true;
          message.tool_calls.push_back(std::move(out));
        }
      }
      history.push_back(std::move(message));
    }
    Settings next = settings_;
    bool has_settings = false;
    if (const auto st = doc.find("settings"); st != doc.end()) {
      if (!st->is_object()) return error(where + "settings: expected an object");
      has_settings = true;
      for (const auto& [key, value] : st->items()) {
        const std::string field = "settings." + key;
        if (key == "think" || key == "show_think") {
          if (!value.is_boolean()) return error(where + field + ": expected true or false");
          (key == "think" ? next.think : next.show_think) = value.get<bool>();
        } else if (key == "effort") {
          const std::string e = value.is_string() ? value.get<std::string>() : value.dump();
          if (e != "low" && e != "high" && e != "max" && e != "none")
            return error(where + field + ": " + e + " is not low, high, max or none");
          next.effort = e;
        } else if (const std::string name = setting_name(key); !name.empty()) {
          if (!value.is_number() && !value.is_string())
            return error(where + field + ": expected a number");
          const std::string v = value.is_string() ? value.get<std::string>() : value.dump();
          if (auto e = set_setting(next, name, v, api_.max_tokens_ceiling))
            return error(where + "settings." + *e);
        } else {
          return error(where + field +
                       ": unknown setting (think, effort, show_think, temp, top_p, top_k, "
                       "min_p, seed, max_tokens)");
        }
      }
    }
    system_ = std::move(system);
    history_ = std::move(history);
    retry_user_.reset();
    if (!history_.empty() && history_.back().role == "user") {  // asked, never answered
      retry_user_ = history_.back().content;
      history_.pop_back();
    }
    if (has_settings) {
      settings_ = next;
      seeded_replies_ = 0;
    }
    const size_t n = msgs->size();
    note("loaded " + std::to_string(n) + (n == 1 ? " message (" : " messages (") +
         std::to_string(turns()) + (turns() == 1 ? " turn" : " turns") + ")" +
         (has_settings ? " and the settings" : "") + " from " + path +
         (retry_user_ ? "; the last question has no answer yet (/retry answers it)" : ""));
  }

  // The conversation's first `count` history messages (the system prompt first), as the renderer
  // takes them.
  PyValue messages_value(size_t count) const {
    PyValue::Array items;
    auto message = [](const std::string& role, const std::string& content) {
      PyValue m = PyValue::object();
      m.set("role", PyValue::string(role));
      m.set("content", PyValue::string(content));
      return m;
    };
    if (!system_.empty()) items.push_back(message("system", system_));
    for (size_t i = 0; i < std::min(count, history_.size()); ++i) {
      const Message& h = history_[i];
      PyValue m = message(h.role, h.content);
      if (h.role == "assistant" && !h.reasoning.empty())
        m.set("reasoning_content", PyValue::string(h.reasoning));
      if (!h.tool_calls.empty()) {
        PyValue::Array calls;
        for (const auto& c : h.tool_calls) {
          PyValue fn = PyValue::object();
          fn.set("name", PyValue::string(c.name));
          fn.set("arguments", PyValue::string(c.arguments_json));
          PyValue call = PyValue::object();
          call.set("type", PyValue::string("function"));
          call.set("function", std::move(fn));
          calls.push_back(std::move(call));
        }
        m.set("tool_calls", PyValue::array(std::move(calls)));
      }
      items.push_back(std::move(m));
    }
    return PyValue::array(std::move(items));
  }

  // The ids of the first `count` history messages rendered as the next prompt renders them, but
  // without the generation prompt (empty when it cannot be rendered).
  std::vector<int32_t> encode_messages(size_t count) const {
    std::vector<int32_t> ids;
    const k3::Engine* engine = service_.engine();
    if (!engine || !engine->tokenizer()) return ids;
    k3::text::ChatOptions options;
    options.add_generation_prompt = false;
    options.thinking = settings_.think;
    if (settings_.think && settings_.effort != "none")
      options.thinking_effort = PyValue::string(settings_.effort);
    auto segments = k3::text::build_chat_segments(messages_value(count), PyValue(), options);
    if (segments.ok()) k3::text::encode_segments(*engine->tokenizer(), *segments, ids);
    return ids;
  }

  // The tokens the conversation takes in the context now (0 before the first message).
  int64_t conversation_tokens() const {
    if (history_.empty() && system_.empty()) return 0;
    return static_cast<int64_t>(encode_messages(history_.size()).size());
  }

  // The conversation's prompt ids and anchor (as the server renders them), or an error message.
  std::optional<std::string> render(k3::ServiceRequest& request) const {
    const k3::Engine* engine = service_.engine();
    if (!engine || !engine->tokenizer()) return std::string("the model is not loaded");
    k3::server::ChatRequest chat;
    chat.messages = messages_value(history_.size());
    chat.thinking = settings_.think;
    chat.effort = settings_.effort == "none" ? "" : settings_.effort;
    auto rendered = k3::server::render_chat_prompt(chat, *engine->tokenizer());
    if (auto* e = std::get_if<k3::server::ApiError>(&rendered)) return e->message;
    request.prompt = std::move(std::get<k3::server::RenderedPrompt>(rendered).ids);
    request.anchor = std::get<k3::server::RenderedPrompt>(rendered).anchor;
    return std::nullopt;
  }

  // The checkpoints worth keeping for what may come next (docs/serving.md §3.10.2), positions in
  // request.prompt: the start of the last user message (the anchor: /undo, /edit and a new
  // question after them diverge there), its end (/retry: only the generation prompt is read
  // again), and, when no effort message leads the prompt, the start of the first answer: /think
  // on|off renders every answer with or without its think block, so the conversation diverges
  // there (with an effort message it diverges at the very start, and nothing can be kept).
  std::vector<int64_t> keep_positions(const k3::ServiceRequest& request) const {
    auto prefix = [&](size_t messages) -> int64_t {
      const std::vector<int32_t> ids = encode_messages(messages);
      if (ids.empty() || ids.size() >= request.prompt.size() ||
          !std::equal(ids.begin(), ids.end(), request.prompt.begin()))
        return 0;
      return static_cast<int64_t>(ids.size());
    };
    std::vector<int64_t> keep;
    if (request.anchor > 0) keep.push_back(request.anchor);
    // The same as the anchor, and also on the first turn when an effort message leads the prompt.
    if (const int64_t start = prefix(history_.size() - 1); start > 0) keep.push_back(start);
    if (const int64_t end = prefix(history_.size()); end > 0) keep.push_back(end);
    if (settings_.effort == "none") {
      const auto first_answer = std::find_if(
          history_.begin(), history_.end(), [](const Message& m) { return m.role == "assistant"; });
      if (first_answer != history_.end())
        if (const int64_t p = prefix(static_cast<size_t>(first_answer - history_.begin())); p > 0)
          keep.push_back(p);
    }
    return keep;
  }

  uint64_t next_seed() {
    if (settings_.seed) return *settings_.seed + seeded_replies_++;
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != sizeof seed)
      seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    return seed;
  }

  // The last user turn goes back into the input (/retry asks again).
  void take_back() {
    if (!history_.empty() && history_.back().role == "user") {
      retry_user_ = history_.back().content;
      history_.pop_back();
    }
  }

  // The request for the conversation so far, or why there is none.
  std::optional<std::string> build_request(k3::ServiceRequest& request) {
    if (auto e = render(request)) return e;
    const int64_t capacity = service_.context_capacity();
    if (static_cast<int64_t>(request.prompt.size()) >= capacity)
      return k3::context_overflow_message("the conversation",
                                          static_cast<int64_t>(request.prompt.size()), capacity) +
             " (/new starts over)";
    request.keep = keep_positions(request);
    request.starts_in_think = settings_.think;
    request.sampling.temperature = settings_.temperature;
    request.sampling.top_p = settings_.top_p;
    request.sampling.top_k = settings_.top_k;
    request.sampling.min_p = settings_.min_p;
    request.sampling.seed = next_seed();
    request.max_tokens = settings_.max_tokens;
    request.cache_prompt = true;
    request.progress_every = 16;
    return std::nullopt;
  }

  // One reply on the screen while its events arrive: the reasoning (dim, or a "thought for"
  // line when hidden), the Markdown-rendered content, tool calls, and a status line (spinner,
  // prefill progress) while nothing else is shown.
  struct ReplyView {
    explicit ReplyView(Chat& owner) : chat(owner), screen(owner.screen_), markdown(owner.styled_) {}

    Chat& chat;
    Screen& screen;
    Markdown markdown;
    Message answer{"assistant", {}, {}, {}};
    const double started = k3::now_seconds();
    double first_reasoning = -1, first_content = -1;
    bool cancel_sent = false, reasoning_open = false, in_reasoning_shown = false;
    int64_t prompt_tokens = 0, cached = 0, processed = 0;
    bool accepted = false, prefilled = false;
    int spin = 0;
    std::optional<k3::GenerationStats> done;
    std::string failure;

    void end_reasoning_display() {
      if (!in_reasoning_shown) return;
      if (screen.tty()) screen.print(kReset);
      in_reasoning_shown = false;
      screen.end_line();
    }
    std::string thought_for(double until) const {
      return "(thought for " +
             seconds_text(until - (first_reasoning > 0 ? first_reasoning : started)) + ")";
    }
    void show_status() {
      if (!answer.content.empty() || (in_reasoning_shown && chat.settings_.show_think) ||
          !screen.tty())
        return;
      static const char* const kSpinner = "-\\|/";
      std::string s(1, kSpinner[spin++ % 4]);
      s += ' ';
      if (cancel_sent)
        s += "stopping";
      else if (!accepted)
        s += "waiting";
      else if (!prefilled)
        s += "prefill " + std::to_string(processed) + "/" + std::to_string(prompt_tokens) +
             " (cached " + std::to_string(cached) + ")";
      else if (!answer.reasoning.empty() && !chat.settings_.show_think)
        s += "thinking";
      else
        s += "generating";
      s += " · " + seconds_text(k3::now_seconds() - started);
      screen.status(s);
    }
    void on_reasoning(const std::string& text) {
      if (first_reasoning < 0) first_reasoning = k3::now_seconds();
      answer.reasoning += text;
      if (!chat.settings_.show_think) return show_status();
      if (!in_reasoning_shown) {
        screen.clear_status();
        if (chat.opt_.text.labels && !screen.tty()) screen.print("[think] ");
        if (screen.tty()) screen.print(kDim);
        in_reasoning_shown = true;
        reasoning_open = true;
      }
      screen.print(text);
    }
    void on_content(const std::string& text) {
      if (first_content < 0) {
        first_content = k3::now_seconds();
        end_reasoning_display();
        screen.clear_status();
        if (!chat.settings_.show_think && !answer.reasoning.empty())
          screen.line(screen.dim(thought_for(first_content)));
        else if (reasoning_open && !screen.tty())
          screen.print("\n");
        if (chat.opt_.text.labels && !screen.tty()) screen.print("[response] ");
      }
      answer.content += text;
      screen.print(markdown.push(text));
    }
    void on_event(ServiceEvent& e) {
      switch (e.kind) {
        case ServiceEvent::Kind::accepted:
          accepted = true;
          prompt_tokens = e.stats.prompt_tokens;
          cached = e.stats.cached_tokens;
          processed = cached;
          prefilled = cached >= prompt_tokens;
          show_status();
          break;
        case ServiceEvent::Kind::progress:
          processed = e.processed;
          prefilled = e.processed >= e.total;
          show_status();
          break;
        case ServiceEvent::Kind::reasoning:
          on_reasoning(e.text);
          break;
        case ServiceEvent::Kind::content:
          on_content(e.text);
          break;
        case ServiceEvent::Kind::tool_call:
          answer.tool_calls.push_back(e.call);
          end_reasoning_display();
          screen.print(markdown.finish());
          screen.end_line();
          screen.line(screen.dim("[tool call] " + e.call.name + " " + e.call.arguments_json));
          break;
        case ServiceEvent::Kind::done:
          done = e.stats;
          break;
        case ServiceEvent::Kind::error: {
          const std::string code = k3::service_error_name(e.error);
          failure = e.text.empty() ? code : e.text;
          if (!code.empty() && code != failure) failure += " (" + code + ")";
          break;
        }
      }
    }
    void close() {
      screen.print(markdown.finish());
      end_reasoning_display();
      screen.clear_status();
      std::fflush(stdout);
    }
  };

  // The user turn at the end of history_ is answered; on failure it is taken back.
  void generate() {
    k3::ServiceRequest request;
    if (auto e = build_request(request)) {
      take_back();
      return error(*e);
    }
    g_interrupt.store(false);
    auto submitted = service_.submit(std::move(request));
    if (!submitted.ok()) {
      take_back();
      return error(submitted.status().message());
    }
    const std::shared_ptr<k3::RequestHandle> handle = *submitted;

    QuietTerminal quiet(screen_.tty());
    ReplyView view(*this);
    ServiceEvent e;
    while (!view.done && view.failure.empty()) {
      if (g_interrupt.exchange(false) && !view.cancel_sent) {
        service_.cancel(handle);
        view.cancel_sent = true;
      }
      if (handle->next(e, std::chrono::milliseconds(100)))
        view.on_event(e);
      else
        view.show_status();
    }
    view.close();
    // The worker's bookkeeping (fed tokens, counters) follows its last event.
    service_.wait_idle(2.0);
    if (!view.failure.empty()) {
      take_back();
      screen_.end_line();
      return error(view.failure);
    }
    conclude(view);
  }

  // After a reply's last event: why it ended, the footer, and what the history keeps.
  void conclude(ReplyView& view) {
    const k3::GenerationStats& st = *view.done;
    const bool interrupted = st.finish == k3::FinishReason::cancelled;
    if (!settings_.show_think && !view.answer.reasoning.empty() && view.first_content < 0)
      screen_.line(screen_.dim(view.thought_for(k3::now_seconds())));
    if (interrupted) {
      screen_.end_line();
      screen_.line(screen_.dim("[interrupted]"));
    } else if (st.finish == k3::FinishReason::length) {
      screen_.end_line();
      screen_.line(screen_.dim("[reply budget reached: " + std::to_string(st.completion_tokens) +
                               " tokens]"));
    }
    screen_.end_line();
    if (footer_ != FooterMode::off) screen_.line(screen_.dim(footer(st)));
    const Message& a = view.answer;
    if (interrupted && a.content.empty() && a.reasoning.empty() && a.tool_calls.empty())
      take_back();  // nothing to keep; /retry asks again
    else
      history_.push_back(std::move(view.answer));
  }

  std::string footer(const k3::GenerationStats& st) const {
    const double decode_s = st.decode_ms / 1e3;
    std::string f = std::to_string(st.completion_tokens) + " tok · " +
                    format(decode_s < 10 ? "%.1f s" : "%.0f s", decode_s) + " · ";
    f += decode_s > 0 ? format(st.completion_tokens / decode_s < 10 ? "%.2f tok/s" : "%.1f tok/s",
                               static_cast<double>(st.completion_tokens) / decode_s)
                      : std::string("- tok/s");
    f += " · prompt " + std::to_string(st.prompt_tokens) + " (cached " +
         std::to_string(st.cached_tokens) + ")";
    if (st.restored_at >= 0) f += " · restored checkpoint @" + std::to_string(st.restored_at);
    if (footer_ == FooterMode::full) {
      f += " · prefill " + format("%.0f ms", st.prefill_ms);
      if (st.prefill_ms > 0)
        f += format(" (%.1f tok/s)", static_cast<double>(st.prompt_tokens - st.cached_tokens) /
                                         (st.prefill_ms / 1e3));
      f += " · thinking " + std::to_string(st.reasoning_tokens) + " tok · reuse " +
           k3::reuse_kind_name(st.reuse) + " · " + k3::finish_reason_name(st.finish);
    }
    return f;
  }

  const k3::Options& opt_;
  k3::EngineService& service_;
  Screen& screen_;
  k3::server::ApiConfig api_;
  std::vector<Message> history_;
  std::optional<std::string>
      retry_user_;  // a user turn taken back (failed or interrupted before any output)
  std::string system_;
  Settings settings_;
  bool styled_ = false;
  bool near_limit_noted_ = false;  // the 90 % notice was shown since the last time below
  uint64_t seeded_replies_ = 0;    // replies since the seed was set (seed, seed + 1, ...)
  FooterMode footer_ = FooterMode::compact;
};

// Waits for the model, showing the load progress. False when it failed (message printed).
bool wait_loaded(k3::EngineService& service, const k3::Options& opt, Screen& screen) {
  const bool stderr_tty = isatty(STDERR_FILENO) == 1;
  const char* spinner = "-\\|/";
  int spin = 0;
  for (;;) {
    const k3::ServiceStats s = service.stats();
    if (s.state == k3::ServiceStats::State::ready) {
      screen.clear_status();
      const k3::Engine* engine = service.engine();
      screen.line(screen.dim("loaded " + opt.model_dir + " in " + seconds_text(s.load_elapsed_s) +
                             (engine ? " (" + engine->describe() + ")" : std::string()) +
                             "; context " + std::to_string(s.context_capacity) +
                             " tokens; checkpoints: " + s.checkpoints));
      return true;
    }
    if (s.state == k3::ServiceStats::State::failed) {
      screen.clear_status();
      std::fprintf(stderr, "coli chat: %s: %s\n", s.failed_step.c_str(), s.load_error.c_str());
      return false;
    }
    if (g_interrupt.load()) {
      screen.clear_status();
      std::fputs("coli chat: interrupted while loading\n", stderr);
      std::fflush(nullptr);
      std::_Exit(130);  // the loader cannot be stopped midway; do not wait for it
    }
    // The engine draws its own bar on a terminal stderr; two writers on one line would fight.
    if (!stderr_tty)
      screen.status(std::string(1, spinner[spin++ % 4]) + " loading " + opt.model_dir + " " +
                    format("%.0f%%", 100 * s.load_progress) + " · " +
                    seconds_text(s.load_elapsed_s));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

int chat(const k3::Options& opt) {
  const bool tty_in = isatty(STDIN_FILENO) == 1;
  const bool tty_out = isatty(STDOUT_FILENO) == 1;
  Screen screen(tty_out);

  // The engine's threads never take our signals: block them while the service starts its
  // worker (threads inherit the mask), then take them here.
  sigset_t ours;
  sigemptyset(&ours);
  sigaddset(&ours, SIGINT);
  sigaddset(&ours, SIGWINCH);
  pthread_sigmask(SIG_BLOCK, &ours, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking call returns EINTR and the loop looks at the flag
  sigaction(SIGINT, &sa, nullptr);
  struct sigaction sw {};
  sw.sa_handler = on_sigwinch;
  sigemptyset(&sw.sa_mask);
  sw.sa_flags = SA_RESTART;
  sigaction(SIGWINCH, &sw, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  k3::ServiceOptions so = service_options(opt);
  so.auto_slots = 4;  // the 3 checkpoints the chat keeps (Chat::keep_positions) and one more
  k3::EngineService service(std::move(so));
  pthread_sigmask(SIG_UNBLOCK, &ours, nullptr);

  screen.line(screen.bold("coli chat") + screen.dim(" · " + opt.model_dir + k3::model_note(opt) +
                                                    " · /help for commands, Ctrl-D quits"));
  if (!wait_loaded(service, opt, screen)) return 3;

  Chat chat(opt, service, screen);
  Input input(tty_in, screen);
  if (!opt.text.chat.empty()) chat.say(opt.text.chat);
  // \001 \002 bracket what readline must not count as printed (only readline reads them).
  const std::string prompt =
      tty_in && tty_out ? std::string("\001") + kBold + "\002> \001" + kReset + "\002" : "> ";
  for (;;) {
    chat.show_header();
    std::string line;
    if (input.read(prompt, line) == Input::Result::quit) break;
    const std::string text = trim(line);
    if (text.empty()) continue;
    if (text == "exit" || text == "quit" || text == ":q") break;
    if ((text[0] == '/' || text[0] == ':') && text.rfind("//", 0) != 0 && text.size() > 1 &&
        std::isalpha(static_cast<unsigned char>(text[1]))) {
      if (!chat.command(text)) break;
      continue;
    }
    chat.say(text.rfind("//", 0) == 0 ? text.substr(1) : text);
  }
  screen.end_line();
  return 0;
}

}  // namespace coli

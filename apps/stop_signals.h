// apps/stop_signals.h — how every program of the tree ends on SIGINT and SIGTERM (docs/serving.md
// §3.9): it exits with 128 + the signal, 130 for SIGINT and 143 for SIGTERM (the status a shell
// shows for a process the signal killed), but as an exit the program made. Header-only: the mains
// of apps/ and tools/ include it; nothing below apps/ may exit (docs/style.md §3).
//
// Two behaviours, one status:
//  * at_check (kimi_k3): the first signal raises the program's stop flag, and the program ends at
//    its next check and returns stop_status(); a second signal exits at once (the first's status).
//  * at_once (k3_repack, k3_synth, `coli chat` on SIGTERM, `coli tokenize` / `render`): the signal
//    exits at once. The repack and the generator may be cut anywhere: a rerun checks what a cut
//    left (docs/container.md), as after a kill.
// `coli serve` / `coli web` take the signals on a thread of their own (sigwait) and drain
// (apps/coli_serve.cpp); they exit with stop_status() too.
// The terminal (stdin's settings when install_stop_handlers ran) is put back before an exit at
// once, so a signal during a line edit or a quiet reply never leaves it without echo.
#pragma once

#include <signal.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <initializer_list>

namespace k3::apps {

// The exit status of a program a stop signal ended: 128 + the signal.
constexpr int stop_status(int sig) {
  return 128 + sig;
}

enum class StopMode { at_check, at_once };

namespace stop_detail {
inline std::atomic<int> g_signal{0};         // the first stop signal, 0 until one came
inline std::atomic<bool>* g_flag = nullptr;  // the program's stop flag (at_check)
inline termios g_terminal{};                 // stdin's settings at installation
inline std::atomic<bool> g_have_terminal{false};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "set from a signal handler");

// Async-signal-safe: tcsetattr and _exit only.
[[noreturn]] inline void exit_now(int sig) {
  if (g_have_terminal.load()) ::tcsetattr(STDIN_FILENO, TCSANOW, &g_terminal);
  ::_exit(stop_status(sig));
}
extern "C" inline void on_stop_at_once(int sig) {
  exit_now(sig);
}
extern "C" inline void on_stop_at_check(int sig) {
  int first = 0;
  if (!g_signal.compare_exchange_strong(first, sig)) exit_now(first);  // the second one
  if (g_flag) g_flag->store(true);
}
}  // namespace stop_detail

// Installs the handler for SIGINT and SIGTERM. `flag` (at_check) is raised by the first signal;
// the program polls it.
inline void install_stop_handlers(StopMode mode, std::atomic<bool>* flag = nullptr) {
  using namespace stop_detail;
  g_flag = flag;
  if (::isatty(STDIN_FILENO) == 1 && ::tcgetattr(STDIN_FILENO, &g_terminal) == 0)
    g_have_terminal.store(true);
  struct sigaction sa {};
  sa.sa_handler = mode == StopMode::at_once ? on_stop_at_once : on_stop_at_check;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM}) ::sigaction(sig, &sa, nullptr);
}

// The first stop signal that came (SIGINT, SIGTERM), or 0.
inline int stop_signal() {
  return stop_detail::g_signal.load();
}

}  // namespace k3::apps

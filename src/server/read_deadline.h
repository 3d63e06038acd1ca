// server/read_deadline.h — the cumulative read deadline of `coli serve` (slowloris): a
// connection that has not sent a complete request line and headers within `seconds` of its
// accept or its last response is shut by a reaper thread (a per-read timeout alone does not
// stop a client dripping a byte at a time), and a body still arriving `seconds` after its
// headers were complete is refused with 408. A request being served is never touched.
#pragma once

#include <atomic>
#include <thread>

namespace k3::server {

class ConnectionGate;

class ReadDeadline {
 public:
  ReadDeadline(double seconds, ConnectionGate& gate) : seconds_(seconds), gate_(gate) {}
  ~ReadDeadline() { stop(); }
  ReadDeadline(const ReadDeadline&) = delete;
  ReadDeadline& operator=(const ReadDeadline&) = delete;

  // Starts / stops the reaper thread (every 250 ms it shuts the connections past the deadline).
  void start();
  void stop();
  // One pass of the reaper.
  void reap();
  // The body of a request whose headers were complete at `headers_done` (now_seconds()) is late.
  bool body_overdue(double headers_done) const;
  double seconds() const { return seconds_; }

 private:
  double seconds_;
  ConnectionGate& gate_;
  std::atomic<bool> running_{false};
  std::thread reaper_;
};

}  // namespace k3::server

// server/read_deadline.cpp — the reaper thread and the body deadline (see server/read_deadline.h).
#include "read_deadline.h"

#include <sys/socket.h>

#include <chrono>

#include "connection_gate.h"
#include "util/sys.h"

namespace k3::server {

void ReadDeadline::start() {
  if (running_.exchange(true)) return;
  reaper_ = std::thread([this] {
    while (running_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      reap();
    }
  });
}

void ReadDeadline::stop() {
  running_.store(false);
  if (reaper_.joinable()) reaper_.join();
}

void ReadDeadline::reap() {
  gate_.visit_idle(seconds_, [](const Peer& p) {
    // The descriptor may have been closed and reused since the gate saw it: shut only the same
    // connection.
    if (const auto current = socket_peer(p.fd); current && *current == p)
      ::shutdown(p.fd, SHUT_RDWR);
  });
}

bool ReadDeadline::body_overdue(double headers_done) const {
  return now_seconds() - headers_done > seconds_;
}

}  // namespace k3::server

// server/connection_gate.cpp — connection caps, sockets found by address, closing a connection
// without reading on (see server/connection_gate.h).
#include "connection_gate.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "server/security.h"
#include "util/sys.h"

namespace k3::server {
namespace {

template <class Visit>
void for_each_connected_socket(Visit visit) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* entry = ::readdir(dir)) {
    const int fd = std::atoi(entry->d_name);
    if (fd <= 2) continue;
    if (auto p = socket_peer(fd); p && !visit(*p)) break;
  }
  ::closedir(dir);
}

int find_connection_socket(const PeerAddress& a) {
  int found = -1;
  for_each_connected_socket([&](const Peer& p) {
    if (p.is(a)) found = p.fd;
    return found < 0;
  });
  return found;
}

}  // namespace

std::optional<Peer> socket_peer(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return std::nullopt;
  sockaddr_storage peer{}, local{};
  socklen_t pl = sizeof peer, ll = sizeof local;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) return std::nullopt;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) return std::nullopt;
  char ip[INET6_ADDRSTRLEN] = {};
  Peer p;
  p.fd = fd;
  if (peer.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&peer)->sin_addr, ip, sizeof ip);
    p.port = ntohs(reinterpret_cast<sockaddr_in*>(&peer)->sin_port);
    p.local_port = ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  } else if (peer.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr, ip, sizeof ip);
    p.port = ntohs(reinterpret_cast<sockaddr_in6*>(&peer)->sin6_port);
    p.local_port = ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
  } else {
    return std::nullopt;
  }
  p.ip = ip;
  return p;
}

void ConnectionGate::set_port(int port) {
  std::lock_guard<std::mutex> lock(mutex_);
  port_ = port;
}

uint64_t ConnectionGate::admit() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::optional<Peer> fresh;
  std::vector<uint64_t> seen;
  for_each_connected_socket([&](const Peer& p) {
    if (p.local_port != port_) return true;
    for (const auto& [id, known] : live_)
      if (known == p) {
        seen.push_back(id);
        return true;
      }
    if (!fresh) fresh = p;
    return true;
  });
  // Connections already closed whose thread has not released them yet do not count.
  for (auto it = live_.begin(); it != live_.end();) {
    if (std::find(seen.begin(), seen.end(), it->first) != seen.end()) {
      ++it;
      continue;
    }
    uncount(it->second);
    it = live_.erase(it);
  }
  if (!fresh) return kUntracked;
  const bool capped =
      cap_loopback_ || !(is_loopback_host(fresh->ip) || fresh->ip.rfind("::ffff:127.", 0) == 0);
  if (live_.size() - retired_ >= max_total_ || (capped && per_ip_[fresh->ip] >= max_per_ip_)) {
    ::shutdown(fresh->fd, SHUT_RDWR);
    ++refused_;
    return 0;
  }
  const uint64_t id = next_id_++;
  fresh->since = now_seconds();
  live_[id] = *fresh;
  ++per_ip_[fresh->ip];
  return id;
}

void ConnectionGate::release(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(id);
  if (it == live_.end()) return;
  poisoned_.erase(std::remove(poisoned_.begin(), poisoned_.end(), it->second), poisoned_.end());
  uncount(it->second);
  live_.erase(it);
}

int ConnectionGate::socket_of(const PeerAddress& a) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, p] : live_)
      if (p.is(a)) return p.fd;
  }
  return find_connection_socket(a);
}

void ConnectionGate::mark(const PeerAddress& a, bool busy) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, p] : live_)
    if (p.is(a)) {
      p.busy = busy;
      p.since = now_seconds();
    }
}

void ConnectionGate::visit_idle(double idle_for, const std::function<void(const Peer&)>& visit) {
  std::lock_guard<std::mutex> lock(mutex_);
  const double now = now_seconds();
  for (auto& [id, p] : live_) {
    if (p.busy || p.retired || now - p.since < idle_for) continue;
    visit(p);
    p.since = now;  // once
  }
}

void ConnectionGate::poison(int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto p = socket_peer(fd)) poisoned_.push_back(*p);
}

bool ConnectionGate::poisoned(const PeerAddress& a) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Peer& p : poisoned_)
    if (p.is(a)) return true;
  return false;
}

void ConnectionGate::retire(int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto p = socket_peer(fd);
  if (!p) return;
  for (auto& [id, known] : live_)
    if (known == *p && !known.retired) {
      uncount(known);
      known.retired = true;
      ++retired_;
    }
}

void ConnectionGate::uncount(Peer& p) {
  if (p.retired) {
    --retired_;
  } else if (--per_ip_[p.ip] == 0) {
    per_ip_.erase(p.ip);
  }
  p.retired = false;
}

void end_connection(int fd, bool drain) {
  if (fd < 0) return;
  ::shutdown(fd, SHUT_WR);
  if (drain) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    char buf[65536];
    for (uint64_t total = 0; total < (uint64_t{256} << 20);) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) break;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      total += static_cast<uint64_t>(n);
    }
  }
  ::shutdown(fd, SHUT_RD);
}

bool peer_hung_up(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace k3::server

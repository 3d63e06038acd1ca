// server/connection_gate.cpp — connection caps and eviction, the peer of a socket and the owner
// of a loopback client's socket, closing a connection without reading on (see
// server/connection_gate.h).
#include "connection_gate.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "util/sys.h"

namespace k3::server {
namespace {

int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
}

// Copies the address of `a` into a sock_diag address field (4 x 32 bits, network order).
void diag_address(const sockaddr_storage& a, __be32 out[4]) {
  if (a.ss_family == AF_INET)
    std::memcpy(out, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, 4);
  else
    std::memcpy(out, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, 16);
}

}  // namespace

bool is_loopback_address(const std::string& ip) {
  in_addr v4{};
  if (::inet_pton(AF_INET, ip.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, ip.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

std::optional<uid_t> loopback_socket_owner(int fd) {
  sockaddr_storage peer{}, local{};
  socklen_t pl = sizeof peer, ll = sizeof local;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
      peer.ss_family != local.ss_family ||
      (peer.ss_family != AF_INET && peer.ss_family != AF_INET6))
    return std::nullopt;
  const int nl = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return std::nullopt;
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } query{};
  query.header.nlmsg_len = sizeof query;
  query.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  query.header.nlmsg_flags = NLM_F_REQUEST;
  query.request.sdiag_family = static_cast<__u8>(peer.ss_family);
  query.request.sdiag_protocol = IPPROTO_TCP;
  query.request.idiag_states = ~0u;
  // The client's socket: its local end is our peer, its remote end is our local address.
  query.request.id.idiag_sport = htons(static_cast<uint16_t>(port_of(peer)));
  query.request.id.idiag_dport = htons(static_cast<uint16_t>(port_of(local)));
  diag_address(peer, query.request.id.idiag_src);
  diag_address(local, query.request.id.idiag_dst);
  query.request.id.idiag_cookie[0] = query.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  std::optional<uid_t> owner;
  alignas(nlmsghdr) char reply[8192];
  if (::send(nl, &query, sizeof query, 0) == static_cast<ssize_t>(sizeof query)) {
    pollfd p{nl, POLLIN, 0};
    const ssize_t n = ::poll(&p, 1, 200) > 0 ? ::recv(nl, reply, sizeof reply, 0) : -1;
    const auto* h = reinterpret_cast<const nlmsghdr*>(reply);
    if (n >= static_cast<ssize_t>(sizeof(nlmsghdr)) && NLMSG_OK(h, static_cast<unsigned>(n)) &&
        h->nlmsg_type == SOCK_DIAG_BY_FAMILY && h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg)))
      owner = static_cast<const inet_diag_msg*>(NLMSG_DATA(h))->idiag_uid;
  }
  ::close(nl);
  return owner;
}

std::optional<Peer> socket_peer(int fd) {
  sockaddr_storage peer{}, local{};
  socklen_t pl = sizeof peer, ll = sizeof local;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) return std::nullopt;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) return std::nullopt;
  char ip[INET6_ADDRSTRLEN] = {};
  if (peer.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&peer)->sin_addr, ip, sizeof ip);
  else if (peer.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr, ip, sizeof ip);
  else
    return std::nullopt;
  Peer p;
  p.fd = fd;
  p.ip = ip;
  p.port = port_of(peer);
  p.local_port = port_of(local);
  p.client = p.ip;
  if (is_loopback_address(p.ip))
    if (const auto uid = loopback_socket_owner(fd)) {
      p.uid = *uid;
      p.client += " uid " + std::to_string(*uid);
    }
  return p;
}

bool ConnectionGate::capped(const Peer& p) const {
  return cap_loopback_ || !is_loopback_address(p.ip);
}

uint64_t ConnectionGate::admit(const Peer& peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto share = per_client_.find(peer.client);
  if (capped(peer) && share != per_client_.end() && share->second >= max_per_client_) {
    ++refused_;
    return 0;
  }
  if (live_.size() - retired_ >= max_total_) {
    // Full: evict the oldest connection that is not serving a request, from the client holding
    // the most connections. Its thread sees the shutdown as end of stream and ends.
    Peer* victim = nullptr;
    size_t victim_share = 0;
    for (auto& [id, p] : live_) {
      if (p.busy || p.retired) continue;
      const size_t held = per_client_[p.client];
      if (!victim || held > victim_share || (held == victim_share && p.since < victim->since)) {
        victim = &p;
        victim_share = held;
      }
    }
    if (!victim) {
      ++refused_;
      return 0;
    }
    ::shutdown(victim->fd, SHUT_RDWR);
    uncount(*victim);
    victim->retired = true;
    ++retired_;
    ++evicted_;
  }
  const uint64_t id = next_id_++;
  Peer& p = live_[id] = peer;
  p.since = now_seconds();
  ++per_client_[p.client];
  return id;
}

void ConnectionGate::release(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(id);
  if (it == live_.end()) return;
  uncount(it->second);
  live_.erase(it);
}

void ConnectionGate::mark(uint64_t id, bool busy) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(id);
  if (it == live_.end()) return;
  it->second.busy = busy;
  it->second.since = now_seconds();
}

void ConnectionGate::retire(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(id);
  if (it == live_.end() || it->second.retired) return;
  uncount(it->second);
  it->second.retired = true;
  ++retired_;
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

void ConnectionGate::refused_outright() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++refused_;
}

ConnectionGate::Stats ConnectionGate::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return {live_.size() - retired_, refused_, evicted_};
}

// A retired connection no longer counts anywhere; one that is live counts for its client.
void ConnectionGate::uncount(Peer& p) {
  if (p.retired) {
    --retired_;
  } else if (--per_client_[p.client] == 0) {
    per_client_.erase(p.client);
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

PeerState peer_state(int fd) {
  PeerState s;
  if (fd < 0) return s;
  pollfd p{fd, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return s;
  s.closed = (p.revents & (POLLHUP | POLLERR)) != 0;
  s.sent_fin = s.closed || (p.revents & POLLRDHUP) != 0;
  return s;
}

}  // namespace k3::server

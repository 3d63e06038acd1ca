// server/connection_gate.h — live connections of `coli serve`: admitted or refused on the accept
// thread (a global and a per-address cap, docs/serving.md), marked busy while a request is
// served, retired once a closing response is written, and poisoned so bytes a client sent after
// a refused request are never served. Also the socket probes the handlers need: has the client
// hung up, and ending a connection without reading further requests from it.
//
// cpp-httplib 0.11 hands neither the accepted socket to its task queue nor the connection's
// socket to handlers, so sockets are found by their addresses among this process's descriptors
// (the fd stays valid while its connection is being served).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace k3::server {

// Which connection a request came on (as the HTTP library reports it).
struct PeerAddress {
  std::string ip;
  int port = -1, local_port = -1;
};

struct Peer {
  int fd = -1;
  std::string ip;
  int port = -1, local_port = -1;
  bool retired = false;  // answered its last request, no longer counted
  bool busy = false;     // a request's headers are in, its response not yet out
  double since = 0;      // now_seconds() of the accept or the last response
  bool operator==(const Peer& o) const {
    return fd == o.fd && ip == o.ip && port == o.port && local_port == o.local_port;
  }
  bool is(const PeerAddress& a) const {
    return port == a.port && local_port == a.local_port && ip == a.ip;
  }
};

// The peer of a connected socket `fd`, or nullopt when fd is not one.
std::optional<Peer> socket_peer(int fd);

class ConnectionGate {
 public:
  ConnectionGate(size_t max_total, size_t max_per_ip, bool cap_loopback)
      : max_total_(max_total), max_per_ip_(max_per_ip), cap_loopback_(cap_loopback) {}
  void set_port(int port);

  // The socket just accepted: registered (returns its id) or refused and shut down (0);
  // kUntracked when no new socket was found.
  uint64_t admit();
  static constexpr uint64_t kUntracked = ~uint64_t{0};
  // The connection's thread is done with it.
  void release(uint64_t id);

  // The socket of the connection `a` came on: from the live table when the gate admitted it,
  // else by a scan of the process's descriptors; -1 when none.
  int socket_of(const PeerAddress& a);
  // A request of this connection is being served (busy) or has been answered.
  void mark(const PeerAddress& a, bool busy);
  // Calls `visit` (under the gate's lock) for each connection neither busy nor retired that has
  // been idle `idle_for` seconds since its accept or its last response, then restarts its clock
  // (so each is visited once per idle period).
  void visit_idle(double idle_for, const std::function<void(const Peer&)>& visit);
  // The connection of `fd` must serve nothing more (see end_connection).
  void poison(int fd);
  bool poisoned(const PeerAddress& a);
  // The connection of `fd` has answered its last request: it stops counting against the caps
  // now, not when its thread gets around to closing it.
  void retire(int fd);

 private:
  void uncount(Peer& p);  // REQUIRES mutex_

  size_t max_total_, max_per_ip_;
  bool cap_loopback_;
  int port_ = -1;
  std::mutex mutex_;
  std::map<uint64_t, Peer> live_;
  std::map<std::string, size_t> per_ip_;
  std::vector<Peer> poisoned_;
  uint64_t next_id_ = 1;
  int64_t refused_ = 0;
  size_t retired_ = 0;
};

// Ends a connection whose response said "Connection: close", once that response is written.
// Bytes the client sent after its headers must never be parsed as a next request (smuggling):
// the write side is shut (FIN after the response), a refused body is drained for up to 2 s
// (`drain`) so the client reads its 413/415 instead of a reset, then reading stops.
void end_connection(int fd, bool drain);

// The peer of `fd` has closed or reset its side (false for fd < 0).
bool peer_hung_up(int fd);

}  // namespace k3::server

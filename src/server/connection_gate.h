// server/connection_gate.h — live connections of `coli serve` (docs/serving.md §4.6): each one
// admitted or refused by the thread that serves it (a global cap and a per-client cap), marked
// busy while a request is served, retired once a closing response is written, and released when
// its thread is done. When the table is full a connection that is not serving a request (idle
// keep-alive, or still sending its headers) is evicted to make room, taken from the client that
// holds the most, oldest first: one process opening slow connections cannot lock the others out.
//
// The gate is told each connection's socket by its own thread (server/http_server.cpp overrides
// the HTTP library's per-connection entry point), so nothing is matched by address: state never
// leaks from one connection to a later one on the same client port. The descriptors it holds
// stay open until release(), so shutting one down (eviction, the read deadline) never reaches a
// reused descriptor.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace k3::server {

struct Peer {
  int fd = -1;
  std::string ip;  // the client's address
  int port = -1;   // the client's port
  int local_port = -1;
  // For a loopback client, the uid owning the client's socket (found through the kernel's socket
  // table); -1 when unknown or remote.
  int64_t uid = -1;
  // What the caps, the eviction and the auth brake count by: the address, and for a loopback
  // client the owning uid too ("127.0.0.1 uid 1000"): every local process shares 127.0.0.1.
  std::string client;
  bool retired = false;  // answered its last request, no longer counted
  bool busy = false;     // a request's headers are in, its response not yet out
  double since = 0;      // now_seconds() of the accept or the last response
};

// The peer of a connected socket `fd` (with the owner of a loopback client's socket), or nullopt
// when fd is not a connected TCP socket.
std::optional<Peer> socket_peer(int fd);
// For our end `fd` of a loopback connection, the uid owning the client's end (an exact
// NETLINK_SOCK_DIAG lookup of that socket by its addresses); nullopt when unknown.
std::optional<uid_t> loopback_socket_owner(int fd);
// 127.0.0.0/8, ::1 or ::ffff:127.0.0.0/104 (a numeric address, as getpeername gives it).
bool is_loopback_address(const std::string& ip);

class ConnectionGate {
 public:
  ConnectionGate(size_t max_total, size_t max_per_client, bool cap_loopback)
      : max_total_(max_total), max_per_client_(max_per_client), cap_loopback_(cap_loopback) {}

  // A connection whose thread starts serving it: its id, or 0 when refused (the caller closes
  // it). May shut down (evict) one connection that is not serving a request.
  uint64_t admit(const Peer& peer);
  // The connection's thread is done with it (before its descriptor is closed).
  void release(uint64_t id);
  // A request of this connection is being served (busy) or has been answered.
  void mark(uint64_t id, bool busy);
  // The connection has answered its last request: it stops counting against the caps now, not
  // when its thread gets around to closing it.
  void retire(uint64_t id);
  // Calls `visit` (under the gate's lock) for each connection neither busy nor retired that has
  // been idle `idle_for` seconds since its accept or its last response, then restarts its clock
  // (so each is visited once per idle period).
  void visit_idle(double idle_for, const std::function<void(const Peer&)>& visit);
  // Counts a connection refused before the gate saw it (no thread was free).
  void refused_outright();

  struct Stats {
    size_t live = 0;
    int64_t refused = 0, evicted = 0;
  };
  Stats stats();

 private:
  void uncount(Peer& p);  // REQUIRES mutex_
  bool capped(const Peer& p) const;

  size_t max_total_, max_per_client_;
  bool cap_loopback_;
  std::mutex mutex_;
  std::map<uint64_t, Peer> live_;
  std::map<std::string, size_t> per_client_;
  uint64_t next_id_ = 1;
  int64_t refused_ = 0, evicted_ = 0;
  size_t retired_ = 0;
};

// Ends a connection whose response said "Connection: close", once that response is written.
// Bytes the client sent after its headers must never be parsed as a next request (smuggling):
// the write side is shut (FIN after the response), a refused body is drained for up to 2 s
// (`drain`) so the client reads its 413/415 instead of a reset, then reading stops.
void end_connection(int fd, bool drain);

// What a socket says about its peer without reading: `closed` after a reset (or both sides
// shut), `sent_fin` once the peer has sent FIN — closed, or only half-closed and still reading
// (the two look alike until something is written to it). No data is consumed.
struct PeerState {
  bool closed = false, sent_fin = false;
};
PeerState peer_state(int fd);

}  // namespace k3::server

// The socket side of `coli serve` below HTTP (docs/serving.md §4): the loopback test of --host
// (a parsed address, not a prefix), the CORS list with no hard-coded extras, the framing guards
// (two Content-Lengths, Content-Length with Transfer-Encoding), the auth brake keyed by client
// (address and, for loopback, the owning uid), and the connection gate: the owner of a loopback
// socket, eviction of the greediest client's idle connection when full, never a busy one.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../src/server/connection_gate.h"
#include "engine/service.h"
#include "serve_demo.h"
#include "server/routes.h"
#include "server/security.h"
#include "test_util.h"

namespace k3::server {
namespace {

TEST(ServeTransport, LoopbackHostIsAParsedAddress) {
  for (const char* yes : {"127.0.0.1", "127.1.2.3", "localhost", "LOCALHOST", "::1", "[::1]",
                          "::ffff:127.0.0.1", "0:0:0:0:0:0:0:1"})
    EXPECT_TRUE(is_loopback_host(yes)) << yes;
  for (const char* no : {"127.evil", "127.0.0.1.evil.example", "127.", "127.0.0.1:80", "0.0.0.0",
                         "::", "10.0.0.1", "::ffff:10.0.0.1", "localhost.evil", "[::2]", ""})
    EXPECT_FALSE(is_loopback_host(no)) << no;
}

TEST(ServeTransport, NoHardCodedExtraOrigins) {
  SecurityOptions c;
  c.port = 8000;
  EXPECT_TRUE(origin_allowed("http://localhost:8000", c));
  for (const char* gone : {"http://localhost:5173", "tauri://localhost", "http://tauri.localhost",
                           "https://tauri.localhost"})
    EXPECT_FALSE(origin_allowed(gone, c)) << gone;
  c.cors_origins = {"http://localhost:5173"};
  EXPECT_TRUE(origin_allowed("http://localhost:5173", c));
}

EngineService& shared_service() {
  return testing::serve_demo_service();
}

ServerOptions server_options() {
  ServerOptions o;
  o.security.port = 8000;
  o.security.api_keys = {"sk-test"};
  return o;
}

HttpRequest request(std::string method, std::string path, const char* key = "sk-test") {
  HttpRequest r;
  r.method = std::move(method);
  r.path = path;
  r.target = std::move(path);
  r.remote_addr = "127.0.0.1";
  r.headers = {{"Host", "127.0.0.1:8000"}};
  if (key) r.headers.emplace_back("Authorization", std::string("Bearer ") + key);
  return r;
}

std::string code_of(const HttpResponse& res) {
  return json::parse(res.body)["error"]["code"].get<std::string>();
}

TEST(ServeTransport, AmbiguousFramingIsRefused) {
  Router router(shared_service(), server_options());
  auto post = [](Fields extra) {
    HttpRequest r = request("POST", "/v1/chat/completions");
    r.headers.emplace_back("Content-Type", "application/json");
    for (auto& f : extra) r.headers.push_back(std::move(f));
    return r;
  };
  for (const Fields& bad :
       {Fields{{"Content-Length", "5"}, {"Content-Length", "6"}},
        Fields{{"Content-Length", "5"}, {"content-length", "5"}},
        Fields{{"Content-Length", "5"}, {"Transfer-Encoding", "chunked"}},
        Fields{{"Transfer-Encoding", "gzip, chunked"}},
        Fields{{"Transfer-Encoding", "chunked"}, {"Transfer-Encoding", "chunked"}}}) {
    const HttpResponse res = router.serve(post(bad));
    EXPECT_EQ(res.status, 400) << bad[0].first << " " << res.body;
    EXPECT_EQ(code_of(res), "invalid_framing");
    EXPECT_TRUE(res.closes());
  }
  // A GET with both is just as ambiguous to a proxy.
  HttpRequest get = request("GET", "/health", nullptr);
  get.headers.emplace_back("Content-Length", "0");
  get.headers.emplace_back("Transfer-Encoding", "chunked");
  EXPECT_EQ(router.serve(get).status, 400);
}

TEST(ServeTransport, AuthBrakeIsPerClientNotPerAddress) {
  Router router(shared_service(), server_options());
  HttpRequest guess = request("GET", "/slots", "sk-guess");
  guess.client = "127.0.0.1 uid 4242";
  for (int i = 0; i < 20; ++i) EXPECT_EQ(router.serve(guess).status, 401);
  HttpRequest blocked = request("GET", "/slots");
  blocked.client = guess.client;
  EXPECT_EQ(router.serve(blocked).status, 429);
  // Another local user on the same address keeps working.
  HttpRequest other = request("GET", "/slots");
  other.client = "127.0.0.1 uid 4243";
  EXPECT_NE(router.serve(other).status, 429);
}

// A connected loopback pair: {server side, client side}.
std::pair<int, int> loopback_pair() {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::listen(listener, 4), 0);
  EXPECT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const int server = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  return {server, client};
}

TEST(ServeTransport, LoopbackPeerCarriesItsOwner) {
  auto [server, client] = loopback_pair();
  const auto peer = socket_peer(server);
  ASSERT_TRUE(peer);
  EXPECT_EQ(peer->ip, "127.0.0.1");
  EXPECT_EQ(peer->uid, static_cast<int64_t>(::getuid()));
  EXPECT_EQ(peer->client, "127.0.0.1 uid " + std::to_string(::getuid()));
  ::close(server);
  ::close(client);
}

TEST(ServeTransport, FullGateEvictsTheGreediestIdleConnection) {
  ConnectionGate gate(3, 8, false);
  std::vector<std::pair<int, int>> pairs;
  for (int i = 0; i < 4; ++i) pairs.push_back(loopback_pair());
  auto peer = [&](int i, const std::string& client) {
    Peer p = *socket_peer(pairs[i].first);
    p.client = client;
    return p;
  };
  const uint64_t a1 = gate.admit(peer(0, "a")), a2 = gate.admit(peer(1, "a"));
  const uint64_t b1 = gate.admit(peer(2, "b"));
  ASSERT_TRUE(a1 && a2 && b1);
  gate.mark(a1, true);  // serving a request: never evicted
  // Full: a newcomer takes the slot of client a's idle connection (a holds the most).
  const uint64_t c1 = gate.admit(peer(3, "c"));
  EXPECT_NE(c1, 0u);
  char byte;
  EXPECT_EQ(::recv(pairs[1].second, &byte, 1, MSG_DONTWAIT), 0) << "a2 was not shut down";
  EXPECT_EQ(gate.stats().evicted, 1);
  EXPECT_EQ(gate.stats().live, 3u);
  // Everything busy: refused.
  gate.mark(b1, true);
  gate.mark(c1, true);
  gate.release(a2);
  EXPECT_EQ(gate.admit(peer(1, "d")), 0u);
  EXPECT_EQ(gate.stats().refused, 1);
  for (auto [s, c] : pairs) {
    ::close(s);
    ::close(c);
  }
}

}  // namespace
}  // namespace k3::server

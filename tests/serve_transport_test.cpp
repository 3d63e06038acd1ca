// The socket side of `coli serve` below HTTP (docs/serving.md §4): the loopback test of --host
// (a parsed address, not a prefix), the CORS list with no hard-coded extras, the framing guards
// (two Content-Lengths, Content-Length with Transfer-Encoding), the auth brake (wrong keys only,
// never the right key, keyed by client: the address, or for any loopback address "loopback" and
// the owning uid), and the connection gate: the owner of a loopback socket, eviction of the
// greediest client's idle connection when full, never a busy one.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../src/server/auth_brake.h"
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

ServerOptions transport_options() {
  ServerOptions o;
  o.security.port = 8000;
  o.security.api_keys = {"sk-test"};
  return o;
}

HttpRequest transport_request(std::string method, std::string path, const char* key = "sk-test") {
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
  Router router(testing::serve_demo_service(), transport_options());
  auto post = [](Fields extra) {
    HttpRequest r = transport_request("POST", "/v1/chat/completions");
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
  HttpRequest get = transport_request("GET", "/health", nullptr);
  get.headers.emplace_back("Content-Length", "0");
  get.headers.emplace_back("Transfer-Encoding", "chunked");
  EXPECT_EQ(router.serve(get).status, 400);
}

// A wrong key is a guess: 20 within 60 s block that client's wrong keys; another local user (a
// different uid on the same address) is another client.
TEST(ServeTransport, AuthBrakeBlocksWrongKeysPerClient) {
  Router router(testing::serve_demo_service(), transport_options());
  HttpRequest guess = transport_request("GET", "/slots", "sk-guess");
  guess.client = "127.0.0.1 uid 4242";
  for (int i = 0; i < 20; ++i) EXPECT_EQ(router.serve(guess).status, 401);
  const HttpResponse blocked = router.serve(guess);
  EXPECT_EQ(blocked.status, 429);
  EXPECT_EQ(code_of(blocked), "too_many_auth_failures");
  EXPECT_FALSE(blocked.header("Retry-After").empty());
  HttpRequest other = guess;
  other.client = "127.0.0.1 uid 4243";
  EXPECT_EQ(router.serve(other).status, 401);
}

// The right key is never refused by the brake: a guesser behind the same proxy (or on the same
// machine) must not lock out the key's holders.
TEST(ServeTransport, AuthBrakeNeverRefusesTheRightKey) {
  Router router(testing::serve_demo_service(), transport_options());
  HttpRequest guess = transport_request("GET", "/slots", "sk-guess");
  guess.client = "10.1.2.3";
  for (int i = 0; i < 25; ++i) router.serve(guess);
  EXPECT_EQ(router.serve(guess).status, 429);
  HttpRequest right = transport_request("GET", "/slots");
  right.client = guess.client;
  EXPECT_EQ(router.serve(right).status, 200);
  EXPECT_EQ(router.serve(guess).status, 429);  // still blocked for wrong keys
}

// A request without a key (a probe, a client not configured yet) is a 401, not a guess.
TEST(ServeTransport, AuthBrakeDoesNotCountMissingKeys) {
  Router router(testing::serve_demo_service(), transport_options());
  HttpRequest keyless = transport_request("GET", "/slots", nullptr);
  keyless.client = "10.1.2.4";
  for (int i = 0; i < 30; ++i) EXPECT_EQ(router.serve(keyless).status, 401) << i;
  HttpRequest other_scheme = keyless;  // a scheme other than Bearer presents no key either
  other_scheme.headers.emplace_back("Authorization", "Basic c2stdGVzdA==");
  EXPECT_EQ(router.serve(other_scheme).status, 401);
  HttpRequest guess = transport_request("GET", "/slots", "sk-guess");
  guess.client = keyless.client;
  EXPECT_EQ(router.serve(guess).status, 401);  // not blocked
  HttpRequest right = transport_request("GET", "/slots");
  right.client = keyless.client;
  EXPECT_EQ(router.serve(right).status, 200);
}

// Any local process can send from any 127.x.y.z: the loopback addresses are one client.
TEST(ServeTransport, AuthBrakeCountsLoopbackAsOneClient) {
  Router router(testing::serve_demo_service(), transport_options());
  HttpRequest guess = transport_request("GET", "/slots", "sk-guess");
  for (int i = 0; i < 20; ++i) {
    guess.client = "127.0." + std::to_string(i) + ".2 uid 4242";
    EXPECT_EQ(router.serve(guess).status, 401);
  }
  guess.client = "127.200.1.1 uid 4242";
  EXPECT_EQ(router.serve(guess).status, 429);
  guess.client = "::1 uid 4242";
  EXPECT_EQ(router.serve(guess).status, 429);
  guess.client = "10.0.0.1";  // a remote address is its own client
  EXPECT_EQ(router.serve(guess).status, 401);
}

// The brake as a function of (client, key, time).
TEST(ServeTransport, AuthBrakeWindowAndBlock) {
  AuthBrake brake;
  const double t0 = 1000;
  for (int i = 0; i < 100; ++i) EXPECT_EQ(brake.check("c", KeyState::missing, t0).status, 401);
  for (size_t i = 0; i < AuthBrake::kMaxFailures; ++i)
    EXPECT_EQ(brake.check("c", KeyState::wrong, t0 + 0.1 * static_cast<double>(i)).status, 401);
  const AuthAnswer blocked = brake.check("c", KeyState::wrong, t0 + 3);
  EXPECT_EQ(blocked.status, 429);
  EXPECT_GT(blocked.retry_after, 50);
  EXPECT_LE(blocked.retry_after, 60);
  EXPECT_EQ(brake.check("c", KeyState::right, t0 + 3).status, 0);
  EXPECT_EQ(brake.check("c", KeyState::missing, t0 + 3).status, 401);
  EXPECT_EQ(brake.check("d", KeyState::wrong, t0 + 3).status, 401);
  // The block ends 60 s after it began, and counting starts over.
  EXPECT_EQ(brake.check("c", KeyState::wrong, t0 + 62).status, 401);
  // Failures older than the window do not count.
  for (size_t i = 0; i + 1 < AuthBrake::kMaxFailures; ++i) brake.check("e", KeyState::wrong, t0);
  EXPECT_EQ(brake.check("e", KeyState::wrong, t0 + 61).status, 401);
  EXPECT_EQ(brake.check("e", KeyState::wrong, t0 + 62).status, 401);
}

TEST(ServeTransport, AuthBrakeClientKey) {
  EXPECT_EQ(AuthBrake::client_key("127.0.0.9 uid 7"), "loopback uid 7");
  EXPECT_EQ(AuthBrake::client_key("127.255.0.1"), "loopback");
  EXPECT_EQ(AuthBrake::client_key("::1 uid 0"), "loopback uid 0");
  EXPECT_EQ(AuthBrake::client_key("::ffff:127.1.2.3 uid 1"), "loopback uid 1");
  EXPECT_EQ(AuthBrake::client_key("128.0.0.1"), "128.0.0.1");
  EXPECT_EQ(AuthBrake::client_key("10.0.0.1"), "10.0.0.1");
  EXPECT_EQ(AuthBrake::client_key("::2"), "::2");
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

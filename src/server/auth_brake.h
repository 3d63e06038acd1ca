// server/auth_brake.h — the brute-force brake on API keys (docs/serving.md §4.2): 20 wrong keys
// from one client within 60 s answer 429 to its wrong keys for the next 60 s. The route guard
// (server/routes.cpp) asks it about every request to a keyed route, once the key is checked.
//
// What counts: only a wrong key is a guess. A request without a key (a health probe, a browser's
// first try, a client not yet configured) is a 401 and counts for nothing, and the right key is
// never refused: behind a proxy, or on one machine, a guesser shares its client with the users
// who hold the key, and must not lock them out. Every loopback address is one client
// (client_key): any local process can send from any of 127.0.0.0/8 for free.
//
// Thread-safe (one lock).
#pragma once

#include <deque>
#include <map>
#include <mutex>
#include <string>

namespace k3::server {

// The key a request presented, as checked against the configured keys.
enum class KeyState { right, wrong, missing };

// The brake's answer: 0 (serve the request), 401, or 429 with `retry_after` seconds.
struct AuthAnswer {
  int status = 0;
  int retry_after = 0;
};

class AuthBrake {
 public:
  // The answer to a request from `client` (HttpRequest::client, e.g. "10.0.0.5" or
  // "127.0.0.1 uid 1000") presenting `key`, at `now` (now_seconds()): right, 0; missing, 401;
  // wrong, 429 while the client is blocked, else 401, counted: the kMaxFailures-th within
  // kWindowSeconds blocks the client for kBlockSeconds.
  AuthAnswer check(const std::string& client, KeyState key, double now);
  AuthAnswer check(const std::string& client, KeyState key);

  // What the brake counts `client` by: the client itself, except that a loopback address
  // (127.0.0.0/8, ::1, ::ffff:127.x.y.z) becomes "loopback", keeping the uid that owns the socket
  // when known ("127.0.0.9 uid 1000" -> "loopback uid 1000").
  static std::string client_key(const std::string& client);

  static constexpr size_t kMaxFailures = 20;
  static constexpr double kWindowSeconds = 60, kBlockSeconds = 60;

 private:
  std::mutex mutex_;
  std::map<std::string, std::deque<double>> failures_;
  std::map<std::string, double> blocked_until_;
};

}  // namespace k3::server

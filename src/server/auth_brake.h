// server/auth_brake.h — the brute-force brake on API keys: 20 failed keys from one address
// within 60 s answer 429 for the next 60 s, whatever the key (docs/serving.md). The route
// guard (server/routes.cpp) asks it before checking a key and tells it about each failure.
#pragma once

#include <deque>
#include <map>
#include <mutex>
#include <string>

namespace k3::server {

class AuthBrake {
 public:
  // Seconds the address stays blocked (0 = not blocked).
  int blocked_for(const std::string& ip);
  // A wrong or missing key from `ip`.
  void failed(const std::string& ip);

  static constexpr size_t kMaxFailures = 20;
  static constexpr double kWindowSeconds = 60, kBlockSeconds = 60;

 private:
  std::mutex mutex_;
  std::map<std::string, std::deque<double>> failures_;
  std::map<std::string, double> blocked_until_;
};

}  // namespace k3::server

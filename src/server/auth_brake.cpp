// server/auth_brake.cpp — failure windows and blocks per client (see server/auth_brake.h).
#include "auth_brake.h"

#include <cmath>

#include "connection_gate.h"
#include "util/sys.h"

namespace k3::server {

std::string AuthBrake::client_key(const std::string& client) {
  const size_t space = client.find(' ');
  const std::string address = client.substr(0, space);
  if (!is_loopback_address(address)) return client;
  return "loopback" + (space == std::string::npos ? std::string() : client.substr(space));
}

AuthAnswer AuthBrake::check(const std::string& client, KeyState key) {
  return check(client, key, now_seconds());
}

AuthAnswer AuthBrake::check(const std::string& client, KeyState key, double now) {
  if (key == KeyState::right) return {};
  if (key == KeyState::missing) return {401, 0};
  const std::string who = client_key(client);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = blocked_until_.find(who); it != blocked_until_.end()) {
    if (it->second > now) return {429, static_cast<int>(std::ceil(it->second - now))};
    blocked_until_.erase(it);
  }
  if (failures_.size() > 4096 && !failures_.count(who))
    failures_.clear();  // bounded memory under a flood of clients
  auto& times = failures_[who];
  times.push_back(now);
  while (!times.empty() && now - times.front() > kWindowSeconds) times.pop_front();
  if (times.size() >= kMaxFailures) {
    blocked_until_[who] = now + kBlockSeconds;
    failures_.erase(who);
  }
  return {401, 0};
}

}  // namespace k3::server

// server/auth_brake.cpp — failure windows and blocks per address (see server/auth_brake.h).
#include "auth_brake.h"

#include <cmath>

#include "util/sys.h"

namespace k3::server {

int AuthBrake::blocked_for(const std::string& ip) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocked_until_.find(ip);
  if (it == blocked_until_.end()) return 0;
  const double left = it->second - now_seconds();
  if (left <= 0) {
    blocked_until_.erase(it);
    return 0;
  }
  return static_cast<int>(std::ceil(left));
}

void AuthBrake::failed(const std::string& ip) {
  std::lock_guard<std::mutex> lock(mutex_);
  const double now = now_seconds();
  auto& times = failures_[ip];
  times.push_back(now);
  while (!times.empty() && now - times.front() > kWindowSeconds) times.pop_front();
  if (times.size() >= kMaxFailures) {
    blocked_until_[ip] = now + kBlockSeconds;
    times.clear();
  }
  if (failures_.size() > 4096) failures_.clear();  // bounded memory under a spoofing flood
}

}  // namespace k3::server

// util/sys.h — facts about the process and the machine (peak RSS, memory, clocks).
#pragma once

#include <chrono>
#include <cstdint>

namespace k3 {

// Peak resident set size of this process in bytes (getrusage).
uint64_t peak_rss_bytes();

// Seconds on a monotonic clock since an arbitrary origin.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace k3

// util/sys.h — facts about the process and the machine (peak RSS, memory, clocks).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace k3 {

// Peak resident set size of this process in bytes (getrusage).
uint64_t peak_rss_bytes();

// Resident set size now (/proc/self/statm; 0 when it cannot be read).
uint64_t current_rss_bytes();
// Resident memory now split by backing (/proc/self/smaps_rollup): private anonymous memory (heap,
// stacks: what the process owns) and file-backed resident pages (mapped files: clean page cache,
// reclaimable). `known` false when the file cannot be read.
struct MemoryUse {
  bool known = false;
  uint64_t anonymous_bytes = 0;
  uint64_t file_backed_bytes = 0;
};
MemoryUse memory_use();

// MemAvailable of /proc/meminfo in bytes (0 when it cannot be read).
uint64_t available_memory_bytes();

// The CPU's "model name" from /proc/cpuinfo ("unknown" when it cannot be read).
std::string cpu_model_name();

// Seconds on a monotonic clock since an arbitrary origin.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace k3

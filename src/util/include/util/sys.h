// util/sys.h — facts about the process and the machine (peak RSS, memory, clocks).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace k3 {

// Peak resident set size of this process in bytes (getrusage; never below current_rss_bytes()).
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

// Asks for transparent huge pages on the 2 MiB-aligned interior of [p, p + bytes) (madvise
// MADV_HUGEPAGE; a no-op where THP is off). Call before the memory is first touched: a large
// buffer then faults in 2 MiB pieces instead of 4 KiB ones, which on machines with costly page
// faults (virtual machines) is most of a load's time (docs/container.md §7).
void advise_huge_pages(const void* p, size_t bytes);

// Resizes `v` to `n` value-initialised elements, huge-page-advised first when it grows past
// 4 MiB.
template <class T, class A>
void resize_huge(std::vector<T, A>& v, size_t n) {
  if (n > v.capacity() && n * sizeof(T) >= (size_t{4} << 20)) {
    std::vector<T, A> fresh;
    fresh.reserve(n);
    advise_huge_pages(fresh.data(), n * sizeof(T));
    fresh.assign(v.begin(), v.end());
    v.swap(fresh);
  }
  v.resize(n);
}

// Seconds on a monotonic clock since an arbitrary origin.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace k3

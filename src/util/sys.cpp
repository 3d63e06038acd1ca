#include "util/sys.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <sstream>

#include "util/uninit_vector.h"

namespace k3 {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

}  // namespace

void* allocate_buffer(size_t bytes) {
  if (bytes < kHugeBufferBytes) {
    void* p = std::aligned_alloc(64, round_up(bytes == 0 ? 1 : bytes, 64));
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  // One huge page more than needed, trimmed so that the block starts on a 2 MiB boundary: every
  // page of it can then be a huge page.
  const size_t length = round_up(bytes, kHugePage);
  void* raw = ::mmap(nullptr, length + kHugePage, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto at = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t begin = (at + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
  if (begin > at) ::munmap(raw, begin - at);
  const uintptr_t tail = at + length + kHugePage - (begin + length);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(begin + length), tail);
  // Huge pages for the whole 2 MiB pieces only. A huge page over the partial last piece would make
  // all 2 MiB of it resident however little of it the buffer uses (on the 4-layer slice, the dense
  // matrices' last pieces held 41.6 MB that no byte of a weight was in, docs/streaming.md §1.11);
  // the tail is refused huge pages explicitly, so THP "always" does not bring them back.
  advise_huge_pages(reinterpret_cast<void*>(begin), bytes);
  const size_t whole = bytes / kHugePage * kHugePage;
  if (length > whole)
    ::madvise(reinterpret_cast<void*>(begin + whole), length - whole, MADV_NOHUGEPAGE);
  return reinterpret_cast<void*>(begin);
}

void free_buffer(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes < kHugeBufferBytes)
    std::free(p);
  else
    ::munmap(p, round_up(bytes, kHugePage));
}

uint64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  // Linux reports KiB. Its high-water mark and /proc/self/statm's resident count are each
  // gathered from per-thread counters flushed at different times, so a peak read just after a
  // current value could come out below it (0.17 MB on a k3-mini server's /metrics): never less
  // than now.
  return std::max(static_cast<uint64_t>(usage.ru_maxrss) * 1024u, current_rss_bytes());
}

void advise_huge_pages(const void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const auto begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

MemoryUse memory_use() {
  std::ifstream rollup("/proc/self/smaps_rollup");
  MemoryUse use;
  uint64_t rss_kb = 0, anon_kb = 0;
  bool have_rss = false, have_anon = false;
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  std::string line;
  while (std::getline(rollup, line)) {
    std::istringstream fields(line);
    if (!(fields >> key >> kb >> unit)) continue;
    if (key == "Rss:") rss_kb = kb, have_rss = true;
    if (key == "Anonymous:") anon_kb = kb, have_anon = true;
  }
  if (!have_rss || !have_anon) return use;
  use.known = true;
  use.anonymous_bytes = anon_kb * 1024;
  use.file_backed_bytes = (rss_kb > anon_kb ? rss_kb - anon_kb : 0) * 1024;
  return use;
}

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t begin = line.find_first_not_of(" \t", colon + 1);
    const size_t end = line.find_last_not_of(" \t\r");
    return begin == std::string::npos ? "unknown" : line.substr(begin, end - begin + 1);
  }
  return "unknown";
}

}  // namespace k3

namespace k3 {

uint64_t current_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long pages_total = 0, pages_resident = 0;
  const int got = std::fscanf(f, "%llu %llu", &pages_total, &pages_resident);
  std::fclose(f);
  if (got != 2) return 0;
  return static_cast<uint64_t>(pages_resident) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

uint64_t available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long value = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &value) == 1) {
      kib = value;
      break;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

}  // namespace k3

#include "util/sys.h"

#include <sys/resource.h>

namespace k3 {

uint64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024u;  // Linux reports KiB
}

}  // namespace k3

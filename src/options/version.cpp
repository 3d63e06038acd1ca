// options/version.cpp — the --version line of every binary. The git hash and build type are
// fixed when CMake configures (src/CMakeLists.txt); outside a git checkout the hash is "unknown".
#include "kernels/isa.h"
#include "options/options.h"

#ifndef K3_VERSION
#define K3_VERSION "0.0.0"
#endif
#ifndef K3_GIT_HASH
#define K3_GIT_HASH "unknown"
#endif
#ifndef K3_BUILD_TYPE
#define K3_BUILD_TYPE "unknown"
#endif

namespace k3 {

std::string version_text(const std::string& program) {
  return program + " " + K3_VERSION + " (git " + K3_GIT_HASH + ", " + K3_BUILD_TYPE +
         " build; kernels scalar avx2 avx512, this CPU runs " + isa_name(best_isa()) + ")";
}

}  // namespace k3

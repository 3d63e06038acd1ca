// options/version.cpp — what CMake fixes when it configures (src/CMakeLists.txt): the --version
// line of every binary (outside a git checkout the hash is "unknown"), and where the built-in
// model lives. The only file that sees those definitions, so a new commit recompiles it alone.
#include <filesystem>

#include "kernels/isa.h"
#include "options/options.h"

// The source tree this build came from, and the installed model's folder.
#ifndef K3_SOURCE_DIR
#error \
    "K3_SOURCE_DIR must name the source tree (src/CMakeLists.txt sets it for options/version.cpp)"
#endif

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

std::string builtin_model_dir() {
  // The source tree's copy while it exists (a build), else the installed one (`make install`).
  const std::string source = std::string(K3_SOURCE_DIR) + "/assets/k3-mini";
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::filesystem::path(source) / "config.json", ec))
    return source;
  const std::string installed = K3_INSTALLED_MODEL_DIR;
  if (std::filesystem::is_regular_file(std::filesystem::path(installed) / "config.json", ec))
    return installed;
  return source;
}

}  // namespace k3

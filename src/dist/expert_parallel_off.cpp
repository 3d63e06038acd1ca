// dist/expert_parallel_off.cpp — the build without MPI (K3_MPI=OFF): one node; --expert-parallel
// says how to get MPI (see dist/expert_parallel.h).
#include "dist/expert_parallel.h"
#include "util/error.h"

namespace k3::dist {

World join(int*, char***) {
  throw Error(
      "--expert-parallel: this build has no MPI (configure with -DK3_MPI=ON after "
      "scripts/setup.sh, which installs Debian's openmpi-bin and libopenmpi-dev)");
}

World world() {
  return {};
}

int serve_worker(const std::string&, const LoadOptions&) {
  throw Error("--expert-parallel: this build has no MPI");
}

std::shared_ptr<ExpertExecutor> remote_executor(const ModelFiles&, const K3Config&,
                                                const LoadOptions&, Isa) {
  throw Error("--expert-parallel: this build has no MPI");
}

std::string describe(int64_t, const ExpertCacheStats&) {
  return "";
}

ExchangeFigures figures(const ExpertCacheStats&) {
  return {};
}

int leave(int status) {
  return status;
}

}  // namespace k3::dist

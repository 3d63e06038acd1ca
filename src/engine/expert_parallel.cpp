// engine/expert_parallel.cpp — the programs' entry to dist/ (see engine/expert_parallel.h).
#include "engine/expert_parallel.h"

#include "dist/expert_parallel.h"

namespace k3 {

int expert_parallel_join(int* argc, char*** argv) {
  return dist::join(argc, argv).rank;
}

int expert_parallel_worker(const std::string& model_dir, const LoadOptions& load) {
  return dist::serve_worker(model_dir, load);
}

int expert_parallel_leave(int status) {
  return dist::leave(status);
}

}  // namespace k3

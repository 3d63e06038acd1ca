// dist/owners.cpp — which rank computes which routed expert (see dist/expert_parallel.h).
#include <numeric>

#include "dist/expert_parallel.h"
#include "util/error.h"

namespace k3::dist {

std::vector<int> expert_owners(int64_t num_experts, int size, std::span<const double> weights) {
  std::vector<int> owner(static_cast<size_t>(num_experts), 0);
  if (weights.empty()) {
    for (int64_t e = 0; e < num_experts; ++e)
      owner[static_cast<size_t>(e)] = static_cast<int>(e % size);
    return owner;
  }
  if (weights.size() != static_cast<size_t>(size))
    throw Error("--ep-weights gives " + std::to_string(weights.size()) + " weights for a job of " +
                std::to_string(size) + " ranks: give one per rank, rank 0 first");
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<double> current(static_cast<size_t>(size), 0.0);
  for (int64_t e = 0; e < num_experts; ++e) {
    size_t pick = 0;
    for (size_t r = 0; r < current.size(); ++r) {
      current[r] += weights[r];
      if (current[r] > current[pick]) pick = r;
    }
    current[pick] -= total;
    owner[static_cast<size_t>(e)] = static_cast<int>(pick);
  }
  return owner;
}

}  // namespace k3::dist

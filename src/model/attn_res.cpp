#include "model/attn_res.h"

#include <cmath>

#include "kernels/vec.h"

namespace k3 {

void attn_res_mix(const float* const* sources, size_t count, const float* query, size_t hidden,
                  double eps, float* p, float* out) {
  for (size_t e = 0; e < count; ++e) {
    const double dot = dot_f64(sources[e], query, hidden);
    const double ms = dot_f64(sources[e], sources[e], hidden) / static_cast<double>(hidden);
    p[e] = static_cast<float>(dot / std::sqrt(ms + eps));
  }
  softmax(p, count);
  for (size_t i = 0; i < hidden; ++i) out[i] = 0.0f;
  for (size_t e = 0; e < count; ++e)
    for (size_t i = 0; i < hidden; ++i) out[i] += p[e] * sources[e][i];
}

}  // namespace k3

#include "model/dense_mlp.h"

#include <vector>

#include "kernels/vec.h"

namespace k3 {

void situ_mlp_forward(const K3Config& c, const Matrix& gate, const Matrix& up, const Matrix& down,
                      const float* x, float* out) {
  std::vector<float> g(static_cast<size_t>(gate.rows)), u(static_cast<size_t>(up.rows));  // [inner]
  gate.apply(x, g.data());
  up.apply(x, u.data());
  const float beta = static_cast<float>(c.activation_situ_beta);
  const float beta_linear = static_cast<float>(c.activation_situ_linear_beta);
  for (size_t i = 0; i < g.size(); ++i) g[i] = situ(g[i], u[i], beta, beta_linear);
  down.apply(g.data(), out);
}

}  // namespace k3

#include "model/dense_mlp.h"

#include "kernels/vec.h"

namespace k3 {

void situ_down(const K3Config& c, const Compute& compute, const Matrix& down, float* g, const float* u,
               float* out) {
  const float beta = static_cast<float>(c.activation_situ_beta);
  const float beta_linear = static_cast<float>(c.activation_situ_linear_beta);
  const size_t n = static_cast<size_t>(down.cols);
  for (size_t i = 0; i < n; ++i) g[i] = situ(g[i], u[i], beta, beta_linear);
  matmul(*compute.kernels, down, g, 1, out);
}

void situ_mlp_forward(const K3Config& c, const Compute& compute, const Matrix& gate, const Matrix& up,
                      const Matrix& down, Workspace& ws, const float* x, float* out) {
  float* g = ws.mlp_gate.data();  // [inner]
  float* u = ws.mlp_up.data();    // [inner]
  const MatmulJob jobs[] = {{&gate, g}, {&up, u}};
  matmul_batch(*compute.kernels, jobs, std::size(jobs), x);
  situ_down(c, compute, down, g, u, out);
}

}  // namespace k3

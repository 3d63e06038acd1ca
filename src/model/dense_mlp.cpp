#include "model/dense_mlp.h"

namespace k3 {

void situ_mlp_forward(const K3Config& c, const Compute& compute, const Matrix& gate,
                      const Matrix& up, const Matrix& down, Workspace& ws, const float* X, size_t n,
                      float* out) {
  float* g = ws.mlp_gate.data();  // [n][inner]
  float* u = ws.mlp_up.data();    // [n][inner]
  const MatmulJob jobs[] = {{&gate, g}, {&up, u}};
  matmul_jobs(compute, jobs, std::size(jobs), X, n);
  situ_down(c, compute, down, g, u, n, out);
}

void situ_down(const K3Config& c, const Compute& compute, const Matrix& down, float* G,
               const float* U, size_t n, float* out) {
  const float beta = static_cast<float>(c.activation_situ_beta);
  const float beta_linear = static_cast<float>(c.activation_situ_linear_beta);
  const size_t inner = static_cast<size_t>(down.cols);
  situ_glu(*compute.kernels, G, U, n * inner, beta, beta_linear);
  matmul_chunk(compute, down, G, n, out);
}

}  // namespace k3

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

void situ_mlp_forward_chunk(const K3Config& c, const Compute& compute, const Matrix& gate, const Matrix& up,
                            const Matrix& down, ChunkWorkspace& cw, const float* X, size_t n, float* out) {
  float* g = cw.mlp_gate.data();  // [n][inner]
  float* u = cw.mlp_up.data();    // [n][inner]
  matmul_chunk(compute, gate, X, n, g);
  matmul_chunk(compute, up, X, n, u);
  situ_down_chunk(c, compute, down, g, u, n, out);
}

void situ_down_chunk(const K3Config& c, const Compute& compute, const Matrix& down, float* G, const float* U,
                     size_t n, float* out) {
  const float beta = static_cast<float>(c.activation_situ_beta);
  const float beta_linear = static_cast<float>(c.activation_situ_linear_beta);
  const size_t inner = static_cast<size_t>(down.cols);
  for (size_t i = 0; i < n * inner; ++i) G[i] = situ(G[i], U[i], beta, beta_linear);
  matmul_chunk(compute, down, G, n, out);
}

}  // namespace k3

// model/dense_mlp.h — SiTU-GLU MLP (dense layers and the fused shared experts).
//
//   out = Wdown( SiTU(Wgate x, Wup x) )
//   SiTU(g, u) = [beta tanh(g / beta) sigmoid(g)] [beta_linear tanh(u / beta_linear)]
#pragma once

#include "model/compute.h"
#include "model/config.h"
#include "model/state.h"
#include "model/weights.h"

namespace k3 {

// x: [gate.cols]; out: [down.rows].
void situ_mlp_forward(const K3Config& config, const Compute& compute, const Matrix& gate,
                      const Matrix& up, const Matrix& down, Workspace& work, const float* x,
                      float* out);

// The second half alone, when gate and up were already computed (batched with other matrices):
// g[i] = SiTU(g[i], u[i]) in place, then out = down g.
void situ_down(const K3Config& config, const Compute& compute, const Matrix& down, float* g,
               const float* u, float* out);

// The chunk forms (n rows, each bit-identical to the one-row call): X [n][gate.cols],
// out [n][down.rows]; situ_down_chunk takes G, U [n][down.cols] (G overwritten).
void situ_mlp_forward_chunk(const K3Config& config, const Compute& compute, const Matrix& gate,
                            const Matrix& up, const Matrix& down, ChunkWorkspace& chunk,
                            const float* X, size_t n, float* out);
void situ_down_chunk(const K3Config& config, const Compute& compute, const Matrix& down, float* G,
                     const float* U, size_t n, float* out);

}  // namespace k3

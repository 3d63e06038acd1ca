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

// n rows X [n][gate.cols] (n = 1 in decode); out: [n][down.rows]. Every row bit-identical to
// the call on that row alone.
void situ_mlp_forward(const K3Config& config, const Compute& compute, const Matrix& gate,
                      const Matrix& up, const Matrix& down, Workspace& work, const float* X,
                      size_t n, float* out);

// The second half alone, when gate and up were already computed (batched with other matrices):
// G[i] = SiTU(G[i], U[i]) in place, then out = down G. G, U: [n][down.cols]; out: [n][down.rows].
void situ_down(const K3Config& config, const Compute& compute, const Matrix& down, float* G,
               const float* U, size_t n, float* out);

}  // namespace k3

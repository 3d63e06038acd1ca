// model/dense_mlp.h — SiTU-GLU MLP (dense layers and the fused shared experts).
//
//   out = Wdown( SiTU(Wgate x, Wup x) )
//   SiTU(g, u) = [beta tanh(g / beta) sigmoid(g)] [beta_linear tanh(u / beta_linear)]
#pragma once

#include "model/config.h"
#include "model/weights.h"

namespace k3 {

// x: [gate.cols]; out: [down.rows].
void situ_mlp_forward(const K3Config& config, const Matrix& gate, const Matrix& up,
                      const Matrix& down, const float* x, float* out);

}  // namespace k3

// kernels/impl/situ_scalar.cpp — SiTU-GLU over a row: kernels/vec.h's situ() on each element, the
// twin that situ_avx2.cpp and situ_avx512.cpp equal bit for bit.
#include "kernels/vec.h"
#include "kernels_impl.h"

namespace k3::impl {

void situ_glu_scalar(float* gate, const float* up, size_t n, float beta, float beta_linear) {
  for (size_t i = 0; i < n; ++i) gate[i] = situ(gate[i], up[i], beta, beta_linear);
}

}  // namespace k3::impl

// kernels/impl/situ_avx2.cpp — SiTU-GLU over a row, 8 lanes at a time: kernels/vec.h's situ()
// (situ_exp, situ_tanh) with the same f32 operations in the same order on every lane, both tanh
// branches computed and blended, NaN lanes given back as situ() gives them; the tail (n % 8) goes
// to the scalar twin's file (situ_scalar.cpp), so that no copy of vec.h's inline functions is
// compiled here with this file's -m flags. Bit for bit equal to the scalar twin
// (tests/dense_kernels_test.cpp). Compiled with -mavx2 -mfma (and -ffp-contract=off, as every file:
// no multiply-add is fused); called only after a run-time CPU check (isa.cpp).
#include <immintrin.h>

#include <iterator>

#include "kernels/situ_poly.h"
#include "kernels_impl.h"

namespace k3::impl {
namespace {

using namespace situ_poly;

inline __m256 set(float v) {
  return _mm256_set1_ps(v);
}

// situ_exp on 8 lanes (NaN lanes: whatever; the callers blend them).
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, set(kExpMin));
  x = _mm256_min_ps(x, set(kExpMax));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, set(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, set(kLn2High)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, set(kLn2Low)));
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 p = set(kExpPoly[0]);
  for (size_t k = 1; k < std::size(kExpPoly); ++k)
    p = _mm256_add_ps(_mm256_mul_ps(p, r), set(kExpPoly[k]));
  p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, z), r), set(1.0f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// situ_tanh on 8 lanes, NaN lanes given back.
inline __m256 tanh8(__m256 x, __m256 sign) {
  const __m256 ax = _mm256_andnot_ps(sign, x);
  // |x| < 0.625: the odd polynomial.
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = set(kTanhPoly[0]);
  for (size_t k = 1; k < std::size(kTanhPoly); ++k)
    p = _mm256_add_ps(_mm256_mul_ps(p, z), set(kTanhPoly[k]));
  const __m256 small = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, z), x), x);
  // Above: sign(x) (1 - e) / (1 + e).
  const __m256 e = exp8(_mm256_mul_ps(set(-2.0f), ax));
  const __m256 t = _mm256_div_ps(_mm256_sub_ps(set(1.0f), e), _mm256_add_ps(set(1.0f), e));
  const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 large = _mm256_xor_ps(t, _mm256_and_ps(negative, sign));
  const __m256 out = _mm256_blendv_ps(large, small, _mm256_cmp_ps(ax, set(kTanhSmall), _CMP_LT_OQ));
  return _mm256_blendv_ps(out, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

}  // namespace

void situ_glu_avx2(float* gate, const float* up, size_t n, float beta, float beta_linear) {
  const __m256 vb = set(beta), vbl = set(beta_linear), one = set(1.0f);
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
    const __m256 ng = _mm256_xor_ps(g, sign);
    const __m256 e = _mm256_blendv_ps(exp8(ng), ng, _mm256_cmp_ps(ng, ng, _CMP_UNORD_Q));
    const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, e));
    const __m256 left = _mm256_mul_ps(_mm256_mul_ps(vb, tanh8(_mm256_div_ps(g, vb), sign)), sig);
    const __m256 right = _mm256_mul_ps(vbl, tanh8(_mm256_div_ps(u, vbl), sign));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(left, right));
  }
  situ_glu_scalar(gate + i, up + i, n - i, beta, beta_linear);
}

}  // namespace k3::impl

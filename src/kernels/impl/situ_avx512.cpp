// kernels/impl/situ_avx512.cpp — SiTU-GLU over a row, 16 lanes at a time: kernels/vec.h's situ()
// (situ_exp, situ_tanh) with the same f32 operations in the same order on every lane, both tanh
// branches computed and blended, NaN lanes given back as situ() gives them; the tail (n % 16) goes
// to the scalar twin's file (situ_scalar.cpp), so that no copy of vec.h's inline functions is
// compiled here with this file's -m flags. Bit for bit equal to the scalar twin
// (tests/dense_kernels_test.cpp). Compiled with the AVX-512 flags; called only after a run-time CPU
// check (isa.cpp).
#include <iterator>

#include "avx512_intrin.h"
#include "kernels/situ_poly.h"
#include "kernels_impl.h"

namespace k3::impl {
namespace {

using namespace situ_poly;

// situ_exp on 16 lanes (NaN lanes: whatever; the callers blend them).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpMin));
  x = _mm512_min_ps(x, _mm512_set1_ps(kExpMax));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(kLn2High)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(kLn2Low)));
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (size_t k = 1; k < std::size(kExpPoly); ++k)
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kExpPoly[k]));
  p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, z), r), _mm512_set1_ps(1.0f));
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

// situ_tanh on 16 lanes, NaN lanes given back.
inline __m512 tanh16(__m512 x) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0x80000000u)));
  const __m512 ax = _mm512_andnot_ps(sign, x);
  // |x| < 0.625: the odd polynomial.
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(kTanhPoly[0]);
  for (size_t k = 1; k < std::size(kTanhPoly); ++k)
    p = _mm512_add_ps(_mm512_mul_ps(p, z), _mm512_set1_ps(kTanhPoly[k]));
  const __m512 small = _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, z), x), x);
  // Above: sign(x) (1 - e) / (1 + e).
  const __m512 e = exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), ax));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 large = _mm512_mask_xor_ps(t, negative, t, sign);
  __m512 out = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(kTanhSmall), _CMP_LT_OQ),
                                    large, small);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), out, x);
}

}  // namespace

void situ_glu_avx512(float* gate, const float* up, size_t n, float beta, float beta_linear) {
  const __m512 vb = _mm512_set1_ps(beta), vbl = _mm512_set1_ps(beta_linear);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0x80000000u)));
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i), u = _mm512_loadu_ps(up + i);
    const __m512 ng = _mm512_xor_ps(g, sign);
    __m512 e = exp16(ng);
    e = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ng, ng, _CMP_UNORD_Q), e, ng);
    const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, e));
    const __m512 left = _mm512_mul_ps(_mm512_mul_ps(vb, tanh16(_mm512_div_ps(g, vb))), sig);
    const __m512 right = _mm512_mul_ps(vbl, tanh16(_mm512_div_ps(u, vbl)));
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(left, right));
  }
  situ_glu_scalar(gate + i, up + i, n - i, beta, beta_linear);
}

}  // namespace k3::impl

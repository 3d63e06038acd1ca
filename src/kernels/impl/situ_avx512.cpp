// kernels/impl/situ_avx512.cpp — SiTU-GLU over a row, 16 lanes at a time
// (kernels/impl/situ_simd.h on AVX-512 vectors). Compiled with the AVX-512 flags; called only
// after a run-time CPU check (isa.cpp).
#include "avx512_intrin.h"
#include "kernels_impl.h"
#include "situ_simd.h"

namespace k3::impl {
namespace {

struct Avx512 {
  using F = __m512;
  using M = __mmask16;
  static constexpr size_t kLanes = 16;
  static F set(float v) { return _mm512_set1_ps(v); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F a) { _mm512_storeu_ps(p, a); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F round(F a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static F pow2(F n) {
    const __m512i bits =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_castsi512_ps(bits);
  }
  static M lt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static M unordered(F a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static F select(M m, F a, F b) { return _mm512_mask_blend_ps(m, a, b); }
  static F sign() { return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0x80000000u))); }
  static F flip_sign(M m, F a) { return _mm512_mask_xor_ps(a, m, a, sign()); }
  static F xor_(F a, F b) { return _mm512_xor_ps(a, b); }
  static F andnot(F a, F b) { return _mm512_andnot_ps(a, b); }
};

}  // namespace

void situ_glu_avx512(float* gate, const float* up, size_t n, float beta, float beta_linear) {
  situ_glu_lanes<Avx512>(gate, up, n, beta, beta_linear);
}

}  // namespace k3::impl

// kernels/impl/situ_avx2.cpp — SiTU-GLU over a row, 8 lanes at a time (kernels/impl/situ_simd.h
// on AVX2 vectors). Compiled with -mavx2 -mfma (and -ffp-contract=off, as every file: no
// multiply-add is fused); called only after a run-time CPU check (isa.cpp).
#include <immintrin.h>

#include "kernels_impl.h"
#include "situ_simd.h"

namespace k3::impl {
namespace {

struct Avx2 {
  using F = __m256;
  using M = __m256;  // all-ones lanes
  static constexpr size_t kLanes = 8;
  static F set(float v) { return _mm256_set1_ps(v); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F a) { _mm256_storeu_ps(p, a); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F round(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F pow2(F n) {
    const __m256i bits =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(bits);
  }
  static M lt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static M unordered(F a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static F select(M m, F a, F b) { return _mm256_blendv_ps(a, b, m); }
  static F sign() { return _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u))); }
  static F flip_sign(M m, F a) { return _mm256_xor_ps(a, _mm256_and_ps(m, sign())); }
  static F xor_(F a, F b) { return _mm256_xor_ps(a, b); }
  static F andnot(F a, F b) { return _mm256_andnot_ps(a, b); }
};

}  // namespace

void situ_glu_avx2(float* gate, const float* up, size_t n, float beta, float beta_linear) {
  situ_glu_lanes<Avx2>(gate, up, n, beta, beta_linear);
}

}  // namespace k3::impl

// kernels/impl/quant_avx2.cpp — AVX2 variants of the row quantisers (kernels/quant.h), byte for
// byte equal to the scalar twins (kernels/impl/quant_scalar.cpp). Compiled with -mavx2 -mfma;
// called only after a run-time CPU check (isa.cpp).
//
// Per row (int8) or group of 64 (int4): max |w| over 8 lanes (maxps skips NaN like the scalar
// running max), the scale and its reciprocal in scalar code (the same two operations), then
// w * inv rounded to nearest even (roundps), NaN lanes zeroed, clamped, converted and narrowed
// with packs (whose 128-bit lane interleave one permute undoes). int4 nibbles are paired in
// 16-bit lanes: (b[2j] & 15) | ((b[2j + 1] << 4) & 0xF0). Columns past the last multiple of 32
// (int8) go through the scalar element rules (quant_common.h).
#include <immintrin.h>

#include <cstdint>

#include "kernels_impl.h"
#include "quant_common.h"

namespace k3::impl {
namespace {

inline float horizontal_max(__m256 m) {
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
}

// max(m, |v|) per lane, NaN lanes of v leaving m as it is.
inline __m256 abs_max(__m256 m, __m256 v) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return _mm256_max_ps(_mm256_and_ps(v, abs_mask), m);
}

// quant_level lane-wise: clamp(rne(v), lo, hi), NaN -> 0, as int32.
inline __m256i levels(__m256 v, __m256 lo, __m256 hi) {
  __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));
  return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
}

// 32 int32 values in [-128, 127] (four registers, column order) -> 32 bytes in column order.
inline __m256i narrow(const __m256i v[4]) {
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i p =
      _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  return _mm256_permutevar8x32_epi32(p, order);
}

}  // namespace

void quantize_int8_row_avx2(const float* w, size_t cols, int8_t* q, float* scale) {
  __m256 m = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= cols; i += 8) m = abs_max(m, _mm256_loadu_ps(w + i));
  float amax = horizontal_max(m);
  for (; i < cols; ++i) amax = abs_max_step(amax, w[i]);
  const float s = int8_row_scale(amax);
  const float inv = 1.0f / s;
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  size_t j = 0;
  for (; j + 32 <= cols; j += 32) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k)
      v[k] = levels(_mm256_mul_ps(_mm256_loadu_ps(w + j + 8 * k), vinv), lo, hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), narrow(v));
  }
  for (; j < cols; ++j) q[j] = static_cast<int8_t>(quant_level(w[j] * inv, -127.0f, 127.0f));
  *scale = s;
}

void quantize_int4_g64_row_avx2(const float* w, size_t cols, uint8_t* packed, float* scales) {
  const __m256 lo = _mm256_set1_ps(-8.0f), hi = _mm256_set1_ps(7.0f);
  const __m256i eight = _mm256_set1_epi32(8);
  const __m256i low_nibble = _mm256_set1_epi16(0x000F), high_nibble = _mm256_set1_epi16(0x00F0);
  for (size_t g = 0; g < cols / 64; ++g) {
    const float* wg = w + g * 64;
    __m256 v[8];
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 8; ++k) {
      v[k] = _mm256_loadu_ps(wg + 8 * k);
      m = abs_max(m, v[k]);
    }
    const float s = int4_group_scale(horizontal_max(m));
    const __m256 vinv = _mm256_set1_ps(1.0f / s);
    __m256i level[8];  // q + 8, in [0, 15]
    for (int k = 0; k < 8; ++k)
      level[k] = _mm256_add_epi32(levels(_mm256_mul_ps(v[k], vinv), lo, hi), eight);
    __m256i pairs[2];  // 16-bit lanes: output byte j in the low byte
    for (int h = 0; h < 2; ++h) {
      const __m256i b = narrow(level + 4 * h);  // bytes of columns 32h .. 32h + 31
      pairs[h] = _mm256_or_si256(_mm256_and_si256(b, low_nibble),
                                 _mm256_and_si256(_mm256_srli_epi16(b, 4), high_nibble));
    }
    // packus interleaves the 128-bit lanes (qwords 0, 2, 1, 3 of the result are in order).
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(pairs[0], pairs[1]), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(packed + g * 32), bytes);
    scales[g] = s;
  }
}

}  // namespace k3::impl

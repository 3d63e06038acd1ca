// kernels/impl/mxfp4_x86_prepare.h — activation preparation shared by the AVX2 and AVX-512
// integer MXFP4 kernels (both TUs have AVX2). Internal linkage: each TU keeps its own copy.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/mxfp4.h"

namespace k3::impl {
namespace {

// Activations of rows [0, tn) and groups [c0, c0 + gc): per group 32 bytes with the columns of
// every 8 reordered as 0,2,4,6,1,3,5,7, and -12 * (sum of the group's 32 values).
void prepare(const int8_t* Q8, size_t cols, size_t tn, size_t c0, size_t gc, uint8_t* qp,
             int32_t* qs) {
  const __m256i order = _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15,  //
                                         0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  for (size_t t = 0; t < tn; ++t) {
    for (size_t g = 0; g < gc; ++g) {
      const __m256i v = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(Q8 + t * cols + (c0 + g) * kMxfp4Group));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qp + (t * gc + g) * kMxfp4Group),
                          _mm256_shuffle_epi8(v, order));
      // sum(q + 128) per 8 bytes, then fold.
      const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(v, bias), _mm256_setzero_si256());
      const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
      const __m128i s1 = _mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2));
      qs[t * gc + g] = -12 * (_mm_cvtsi128_si32(s1) - 32 * 128);
    }
  }
}

}  // namespace
}  // namespace k3::impl

// kernels/impl/x86_common.h — AVX2-level pieces shared by the AVX2 and AVX-512 kernel TUs (both
// are compiled with AVX2): the q8 activation preparation of the integer-dot paths (MXFP4 and
// int4), the 8x8 dword transpose, a horizontal sum and an aligned allocator. Internal linkage: each
// TU keeps its own copy.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <new>

namespace k3::impl {
namespace {

// The sum of v's 8 floats: the halves added, then pairs, then the last two.
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Aligned allocator for the kernels' thread-local buffers. Being a type of each translation unit,
// it also keeps their std::vector instantiations local: no weak symbol shared with another unit,
// whose copy, built with other instructions, the linker could pick
// (Style.SimdUnitsDefineNoSharedSymbols).
template <class T, size_t Align>
struct AlignedAlloc {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = AlignedAlloc<U, Align>;
  };
  AlignedAlloc() = default;
  template <class U>
  AlignedAlloc(const AlignedAlloc<U, Align>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{Align}));
  }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{Align}); }
  template <class U>
  bool operator==(const AlignedAlloc<U, Align>&) const {
    return true;
  }
};

// Activations of rows [0, tn) and 32-value groups [c0, c0 + gc) of Q8 [tn][cols]: per group 32
// bytes with the columns of every 8 reordered as 0,2,4,6,1,3,5,7 (qp [tn][gc][32]), and
// qs [tn][gc] = -weight_offset * (sum of the group's 32 values), the correction that turns
// dots against unsigned weights (w + weight_offset) into dots against w: 12 for MXFP4's doubled
// e2m1 + 12, 8 for int4 nibbles.
void prepare(const int8_t* Q8, size_t cols, size_t tn, size_t c0, size_t gc, int32_t weight_offset,
             uint8_t* qp, int32_t* qs) {
  const __m256i order = _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15,  //
                                         0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  for (size_t t = 0; t < tn; ++t) {
    for (size_t g = 0; g < gc; ++g) {
      const __m256i v =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Q8 + t * cols + (c0 + g) * 32));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qp + (t * gc + g) * 32),
                          _mm256_shuffle_epi8(v, order));
      // sum(q + 128) per 8 bytes, then fold.
      const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(v, bias), _mm256_setzero_si256());
      const __m128i s2 =
          _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
      const __m128i s1 = _mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2));
      qs[t * gc + g] = -weight_offset * (_mm_cvtsi128_si32(s1) - 32 * 128);
    }
  }
}

// r[i] = the 8 dwords of row i -> r[c] = dword c of the 8 rows (lane i = row i).
inline void transpose8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // u[4i + c], 128-bit lane L: column 4L + c of rows 4i..4i+3.
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
  }
}

}  // namespace
}  // namespace k3::impl

// kernels_test — MXFP4 decoding and its exact matvec (kernels/mxfp4.h), BF16/F16 conversions
// (kernels/convert.h), the scalar f32 and exact MXFP4 kernels (kernels/isa.h) and the vector
// helpers (kernels/vec.h), against double-precision references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/convert.h"
#include "kernels/isa.h"
#include "kernels/mxfp4.h"
#include "kernels/vec.h"
#include "test_util.h"

namespace {

using k3::testing::bits_of;
using k3::testing::random_floats;

// The scalar twins through the kernel table, in the shapes these tests were written for.
void matvec_mxfp4_f32_exact(const uint8_t* packed, const uint8_t* scales, size_t rows, size_t cols,
                            const float* x, float* y) {
  k3::kernel_table(k3::Isa::kScalar)
      .matmul_mxfp4_exact(packed, scales, cols, x, 1, y, rows, 0, rows);
}
void matvec_f32(const float* W, size_t rows, size_t cols, const float* x, float* y) {
  k3::kernel_table(k3::Isa::kScalar).matmul_f32(W, cols, x, 1, y, rows, 0, rows);
}
void matmul_f32(const float* W, size_t rows, size_t cols, const float* X, size_t n, float* Y) {
  k3::kernel_table(k3::Isa::kScalar).matmul_f32(W, cols, X, n, Y, rows, 0, rows);
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

const double kE2M1Ref[16] = {0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6};

// ---------------------------------------------------------------------------------------------
// MXFP4 decoding

TEST(Mxfp4Decode, AllSixteenCodes) {
  // One row of 32 columns: column c < 16 holds code c, the rest code 0.
  std::vector<uint8_t> packed(16, 0);
  for (int c = 0; c < 16; ++c) {
    const int j = c / 2;
    packed[static_cast<size_t>(j)] |= static_cast<uint8_t>((c & 1) ? (c << 4) : c);
  }
  const uint8_t scale = 127;
  for (int c = 0; c < 16; ++c) {
    const float w = k3::mxfp4_weight(packed.data(), &scale, 32, 0, static_cast<size_t>(c));
    EXPECT_EQ(w, static_cast<float>(kE2M1Ref[c])) << "code " << c;
    EXPECT_EQ(std::signbit(w), c >= 8) << "code " << c;
    EXPECT_EQ(k3::kE2M1[c], static_cast<float>(kE2M1Ref[c])) << "code " << c;
  }
  // Code 8 is negative zero.
  const float neg_zero = k3::mxfp4_weight(packed.data(), &scale, 32, 0, 8);
  EXPECT_EQ(neg_zero, 0.0f);
  EXPECT_TRUE(std::signbit(neg_zero));
  EXPECT_FALSE(std::signbit(k3::mxfp4_weight(packed.data(), &scale, 32, 0, 0)));
}

TEST(Mxfp4Decode, ExponentBytes) {
  for (int s : {1, 100, 120, 126, 127, 128, 130, 200, 253, 254}) {
    const float want = std::ldexp(1.0f, s - 127);
    EXPECT_EQ(k3::mxfp4_scale(static_cast<uint8_t>(s)), want) << s;
    EXPECT_TRUE(std::isnormal(k3::mxfp4_scale(static_cast<uint8_t>(s)))) << s;
    const uint8_t packed[16] = {0x72};  // col 0: code 2 (1.0), col 1: code 7 (6.0)
    const uint8_t scale = static_cast<uint8_t>(s);
    EXPECT_EQ(k3::mxfp4_weight(packed, &scale, 32, 0, 0), want) << s;
    if (s <= 252) {
      EXPECT_EQ(k3::mxfp4_weight(packed, &scale, 32, 0, 1), std::ldexp(6.0f, s - 127)) << s;
    }
  }
  // Every byte 1..254 is an exact power of two: its f32 bits are (s << 23).
  for (int s = 1; s <= 254; ++s)
    EXPECT_EQ(bits_of(k3::mxfp4_scale(static_cast<uint8_t>(s))), uint32_t(s) << 23) << s;
}

TEST(Mxfp4Decode, EdgeBytes) {
  // 0 -> 2^-127 exactly: a nonzero f32 subnormal (bits 0x00400000).
  const float s0 = k3::mxfp4_scale(0);
  EXPECT_NE(s0, 0.0f);
  EXPECT_EQ(std::fpclassify(s0), FP_SUBNORMAL);
  EXPECT_EQ(static_cast<double>(s0), std::ldexp(1.0, -127));
  EXPECT_EQ(bits_of(s0), 0x00400000u);
  const uint8_t packed[16] = {0x12};  // col 0 (low nibble): code 2 = 1.0, col 1: code 1 = 0.5
  const uint8_t zero = 0;
  EXPECT_EQ(static_cast<double>(k3::mxfp4_weight(packed, &zero, 32, 0, 0)), std::ldexp(1.0, -127));
  EXPECT_EQ(static_cast<double>(k3::mxfp4_weight(packed, &zero, 32, 0, 1)), std::ldexp(1.0, -128));
  // 255 -> NaN.
  EXPECT_TRUE(std::isnan(k3::mxfp4_scale(255)));
  const uint8_t nan_scale = 255;
  EXPECT_TRUE(std::isnan(k3::mxfp4_weight(packed, &nan_scale, 32, 0, 1)));
}

TEST(Mxfp4Decode, NibbleOrderAndScaleLayout) {
  // 3 rows x 64 columns: two groups per row, each with its own scale byte.
  const size_t rows = 3, cols = 64;
  std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 32);
  std::mt19937 rng(7);
  for (auto& b : packed) b = static_cast<uint8_t>(rng());
  for (size_t k = 0; k < scales.size(); ++k) scales[k] = static_cast<uint8_t>(121 + k);
  for (size_t o = 0; o < rows; ++o) {
    for (size_t i = 0; i < cols; ++i) {
      const uint8_t byte = packed[o * 32 + i / 2];
      const int code = (i % 2 == 0) ? (byte & 0xF) : (byte >> 4);
      const double want = kE2M1Ref[code] * std::ldexp(1.0, int(scales[o * 2 + i / 32]) - 127);
      EXPECT_EQ(static_cast<double>(k3::mxfp4_weight(packed.data(), scales.data(), cols, o, i)),
                want)
          << o << "," << i;
    }
  }
  // A hand-made byte: 0xA3 -> column 0 = code 3 (1.5), column 1 = code 10 (-1).
  std::vector<uint8_t> p(16, 0);
  p[0] = 0xA3;
  p[15] = 0x0F;  // column 30 = code 15 (-6), column 31 = 0
  const uint8_t s = 127;
  EXPECT_EQ(k3::mxfp4_weight(p.data(), &s, 32, 0, 0), 1.5f);
  EXPECT_EQ(k3::mxfp4_weight(p.data(), &s, 32, 0, 1), -1.0f);
  EXPECT_EQ(k3::mxfp4_weight(p.data(), &s, 32, 0, 30), -6.0f);
  EXPECT_EQ(k3::mxfp4_weight(p.data(), &s, 32, 0, 31), 0.0f);
}

// ---------------------------------------------------------------------------------------------
// MXFP4 exact matvec

struct Mxfp4Matrix {
  size_t rows, cols;
  std::vector<uint8_t> packed, scales;
};

Mxfp4Matrix random_mxfp4(size_t rows, size_t cols, std::mt19937& rng) {
  Mxfp4Matrix m{rows, cols, std::vector<uint8_t>(rows * cols / 2),
                std::vector<uint8_t>(rows * cols / 32)};
  for (auto& b : m.packed) b = static_cast<uint8_t>(rng());
  std::uniform_int_distribution<int> sd(118, 132);
  for (auto& s : m.scales) s = static_cast<uint8_t>(sd(rng));
  return m;
}

// The documented order, written out independently: per group, ga = sum in f32 in column order,
// then acc += ga * 2^(s - 127) in f32.
std::vector<float> mxfp4_hand_rolled(const Mxfp4Matrix& m, const std::vector<float>& x) {
  std::vector<float> y(m.rows);
  const size_t groups = m.cols / 32;
  for (size_t o = 0; o < m.rows; ++o) {
    float acc = 0.0f;
    for (size_t g = 0; g < groups; ++g) {
      float ga = 0.0f;
      for (size_t k = 0; k < 32; ++k) {
        const size_t i = g * 32 + k;
        const uint8_t byte = m.packed[o * (m.cols / 2) + i / 2];
        const int code = (i & 1) ? (byte >> 4) : (byte & 0xF);
        const float prod = x[i] * static_cast<float>(kE2M1Ref[code]);
        ga = ga + prod;
      }
      const float scale = std::ldexp(1.0f, int(m.scales[o * groups + g]) - 127);
      const float scaled = ga * scale;
      acc = acc + scaled;
    }
    y[o] = acc;
  }
  return y;
}

TEST(Mxfp4Matvec, MatchesDoubleReference) {
  std::mt19937 rng(1234);
  for (size_t cols : {32, 64, 96}) {
    for (size_t rows : {1, 5, 13, 31}) {
      const Mxfp4Matrix m = random_mxfp4(rows, cols, rng);
      const std::vector<float> x = random_floats(cols, rng);
      std::vector<float> y(rows, NAN);
      matvec_mxfp4_f32_exact(m.packed.data(), m.scales.data(), rows, cols, x.data(), y.data());
      for (size_t o = 0; o < rows; ++o) {
        double ref = 0.0, mag = 0.0;
        for (size_t i = 0; i < cols; ++i) {
          const double w = k3::mxfp4_weight(m.packed.data(), m.scales.data(), cols, o, i);
          ref += w * x[i];
          mag += std::fabs(w * x[i]);
        }
        EXPECT_LE(std::fabs(y[o] - ref), 1e-5 * std::max(std::fabs(ref), mag) + 1e-30)
            << "rows " << rows << " cols " << cols << " row " << o << ": " << y[o] << " vs " << ref;
      }
    }
  }
}

TEST(Mxfp4Matvec, BitExactToDocumentedOrder) {
  std::mt19937 rng(99);
  for (size_t cols : {32, 64, 96}) {
    for (size_t rows : {3, 13, 17}) {
      const Mxfp4Matrix m = random_mxfp4(rows, cols, rng);
      const std::vector<float> x = random_floats(cols, rng, 3.0f);
      std::vector<float> y(rows, NAN);
      matvec_mxfp4_f32_exact(m.packed.data(), m.scales.data(), rows, cols, x.data(), y.data());
      const std::vector<float> want = mxfp4_hand_rolled(m, x);
      for (size_t o = 0; o < rows; ++o)
        EXPECT_EQ(bits_of(y[o]), bits_of(want[o]))
            << "rows " << rows << " cols " << cols << " row " << o;
    }
  }
}

TEST(Mxfp4Matvec, SmallHandExample) {
  // One row, 64 columns: group 0 scale 2^1, group 1 scale 2^-2.
  std::vector<uint8_t> packed(32, 0), scales = {128, 125};
  packed[0] = 0x72;   // x0 * 1.0 + x1 * 6.0
  packed[16] = 0x9C;  // x32 * -2.0 + x33 * -0.5
  std::vector<float> x(64, 100.0f);
  x[0] = 1.0f;
  x[1] = 2.0f;
  x[32] = 4.0f;
  x[33] = 8.0f;
  float y = 0.0f;
  matvec_mxfp4_f32_exact(packed.data(), scales.data(), 1, 64, x.data(), &y);
  EXPECT_EQ(y, (1.0f + 12.0f) * 2.0f + (-8.0f - 4.0f) * 0.25f);
}

// ---------------------------------------------------------------------------------------------
// Conversions

TEST(KernelsConvert, Bf16WideningIsExactForEveryPattern) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h)
    ASSERT_EQ(bits_of(k3::bf16_to_f32(static_cast<uint16_t>(h))), h << 16) << std::hex << h;
  EXPECT_EQ(k3::bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(k3::bf16_to_f32(0xC040), -3.0f);
  EXPECT_EQ(k3::bf16_to_f32(0x4049), 3.140625f);
  EXPECT_EQ(static_cast<double>(k3::bf16_to_f32(0x0001)), std::ldexp(1.0, -133));  // subnormal
  EXPECT_EQ(static_cast<double>(k3::bf16_to_f32(0x8001)), -std::ldexp(1.0, -133));
  EXPECT_EQ(k3::bf16_to_f32(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(k3::bf16_to_f32(0xFF80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(k3::bf16_to_f32(0x7FC0)));
  EXPECT_TRUE(std::signbit(k3::bf16_to_f32(0x8000)));

  // Little-endian byte widening.
  const uint8_t src[] = {0x80, 0x3F, 0x40, 0xC0, 0x01, 0x00, 0x80, 0xFF};
  float dst[4];
  EXPECT_EQ(k3::widen_bf16(src, 4, dst), 3u) << "-Inf is the first non-finite element";
  EXPECT_EQ(dst[0], 1.0f);
  EXPECT_EQ(dst[1], -3.0f);
  EXPECT_EQ(bits_of(dst[2]), 0x00010000u);
  EXPECT_EQ(dst[3], -std::numeric_limits<float>::infinity());
}

// The widening converters report the first non-finite element (NaN, +Inf, -Inf) wherever it lies,
// and only those: the largest finite values, subnormals and signed zeros pass. Every element is
// still converted.
TEST(KernelsConvert, WideningReportsTheFirstNonFiniteElement) {
  const size_t n = 3001;
  std::vector<uint8_t> bf16(2 * n), f16(2 * n);
  std::vector<float> f32(n), out(n);
  const uint16_t finite_bf16[] = {0x7F7F, 0xFF7F, 0x0001, 0x8000, 0x3F80};
  const uint16_t finite_f16[] = {0x7BFF, 0xFBFF, 0x0001, 0x8000, 0x3C00};
  const auto put = [](std::vector<uint8_t>& v, size_t i, uint16_t h) {
    v[2 * i] = static_cast<uint8_t>(h);
    v[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  };
  const auto fill = [&] {
    for (size_t i = 0; i < n; ++i) {
      put(bf16, i, finite_bf16[i % 5]);
      put(f16, i, finite_f16[i % 5]);
      f32[i] = k3::bf16_to_f32(finite_bf16[i % 5]);
    }
  };
  fill();
  EXPECT_EQ(k3::widen_bf16(bf16.data(), n, out.data()), n);
  EXPECT_EQ(k3::widen_f16(f16.data(), n, out.data()), n);
  EXPECT_EQ(k3::find_non_finite(f32.data(), n), n);
  EXPECT_EQ(k3::find_non_finite(f32.data(), 0), 0u);
  // NaN (quiet and signalling, either sign), +Inf and -Inf.
  const uint16_t bad_bf16[] = {0x7FC0, 0x7F81, 0x7F80, 0xFF80, 0xFFC1};
  const uint16_t bad_f16[] = {0x7E00, 0x7C01, 0x7C00, 0xFC00, 0xFE01};
  for (const size_t at : {size_t{0}, size_t{1}, size_t{1023}, size_t{1024}, size_t{2999}, n - 1}) {
    for (int k = 0; k < 5; ++k) {
      fill();
      put(bf16, at, bad_bf16[k]);
      put(f16, at, bad_f16[k]);
      f32[at] = k3::bf16_to_f32(bad_bf16[k]);
      if (at + 1 < n) {  // a second one later: the first is reported
        put(bf16, n - 1, 0x7FC0);
        put(f16, n - 1, 0x7E00);
        f32[n - 1] = k3::bf16_to_f32(0x7FC0);
      }
      EXPECT_EQ(k3::widen_bf16(bf16.data(), n, out.data()), at) << at << " " << k;
      EXPECT_EQ(bits_of(out[at]), static_cast<uint32_t>(bad_bf16[k]) << 16);
      EXPECT_EQ(bits_of(out[n / 2]), static_cast<uint32_t>(finite_bf16[(n / 2) % 5]) << 16);
      EXPECT_EQ(k3::widen_f16(f16.data(), n, out.data()), at) << at << " " << k;
      EXPECT_EQ(k3::find_non_finite(f32.data(), n), at) << at << " " << k;
    }
  }
}

TEST(KernelsConvert, F32ToBf16RoundsToNearestEven) {
  EXPECT_EQ(k3::f32_to_bf16(1.0f), 0x3F80);
  // Ties go to the even mantissa.
  EXPECT_EQ(k3::f32_to_bf16(float_of(0x3F808000)), 0x3F80);  // tie, 0x3F80 is even
  EXPECT_EQ(k3::f32_to_bf16(float_of(0x3F818000)), 0x3F82);  // tie, 0x3F81 odd -> up
  EXPECT_EQ(k3::f32_to_bf16(float_of(0xBF818000)), 0xBF82);  // negative tie
  EXPECT_EQ(k3::f32_to_bf16(float_of(0xBF808000)), 0xBF80);
  // Off-tie values go to the nearest.
  EXPECT_EQ(k3::f32_to_bf16(float_of(0x3F808001)), 0x3F81);
  EXPECT_EQ(k3::f32_to_bf16(float_of(0x3F807FFF)), 0x3F80);
  EXPECT_EQ(k3::f32_to_bf16(float_of(0x3F81FFFF)), 0x3F82);
  // Subnormal tie, carry into the exponent, overflow to infinity.
  EXPECT_EQ(k3::f32_to_bf16(float_of(0x00018000)), 0x0002);
  EXPECT_EQ(k3::f32_to_bf16(float_of(0x3FFFFFFF)), 0x4000);
  EXPECT_EQ(k3::f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(k3::f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(k3::f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(k3::f32_to_bf16(-0.0f), 0x8000);
  // NaN stays NaN, quiet (even a signalling NaN whose payload sits in the low half).
  EXPECT_TRUE(
      std::isnan(k3::bf16_to_f32(k3::f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  const uint16_t snan = k3::f32_to_bf16(float_of(0x7F800001));
  EXPECT_TRUE(std::isnan(k3::bf16_to_f32(snan)));
  EXPECT_TRUE(snan & 0x40);
  EXPECT_TRUE(std::isnan(k3::bf16_to_f32(k3::f32_to_bf16(float_of(0xFF800001)))));
  // Every non-NaN bf16 survives a round trip.
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = k3::bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(k3::f32_to_bf16(f), h) << std::hex << h;
  }
}

TEST(KernelsConvert, F16Widening) {
  EXPECT_EQ(k3::f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(k3::f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(k3::f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(k3::f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(k3::f16_to_f32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(k3::f16_to_f32(0x03FF), 1023.0f * std::ldexp(1.0f, -24));
  EXPECT_EQ(k3::f16_to_f32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(k3::f16_to_f32(0x3555), 0.333251953125f);  // 1365 / 4096
  EXPECT_EQ(k3::f16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(k3::f16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(k3::f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(k3::f16_to_f32(0x7C01)));
  EXPECT_EQ(k3::f16_to_f32(0x0000), 0.0f);
  EXPECT_FALSE(std::signbit(k3::f16_to_f32(0x0000)));
  EXPECT_TRUE(std::signbit(k3::f16_to_f32(0x8000)));
  // Every pattern against the textbook formula, evaluated in double.
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const int sign = (h >> 15) & 1, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 31) continue;
    const double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(double(1024 + m), e - 25);
    const double want = sign ? -mag : mag;
    const float got = k3::f16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
    ASSERT_EQ(std::signbit(got), sign == 1) << std::hex << h;
  }
  const uint8_t src[] = {0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B, 0x01, 0x00};
  float dst[4];
  EXPECT_EQ(k3::widen_f16(src, 4, dst), 4u);
  EXPECT_EQ(dst[0], 1.0f);
  EXPECT_EQ(dst[1], -2.0f);
  EXPECT_EQ(dst[2], 65504.0f);
  EXPECT_EQ(dst[3], std::ldexp(1.0f, -24));
}

// ---------------------------------------------------------------------------------------------
// Dense matvec / matmul

TEST(KernelsMatvec, MatchesDoubleReferenceOnAwkwardSizes) {
  std::mt19937 rng(5);
  for (size_t rows : {1, 7, 33}) {
    for (size_t cols : {1, 5, 63, 130}) {
      const auto W = random_floats(rows * cols, rng);
      const auto x = random_floats(cols, rng);
      std::vector<float> y(rows, NAN);
      matvec_f32(W.data(), rows, cols, x.data(), y.data());
      for (size_t o = 0; o < rows; ++o) {
        double ref = 0, mag = 0;
        for (size_t i = 0; i < cols; ++i) {
          ref += double(W[o * cols + i]) * x[i];
          mag += std::fabs(double(W[o * cols + i]) * x[i]);
        }
        EXPECT_LE(std::fabs(y[o] - ref), 1e-6 * mag + 1e-30)
            << rows << "x" << cols << " row " << o << ": " << y[o] << " vs " << ref;
      }
    }
  }
}

TEST(KernelsMatvec, LargeEnoughForThreads) {
  // Above the OpenMP threshold; results must still match the reference row by row.
  std::mt19937 rng(6);
  const size_t rows = 300, cols = 515;
  const auto W = random_floats(rows * cols, rng);
  const auto x = random_floats(cols, rng);
  std::vector<float> y(rows, NAN);
  matvec_f32(W.data(), rows, cols, x.data(), y.data());
  for (size_t o = 0; o < rows; ++o) {
    double ref = 0, mag = 0;
    for (size_t i = 0; i < cols; ++i) {
      ref += double(W[o * cols + i]) * x[i];
      mag += std::fabs(double(W[o * cols + i]) * x[i]);
    }
    ASSERT_LE(std::fabs(y[o] - ref), 1e-6 * mag) << o;
  }
}

TEST(KernelsMatmul, RowsEqualMatvecExactly) {
  std::mt19937 rng(8);
  for (size_t rows : {1, 7, 33, 200}) {
    for (size_t cols : {1, 5, 63, 130, 513}) {
      for (size_t n_rows : {1, 3, 4}) {
        const auto W = random_floats(rows * cols, rng);
        const auto X = random_floats(n_rows * cols, rng);
        std::vector<float> Y(n_rows * rows, NAN);
        matmul_f32(W.data(), rows, cols, X.data(), n_rows, Y.data());
        for (size_t t = 0; t < n_rows; ++t) {
          std::vector<float> y(rows, NAN);
          matvec_f32(W.data(), rows, cols, X.data() + t * cols, y.data());
          for (size_t o = 0; o < rows; ++o) {
            ASSERT_EQ(bits_of(Y[t * rows + o]), bits_of(y[o]))
                << rows << "x" << cols << " n=" << n_rows << " t=" << t << " o=" << o;
            double ref = 0, mag = 0;
            for (size_t i = 0; i < cols; ++i) {
              ref += double(W[o * cols + i]) * X[t * cols + i];
              mag += std::fabs(double(W[o * cols + i]) * X[t * cols + i]);
            }
            ASSERT_LE(std::fabs(Y[t * rows + o] - ref), 1e-6 * mag + 1e-30);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Vector helpers

TEST(KernelsVec, RmsnormMatchesDouble) {
  std::mt19937 rng(11);
  for (size_t n : {1, 7, 64, 1000}) {
    for (double eps : {1e-5, 1e-6}) {
      const auto x = random_floats(n, rng, 0.3f);
      const auto w = random_floats(n, rng);
      std::vector<float> out(n, NAN);
      k3::rmsnorm(x.data(), w.data(), n, eps, out.data());
      double ss = 0;
      for (float v : x) ss += double(v) * v;
      const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
      for (size_t i = 0; i < n; ++i) {
        const double ref = double(x[i]) * inv * w[i];
        EXPECT_NEAR(out[i], ref, 4e-7 * std::fabs(ref) + 1e-30) << n << " " << i;
      }
      // In place.
      std::vector<float> y = x;
      k3::rmsnorm(y.data(), w.data(), n, eps, y.data());
      EXPECT_EQ(y, out);
    }
  }
  // eps matters for small inputs: x = 1e-3 everywhere, w = 1 -> 1e-3 / sqrt(1e-6 + eps).
  const std::vector<float> x(16, 1e-3f), w(16, 1.0f);
  std::vector<float> out(16);
  k3::rmsnorm(x.data(), w.data(), 16, 1e-5, out.data());
  EXPECT_NEAR(out[0], 1e-3 / std::sqrt(1e-6 + 1e-5), 1e-6);
}

TEST(KernelsVec, L2NormalizeMatchesDouble) {
  std::mt19937 rng(12);
  for (size_t n : {1, 16, 128, 777}) {
    auto x = random_floats(n, rng, 2.0f);
    const auto orig = x;
    k3::l2_normalize(x.data(), n, 1e-6);
    double ss = 0;
    for (float v : orig) ss += double(v) * v;
    const double inv = 1.0 / std::sqrt(ss + 1e-6);
    double norm2 = 0;
    for (size_t i = 0; i < n; ++i) {
      const double ref = orig[i] * inv;
      EXPECT_NEAR(x[i], ref, 4e-7 * std::fabs(ref) + 1e-30) << n << " " << i;
      norm2 += double(x[i]) * x[i];
    }
    EXPECT_NEAR(norm2, ss / (ss + 1e-6), 1e-5);
  }
  // eps is added to the sum of squares (not to the norm): [1e-3] -> 1e-3 / sqrt(1e-6 + 1e-6).
  float v = 1e-3f;
  k3::l2_normalize(&v, 1, 1e-6);
  EXPECT_NEAR(v, 1e-3 / std::sqrt(2e-6), 1e-6);
  // All zeros stay zero.
  std::vector<float> z(8, 0.0f);
  k3::l2_normalize(z.data(), 8, 1e-6);
  for (float e : z) EXPECT_EQ(e, 0.0f);
}

TEST(KernelsVec, SoftmaxMatchesDouble) {
  std::mt19937 rng(13);
  for (size_t n : {1, 2, 10, 1024}) {
    auto x = random_floats(n, rng, 5.0f);
    x[0] += 80.0f;  // large values must not overflow (max is subtracted)
    const auto orig = x;
    k3::softmax(x.data(), n);
    double mx = orig[0];
    for (float v : orig) mx = std::max(mx, double(v));
    double sum = 0;
    for (float v : orig) sum += std::exp(double(v) - mx);
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
      const double ref = std::exp(double(orig[i]) - mx) / sum;
      EXPECT_NEAR(x[i], ref, 2e-6 * ref + 1e-30) << n << " " << i;
      EXPECT_GE(x[i], 0.0f);
      total += x[i];
    }
    EXPECT_NEAR(total, 1.0, 1e-5);
  }
  std::vector<float> big = {1000.0f, 1000.0f, -1000.0f};
  k3::softmax(big.data(), 3);
  EXPECT_FLOAT_EQ(big[0], 0.5f);
  EXPECT_FLOAT_EQ(big[1], 0.5f);
  EXPECT_EQ(big[2], 0.0f);
  k3::softmax(nullptr, 0);  // no-op
}

TEST(KernelsVec, DotAndActivations) {
  std::mt19937 rng(14);
  const auto a = random_floats(101, rng), b = random_floats(101, rng);
  double ref = 0;
  for (size_t i = 0; i < 101; ++i) ref += double(a[i]) * b[i];
  EXPECT_EQ(k3::dot_f64(a.data(), b.data(), 101), ref);
  EXPECT_FLOAT_EQ(k3::sigmoid(0.0f), 0.5f);
  EXPECT_NEAR(k3::silu(2.0f), 2.0 / (1.0 + std::exp(-2.0)), 1e-6);
  for (float g : {-3.0f, -0.5f, 0.0f, 0.7f, 9.0f}) {
    for (float u : {-40.0f, -1.0f, 0.3f, 30.0f}) {
      const double want =
          4.0 * std::tanh(g / 4.0) / (1.0 + std::exp(-double(g))) * 25.0 * std::tanh(u / 25.0);
      EXPECT_NEAR(k3::situ(g, u, 4.0f, 25.0f), want, 1e-5 * std::max(1.0, std::fabs(want)))
          << g << " " << u;
    }
  }
}

// SiTU's own exp and tanh (kernels/vec.h): within 1.5 and 2 ulps of the double-precision values
// over every 509th float of their ranges (measured over every 97th: 1.00 and 1.51, glibc's tanhf
// 2.19), and their edges: the clamp of exp, saturation and odd symmetry of tanh, NaN.
// |got - want| in units of the float spacing at want: the smaller of the two gaps around the
// float nearest want (below a power of two the spacing halves).
double ulps_from(float got, double want) {
  const float w = std::fabs(static_cast<float>(want));
  const double ulp = std::min(std::nextafter(w, INFINITY) - w, w - std::nextafter(w, 0.0f));
  return std::fabs(got - want) / ulp;
}

TEST(KernelsVec, SituExpAndTanhWithinTwoUlps) {
  double worst_exp = 0, worst_tanh = 0;
  for (uint64_t b = 0; b <= 0xFFFFFFFFu; b += 509) {
    const float x = float_of(static_cast<uint32_t>(b));
    if (!std::isfinite(x)) continue;
    if (x >= -87.0f && x <= 88.0f)
      worst_exp = std::max(worst_exp, ulps_from(k3::situ_exp(x), std::exp(double(x))));
    if (std::fabs(x) > 1e-30f)  // below, tanh(x) = x exactly; ulps of denormals say nothing
      worst_tanh = std::max(worst_tanh, ulps_from(k3::situ_tanh(x), std::tanh(double(x))));
  }
  std::printf("situ_exp: %.3f ulp at worst, situ_tanh: %.3f ulp\n", worst_exp, worst_tanh);
  EXPECT_LE(worst_exp, 1.5);
  EXPECT_LE(worst_tanh, 2.0);
  EXPECT_EQ(k3::situ_exp(0.0f), 1.0f);
  EXPECT_EQ(k3::situ_exp(-1000.0f), k3::situ_exp(-87.0f));  // clamped: a normal float
  EXPECT_EQ(k3::situ_exp(1000.0f), k3::situ_exp(88.0f));
  EXPECT_GT(k3::situ_exp(-87.0f), 0.0f);
  EXPECT_TRUE(std::isnan(k3::situ_exp(NAN)));
  EXPECT_EQ(k3::situ_tanh(30.0f), 1.0f);
  EXPECT_EQ(k3::situ_tanh(-INFINITY), -1.0f);
  EXPECT_EQ(k3::situ_tanh(-0.0f), 0.0f);
  for (float x : {0.1f, 0.6249f, 0.625f, 3.0f, 9.5f})
    EXPECT_EQ(k3::situ_tanh(-x), -k3::situ_tanh(x)) << x;
  EXPECT_TRUE(std::isnan(k3::situ_tanh(NAN)));
  EXPECT_TRUE(std::isnan(k3::situ(NAN, 1.0f, 4.0f, 25.0f)));
  EXPECT_TRUE(std::isnan(k3::situ(1.0f, NAN, 4.0f, 25.0f)));
}

}  // namespace

// dense_kernels_test — the dense kernels of every ISA variant (kernels/isa.h: f32, int8 per row,
// int4 group-64) against the scalar twins and a double-precision reference on awkward sizes and
// row ranges; the load-time quantisers (kernels/quant.h) against hand-computed cases; the threaded
// wrapper k3::matmul (kernels/matmul.h) against the single-threaded table call.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/vec.h"
#include "test_util.h"

namespace {

using k3::testing::bits_of;
using k3::testing::random_floats;

// The SIMD variants twin_isas() leaves out, as skipped tests (tests/test_util.h).
K3_TWIN_ISA_TESTS(DenseKernels)

using k3::Isa;
using k3::KernelTable;
using k3::WeightFormat;
using k3::WeightMatrix;

// Largest |Y - Y_ref| allowed, relative to max |Y_ref| over all outputs of the call (Y_ref: the
// double reference or the scalar twin). The SIMD variants only reorder the f32 sums (int4 also
// folds the group scale into the dequantised weight), so the error is f32 rounding of sums of
// up to 1088 random products: seen up to 1.7e-5 (one output, 1000 columns, where |y| is small
// against the terms). A wrong column, tail, scale or nibble costs >= 1e-3.
constexpr double kF32Tol = 5e-5;
constexpr double kInt8Tol = 5e-5;
constexpr double kInt4Tol = 5e-5;

// Outputs outside the row range (and the ldy padding) must keep this exact value.
constexpr float kSentinel = -1234.5f;

const std::vector<size_t> kRows = {1, 3, 17, 67};
const std::vector<size_t> kDenseCols = {1, 7, 64, 100, 131, 1000};
const std::vector<size_t> kInt4Cols = {64, 128, 192, 1088};
const std::vector<size_t> kNs = {1, 2, 3, 5, 8, 13, 64};

// A matrix quantised to `format` plus its dequantised weights in double.
struct Case {
  WeightMatrix m;
  std::vector<double> deq;  // [rows][cols]
};

Case make_case(WeightFormat format, size_t rows, size_t cols, std::mt19937& rng) {
  Case c;
  c.m.rows = static_cast<int64_t>(rows);
  c.m.cols = static_cast<int64_t>(cols);
  const std::vector<float> w = random_floats(rows * cols, rng);
  c.m.f32.assign(w.begin(), w.end());
  c.deq.resize(rows * cols);
  if (format == WeightFormat::kF32) {
    for (size_t i = 0; i < rows * cols; ++i) c.deq[i] = c.m.f32[i];
    return c;
  }
  k3::quantize_matrix(c.m, format == WeightFormat::kInt8Row ? 8 : 4,
                      k3::kernel_table(k3::best_isa()));
  EXPECT_EQ(c.m.format, format);
  for (size_t o = 0; o < rows; ++o)
    for (size_t i = 0; i < cols; ++i) {
      if (format == WeightFormat::kInt8Row) {
        c.deq[o * cols + i] = static_cast<double>(c.m.scales[o]) * c.m.q8[o * cols + i];
      } else {
        const uint8_t b = c.m.q4[o * cols / 2 + i / 2];
        const int nib = (i % 2 == 0) ? (b & 0xF) : (b >> 4);
        c.deq[o * cols + i] = static_cast<double>(c.m.scales[o * cols / 64 + i / 64]) * (nib - 8);
      }
    }
  return c;
}

// One table call over rows [begin, end) into a sentinel-filled Y of row stride ldy.
std::vector<float> run_kernel(const KernelTable& k, const WeightMatrix& m,
                              const std::vector<float>& X, size_t n, size_t ldy, size_t begin,
                              size_t end) {
  std::vector<float> Y(n * ldy, kSentinel);
  const size_t cols = static_cast<size_t>(m.cols);
  switch (m.format) {
    case WeightFormat::kF32:
      k.matmul_f32(m.f32.data(), cols, X.data(), n, Y.data(), ldy, begin, end);
      break;
    case WeightFormat::kInt8Row:
      k.matmul_int8(m.q8.data(), m.scales.data(), cols, X.data(), n, Y.data(), ldy, begin, end);
      break;
    case WeightFormat::kInt4G64:
      k.matmul_int4(m.q4.data(), m.scales.data(), cols, X.data(), n, Y.data(), ldy, begin, end);
      break;
  }
  return Y;
}

double tolerance(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return kF32Tol;
    case WeightFormat::kInt8Row:
      return kInt8Tol;
    case WeightFormat::kInt4G64:
      return kInt4Tol;
  }
  return 0.0;
}

// Every ISA against the scalar twin and the double reference, over every size and a few row
// ranges (full, interior, single row at the end).
void check_format(WeightFormat format, const std::vector<size_t>& rows_list,
                  const std::vector<size_t>& cols_list, const std::vector<size_t>& n_list) {
  std::mt19937 rng(1234 + static_cast<int>(format));
  const KernelTable& scalar = k3::kernel_table(Isa::kScalar);
  const double tol = tolerance(format);
  double worst = 0.0;
  for (size_t rows : rows_list)
    for (size_t cols : cols_list) {
      const Case c = make_case(format, rows, cols, rng);
      for (size_t n : n_list) {
        const std::vector<float> X = random_floats(n * cols, rng);
        const size_t ldy = rows + 3;
        // Double reference over all rows.
        std::vector<double> ref(n * rows);
        double ymax = 0.0;
        for (size_t t = 0; t < n; ++t)
          for (size_t o = 0; o < rows; ++o) {
            double acc = 0.0;
            for (size_t i = 0; i < cols; ++i) acc += c.deq[o * cols + i] * X[t * cols + i];
            ref[t * rows + o] = acc;
            ymax = std::max(ymax, std::fabs(acc));
          }
        ASSERT_GT(ymax, 0.0);
        std::vector<std::pair<size_t, size_t>> ranges = {{0, rows}};
        if (rows >= 3) ranges.push_back({1, rows - 1});
        if (rows >= 17) ranges.push_back({rows / 3, rows / 3 + 5});
        ranges.push_back({rows - 1, rows});
        for (auto [begin, end] : ranges) {
          const std::vector<float> ys = run_kernel(scalar, c.m, X, n, ldy, begin, end);
          for (Isa isa : k3::testing::twin_isas()) {
            SCOPED_TRACE(std::string(k3::isa_name(isa)) + " " + k3::weight_format_name(format) +
                         " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                         " n=" + std::to_string(n) + " range=[" + std::to_string(begin) + "," +
                         std::to_string(end) + ")");
            const std::vector<float> y =
                run_kernel(k3::kernel_table(isa), c.m, X, n, ldy, begin, end);
            double err_ref = 0.0, err_scalar = 0.0;
            size_t bad_untouched = 0;
            for (size_t t = 0; t < n; ++t)
              for (size_t o = 0; o < ldy; ++o) {
                const float v = y[t * ldy + o];
                if (o < begin || o >= end) {
                  bad_untouched += bits_of(v) != bits_of(kSentinel);
                  continue;
                }
                err_ref = std::max(err_ref, std::fabs(v - ref[t * rows + o]));
                err_scalar =
                    std::max(err_scalar, std::fabs(static_cast<double>(v) - ys[t * ldy + o]));
              }
            EXPECT_EQ(bad_untouched, 0u) << "outputs outside the row range were written";
            EXPECT_LE(err_ref / ymax, tol) << "vs double reference";
            EXPECT_LE(err_scalar / ymax, tol) << "vs scalar twin";
            worst = std::max({worst, err_ref / ymax, err_scalar / ymax});
          }
        }
      }
    }
  ::testing::Test::RecordProperty("worst_relative_error", std::to_string(worst));
  std::printf("%s: worst relative error %.3g (tolerance %.3g)\n", k3::weight_format_name(format),
              worst, tol);
}

TEST(KernelsDense, F32EveryIsaMatchesScalarAndDouble) {
  check_format(WeightFormat::kF32, kRows, kDenseCols, kNs);
}

TEST(KernelsDense, Int8EveryIsaMatchesScalarAndDouble) {
  check_format(WeightFormat::kInt8Row, kRows, kDenseCols, kNs);
}

TEST(KernelsDense, Int4EveryIsaMatchesScalarAndDouble) {
  check_format(WeightFormat::kInt4G64, kRows, kInt4Cols, kNs);
}

// More activation rows than one accumulator block of the panel paths (64).
TEST(KernelsDense, ManyActivationRows) {
  check_format(WeightFormat::kF32, {9}, {131}, {65, 131});
  check_format(WeightFormat::kInt8Row, {9}, {131}, {65, 131});
  check_format(WeightFormat::kInt4G64, {9}, {192}, {65, 131});
}

TEST(KernelsDense, EmptyRangeOrNoRowsWritesNothing) {
  std::mt19937 rng(7);
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kInt8Row, WeightFormat::kInt4G64}) {
    const Case c = make_case(format, 9, 128, rng);
    const std::vector<float> X = random_floats(3 * 128, rng);
    for (Isa isa : k3::testing::twin_isas()) {
      const KernelTable& k = k3::kernel_table(isa);
      for (const auto& y : {run_kernel(k, c.m, X, 3, 9, 4, 4), run_kernel(k, c.m, X, 0, 9, 0, 9)})
        for (float v : y) EXPECT_EQ(bits_of(v), bits_of(kSentinel)) << k3::isa_name(isa);
    }
  }
}

// The result of a row does not depend on the range it was computed in (so threading by rows
// cannot change results).
TEST(KernelsDense, RowsIndependentOfRange) {
  std::mt19937 rng(11);
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kInt8Row, WeightFormat::kInt4G64}) {
    const size_t rows = 23, cols = format == WeightFormat::kInt4G64 ? 192 : 131;
    const Case c = make_case(format, rows, cols, rng);
    for (size_t n : {1, 2, 6, 13}) {
      const std::vector<float> X = random_floats(n * cols, rng);
      for (Isa isa : k3::testing::twin_isas()) {
        const KernelTable& k = k3::kernel_table(isa);
        const std::vector<float> full = run_kernel(k, c.m, X, n, rows, 0, rows);
        std::vector<float> pieces(n * rows, kSentinel);
        for (auto [b, e] : {std::pair<size_t, size_t>{0, 5}, {5, 6}, {6, 13}, {13, 23}}) {
          const std::vector<float> part = run_kernel(k, c.m, X, n, rows, b, e);
          for (size_t t = 0; t < n; ++t)
            for (size_t o = b; o < e; ++o) pieces[t * rows + o] = part[t * rows + o];
        }
        for (size_t i = 0; i < full.size(); ++i)
          ASSERT_EQ(bits_of(full[i]), bits_of(pieces[i]))
              << k3::isa_name(isa) << " " << k3::weight_format_name(format) << " n=" << n
              << " i=" << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// k3::matmul (threaded) equals the single-threaded table call exactly.

TEST(KernelsDenseMatmul, ThreadedEqualsSingleCallExactly) {
  std::mt19937 rng(5);
  const int saved = omp_get_max_threads();
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kInt8Row, WeightFormat::kInt4G64}) {
    const size_t rows = 301, cols = format == WeightFormat::kInt4G64 ? 1088 : 1000;
    const Case c = make_case(format, rows, cols, rng);
    for (size_t n : {1, 5, 64}) {
      const std::vector<float> X = random_floats(n * cols, rng);
      for (Isa isa : k3::testing::twin_isas()) {
        const KernelTable& k = k3::kernel_table(isa);
        const std::vector<float> single = run_kernel(k, c.m, X, n, rows, 0, rows);
        for (int threads : {1, 2, 3}) {
          omp_set_num_threads(threads);
          std::vector<float> y(n * rows, kSentinel);
          k3::matmul(k, c.m, X.data(), n, y.data());
          for (size_t i = 0; i < y.size(); ++i)
            ASSERT_EQ(bits_of(y[i]), bits_of(single[i]))
                << k3::isa_name(isa) << " " << k3::weight_format_name(format) << " n=" << n
                << " threads=" << threads << " i=" << i;
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

// k3::matmul_row_ranges (the grammar-constrained head) writes exactly the rows of its ranges, each
// bit-identical to k3::matmul's, whatever the thread count; float and integer-dot activations.
TEST(KernelsDenseMatmul, RowRangesEqualTheFullMatmulOnTheirRows) {
  std::mt19937 rng(7);
  const int saved = omp_get_max_threads();
  const std::vector<k3::RowRange> ranges = {{0, 1}, {5, 21}, {64, 65}, {100, 301}};
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kInt8Row, WeightFormat::kInt4G64}) {
    const size_t rows = 301, cols = format == WeightFormat::kInt4G64 ? 1088 : 1024;
    Case c = make_case(format, rows, cols, rng);
    for (bool idot : {false, true}) {
      if (idot && format == WeightFormat::kF32) continue;
      c.m.int8_activations = idot;
      for (size_t n : {1, 3}) {
        const std::vector<float> X = random_floats(n * cols, rng);
        for (Isa isa : k3::testing::twin_isas()) {
          const KernelTable& k = k3::kernel_table(isa);
          std::vector<float> full(n * rows, kSentinel);
          k3::matmul(k, c.m, X.data(), n, full.data());
          for (int threads : {1, 2, 3}) {
            omp_set_num_threads(threads);
            std::vector<float> y(n * rows, kSentinel);
            k3::matmul_row_ranges(k, c.m, X.data(), n, ranges, y.data());
            for (size_t t = 0; t < n; ++t)
              for (size_t o = 0; o < rows; ++o) {
                const bool in = std::any_of(ranges.begin(), ranges.end(), [&](const auto& r) {
                  return o >= r.begin && o < r.end;
                });
                const float want = in ? full[t * rows + o] : kSentinel;
                ASSERT_EQ(bits_of(y[t * rows + o]), bits_of(want))
                    << k3::isa_name(isa) << " " << k3::weight_format_name(format)
                    << " idot=" << idot << " n=" << n << " threads=" << threads << " row " << o;
              }
          }
          omp_set_num_threads(saved);
        }
      }
    }
  }
  std::vector<float> y(301, kSentinel);
  const Case c = make_case(WeightFormat::kF32, 301, 64, rng);
  const std::vector<float> x = random_floats(64, rng);
  const std::vector<k3::RowRange> outside = {{300, 302}};
  EXPECT_HAS(k3::testing::error_of([&] {
               k3::matmul_row_ranges(k3::kernel_table(Isa::kScalar), c.m, x.data(), 1, outside,
                                     y.data());
             }),
             "rows [300, 302) outside the matrix's 301");
}

// The bits of a SiTU result, every NaN as one pattern (a NaN's payload may depend on which
// operand an instruction takes first).
std::vector<uint32_t> situ_bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::isnan(v[i]) ? 0x7FC00000u : bits_of(v[i]);
  return out;
}

// situ_glu: element by element the scalar SiTU of kernels/vec.h on every ISA (the SIMD rows and
// their scalar tails, special values included), each 32-group then quantised by the table's
// quantize_q8_32, whatever the thread count; three pairs of betas; sizes below and above its
// one-thread threshold (16,384 elements on the SIMD tables, 128 on the scalar one), and a partial
// last group.
TEST(KernelsDenseMatmul, SituGluEqualsTheScalarLoopOnEveryThreadCount) {
  std::mt19937 rng(8);
  const int saved = omp_get_max_threads();
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,     -0.0f,   inf,     -inf,     NAN,    2.5f,   -2.5f,  2.4999f,
                            -2.4999f, 15.624f, 15.626f, -15.626f, 90.0f,  -90.0f, 400.0f, -400.0f,
                            1e-30f,   -1e-30f, 3e38f,   -3e38f,   1e-40f, 36.0f,  -36.0f, 1.0f};
  struct Betas {
    float beta, beta_linear;
  };
  for (const Betas b : {Betas{4.0f, 25.0f}, Betas{1.0f, 0.5f}, Betas{1e3f, 3.0f}})
    for (const size_t count : {size_t{32}, size_t{1000}, size_t{3072}, size_t{6 * 3072 + 32}}) {
      std::vector<float> gate = random_floats(count, rng), up = random_floats(count, rng);
      for (float& g : gate) g *= 8.0f;  // past the tanh knee of beta = 4
      for (float& u : up) u *= 40.0f;
      // Specials on both inputs, at positions that land in SIMD rows and in the tails.
      for (size_t j = 0; j < std::size(specials) && j < count; ++j) {
        gate[(j * 37) % count] = specials[j];
        up[(j * 53 + 5) % count] = specials[std::size(specials) - 1 - j];
      }
      std::vector<float> want(count);
      for (size_t i = 0; i < count; ++i) want[i] = k3::situ(gate[i], up[i], b.beta, b.beta_linear);
      const bool whole = count % 32 == 0;  // 1000: a partial last group, SiTU only
      for (Isa isa : k3::testing::twin_isas()) {
        const KernelTable& k = k3::kernel_table(isa);
        std::vector<int8_t> want_q(count), q(count);
        std::vector<float> want_d(count / 32), d(count / 32);
        if (whole) k3::quantize_q8_32(k, want.data(), 1, count, want_q.data(), want_d.data());
        for (int threads : {1, 2, 3}) {
          omp_set_num_threads(threads);
          std::vector<float> g = gate;
          k3::situ_glu(k, g.data(), up.data(), count, b.beta, b.beta_linear);
          ASSERT_EQ(situ_bits(g), situ_bits(want)) << k3::isa_name(isa) << " count=" << count
                                                   << " threads=" << threads << " beta=" << b.beta;
          if (!whole) continue;
          g = gate;
          k3::situ_glu(k, g.data(), up.data(), count, b.beta, b.beta_linear, q.data(), d.data());
          ASSERT_EQ(situ_bits(g), situ_bits(want));
          ASSERT_EQ(q, want_q) << k3::isa_name(isa) << " count=" << count << " " << threads;
          ASSERT_EQ(std::memcmp(d.data(), want_d.data(), d.size() * sizeof(float)), 0);
        }
        omp_set_num_threads(saved);
      }
    }
  // The quantisation needs whole 32-groups.
  std::vector<float> g = random_floats(40, rng), u = random_floats(40, rng);
  std::vector<int8_t> q(64);
  std::vector<float> d(2);
  EXPECT_HAS(k3::testing::error_of([&] {
               k3::situ_glu(k3::kernel_table(Isa::kScalar), g.data(), u.data(), 40, 4.0f, 25.0f,
                            q.data(), d.data());
             }),
             "40 elements are not whole 32-groups");
}

// ---------------------------------------------------------------------------------------------
// Quantisers (docs/quant_formats.md §3–4).

TEST(KernelsQuant, Int8RoundsHalfToEven) {
  // amax 127 -> s = 1, 1/s = 1: the products are the values themselves.
  const std::vector<float> w = {0.5f,  1.5f,   2.5f,   -0.5f, -1.5f,
                                -2.5f, 126.5f, 127.0f, 3.49f, -3.51f};
  const std::vector<int8_t> want = {0, 2, 2, 0, -2, -2, 126, 127, 3, -4};
  std::vector<int8_t> q(w.size());
  float s = 0.0f;
  k3::quantize_int8_row(w.data(), w.size(), q.data(), &s);
  EXPECT_EQ(s, 1.0f);
  EXPECT_EQ(q, want);
  // amax 63.5 -> s = 0.5, 1/s = 2: 0.25 -> 0.5 -> 0, 0.75 -> 1.5 -> 2, 1.25 -> 2.5 -> 2.
  const std::vector<float> w2 = {0.25f, 0.75f, 1.25f, -1.75f, 63.5f, -63.25f};
  const std::vector<int8_t> want2 = {0, 2, 2, -4, 127, -126};
  std::vector<int8_t> q2(w2.size());
  k3::quantize_int8_row(w2.data(), w2.size(), q2.data(), &s);
  EXPECT_EQ(s, 0.5f);
  EXPECT_EQ(q2, want2);
}

// The quantisers against the formula written with nearbyint (the libm round half to even), on
// random rows with exact .5 products, tiny and huge magnitudes, zeros and negative zeros: the
// quantisers' own rounding (kernels/quant.cpp, rne) must give the same bytes.
TEST(KernelsQuant, MatchTheFormulaWrittenWithNearbyint) {
  std::mt19937 rng(1202);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const float magnitudes[] = {1e-30f, 1e-7f, 1.0f, 127.0f, 3e5f, 1e30f};
  for (int trial = 0; trial < 400; ++trial) {
    const size_t cols = 64 * (1 + static_cast<size_t>(trial % 5));
    const float mag = magnitudes[trial % std::size(magnitudes)];
    std::vector<float> w(cols);
    for (float& x : w) x = unit(rng) * mag;
    if (trial % 3 == 0)  // products landing on exact halves: w = (k + 0.5) * s with s = amax/127
      for (size_t i = 0; i < cols; ++i)
        w[i] = (static_cast<float>(static_cast<int>(i % 127) - 63) + 0.5f) * mag / 127.0f;
    if (trial % 7 == 0) w[0] = -0.0f;
    // int8 per row.
    std::vector<int8_t> q(cols), want(cols);
    float s = 0;
    k3::quantize_int8_row(w.data(), cols, q.data(), &s);
    float amax = 0;
    for (float x : w) amax = std::max(amax, std::fabs(x));
    const float s8 = std::max(amax / 127.0f, 1e-20f), inv8 = 1.0f / s8;
    for (size_t i = 0; i < cols; ++i)
      want[i] = static_cast<int8_t>(std::clamp(std::nearbyint(w[i] * inv8), -127.0f, 127.0f));
    ASSERT_EQ(s, s8) << trial;
    ASSERT_EQ(q, want) << trial;
    // int4 groups of 64, and the int8 -> int4 downcast.
    std::vector<uint8_t> packed(cols / 2), want4(cols / 2), down(cols / 2), want_down(cols / 2);
    std::vector<float> scales(cols / 64), down_scales(cols / 64);
    k3::quantize_int4_g64_row(w.data(), cols, packed.data(), scales.data());
    k3::downcast_int8_row_to_int4_g64(q.data(), s, cols, down.data(), down_scales.data());
    for (size_t g = 0; g < cols / 64; ++g) {
      float gmax = 0;
      int qmax = 0;
      for (size_t i = 0; i < 64; ++i) {
        gmax = std::max(gmax, std::fabs(w[g * 64 + i]));
        qmax = std::max(qmax, std::abs(static_cast<int>(q[g * 64 + i])));
      }
      const float s4 = std::max(gmax / 7.0f, 1e-20f), inv4 = 1.0f / s4;
      const float sd = std::max(static_cast<float>(qmax) * s / 7.0f, 1e-20f);
      ASSERT_EQ(scales[g], s4) << trial;
      ASSERT_EQ(down_scales[g], sd) << trial;
      for (size_t j = 0; j < 32; ++j) {
        const auto code = [&](float v) {
          return static_cast<int>(std::clamp(std::nearbyint(v), -8.0f, 7.0f)) + 8;
        };
        const size_t a = g * 64 + 2 * j, b = a + 1;
        want4[g * 32 + j] = static_cast<uint8_t>(code(w[a] * inv4) | (code(w[b] * inv4) << 4));
        want_down[g * 32 + j] =
            static_cast<uint8_t>(code(static_cast<float>(q[a]) * s / sd) |
                                 (code(static_cast<float>(q[b]) * s / sd) << 4));
      }
    }
    ASSERT_EQ(packed, want4) << trial;
    ASSERT_EQ(down, want_down) << trial;
  }
}

// The 32 bytes of group g of a packed int4 row, unpacked to the 64 signed codes.
std::vector<int> unpack_int4(const std::vector<uint8_t>& packed, size_t g) {
  std::vector<int> q(64);
  for (size_t j = 0; j < 32; ++j) {
    q[2 * j] = (packed[g * 32 + j] & 0xF) - 8;
    q[2 * j + 1] = (packed[g * 32 + j] >> 4) - 8;
  }
  return q;
}

TEST(KernelsQuant, Int4RoundsHalfToEvenPerGroup) {
  // Group 0: amax 7 -> s = 1. Group 1: amax 3.5 -> s = 0.5, 1/s = 2.
  std::vector<float> w(128, 0.0f);
  const float g0[] = {0.5f,  1.5f, 2.5f,  3.5f, -0.5f, -1.5f, -2.5f,
                      -3.5f, 7.0f, -7.0f, 4.5f, 5.5f,  6.5f,  -6.5f};
  const int want0[] = {0, 2, 2, 4, 0, -2, -2, -4, 7, -7, 4, 6, 6, -6};
  const float g1[] = {0.25f, 0.75f, 1.25f, -1.75f, 3.5f, -3.25f, 2.75f};
  const int want1[] = {0, 2, 2, -4, 7, -6, 6};
  std::copy(std::begin(g0), std::end(g0), w.begin());
  std::copy(std::begin(g1), std::end(g1), w.begin() + 64);
  std::vector<uint8_t> packed(64);
  float scales[2] = {0, 0};
  k3::quantize_int4_g64_row(w.data(), w.size(), packed.data(), scales);
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_EQ(scales[1], 0.5f);
  const std::vector<int> q0 = unpack_int4(packed, 0), q1 = unpack_int4(packed, 1);
  for (size_t i = 0; i < std::size(want0); ++i)
    EXPECT_EQ(q0[i], want0[i]) << "group 0 column " << i;
  for (size_t i = 0; i < std::size(want1); ++i)
    EXPECT_EQ(q1[i], want1[i]) << "group 1 column " << i;
  for (size_t i = std::size(want0); i < 64; ++i) EXPECT_EQ(q0[i], 0) << i;
  for (size_t i = std::size(want1); i < 64; ++i) EXPECT_EQ(q1[i], 0) << i;
}

TEST(KernelsQuant, NibbleOrderLowIsEvenColumn) {
  std::vector<float> w(64, 0.0f);
  w[0] = 7.0f;   // code 7 -> nibble 15
  w[1] = -7.0f;  // code -7 -> nibble 1
  w[2] = 1.0f;   // nibble 9
  w[5] = -3.0f;  // nibble 5 in the high half of byte 2
  std::vector<uint8_t> packed(32);
  float s = 0.0f;
  k3::quantize_int4_g64_row(w.data(), 64, packed.data(), &s);
  EXPECT_EQ(s, 1.0f);
  EXPECT_EQ(packed[0], 0x1F);
  EXPECT_EQ(packed[1], 0x89);
  EXPECT_EQ(packed[2], 0x58);
  for (size_t j = 3; j < 32; ++j) EXPECT_EQ(packed[j], 0x88) << j;
}

TEST(KernelsQuant, AllZeroRows) {
  const std::vector<float> zeros(128, 0.0f);
  std::vector<int8_t> q(128, 99);
  float s = 0.0f;
  k3::quantize_int8_row(zeros.data(), zeros.size(), q.data(), &s);
  EXPECT_EQ(s, 1e-20f);
  for (int8_t v : q) EXPECT_EQ(v, 0);
  std::vector<uint8_t> packed(64, 0);
  float s4[2] = {0, 0};
  k3::quantize_int4_g64_row(zeros.data(), zeros.size(), packed.data(), s4);
  EXPECT_EQ(s4[0], 1e-20f);
  EXPECT_EQ(s4[1], 1e-20f);
  for (uint8_t b : packed) EXPECT_EQ(b, 0x88);
  // Values far below the scale floor quantise to zero under the 1e-20 floor too.
  const std::vector<float> tiny = {1e-38f, -1e-38f, 1e-30f, 0.0f};
  std::vector<int8_t> qt(tiny.size(), 99);
  k3::quantize_int8_row(tiny.data(), tiny.size(), qt.data(), &s);
  EXPECT_EQ(s, 1e-20f);
  for (int8_t v : qt) EXPECT_EQ(v, 0);
}

TEST(KernelsQuant, ExtremeValuesAndClampLimits) {
  // ±FLT_MAX: s = FLT_MAX / 127 (finite), the extremes map to ±127, tiny values to 0.
  {
    const std::vector<float> w = {FLT_MAX, -FLT_MAX, 1.0f, -1e-30f, FLT_MAX / 2};
    std::vector<int8_t> q(w.size());
    float s = 0.0f;
    k3::quantize_int8_row(w.data(), w.size(), q.data(), &s);
    EXPECT_EQ(s, FLT_MAX / 127.0f);
    EXPECT_TRUE(std::isfinite(s));
    EXPECT_EQ(q[0], 127);
    EXPECT_EQ(q[1], -127);
    EXPECT_EQ(q[2], 0);
    EXPECT_EQ(q[3], 0);
    EXPECT_EQ(q[4], 63);  // (FLT_MAX / 2) * (1 / s) = 63.4999962: the reciprocal rounds down
  }
  // Mixed huge and tiny within one row and one int4 group.
  {
    const float huge = FLT_MAX / 1e10f;
    std::vector<float> w(64, 1e-30f);
    w[3] = huge;
    w[10] = -huge;
    w[11] = -1e-30f;
    std::vector<int8_t> q(64);
    float s = 0.0f;
    k3::quantize_int8_row(w.data(), 64, q.data(), &s);
    EXPECT_EQ(s, huge / 127.0f);
    for (size_t i = 0; i < 64; ++i) EXPECT_EQ(q[i], i == 3 ? 127 : i == 10 ? -127 : 0) << i;
    std::vector<uint8_t> packed(32);
    float s4 = 0.0f;
    k3::quantize_int4_g64_row(w.data(), 64, packed.data(), &s4);
    EXPECT_EQ(s4, huge / 7.0f);
    const std::vector<int> q4 = unpack_int4(packed, 0);
    for (size_t i = 0; i < 64; ++i) EXPECT_EQ(q4[i], i == 3 ? 7 : i == 10 ? -7 : 0) << i;
  }
  // Random rows stay within the clamp limits and reach ±127 / ±7 at their extremes; -128 and
  // nibble 0 (-8) never occur since |w| <= amax.
  std::mt19937 rng(3);
  for (int rep = 0; rep < 50; ++rep) {
    std::vector<float> w = random_floats(192, rng, rep % 2 ? 1e-12f : 1e12f);
    std::vector<int8_t> q(192);
    float s = 0.0f;
    k3::quantize_int8_row(w.data(), w.size(), q.data(), &s);
    const size_t imax = static_cast<size_t>(
        std::max_element(w.begin(), w.end(),
                         [](float a, float b) { return std::fabs(a) < std::fabs(b); }) -
        w.begin());
    EXPECT_EQ(q[imax], w[imax] > 0 ? 127 : -127);
    for (int8_t v : q) {
      EXPECT_GE(v, -127);
      EXPECT_LE(v, 127);
    }
    std::vector<uint8_t> packed(96);
    float s4[3];
    k3::quantize_int4_g64_row(w.data(), w.size(), packed.data(), s4);
    for (size_t g = 0; g < 3; ++g) {
      const std::vector<int> q4 = unpack_int4(packed, g);
      float amax = 0.0f;
      for (size_t i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(w[g * 64 + i]));
      EXPECT_EQ(s4[g], amax / 7.0f);
      for (size_t i = 0; i < 64; ++i) {
        EXPECT_GE(q4[i], -7);
        EXPECT_LE(q4[i], 7);
        if (std::fabs(w[g * 64 + i]) == amax) {
          EXPECT_EQ(q4[i], w[g * 64 + i] > 0 ? 7 : -7);
        }
      }
    }
  }
}

// Every ISA's row quantisers (KernelTable) against the scalar twins, byte for byte, on awkward
// widths (column tails of every length around the vector widths) and values: exact .5 products,
// ties at the clamp, zeros and negative zeros, denormals, huge and tiny magnitudes, NaN (skipped
// by the max, level 0) and infinities (scale inf, every level 0 or NaN -> 0).
TEST(KernelsQuant, EveryIsaMatchesTheScalarTwinByteForByte) {
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const float magnitudes[] = {1e-38f, 1e-30f, 1e-3f, 1.0f, 1e4f, 3e38f};
  const size_t widths[] = {1,  2,  7,  8,  9,   15,  16,  17,  31,  32,  33,   47,
                           63, 64, 65, 96, 100, 127, 128, 129, 192, 448, 1000, 7168};
  int cases = 0;
  for (const size_t cols : widths)
    for (int trial = 0; trial < 24; ++trial) {
      const float mag = magnitudes[trial % std::size(magnitudes)];
      std::vector<float> w(cols);
      for (float& x : w) x = unit(rng) * mag;
      if (trial % 4 == 1)  // exact halves: w = (k + 0.5) * amax / 127, amax the last column's
        for (size_t i = 0; i < cols; ++i)
          w[i] = (static_cast<float>(static_cast<int>(i % 255) - 127) + 0.5f) * mag / 127.0f;
      if (trial % 5 == 2) w[rng() % cols] = -0.0f;
      if (trial % 6 == 3) w[rng() % cols] = std::numeric_limits<float>::quiet_NaN();
      if (trial % 8 == 5) w[rng() % cols] = std::numeric_limits<float>::denorm_min();
      if (trial % 12 == 7) w[rng() % cols] = -std::numeric_limits<float>::infinity();
      if (trial == 23) std::fill(w.begin(), w.end(), 0.0f);
      std::vector<int8_t> want8(cols);
      float want_scale = 0;
      k3::quantize_int8_row(w.data(), cols, want8.data(), &want_scale);
      const size_t groups = cols / 64;
      std::vector<uint8_t> want4(groups * 32);
      std::vector<float> want4_scales(groups);
      k3::quantize_int4_g64_row(w.data(), cols, want4.data(), want4_scales.data());
      for (const Isa isa : k3::supported_isas()) {
        const KernelTable& kt = k3::kernel_table(isa);
        const std::string where = std::string(k3::isa_name(isa)) + " cols " + std::to_string(cols) +
                                  " trial " + std::to_string(trial);
        std::vector<int8_t> q(cols + 1, 0x55);  // one guard byte past the row
        float scale = -1;
        kt.quantize_int8_row(w.data(), cols, q.data(), &scale);
        ASSERT_EQ(std::memcmp(&scale, &want_scale, 4), 0) << where;
        ASSERT_EQ(std::memcmp(q.data(), want8.data(), cols), 0) << where;
        ASSERT_EQ(q[cols], 0x55) << where << ": wrote past the row";
        std::vector<uint8_t> p(groups * 32 + 1, 0x55);
        std::vector<float> s(groups + 1, -1.0f);
        kt.quantize_int4_g64_row(w.data(), cols, p.data(), s.data());
        // std::equal, not memcmp: with no whole group the reference vectors are empty (null).
        ASSERT_TRUE(std::equal(want4.begin(), want4.end(), p.begin())) << where;
        ASSERT_TRUE(std::equal(want4_scales.begin(), want4_scales.end(), s.begin(),
                               [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; }))
            << where;
        ASSERT_EQ(p[groups * 32], 0x55) << where << ": wrote past the row";
        ASSERT_EQ(s[groups], -1.0f) << where << ": wrote past the scales";
        ++cases;
      }
    }
  EXPECT_GE(cases, static_cast<int>(std::size(widths)) * 24);
}

// The scalar rules on the values the vector variants must reproduce: a NaN weight is skipped by
// the max and gets level 0; an infinity makes the scale inf, every finite weight level 0 and the
// infinity itself NaN -> 0; ties round to even.
TEST(KernelsQuant, NanInfinityAndTiesByTheScalarRule) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> w(64, 0.0f);
  w[0] = 127.0f;  // scale 1: levels are the weights rounded
  w[1] = nan;
  w[2] = 2.5f;   // tie -> 2
  w[3] = -3.5f;  // tie -> -4
  std::vector<int8_t> q(64);
  float s = 0;
  k3::quantize_int8_row(w.data(), 64, q.data(), &s);
  EXPECT_EQ(s, 1.0f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 0);
  EXPECT_EQ(q[2], 2);
  EXPECT_EQ(q[3], -4);
  w[5] = -inf;
  k3::quantize_int8_row(w.data(), 64, q.data(), &s);
  EXPECT_EQ(s, inf);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(q[static_cast<size_t>(i)], 0) << i;
  std::vector<uint8_t> p(32);
  float s4 = 0;
  k3::quantize_int4_g64_row(w.data(), 64, p.data(), &s4);
  EXPECT_EQ(s4, inf);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(p[static_cast<size_t>(j)], 0x88) << j;  // level 0 = 8
}

// quantize_matrix = the scalar row quantisers applied to every row, in the documented layout,
// with every ISA's table.
TEST(KernelsQuant, QuantizeMatrixFormatsAndFallback) {
  for (const Isa isa : k3::supported_isas()) {
    SCOPED_TRACE(k3::isa_name(isa));
    const KernelTable& kt = k3::kernel_table(isa);
    std::mt19937 rng(9);
    const auto make = [&](size_t rows, size_t cols) {
      WeightMatrix m;
      m.rows = static_cast<int64_t>(rows);
      m.cols = static_cast<int64_t>(cols);
      const std::vector<float> w = random_floats(rows * cols, rng);
      m.f32.assign(w.begin(), w.end());
      return m;
    };
    {  // 32 bits: unchanged.
      WeightMatrix m = make(5, 100);
      const std::vector<float> before(m.f32.begin(), m.f32.end());
      k3::quantize_matrix(m, 32, kt);
      EXPECT_EQ(m.format, WeightFormat::kF32);
      EXPECT_TRUE(std::equal(m.f32.begin(), m.f32.end(), before.begin(), before.end()));
      EXPECT_EQ(m.bytes(), 5u * 100u * 4u);
    }
    for (auto [bits, cols, want] :
         {std::tuple{8, size_t{100}, WeightFormat::kInt8Row},
          std::tuple{8, size_t{128}, WeightFormat::kInt8Row},
          std::tuple{4, size_t{128}, WeightFormat::kInt4G64},
          std::tuple{4, size_t{100}, WeightFormat::kInt8Row},    // fallback
          std::tuple{4, size_t{96}, WeightFormat::kInt8Row}}) {  // fallback
      SCOPED_TRACE("bits=" + std::to_string(bits) + " cols=" + std::to_string(cols));
      const size_t rows = 7;
      WeightMatrix m = make(rows, cols);
      const std::vector<float> w(m.f32.begin(), m.f32.end());
      k3::quantize_matrix(m, bits, kt);
      EXPECT_EQ(m.format, want);
      EXPECT_TRUE(m.f32.empty());
      if (want == WeightFormat::kInt8Row) {
        ASSERT_EQ(m.q8.size(), rows * cols);
        ASSERT_EQ(m.scales.size(), rows);
        EXPECT_TRUE(m.q4.empty());
        EXPECT_EQ(m.bytes(), rows * cols + rows * 4);
        for (size_t o = 0; o < rows; ++o) {
          std::vector<int8_t> q(cols);
          float s = 0.0f;
          k3::quantize_int8_row(w.data() + o * cols, cols, q.data(), &s);
          EXPECT_EQ(s, m.scales[o]);
          EXPECT_TRUE(
              std::equal(q.begin(), q.end(), m.q8.begin() + static_cast<ptrdiff_t>(o * cols)))
              << o;
        }
      } else {
        ASSERT_EQ(m.q4.size(), rows * cols / 2);
        ASSERT_EQ(m.scales.size(), rows * cols / 64);
        EXPECT_TRUE(m.q8.empty());
        EXPECT_EQ(m.bytes(), rows * cols / 2 + rows * cols / 64 * 4);
        for (size_t o = 0; o < rows; ++o) {
          std::vector<uint8_t> p(cols / 2);
          std::vector<float> s(cols / 64);
          k3::quantize_int4_g64_row(w.data() + o * cols, cols, p.data(), s.data());
          EXPECT_TRUE(std::equal(s.begin(), s.end(),
                                 m.scales.begin() + static_cast<ptrdiff_t>(o * cols / 64)))
              << o;
          EXPECT_TRUE(
              std::equal(p.begin(), p.end(), m.q4.begin() + static_cast<ptrdiff_t>(o * cols / 2)))
              << o;
        }
      }
    }
    {  // Unsupported widths and double quantisation are errors.
      WeightMatrix m = make(2, 64);
      EXPECT_NE(k3::testing::error_of([&] { k3::quantize_matrix(m, 16, kt); }), "");
      EXPECT_NE(k3::testing::error_of([&] { k3::quantize_matrix(m, 2, kt); }), "");
      k3::quantize_matrix(m, 8, kt);
      EXPECT_NE(k3::testing::error_of([&] { k3::quantize_matrix(m, 4, kt); }), "");
    }
  }
}

TEST(KernelsQuant, QuantizeMatrixIndependentOfThreadCount) {
  std::mt19937 rng(10);
  const int saved = omp_get_max_threads();
  for (int bits : {8, 4}) {
    // Large enough (rows * cols > 2^16) for the parallel loop to engage.
    const size_t rows = 131, cols = 1024;
    const std::vector<float> w = random_floats(rows * cols, rng);
    std::vector<WeightMatrix> out;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      WeightMatrix m;
      m.rows = static_cast<int64_t>(rows);
      m.cols = static_cast<int64_t>(cols);
      m.f32.assign(w.begin(), w.end());
      k3::quantize_matrix(m, bits, k3::kernel_table(k3::best_isa()));
      out.push_back(std::move(m));
    }
    for (size_t i = 1; i < out.size(); ++i) {
      EXPECT_EQ(out[i].q8, out[0].q8) << bits;
      EXPECT_EQ(out[i].q4, out[0].q4) << bits;
      ASSERT_EQ(out[i].scales.size(), out[0].scales.size());
      EXPECT_EQ(std::memcmp(out[i].scales.data(), out[0].scales.data(), out[0].scales.size() * 4),
                0)
          << bits;
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// int4 weights on int8 activations (KernelTable::matmul_int4_idot, k3::matmul_int4_idot): every
// ISA bit-identical to the scalar twin; the scalar twin against the formula in double and
// against the f32-activation int4 path.

namespace {

using k3::Error;

// Activations in the q8_32 format: q [n][cols], d [n][cols / 32].
struct Q8Acts {
  std::vector<int8_t> q;
  std::vector<float> d;
};

Q8Acts quantise_acts(const std::vector<float>& X, size_t n, size_t cols) {
  Q8Acts a{std::vector<int8_t>(n * cols), std::vector<float>(n * cols / 32)};
  k3::quantize_q8_32(k3::kernel_table(Isa::kScalar), X.data(), n, cols, a.q.data(), a.d.data());
  return a;
}

// An int4-g64 matrix with uniformly random nibbles and scales in [0.01, 2) (no f32 source).
WeightMatrix random_int4(size_t rows, size_t cols, std::mt19937& rng) {
  WeightMatrix m;
  m.format = WeightFormat::kInt4G64;
  m.rows = static_cast<int64_t>(rows);
  m.cols = static_cast<int64_t>(cols);
  m.q4.resize(rows * cols / 2);
  m.scales.resize(rows * cols / 64);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.01f, 2.0f);
  for (auto& b : m.q4) b = static_cast<uint8_t>(byte(rng));
  for (auto& s : m.scales) s = scale(rng);
  return m;
}

// A NaN with a payload that no kernel produces: outputs outside the row range must keep it.
float idot_sentinel() {
  const uint32_t u = 0x7FA5A5A5u;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<float> run_idot(const KernelTable& k, const WeightMatrix& m, const Q8Acts& a, size_t n,
                            size_t ldy, size_t begin, size_t end) {
  std::vector<float> Y(n * ldy, idot_sentinel());
  k.matmul_int4_idot(m.q4.data(), m.scales.data(), static_cast<size_t>(m.cols), a.q.data(),
                     a.d.data(), n, Y.data(), ldy, begin, end);
  return Y;
}

// Every ISA equals the scalar twin bit for bit (memcmp), the untouched outputs included; the
// scalar twin writes exactly the range.
void expect_idot_identical(const WeightMatrix& m, const Q8Acts& a, size_t n, size_t ldy,
                           size_t begin, size_t end) {
  const std::vector<float> want =
      run_idot(k3::kernel_table(Isa::kScalar), m, a, n, ldy, begin, end);
  for (size_t t = 0; t < n; ++t)
    for (size_t o = 0; o < ldy; ++o)
      ASSERT_EQ(bits_of(want[t * ldy + o]) == bits_of(idot_sentinel()), o < begin || o >= end)
          << t << " " << o;
  for (Isa isa : k3::testing::twin_isas()) {
    SCOPED_TRACE(k3::isa_name(isa));
    const std::vector<float> got = run_idot(k3::kernel_table(isa), m, a, n, ldy, begin, end);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
}

// The nibble value (0..15) of column i of row o.
int nibble(const WeightMatrix& m, size_t o, size_t i) {
  const uint8_t b = m.q4[o * static_cast<size_t>(m.cols) / 2 + i / 2];
  return i % 2 == 0 ? (b & 0xF) : (b >> 4);
}

}  // namespace

// Rows not multiples of the 16 (AVX-512) / 8 (AVX2) row blocks, 1..65 activation rows (one tile
// of 64 and one past it), widths of 1, 2, 3, 17 groups (odd counts end in a half window of the
// one-row path) and model widths; full, interior, single-row and empty row ranges.
TEST(KernelsInt4Idot, EveryIsaBitIdenticalToScalar) {
  std::mt19937 rng(601);
  for (size_t cols : {64u, 128u, 192u, 1088u, 7168u, 7232u})
    for (size_t rows : {1u, 3u, 17u, 67u}) {
      if (cols > 1088 && rows == 67) continue;  // the 7168-wide cases keep the scalar time short
      WeightMatrix m = random_int4(rows, cols, rng);
      for (size_t n : {1u, 2u, 3u, 7u, 17u, 64u, 65u}) {
        const Q8Acts a = quantise_acts(random_floats(n * cols, rng), n, cols);
        std::vector<std::pair<size_t, size_t>> ranges = {
            {0, rows}, {rows - 1, rows}, {rows / 2, rows / 2}};
        if (rows >= 3) ranges.push_back({1, rows - 1});
        for (auto [b, e] : ranges) {
          SCOPED_TRACE("rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                       " n=" + std::to_string(n) + " range=[" + std::to_string(b) + "," +
                       std::to_string(e) + ")");
          expect_idot_identical(m, a, n, rows + 3, b, e);
        }
      }
    }
}

// Extremes of the integer sums: every nibble 0 (weight -8) or 15 (+7) against q = +-127 and the
// -128 that quantize_q8_32 never produces (|isum| up to 32 * 8 * 128 per half-group), unit
// scales (the exact value is known), and zero weight scales.
TEST(KernelsInt4Idot, ExtremeValues) {
  const size_t rows = 19, cols = 7168, halves = cols / 32;
  for (const uint8_t byte : {uint8_t{0x00}, uint8_t{0xFF}})
    for (const int qv : {127, -127, -128}) {
      WeightMatrix m;
      m.format = WeightFormat::kInt4G64;
      m.rows = rows;
      m.cols = cols;
      m.q4.assign(rows * cols / 2, byte);
      m.scales.assign(rows * cols / 64, 1.0f);
      for (size_t g = 0; g < cols / 64; ++g)
        m.scales[5 * (cols / 64) + g] = 0.0f;  // row 5: zero scales
      m.scales[7 * (cols / 64) + 3] = 0.0f;    // row 7: one zero group
      for (size_t n : {1u, 3u, 17u}) {
        SCOPED_TRACE("byte=" + std::to_string(byte) + " q=" + std::to_string(qv) +
                     " n=" + std::to_string(n));
        Q8Acts a{std::vector<int8_t>(n * cols, static_cast<int8_t>(qv)),
                 std::vector<float>(n * halves, 1.0f)};
        expect_idot_identical(m, a, n, rows, 0, rows);
        const std::vector<float> y =
            run_idot(k3::kernel_table(Isa::kScalar), m, a, n, rows, 0, rows);
        const double per_half = (byte == 0 ? -8.0 : 7.0) * qv * 32;  // |.| <= 32768: exact sums
        for (size_t t = 0; t < n; ++t) {
          EXPECT_EQ(y[t * rows + 0], static_cast<float>(per_half * static_cast<double>(halves)));
          EXPECT_EQ(bits_of(y[t * rows + 5]), bits_of(0.0f));
          EXPECT_EQ(y[t * rows + 7],
                    static_cast<float>(per_half * static_cast<double>(halves - 2)));
        }
      }
    }
}

// The scalar twin against the contract evaluated in double, with the integer sums recomputed
// here from the unpacked nibbles. (1) Power-of-two scales d = 2^a (a in {-1, 0}) and s = 2^b
// (b in {0, 1}): every product and partial sum is a multiple of 2^-1 below 2^23 in magnitude
// (<= 64 half-groups x 32768 x 2), so exact in float, and the result must equal the double
// exactly (any wrong nibble, column or offset shows). (2) Random scales: the only error is float
// rounding in the reduction, one rounding of d * s, one of the product and one per addition, so
//   |y - ref| <= (H + 2) * 2^-24 * sum_h |isum_h d_h s_h|     (H = cols / 32 half-groups).
TEST(KernelsInt4Idot, ScalarMatchesDoubleFormula) {
  std::mt19937 rng(602);
  const KernelTable& scalar = k3::kernel_table(Isa::kScalar);
  std::uniform_int_distribution<int> qd(-128, 127), ed(-1, 0);
  std::uniform_real_distribution<float> dd(1e-3f, 4.0f);
  for (const bool pow2 : {true, false})
    for (size_t cols : {64u, 192u, 1088u, 2048u}) {
      const size_t rows = 5, n = 3, halves = cols / 32;
      WeightMatrix m = random_int4(rows, cols, rng);
      Q8Acts a{std::vector<int8_t>(n * cols), std::vector<float>(n * halves)};
      for (auto& v : a.q) v = static_cast<int8_t>(qd(rng));
      for (auto& v : a.d) v = pow2 ? std::ldexp(1.0f, ed(rng)) : dd(rng);
      if (pow2)
        for (auto& s : m.scales) s = std::ldexp(1.0f, ed(rng) + 1);  // b in {0, 1}
      const std::vector<float> y = run_idot(scalar, m, a, n, rows, 0, rows);
      for (size_t t = 0; t < n; ++t)
        for (size_t o = 0; o < rows; ++o) {
          double ref = 0.0, mag = 0.0;
          for (size_t h = 0; h < halves; ++h) {
            int64_t isum = 0;
            for (size_t i = h * 32; i < h * 32 + 32; ++i)
              isum += (nibble(m, o, i) - 8) * int64_t{a.q[t * cols + i]};
            const double term =
                static_cast<double>(isum) * a.d[t * halves + h] * m.scales[o * (cols / 64) + h / 2];
            ref += term;
            mag += std::fabs(term);
          }
          SCOPED_TRACE("pow2=" + std::to_string(pow2) + " cols=" + std::to_string(cols) +
                       " t=" + std::to_string(t) + " o=" + std::to_string(o));
          if (pow2)
            EXPECT_EQ(static_cast<double>(y[t * rows + o]), ref);
          else
            EXPECT_LE(std::fabs(y[t * rows + o] - ref),
                      static_cast<double>(halves + 2) * 0x1p-24 * mag);
        }
    }
}

// The idot paths against the f32-activation paths differ by the q8_32 rounding of the
// activations alone; its expected size is k3::testing::q8_rounding_rel_l2 (tests/test_util.h),
// derived from the weights and activations. On these fixed values (7168 columns, 8 x 64 outputs)
// measured / expected = 0.958 (int4), 1.013 (int8) and 0.977 (MXFP4, tests/mxfp4_kernels_test.cpp),
// every ISA the same digits (the paths are bit-identical). The sum of 512 squared errors spreads
// ~6% (sqrt(2 / 512)), ~3% on the ratio: the window is 5 of those either side. A rounding step off
// by 2x measures 2x; an activation left unrounded measures ~0.
constexpr double kQ8ModelLow = 0.85, kQ8ModelHigh = 1.15;

// Against the f32-activation int4 path (the same weights, activations not quantised): the
// difference is the int8 rounding of the activations, |e| <= d / 2 per value, d = amax / 127
// per 32 values: rms d / sqrt(12), about 2.1 sigma / 127 / 3.46 = 0.0048 sigma for normal
// activations (amax of 32 normals ~ 2.1 sigma), hence a relative output error of about 0.005.
// Relative L2 error over the outputs, normal weights and activations, 7168 columns: measured
// 0.00522 on every ISA (they are bit-identical), 0.958 x the rounding model's 0.00545
// (kQ8ModelLow .. kQ8ModelHigh above).
TEST(KernelsInt4Idot, CloseToF32ActivationPath) {
  std::mt19937 rng(603);
  const size_t rows = 64, cols = 7168, n = 8;
  const Case c = make_case(WeightFormat::kInt4G64, rows, cols, rng);
  const std::vector<float> X = random_floats(n * cols, rng);
  const KernelTable& scalar = k3::kernel_table(Isa::kScalar);
  std::vector<float> want(n * rows);
  scalar.matmul_int4(c.m.q4.data(), c.m.scales.data(), cols, X.data(), n, want.data(), rows, 0,
                     rows);
  const double predicted =
      k3::testing::q8_rounding_rel_l2(c.deq.data(), X.data(), want.data(), n, rows, cols);
  for (Isa isa : k3::testing::twin_isas()) {
    SCOPED_TRACE(k3::isa_name(isa));
    const KernelTable& k = k3::kernel_table(isa);
    Q8Acts a{std::vector<int8_t>(n * cols), std::vector<float>(n * cols / 32)};
    k3::quantize_q8_32(k, X.data(), n, cols, a.q.data(), a.d.data());
    const std::vector<float> y = run_idot(k, c.m, a, n, rows, 0, rows);
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      diff2 += (static_cast<double>(y[i]) - want[i]) * (static_cast<double>(y[i]) - want[i]);
      ref2 += static_cast<double>(want[i]) * want[i];
    }
    const double rel = std::sqrt(diff2 / ref2);
    ::testing::Test::RecordProperty(std::string("rel_l2_") + k3::isa_name(isa),
                                    std::to_string(rel));
    std::printf(
        "int4 idot vs f32 activations (%s): relative L2 %.4g, the rounding model %.4g (x%.3f)\n",
        k3::isa_name(isa), rel, predicted, rel / predicted);
    EXPECT_LE(rel, kQ8ModelHigh * predicted);
    EXPECT_GE(rel, kQ8ModelLow * predicted);
  }
}

// k3::matmul_int4_idot (threaded) equals the single-threaded table call exactly, for any
// thread count; a matrix of another format is refused.
TEST(KernelsInt4Idot, ThreadedWrapperEqualsSingleCall) {
  std::mt19937 rng(604);
  const int saved = omp_get_max_threads();
  const size_t rows = 301, cols = 1088;
  const WeightMatrix m = random_int4(rows, cols, rng);
  for (size_t n : {1u, 5u, 64u}) {
    const Q8Acts a = quantise_acts(random_floats(n * cols, rng), n, cols);
    for (Isa isa : k3::testing::twin_isas()) {
      const KernelTable& k = k3::kernel_table(isa);
      const std::vector<float> single = run_idot(k, m, a, n, rows, 0, rows);
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        std::vector<float> y(n * rows, idot_sentinel());
        k3::matmul_int4_idot(k, m, a.q.data(), a.d.data(), n, y.data());
        EXPECT_EQ(std::memcmp(y.data(), single.data(), y.size() * sizeof(float)), 0)
            << k3::isa_name(isa) << " n=" << n << " threads=" << threads;
      }
    }
  }
  omp_set_num_threads(saved);
  const Case f32 = make_case(WeightFormat::kF32, 4, 64, rng);
  std::vector<int8_t> q(64);
  std::vector<float> d(2), y(4);
  EXPECT_THROW(
      k3::matmul_int4_idot(k3::kernel_table(Isa::kScalar), f32.m, q.data(), d.data(), 1, y.data()),
      Error);
}

// ---------------------------------------------------------------------------------------------
// int8-per-row weights on int8 activations (KernelTable::matmul_int8_idot,
// k3::matmul_int8_idot): every ISA bit-identical to the scalar twin; the scalar twin against the
// formula in double and against the f32-activation int8 path.

namespace {

// An int8-per-row matrix with uniformly random values in [-127, 127] and scales in [0.01, 2).
WeightMatrix random_int8(size_t rows, size_t cols, std::mt19937& rng) {
  WeightMatrix m;
  m.format = WeightFormat::kInt8Row;
  m.rows = static_cast<int64_t>(rows);
  m.cols = static_cast<int64_t>(cols);
  m.q8.resize(rows * cols);
  m.scales.resize(rows);
  std::uniform_int_distribution<int> val(-127, 127);
  std::uniform_real_distribution<float> scale(0.01f, 2.0f);
  for (auto& v : m.q8) v = static_cast<int8_t>(val(rng));
  for (auto& s : m.scales) s = scale(rng);
  return m;
}

std::vector<float> run_i8dot(const KernelTable& k, const WeightMatrix& m, const Q8Acts& a, size_t n,
                             size_t ldy, size_t begin, size_t end) {
  std::vector<float> Y(n * ldy, idot_sentinel());
  k.matmul_int8_idot(m.q8.data(), m.scales.data(), static_cast<size_t>(m.cols), a.q.data(),
                     a.d.data(), n, Y.data(), ldy, begin, end);
  return Y;
}

void expect_i8dot_identical(const WeightMatrix& m, const Q8Acts& a, size_t n, size_t ldy,
                            size_t begin, size_t end) {
  const std::vector<float> want =
      run_i8dot(k3::kernel_table(Isa::kScalar), m, a, n, ldy, begin, end);
  for (size_t t = 0; t < n; ++t)
    for (size_t o = 0; o < ldy; ++o)
      ASSERT_EQ(bits_of(want[t * ldy + o]) == bits_of(idot_sentinel()), o < begin || o >= end)
          << t << " " << o;
  for (Isa isa : k3::testing::twin_isas()) {
    SCOPED_TRACE(k3::isa_name(isa));
    const std::vector<float> got = run_i8dot(k3::kernel_table(isa), m, a, n, ldy, begin, end);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
}

}  // namespace

// Rows not multiples of the 16 (AVX-512) / 8 (AVX2) row blocks, 1..65 activation rows (one tile
// of 64 and one past it), widths of 1, 2, 3, 9, 17 groups (odd counts and partial units of 8
// groups) and model widths; full, interior, single-row and empty row ranges.
TEST(KernelsInt8Idot, EveryIsaBitIdenticalToScalar) {
  std::mt19937 rng(701);
  for (size_t cols : {32u, 64u, 96u, 288u, 544u, 7168u, 7200u})
    for (size_t rows : {1u, 3u, 17u, 67u}) {
      if (cols > 544 && rows == 67) continue;  // the 7168-wide cases keep the scalar time short
      WeightMatrix m = random_int8(rows, cols, rng);
      for (size_t n : {1u, 2u, 3u, 7u, 17u, 64u, 65u}) {
        const Q8Acts a = quantise_acts(random_floats(n * cols, rng), n, cols);
        std::vector<std::pair<size_t, size_t>> ranges = {
            {0, rows}, {rows - 1, rows}, {rows / 2, rows / 2}};
        if (rows >= 3) ranges.push_back({1, rows - 1});
        for (auto [b, e] : ranges) {
          SCOPED_TRACE("rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                       " n=" + std::to_string(n) + " range=[" + std::to_string(b) + "," +
                       std::to_string(e) + ")");
          expect_i8dot_identical(m, a, n, rows + 3, b, e);
        }
      }
    }
}

// Extremes of the integer sums: every weight +-127 against q = +-127 (|isum| = 32 * 127^2 per
// group; the AVX2 pair sums 2 * 127^2 just below int16 saturation), unit scales (the exact value
// is known), a zero row scale and a zero activation group.
TEST(KernelsInt8Idot, ExtremeValues) {
  const size_t rows = 19, cols = 7168, groups = cols / 32;
  for (const int wv : {127, -127})
    for (const int qv : {127, -127}) {
      WeightMatrix m;
      m.format = WeightFormat::kInt8Row;
      m.rows = rows;
      m.cols = cols;
      m.q8.assign(rows * cols, static_cast<int8_t>(wv));
      m.scales.assign(rows, 1.0f);
      m.scales[5] = 0.0f;  // row 5: zero scale
      for (size_t n : {1u, 3u, 17u}) {
        SCOPED_TRACE("w=" + std::to_string(wv) + " q=" + std::to_string(qv) +
                     " n=" + std::to_string(n));
        Q8Acts a{std::vector<int8_t>(n * cols, static_cast<int8_t>(qv)),
                 std::vector<float>(n * groups, 1.0f)};
        for (size_t t = 0; t < n; ++t) a.d[t * groups + 3] = 0.0f;  // group 3: zero d
        expect_i8dot_identical(m, a, n, rows, 0, rows);
        const std::vector<float> y =
            run_i8dot(k3::kernel_table(Isa::kScalar), m, a, n, rows, 0, rows);
        const double per_group = 32.0 * wv * qv;  // 2^5 * 16129: partial sums < 2^29 are exact
        for (size_t t = 0; t < n; ++t) {
          EXPECT_EQ(y[t * rows + 0],
                    static_cast<float>(per_group * static_cast<double>(groups - 1)));
          EXPECT_EQ(y[t * rows + 5], 0.0f);
        }
      }
    }
}

// The scalar twin against the contract evaluated in double. (1) Power-of-two scales d = 2^a
// (a in {-1, 0}) and s = 2^b (b in {0, 1}): every partial sum is a multiple of 2^-1 below
// 2^23 (<= 64 groups x 32 x 127 x 128), so exact in float, and the result must equal the double
// exactly. (2) Random scales: one rounding of each product, one per addition and one for the
// row scale, so |y - ref| <= (G + 2) * 2^-24 * |s| * sum_h |isum_h d_h|   (G = cols / 32).
TEST(KernelsInt8Idot, ScalarMatchesDoubleFormula) {
  std::mt19937 rng(702);
  const KernelTable& scalar = k3::kernel_table(Isa::kScalar);
  std::uniform_int_distribution<int> qd(-127, 127), ed(-1, 0);
  std::uniform_real_distribution<float> dd(1e-3f, 4.0f);
  for (const bool pow2 : {true, false})
    for (size_t cols : {32u, 96u, 1088u, 2048u}) {
      const size_t rows = 5, n = 3, groups = cols / 32;
      WeightMatrix m = random_int8(rows, cols, rng);
      Q8Acts a{std::vector<int8_t>(n * cols), std::vector<float>(n * groups)};
      for (auto& v : a.q) v = static_cast<int8_t>(qd(rng));
      for (auto& v : a.d) v = pow2 ? std::ldexp(1.0f, ed(rng)) : dd(rng);
      if (pow2)
        for (auto& s : m.scales) s = std::ldexp(1.0f, ed(rng) + 1);
      const std::vector<float> y = run_i8dot(scalar, m, a, n, rows, 0, rows);
      for (size_t t = 0; t < n; ++t)
        for (size_t o = 0; o < rows; ++o) {
          double ref = 0.0, mag = 0.0;
          for (size_t h = 0; h < groups; ++h) {
            int64_t isum = 0;
            for (size_t i = h * 32; i < h * 32 + 32; ++i)
              isum += int64_t{m.q8[o * cols + i]} * a.q[t * cols + i];
            const double term = static_cast<double>(isum) * a.d[t * groups + h];
            ref += term;
            mag += std::fabs(term);
          }
          ref *= m.scales[o];
          mag *= std::fabs(m.scales[o]);
          SCOPED_TRACE("pow2=" + std::to_string(pow2) + " cols=" + std::to_string(cols) +
                       " t=" + std::to_string(t) + " o=" + std::to_string(o));
          if (pow2)
            EXPECT_EQ(static_cast<double>(y[t * rows + o]), ref);
          else
            EXPECT_LE(std::fabs(y[t * rows + o] - ref),
                      static_cast<double>(groups + 2) * 0x1p-24 * mag);
        }
    }
}

// Against the f32-activation int8 path (the same weights, activations not quantised): the
// difference is the int8 rounding of the activations, about 0.005 relative (as for int4 idot).
// Relative L2 error, normal weights and activations, 7168 columns: measured 0.00557 on every ISA
// (they are bit-identical), 1.013 x the rounding model's 0.00550 (kQ8ModelLow .. kQ8ModelHigh).
TEST(KernelsInt8Idot, CloseToF32ActivationPath) {
  std::mt19937 rng(703);
  const size_t rows = 64, cols = 7168, n = 8;
  const Case c = make_case(WeightFormat::kInt8Row, rows, cols, rng);
  const std::vector<float> X = random_floats(n * cols, rng);
  const KernelTable& scalar = k3::kernel_table(Isa::kScalar);
  std::vector<float> want(n * rows);
  scalar.matmul_int8(c.m.q8.data(), c.m.scales.data(), cols, X.data(), n, want.data(), rows, 0,
                     rows);
  const double predicted =
      k3::testing::q8_rounding_rel_l2(c.deq.data(), X.data(), want.data(), n, rows, cols);
  for (Isa isa : k3::testing::twin_isas()) {
    SCOPED_TRACE(k3::isa_name(isa));
    const KernelTable& k = k3::kernel_table(isa);
    Q8Acts a{std::vector<int8_t>(n * cols), std::vector<float>(n * cols / 32)};
    k3::quantize_q8_32(k, X.data(), n, cols, a.q.data(), a.d.data());
    const std::vector<float> y = run_i8dot(k, c.m, a, n, rows, 0, rows);
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      diff2 += (static_cast<double>(y[i]) - want[i]) * (static_cast<double>(y[i]) - want[i]);
      ref2 += static_cast<double>(want[i]) * want[i];
    }
    const double rel = std::sqrt(diff2 / ref2);
    ::testing::Test::RecordProperty(std::string("rel_l2_") + k3::isa_name(isa),
                                    std::to_string(rel));
    std::printf(
        "int8 idot vs f32 activations (%s): relative L2 %.4g, the rounding model %.4g (x%.3f)\n",
        k3::isa_name(isa), rel, predicted, rel / predicted);
    EXPECT_LE(rel, kQ8ModelHigh * predicted);
    EXPECT_GE(rel, kQ8ModelLow * predicted);
  }
}

// k3::matmul_int8_idot (threaded) equals the single-threaded table call exactly, for any thread
// count; a matrix of another format, or a width that is not a multiple of 32, is refused.
TEST(KernelsInt8Idot, ThreadedWrapperEqualsSingleCall) {
  std::mt19937 rng(704);
  const int saved = omp_get_max_threads();
  const size_t rows = 301, cols = 1088;
  const WeightMatrix m = random_int8(rows, cols, rng);
  for (size_t n : {1u, 5u, 64u}) {
    const Q8Acts a = quantise_acts(random_floats(n * cols, rng), n, cols);
    for (Isa isa : k3::testing::twin_isas()) {
      const KernelTable& k = k3::kernel_table(isa);
      const std::vector<float> single = run_i8dot(k, m, a, n, rows, 0, rows);
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        std::vector<float> y(n * rows, idot_sentinel());
        k3::matmul_int8_idot(k, m, a.q.data(), a.d.data(), n, y.data());
        EXPECT_EQ(std::memcmp(y.data(), single.data(), y.size() * sizeof(float)), 0)
            << k3::isa_name(isa) << " n=" << n << " threads=" << threads;
      }
    }
  }
  omp_set_num_threads(saved);
  std::vector<int8_t> q(64);
  std::vector<float> d(2), y(4);
  const Case f32 = make_case(WeightFormat::kF32, 4, 64, rng);
  EXPECT_THROW(
      k3::matmul_int8_idot(k3::kernel_table(Isa::kScalar), f32.m, q.data(), d.data(), 1, y.data()),
      Error);
  const WeightMatrix i4 = random_int4(4, 64, rng);
  EXPECT_THROW(
      k3::matmul_int8_idot(k3::kernel_table(Isa::kScalar), i4, q.data(), d.data(), 1, y.data()),
      Error);
  const WeightMatrix odd = random_int8(4, 48, rng);  // int8 rows may have any width
  EXPECT_THROW(
      k3::matmul_int8_idot(k3::kernel_table(Isa::kScalar), odd, q.data(), d.data(), 1, y.data()),
      Error);
}

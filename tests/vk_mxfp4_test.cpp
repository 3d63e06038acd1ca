// vk_mxfp4_test — the Vulkan MXFP4 shaders (vk/mxfp4_device.h, docs/vulkan.md) on the device
// VK_ICD_FILENAMES selects (tests/CMakeLists.txt: Mesa's lavapipe): one matrix and the whole
// expert (gate, up, SiTU, down) against the CPU's exact float MXFP4 kernel at K3's shapes and odd
// ones (rel-L2 <= 1e-5), a row's bits independent of the batch and of the GEMV / GEMM route, the
// device-memory cap, validation-layer errors, and a missing loader as a clear error. A machine
// without the loader or a driver fails these tests: it never skips them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/vec.h"
#include "test_util.h"
#include "util/error.h"
#include "vk/mxfp4_device.h"

namespace {

const bool kOnLavapipe = (k3::testing::select_lavapipe(), true);

// The CPU's exact float kernel and the shader sum the same products in different orders; f32
// rounding then differs by ~2^-24 sqrt(inputs) of an output (1e-6 at 3584 inputs). A nibble or
// scale read wrongly moves a row by far more than 1e-5.
constexpr double kRelL2 = 1e-5;

struct Mat {
  std::vector<uint8_t> packed, scales;
  uint32_t O, I;
};

Mat random_matrix(uint32_t O, uint32_t I, uint32_t seed) {
  std::mt19937 rng(seed);
  Mat m{std::vector<uint8_t>(size_t{O} * I / 2), std::vector<uint8_t>(size_t{O} * I / 32), O, I};
  for (auto& b : m.packed) b = static_cast<uint8_t>(rng());
  for (auto& e : m.scales) e = static_cast<uint8_t>(120 + rng() % 12);  // 2^-7 .. 2^4
  return m;
}

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

const k3::KernelTable& cpu() {
  return k3::kernel_table(k3::Isa::kScalar);
}

std::vector<float> cpu_matmul(const Mat& m, const std::vector<float>& X, size_t rows) {
  std::vector<float> Y(rows * m.O);
  k3::matmul_mxfp4_exact(cpu(), {m.packed.data(), m.scales.data(), m.O, m.I}, X.data(), rows,
                         Y.data());
  return Y;
}

struct Expert {
  Mat gate, up, down;
  k3::vk::ExpertBytes bytes() const {
    return {gate.packed.data(), gate.scales.data(), up.packed.data(),
            up.scales.data(),   down.packed.data(), down.scales.data()};
  }
};

Expert random_expert(uint32_t R, uint32_t I, uint32_t seed) {
  return {random_matrix(I, R, seed), random_matrix(I, R, seed + 1), random_matrix(R, I, seed + 2)};
}

// The CPU executor's float path (model/latent_moe.cpp apply_expert with K3_IDOT=0).
std::vector<float> cpu_expert(const Expert& e, const std::vector<float>& z, size_t rows) {
  std::vector<float> gate = cpu_matmul(e.gate, z, rows), up = cpu_matmul(e.up, z, rows);
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = k3::situ(gate[i], up[i], 4.0f, 25.0f);
  return cpu_matmul(e.down, gate, rows);
}

std::unique_ptr<k3::vk::Mxfp4Device> open(uint32_t R, uint32_t I,
                                          k3::vk::DeviceOptions options = {}) {
  return k3::vk::Mxfp4Device::open(options, {R, I, 4.0f, 25.0f});
}

TEST(VkMxfp4, MatmulMatchesTheCpuFloatKernel) {
  auto dev = open(32, 32);
  std::printf("device: %s\n", dev->name().c_str());
  struct Case {
    uint32_t O, I, rows;
  };
  // K3's gate/up (3584 -> 3072) on the GEMV route; odd shapes on both routes: fewer groups than
  // a workgroup's 64 invocations, a group count not a multiple of 64, one output, 17 rows.
  const Case cases[] = {{3072, 3584, 2}, {37, 96, 1},  {37, 96, 17}, {5, 32, 3},
                        {130, 2080, 16}, {1, 4128, 5}, {64, 64, 20}};
  for (const Case& c : cases) {
    const Mat m = random_matrix(c.O, c.I, c.O + c.I);
    const std::vector<float> X = randn(size_t{c.rows} * c.I, c.rows);
    std::vector<float> Y(size_t{c.rows} * c.O);
    dev->matmul(m.packed.data(), m.scales.data(), c.O, c.I, X.data(), c.rows, Y.data());
    const double err = rel_l2(Y, cpu_matmul(m, X, c.rows));
    std::printf("matmul %u x %u, %u rows: rel-L2 %.3g\n", c.O, c.I, c.rows, err);
    EXPECT_LE(err, kRelL2) << c.O << " x " << c.I << ", " << c.rows << " rows";
  }
}

TEST(VkMxfp4, WholeExpertMatchesTheCpuFloatPath) {
  struct Case {
    uint32_t R, I;
    std::vector<uint32_t> rows;  // per expert of the batch
  };
  // K3's expert (R 3584, I 3072) with one row; a small odd one with both routes in one batch.
  const Case cases[] = {{3584, 3072, {1}}, {96, 160, {1, 17, 3}}};
  for (const Case& c : cases) {
    auto dev = open(c.R, c.I);
    std::vector<Expert> experts;
    std::vector<k3::vk::Mxfp4Device::Group> groups;
    size_t P = 0;
    for (size_t j = 0; j < c.rows.size(); ++j) {
      experts.push_back(random_expert(c.R, c.I, static_cast<uint32_t>(10 * j + 1)));
      const int32_t slot = dev->upload(experts.back().bytes());
      ASSERT_GE(slot, 0);
      groups.push_back({slot, c.rows[j]});
      P += c.rows[j];
    }
    // z at the scale of the model's latent rows; SiTU's tanh bounds keep the rest in range.
    const std::vector<float> z = randn(P * c.R, 7, 0.5f);
    std::vector<float> out(P * c.R);
    dev->issue(groups, z.data());
    ASSERT_TRUE(dev->join(out.data()));
    size_t row = 0;
    for (size_t j = 0; j < experts.size(); ++j) {
      const size_t m = c.rows[j];
      const std::vector<float> zj(z.begin() + static_cast<std::ptrdiff_t>(row * c.R),
                                  z.begin() + static_cast<std::ptrdiff_t>((row + m) * c.R));
      const std::vector<float> got(out.begin() + static_cast<std::ptrdiff_t>(row * c.R),
                                   out.begin() + static_cast<std::ptrdiff_t>((row + m) * c.R));
      const double err = rel_l2(got, cpu_expert(experts[j], zj, m));
      std::printf("expert R %u I %u, %zu rows: rel-L2 %.3g\n", c.R, c.I, m, err);
      EXPECT_LE(err, kRelL2) << "R " << c.R << " I " << c.I << " expert " << j;
      row += m;
    }
  }
}

TEST(VkMxfp4, RowBitsIndependentOfTheBatchAndTheRoute) {
  const uint32_t R = 64, I = 96;
  auto dev = open(R, I);
  const Expert a = random_expert(R, I, 3), b = random_expert(R, I, 9);
  const int32_t sa = dev->upload(a.bytes()), sb = dev->upload(b.bytes());
  ASSERT_GE(sa, 0);
  ASSERT_GE(sb, 0);
  const std::vector<float> z = randn(40 * R, 5);
  // Row 0 of expert a alone (GEMV) ...
  std::vector<float> alone(R);
  const k3::vk::Mxfp4Device::Group one[] = {{sa, 1}};
  dev->issue(one, z.data());
  ASSERT_TRUE(dev->join(alone.data()));
  // ... and as the first of m rows of a, behind k rows of b: 1..15 rows take the GEMV route,
  // 16 on the GEMM route.
  for (uint32_t m : {2u, 5u, 15u, 16u, 17u, 33u}) {
    for (uint32_t k : {0u, 1u, 7u}) {
      std::vector<float> zz(size_t{k + m} * R);
      std::copy(z.begin() + R, z.begin() + R + size_t{k} * R, zz.begin());  // b's rows
      std::copy(z.begin(), z.begin() + size_t{m} * R, zz.begin() + size_t{k} * R);
      std::vector<k3::vk::Mxfp4Device::Group> groups;
      if (k) groups.push_back({sb, k});
      groups.push_back({sa, m});
      std::vector<float> out(zz.size());
      dev->issue(groups, zz.data());
      ASSERT_TRUE(dev->join(out.data()));
      EXPECT_EQ(0, std::memcmp(out.data() + size_t{k} * R, alone.data(), R * sizeof(float)))
          << m << " rows of a behind " << k << " rows of b";
    }
  }
}

TEST(VkMxfp4, DeviceMemoryCapRefusesAnUploadAndHoldsNothingForIt) {
  const uint32_t R = 64, I = 96;
  k3::vk::DeviceOptions options;
  const Expert e = random_expert(R, I, 1);
  const uint64_t one = open(R, I)->expert_bytes();  // one expert's region in a block
  options.device_cap_bytes = one * 2 + one / 2;     // room for two experts
  auto dev = open(R, I, options);
  EXPECT_GE(dev->upload(e.bytes()), 0);
  EXPECT_GE(dev->upload(e.bytes()), 0);
  const uint64_t used = dev->bytes_in_use();
  EXPECT_LE(used, options.device_cap_bytes);  // the blocks held, within the cap
  EXPECT_EQ(-1, dev->upload(e.bytes()));
  EXPECT_EQ(used, dev->bytes_in_use());
  dev->release(0);
  EXPECT_GE(dev->upload(e.bytes()), 0);  // a freed slot makes room again
  EXPECT_EQ(used, dev->bytes_in_use());  // in the same block
  EXPECT_EQ(dev->blocks(), 1u);
}

// Experts share blocks (one allocation for many experts, not two each), and a block whose experts
// are all released goes back to the driver.
TEST(VkMxfp4, ExpertsShareBlocksAndAnEmptyBlockIsFreed) {
  const uint32_t R = 64, I = 96;
  auto dev = open(R, I);
  const Expert e = random_expert(R, I, 2);
  std::vector<int32_t> slots;
  for (int i = 0; i < 6; ++i) slots.push_back(dev->upload(e.bytes()));
  EXPECT_EQ(dev->blocks(), 1u);
  EXPECT_GE(dev->bytes_in_use(), 6 * dev->expert_bytes());
  EXPECT_FALSE(dev->memory_budget());  // lavapipe lacks VK_EXT_memory_budget
  for (int32_t s : slots) dev->release(s);
  EXPECT_EQ(dev->blocks(), 0u);
  EXPECT_EQ(dev->bytes_in_use(), 0u);
}

TEST(VkMxfp4, ValidationLayerReportsNoErrors) {
  k3::vk::DeviceOptions options;
  options.validation = true;
  auto dev = open(96, 160, options);
  const Expert e = random_expert(96, 160, 4);
  const k3::vk::Mxfp4Device::Group g[] = {{dev->upload(e.bytes()), 17}};
  const std::vector<float> z = randn(17 * 96, 2);
  std::vector<float> out(z.size());
  dev->issue(g, z.data());
  ASSERT_TRUE(dev->join(out.data()));
  dev->release(g[0].slot);
  EXPECT_EQ(0u, dev->validation_errors());
}

// COLI_VK_DENSE: a dense matrix in each RAM format the loader makes (f32, int8 per row, int4 in
// groups of 64; kernels/quant.h) against the CPU's matmul on f32 activations (the scalar table),
// at K3 shapes and odd ones on both routes, staged and mapped, under validation; and a row's bits
// alone equal its bits in batches of 5 and 20 rows (GEMV and GEMM routes).
k3::WeightMatrix dense_matrix(uint32_t O, uint32_t I, int bits, uint32_t seed) {
  k3::WeightMatrix w;
  w.rows = O;
  w.cols = I;
  const std::vector<float> f32 = randn(size_t{O} * I, seed, 0.05f);
  w.f32.assign(f32.begin(), f32.end());
  k3::quantize_matrix(w, bits, cpu());
  return w;
}

k3::vk::Mxfp4Device::DenseMatrix dense_view(const k3::WeightMatrix& w) {
  using F = k3::vk::Mxfp4Device::DenseFormat;
  k3::vk::Mxfp4Device::DenseMatrix m;
  m.rows = static_cast<uint32_t>(w.rows);
  m.cols = static_cast<uint32_t>(w.cols);
  switch (w.format) {
    case k3::WeightFormat::kF32:
      m.format = F::kF32;
      m.weights = w.f32_data();
      break;
    case k3::WeightFormat::kInt8Row:
      m.format = F::kInt8Row;
      m.weights = w.q8_data();
      m.scales = w.scale_data();
      break;
    case k3::WeightFormat::kInt4G64:
      m.format = F::kInt4G64;
      m.weights = w.q4_data();
      m.scales = w.scale_data();
      break;
  }
  return m;
}

TEST(VkDense, EveryRamFormatMatchesTheCpuOnF32Activations) {
  struct Case {
    uint32_t O, I, rows;
  };
  // K3's MLA q_a (7168 -> 1536) on the GEMM route; odd shapes: fewer groups than 64
  // invocations, a group count not a multiple of 64, one output, rows on both sides of 16.
  const Case cases[] = {{1536, 7168, 16}, {37, 128, 1}, {37, 128, 17}, {5, 64, 3},
                        {130, 2112, 16},  {1, 4160, 5}, {64, 64, 20}};
  for (const char* staged : {"0", "1"}) {
    k3::vk::DeviceOptions options;
    options.validation = true;
    options.staged = staged[0] == '1' ? 1 : 0;
    auto dev = open(32, 32, options);
    for (int bits : {32, 8, 4})
      for (const Case& c : cases) {
        if (c.O == 1536 && options.staged == 1) continue;  // the K3 shape once (seconds here)
        const k3::WeightMatrix w = dense_matrix(c.O, c.I, bits, c.O + c.I + bits);
        const std::vector<float> X = randn(size_t{c.rows} * c.I, c.rows);
        std::vector<float> want(size_t{c.rows} * c.O), got(want.size());
        k3::matmul(cpu(), w, X.data(), c.rows, want.data());
        const int32_t slot = dev->upload_dense(dense_view(w));
        ASSERT_GE(slot, 0);
        ASSERT_TRUE(dev->dense_matmul(slot, X.data(), c.rows, got.data()));
        dev->release(slot);
        const double err = rel_l2(got, want);
        if (c.O == 1536)
          std::printf("dense %d-bit %u x %u, %u rows (staged %s): rel-L2 %.3g\n", bits, c.O, c.I,
                      c.rows, staged, err);
        EXPECT_LE(err, kRelL2) << bits << "-bit " << c.O << " x " << c.I << ", " << c.rows
                               << " rows, staged " << staged;
      }
    EXPECT_EQ(dev->bytes_in_use(), 0u);
    EXPECT_EQ(dev->validation_errors(), 0u);
  }
}

TEST(VkDense, RowBitsIndependentOfTheBatchAndTheRoute) {
  auto dev = open(32, 32);
  for (int bits : {32, 8, 4}) {
    const k3::WeightMatrix w = dense_matrix(70, 320, bits, 7 + bits);
    const int32_t slot = dev->upload_dense(dense_view(w));
    ASSERT_GE(slot, 0);
    const std::vector<float> X = randn(20 * 320, 11);
    std::vector<float> batch20(20 * 70), batch5(5 * 70), alone(70);
    ASSERT_TRUE(dev->dense_matmul(slot, X.data(), 20, batch20.data()));  // GEMM route
    for (uint32_t r = 0; r < 20; ++r) {
      ASSERT_TRUE(dev->dense_matmul(slot, X.data() + r * 320, 1, alone.data()));
      EXPECT_EQ(0, std::memcmp(alone.data(), batch20.data() + r * 70, 70 * sizeof(float)))
          << bits << "-bit row " << r;
    }
    ASSERT_TRUE(dev->dense_matmul(slot, X.data() + 5 * 320, 5, batch5.data()));  // GEMV route
    EXPECT_EQ(0, std::memcmp(batch5.data(), batch20.data() + 5 * 70, 5 * 70 * sizeof(float)))
        << bits;
    dev->release(slot);
  }
}

TEST(VkDense, BadShapeIsAClearError) {
  auto dev = open(32, 32);
  const k3::WeightMatrix w = dense_matrix(8, 96, 32, 1);  // f32: 96 = 3 groups of 32, fine
  ASSERT_GE(dev->upload_dense(dense_view(w)), 0);
  k3::vk::Mxfp4Device::DenseMatrix bad = dense_view(w);
  bad.cols = 48;
  try {
    dev->upload_dense(bad);
    FAIL() << "a 48-wide matrix was accepted";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
  }
}

// Staged uploads (device-local buffers written through a staging copy, what a GPU without a
// large host-visible window gets) give the bits of uploads written in place; under validation.
TEST(VkMxfp4, StagedUploadsEqualMappedOnes) {
  const uint32_t R = 96, I = 160;
  std::vector<float> outs[2];
  for (int staged : {0, 1}) {
    k3::vk::DeviceOptions options;
    options.staged = staged;
    options.validation = true;
    auto dev = open(R, I, options);
    EXPECT_EQ(dev->staged(), staged == 1);
    const Expert a = random_expert(R, I, 21), b = random_expert(R, I, 31);
    const int32_t sa = dev->upload(a.bytes()), sb = dev->upload(b.bytes());
    ASSERT_GE(sa, 0);
    ASSERT_GE(sb, 0);
    const std::vector<float> z = randn(20 * R, 8);
    const k3::vk::Mxfp4Device::Group groups[] = {{sa, 3}, {sb, 17}};
    outs[staged].resize(z.size());
    dev->issue(groups, z.data());
    ASSERT_TRUE(dev->join(outs[staged].data()));
    // An upload between batches (a promotion) is seen by the next one.
    dev->release(sa);
    const int32_t sc = dev->upload(a.bytes());
    std::vector<float> again(z.size());
    const k3::vk::Mxfp4Device::Group groups2[] = {{sc, 3}, {sb, 17}};
    dev->issue(groups2, z.data());
    ASSERT_TRUE(dev->join(again.data()));
    EXPECT_EQ(0, std::memcmp(again.data(), outs[staged].data(), z.size() * sizeof(float)));
    EXPECT_EQ(0u, dev->validation_errors());
  }
  EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)));
}

TEST(VkMxfp4, MissingLoaderIsAClearError) {
  k3::vk::DeviceOptions options;
  options.loader = "libvulkan-missing.so.1";
  const std::string error = k3::testing::error_of([&] { open(32, 32, options); });
  EXPECT_NE(error.find("libvulkan-missing.so.1"), std::string::npos) << error;
  EXPECT_NE(error.find("apt-get install libvulkan1"), std::string::npos) << error;
}

}  // namespace

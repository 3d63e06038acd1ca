// tests/test_util.h — shared test helpers: reading safetensors tensors, the fixture README's
// closeness criterion, running a command and capturing its output.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "kernels/isa.h"
#include "util/error.h"

// Expects the error message `msg` to contain `sub`, printing both when it does not.
#define EXPECT_HAS(msg, sub)                               \
  EXPECT_NE(std::string(msg).find(sub), std::string::npos) \
      << "message: " << (msg) << "\nexpected it to contain: " << (sub)

namespace k3::testing {

// The tiny synthetic checkpoint with its goldens (tests/data/k3-tiny/README.md).
inline const std::string kTinyDir = std::string(K3_SOURCE_DIR) + "/tests/data/k3-tiny";
// The k3_synth "demo" checkpoint (random weights, the real vocabulary and tokenizer), written once
// a build (tests/CMakeLists.txt, k3_test_demo_model). Shared by every test process: read it, never
// write into it (copy it first, as poisoned_copy() does).
inline const std::string kDemoDir = K3_TEST_DEMO_DIR;

// Read-only access to the tensors of one safetensors file.
struct Tensors {
  explicit Tensors(const std::string& path) : shard(open_posix_file(path)) {}
  bool has(const std::string& name) const { return shard.find(name) != nullptr; }
  std::vector<float> f32(const std::string& name) const { return read<float>(name, DType::kF32); }
  std::vector<int64_t> i64(const std::string& name) const {
    return read<int64_t>(name, DType::kI64);
  }
  SafetensorsShard shard;

 private:
  template <typename T>
  std::vector<T> read(const std::string& name, DType dtype) const {
    const TensorInfo* t = shard.find(name);
    EXPECT_NE(t, nullptr) << name;
    if (!t) return {};
    EXPECT_EQ(t->dtype, dtype) << name;
    if (t->dtype != dtype) return {};
    std::vector<T> v(t->numel());
    shard.read(*t, v.data());
    return v;
  }
};

// The bit pattern of `f` (bit-identity checks).
inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// `n` floats drawn from N(0, scale^2).
inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Closeness {
  double rel_l2 = 0;
  double max_abs = 0;
  double max_ref = 0;
};

inline Closeness closeness(const float* got, const float* want, size_t n) {
  double diff2 = 0, ref2 = 0;
  Closeness c;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff2 += d * d;
    ref2 += static_cast<double>(want[i]) * want[i];
    c.max_abs = std::max(c.max_abs, std::fabs(d));
    c.max_ref = std::max(c.max_ref, std::fabs(static_cast<double>(want[i])));
  }
  c.rel_l2 = std::sqrt(diff2) / std::max(std::sqrt(ref2), 1e-30);
  return c;
}

// The fixture README's acceptance for an f32 engine: rel-L2 <= 1e-4 and
// max abs <= 1e-3 * max(1, max|want|). Returns the rel-L2.
inline double expect_close(const std::string& name, const float* got, const float* want, size_t n) {
  const Closeness c = closeness(got, want, n);
  EXPECT_LE(c.rel_l2, 1e-4) << name << " rel-L2";
  EXPECT_LE(c.max_abs, 1e-3 * std::max(1.0, c.max_ref)) << name << " max abs";
  return c.rel_l2;
}

// The relative L2 error that rounding the activations X [n][cols] to q8_32 is expected to put into
// Y = W X (W [rows][cols], dequantised, in double; Y [n][rows] the product on unrounded X). The
// rounding (quantize_q8_32, docs/quant_formats.md §5: per 32 values d = max|x| / 127, q = round(x /
// d)) moves each value by e, uniform in [-d/2, d/2] (variance d^2 / 12) and independent of W,
// except the group's largest |x|, which is exact (q = +-127). So E[dY[t][o]^2] = sum_i W[o][i]^2
// var(e[t][i]) and the expected relative error is sqrt(sum E[dY^2] / sum Y^2). d is computed here
// from X by that formula, not taken from the kernel under test. Over n * rows outputs of thousands
// of terms the measured error is this figure within a few percent (sqrt(2 / outputs) for the sum of
// squares).
inline double q8_rounding_rel_l2(const double* W, const float* X, const float* Y, size_t n,
                                 size_t rows, size_t cols) {
  std::vector<double> var(cols);
  double err2 = 0, ref2 = 0;
  for (size_t t = 0; t < n; ++t) {
    const float* x = X + t * cols;
    for (size_t g = 0; g < cols; g += 32) {
      size_t top = g;
      for (size_t i = g; i < g + 32; ++i)
        if (std::fabs(x[i]) > std::fabs(x[top])) top = i;
      const double d = std::fabs(static_cast<double>(x[top])) / 127;
      for (size_t i = g; i < g + 32; ++i) var[i] = i == top ? 0.0 : d * d / 12;
    }
    for (size_t o = 0; o < rows; ++o) {
      for (size_t i = 0; i < cols; ++i) err2 += W[o * cols + i] * W[o * cols + i] * var[i];
      ref2 += static_cast<double>(Y[t * rows + o]) * Y[t * rows + o];
    }
  }
  return std::sqrt(err2 / ref2);
}

struct CommandResult {
  int status = -1;
  std::string out;  // stdout (and stderr too for run_command)
  std::string err;  // stderr, for run_split
};

// Runs `f` and returns the k3::Error message; a test failure when nothing or something else is
// thrown.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const k3::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected k3::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected k3::Error, nothing was thrown";
  return "";
}

// A fresh directory under the build folder, removed at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = (std::filesystem::path(K3_BINARY_DIR) / "test_tmp" /
             (tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++)))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const {
    return (std::filesystem::path(path_) / name).string();
  }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

// A copy of the model at `source` in the existing directory `dir` — symbolic links to its files,
// except the shard holding `tensor` (a name without the checkpoint's prefix, as
// ModelFiles::find takes it), which is copied — with `bytes` written over element `index` of that
// tensor. Returns the copied shard's path.
std::string poisoned_copy(const std::string& source, const std::string& dir,
                          const std::string& tensor, uint64_t index, const std::string& bytes);

// Runs `command` through /bin/sh, capturing stdout and stderr together.
CommandResult run_command(const std::string& command);
// Runs `command` through /bin/sh with stdin from `stdin_path` (/dev/null when empty), stdout and
// stderr captured apart.
CommandResult run_split(const std::string& command, const std::string& stdin_path = "");

// The kernel variants an ISA twin test runs, scalar first: every one this CPU runs, up to K3_ISA
// when it names one (K3_ISA=avx2 checks what an AVX2-only machine checks). A variant left out is
// reported by the skipped test <suite>TwinIsa.<variant> of the same binary (K3_TWIN_ISA_TESTS
// below), so ctest's summary lists it among the tests that did not run; calling twin_isas() in a
// binary that does not define those tests is a test failure.
std::vector<Isa> twin_isas();
// The SIMD variants of twin_isas() (scalar left out). A test that compares them with the scalar
// twin skips, naming why, when there is none: it would otherwise pass having asserted nothing.
std::vector<Isa> simd_isas();
// Why twin_isas() leaves `isa` out ("not available on this CPU", "excluded by K3_ISA=avx2"), or
// "" when it runs.
std::string isa_left_out(Isa isa);
// The body of <suite>TwinIsa.<variant>: skipped (GTEST_SKIP, with isa_left_out's reason) when the
// variant is left out, else it checks that the variant's kernel table is that variant's.
void check_twin_isa(Isa isa);
bool twin_isa_tests_defined();  // K3_TWIN_ISA_TESTS' registration (see twin_isas)

// Writes the tiny synthetic checkpoint (tools/synth_lib.h, preset "tiny") with `experts` routed
// experts per layer and the given seed into `dir`: rows of a chunk or a batch share some experts
// and not others.
void write_tiny_synth(const std::string& dir, int64_t experts = 64, uint64_t seed = 1);

// Points VK_ICD_FILENAMES at Mesa's lavapipe (K3_LAVAPIPE_ICD, found by tests/CMakeLists.txt)
// and XDG_RUNTIME_DIR at the build folder, unless the environment names them already (a real
// GPU's driver, on a machine that has one). The Vulkan tests call it before main:
// `const bool kOnLavapipe = (k3::testing::select_lavapipe(), true);`.
void select_lavapipe();

}  // namespace k3::testing

// One skipped-or-passing test per SIMD variant, in every test file that calls twin_isas():
// <suite>TwinIsa.avx2 and <suite>TwinIsa.avx512 (the suite names the file: ctest names must be
// unique). A run on an AVX2-only machine (or with K3_ISA=avx2 / scalar) lists
// "GoldenQuantTwinIsa.avx512 ... Skipped" in ctest's summary instead of passing its twin tests
// silently short of a variant.
#define K3_TWIN_ISA_TESTS(suite)                                                                 \
  [[maybe_unused]] const bool k3_twin_isa_tests_##suite = k3::testing::twin_isa_tests_defined(); \
  TEST(suite##TwinIsa, avx2) {                                                                   \
    k3::testing::check_twin_isa(k3::Isa::kAvx2);                                                 \
  }                                                                                              \
  TEST(suite##TwinIsa, avx512) {                                                                 \
    k3::testing::check_twin_isa(k3::Isa::kAvx512);                                               \
  }

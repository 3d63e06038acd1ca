// tests/test_util.h — shared test helpers: reading safetensors tensors, the fixture README's
// closeness criterion, running a command and capturing its output.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
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
// when it names one (K3_ISA=avx2 checks what an AVX2-only machine checks). Once per test it
// prints a line for every variant left out ("ISA avx512: not available on this CPU, its twin
// tests did not run") and records them as the test property isa_not_run, so a run on an
// AVX2-only machine says what it did not check instead of passing silently.
std::vector<Isa> twin_isas();

}  // namespace k3::testing

// bench/ggml_peer.h — ggml's CPU MXFP4 dot product, loaded at run time (dlopen) from the prebuilt
// libraries of the npm package @node-llama-cpp/linux-x64 (bench/package.json), as a speed and
// correctness peer for our MXFP4 kernels. Optional: when the package is missing or does not load,
// the bench says so and carries on. Nothing here is linked at build time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace k3bench {

// ggml's block_mxfp4: 32 weights per 17 bytes, e = exponent byte, qs[j] holds element j in the
// low nibble and element j + 16 in the high nibble (the checkpoint packs 2j / 2j + 1).
inline constexpr size_t kGgmlMxfp4Block = 17;
// ggml's block_q8_0: fp16 scale + 32 int8.
inline constexpr size_t kGgmlQ8Block = 34;

class GgmlPeer {
 public:
  using VecDot = void (*)(int n, float* s, size_t bs, const void* vx, size_t bx, const void* vy,
                          size_t by, int nrc);
  using QuantizeRow = void (*)(const float* x, void* y, int64_t k);
  using DequantizeRow = void (*)(const void* x, float* y, int64_t k);

  // Looks for libggml-base.so under `bins_root` (searched recursively), loads it and every
  // libggml-cpu-*.so beside it, keeps the CPU variant with the highest ggml_backend_score().
  // Never throws: on failure ok() is false and why() says what went wrong.
  explicit GgmlPeer(const std::string& bins_root);
  ~GgmlPeer();
  GgmlPeer(const GgmlPeer&) = delete;
  GgmlPeer& operator=(const GgmlPeer&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  // "libggml-cpu-zen4.so (score 123)" and the library directory.
  const std::string& variant() const { return variant_; }
  const std::string& dir() const { return dir_; }

  VecDot vec_dot_mxfp4_q8_0 = nullptr;
  QuantizeRow quantize_row_q8_0 = nullptr;
  DequantizeRow dequantize_row_mxfp4 = nullptr;  // from libggml-base

 private:
  bool ok_ = false;
  std::string why_;
  std::string variant_;
  std::string dir_;
  void* base_ = nullptr;
  void* cpu_ = nullptr;
};

// Repacks one MXFP4 matrix from the checkpoint layout (packed [rows][cols/2], scales
// [rows][cols/32]) to ggml blocks ([rows][cols/32] x 17 bytes); `exponent_offset` is added to
// every scale byte (0 when both sides read the byte the same way).
std::vector<uint8_t> repack_mxfp4_for_ggml(const uint8_t* packed, const uint8_t* scales,
                                           size_t rows, size_t cols, int exponent_offset);

}  // namespace k3bench

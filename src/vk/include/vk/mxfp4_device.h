// vk/mxfp4_device.h — routed MXFP4 experts on a Vulkan device (docs/vulkan.md).
//
// The Vulkan loader (libvulkan.so.1) is opened at run time with dlopen, so a binary built with
// K3_VULKAN starts on a machine without it; nothing opens a device unless a caller asks (the
// engine only with COLI_VULKAN=1). Compute shaders embedded as SPIR-V at build time
// (src/vk/shaders) take the release's bytes: the nibbles as stored, the ue8m0 scales widened to f32
// per (row, 32-group) on upload (the caller's copy untouched). One expert is computed whole on the
// device in the latent space: gate and up, SiTU, down, all in f32 (the K3_IDOT=0 numerics); rows
// below `gemm_rows` take the GEMV route, from `gemm_rows` on the tiled GEMM route, and a row's bits
// depend on neither the route nor the other rows of the dispatch (shaders/mxfp4_mm.comp).
//
// Device memory: experts are placed best-fit in large blocks (vk/block_allocator.h).
// Thread-safety: issue(), join(), release() and matmul() on one thread (the engine's), issue()
// and join() alternating; upload() may run on another thread (an uploader) meanwhile. A release
// while a batch is in flight frees the expert's memory once the batch is done.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace k3::vk {

// True when this binary was built with K3_VULKAN (the shaders and the loader code are in).
bool built_with_vulkan();

struct DeviceOptions {
  uint32_t gemm_rows = 16;        // COLI_VK_TIER_GEMM_ROWS: rows from which the GEMM route runs
  uint64_t device_cap_bytes = 0;  // COLI_VK_DEVICE_CAP_MB: device memory this process may take
                                  // for experts (0 = what the driver gives)
  bool validation = false;        // Khronos validation layer on (its errors are counted)
  // COLI_VK_STAGED: experts in device-local memory written through a staging buffer (1), or in
  // host-visible memory written in place (0); -1 = staged when the host-visible device-local
  // memory is under a quarter of the largest device-local heap (no resizable BAR).
  int staged = -1;
  std::string loader = "libvulkan.so.1";  // the loader dlopen()ed (tests name a missing one)
};

// One routed expert's geometry and activation (docs/architecture.md §3.6).
struct ExpertShape {
  uint32_t hidden = 0;        // routed_expert_hidden_size R: input of gate/up, output of down
  uint32_t intermediate = 0;  // moe_intermediate_size I
  float beta = 4.0f;          // SiTU β1
  float beta_linear = 25.0f;  // SiTU β2
};

// An expert's bytes as the release stores them (experts/expert_store.h's ExpertView): gate and
// up packed [I][R/2], scales [I][R/32]; down packed [R][I/2], scales [R][I/32] (ue8m0).
struct ExpertBytes {
  const uint8_t* gate_packed = nullptr;
  const uint8_t* gate_scale = nullptr;
  const uint8_t* up_packed = nullptr;
  const uint8_t* up_scale = nullptr;
  const uint8_t* down_packed = nullptr;
  const uint8_t* down_scale = nullptr;
};

class Mxfp4Device {
 public:
  // Opens the loader, an instance and the best device with a compute queue (a discrete GPU, else
  // an integrated one, else any). Throws k3::Error naming what is missing (the loader, a driver,
  // a compute queue, the validation layer) and how to get it.
  static std::unique_ptr<Mxfp4Device> open(const DeviceOptions& options, const ExpertShape& shape);
  virtual ~Mxfp4Device() = default;

  virtual const std::string& name() const = 0;  // "llvmpipe (LLVM 15.0.6, 256 bits)"
  virtual bool is_cpu() const = 0;              // a CPU implementation (lavapipe)
  virtual bool is_discrete() const = 0;         // a discrete GPU (its own memory, over a bus)
  // Device bytes one uploaded expert takes (f32 scales included).
  virtual uint64_t expert_bytes() const = 0;
  virtual uint64_t bytes_in_use() const = 0;  // device memory held for experts (whole blocks)
  virtual uint64_t blocks() const = 0;        // device memory blocks held
  virtual bool staged() const = 0;            // uploads go through a staging buffer
  virtual uint64_t memory_bytes() const = 0;  // the largest device-local heap
  // What VK_EXT_memory_budget says this process may still take from the largest device-local
  // heap (heapBudget less heapUsage), or nothing when the device does not offer the extension.
  virtual std::optional<uint64_t> memory_budget() const = 0;
  // The most (row, expert) pairs one issue() takes.
  virtual size_t max_pairs() const = 0;

  // Copies an expert to the device (placed best-fit in a block). Returns its slot, or -1 when the
  // device memory cap or the driver refuses it (nothing is then held). May run on a thread of
  // its own while a batch is in flight.
  virtual int32_t upload(const ExpertBytes& expert) = 0;
  // Frees a slot; while a batch is in flight its memory is freed once that batch is done (its
  // results stay for join()).
  virtual void release(int32_t slot) = 0;

  // One expert's share of a batch: `rows` consecutive rows of the batch's z.
  struct Group {
    int32_t slot;
    uint32_t rows;
  };
  // Starts the groups on z [P][hidden] (P = their rows, at most max_pairs()) and returns at once.
  virtual void issue(std::span<const Group> groups, const float* z) = 0;
  // Waits for the batch; out [P][hidden] = W2 SiTU(W1 z, W3 z) per row. False when the device
  // failed (lost): out is then undefined and the device must not be used again.
  virtual bool join(float* out) = 0;

  // Y [rows][O] = W X for one MXFP4 matrix W [O][I] (packed [O][I/2], ue8m0 scales [O][I/32])
  // and X [rows][I], synchronously (the kernel tests).
  virtual void matmul(const uint8_t* packed, const uint8_t* scales, uint32_t O, uint32_t I,
                      const float* X, uint32_t rows, float* Y) = 0;

  // A dense matrix of prompt chunks (COLI_VK_DENSE) in the RAM format the loader made it
  // (docs/quant_formats.md), uploaded as stored: f32, int8 per row or int4 in groups of 64.
  enum class DenseFormat : uint32_t { kF32 = 0, kInt8Row = 1, kInt4G64 = 2 };
  struct DenseMatrix {
    DenseFormat format = DenseFormat::kF32;
    uint32_t rows = 0, cols = 0;    // W [rows][cols]; cols a multiple of 32 (int4: of 64)
    const void* weights = nullptr;  // f32 [rows][cols], int8 [rows][cols] or int4 [rows][cols/2]
    const float* scales = nullptr;  // int8: [rows]; int4: [rows][cols/64]; f32: unused
  };
  // Copies a dense matrix to the device (best-fit in the blocks, under the memory cap). Returns
  // its slot, or -1 when the cap or the driver refuses it. Throws k3::Error on a bad shape.
  virtual int32_t upload_dense(const DenseMatrix& matrix) = 0;
  // Y [rows][W.rows] = W X for X [rows][W.cols], synchronously, with f32 activations; on its own
  // command buffer, so an expert batch may be in flight meanwhile. False when the device failed
  // (lost): Y is then undefined.
  virtual bool dense_matmul(int32_t slot, const float* X, uint32_t rows, float* Y) = 0;

  // Errors the validation layer reported (DeviceOptions::validation).
  virtual uint64_t validation_errors() const = 0;
};

}  // namespace k3::vk

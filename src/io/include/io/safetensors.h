// io/safetensors.h — one safetensors shard: header parsing with full validation.
// Owns: dtype table, TensorInfo, header validation (length cap, JSON, dtype, shape x size,
// ranges inside the data region, no overlaps). Does not own: lookup across shards (model_files.h)
// or widening to f32 (kernels/convert.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/file.h"

namespace k3 {

enum class DType {
  kBF16,
  kF16,
  kF32,
  kF64,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0
};

// Bytes per element.
size_t dtype_size(DType dtype);
// Canonical safetensors name ("BF16", "F8_E4M3", ...).
const char* dtype_name(DType dtype);
// Parses a safetensors dtype name; returns false for an unknown name.
bool parse_dtype(const std::string& name, DType* out);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t file_offset = 0;  // absolute byte offset of the first byte in the shard file
  uint64_t nbytes = 0;
  uint64_t numel() const;
};

// The header's "__metadata__" object (string to string; anything else is refused).
using SafetensorsMetadata = std::map<std::string, std::string>;

// Padding tensors: zero-filled U8 tensors a writer inserts so the next tensor starts on an
// alignment boundary (the format forbids holes between tensors). Lookups skip them.
inline constexpr const char* kPaddingTensorPrefix = "__k3_pad.";
std::string padding_tensor_name(uint64_t n);  // "__k3_pad.<n>"
bool is_padding_tensor(const std::string& name);

// The error text for the non-finite `value` (NaN, +Inf or -Inf) at flat element `index` of tensor
// `t` of the shard at `path`: the path, the tensor, the value, the element index (and its
// multi-dimensional index with the shape) and the fix. Loaders and the repack refuse such a tensor.
std::string non_finite_message(const std::string& path, const TensorInfo& t, uint64_t index,
                               float value);

// Header JSON larger than this is refused (the real shard 93 header is ~0.8 MB).
inline constexpr uint64_t kMaxHeaderBytes = uint64_t{256} << 20;

// Parses and validates a header. `header_json` is the N bytes after the 8-byte length;
// `file_size` is the shard size. Tensors are returned in data-offset order. Throws k3::Error
// naming `path` and the offending tensor.
std::vector<TensorInfo> parse_safetensors_header(const std::string& header_json, uint64_t file_size,
                                                 const std::string& path,
                                                 SafetensorsMetadata* metadata = nullptr);

// An open shard: its file and its validated tensor table.
class SafetensorsShard {
 public:
  // Reads and validates the header of `file`. Throws k3::Error.
  explicit SafetensorsShard(std::unique_ptr<File> file);

  const std::string& path() const { return file_->path(); }
  const File& file() const { return *file_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const SafetensorsMetadata& metadata() const { return metadata_; }
  // Bytes before the data region (8 + header length).
  uint64_t data_start() const { return data_start_; }
  // nullptr when the shard has no tensor of that name.
  const TensorInfo* find(const std::string& name) const;
  // Reads the raw bytes of `info` (which must belong to this shard) into `dst`.
  void read(const TensorInfo& info, void* dst) const;
  // The whole shard mapped read-only (K3_MMAP), created on first use and shared by every caller.
  std::shared_ptr<const FileMapping> mapping() const;
  // Bytes read() has delivered so far (load progress: GB/s and ETA).
  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  mutable std::atomic<uint64_t> bytes_read_{0};
  mutable std::mutex mapping_mutex_;
  mutable std::shared_ptr<const FileMapping> mapping_;
  std::unique_ptr<File> file_;
  std::vector<TensorInfo> tensors_;
  SafetensorsMetadata metadata_;
  uint64_t data_start_ = 0;
  std::vector<uint32_t> by_name_;  // [tensors] indices into tensors_, in name order
};

}  // namespace k3

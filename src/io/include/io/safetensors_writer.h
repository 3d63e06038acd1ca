// io/safetensors_writer.h — writes one safetensors shard in the real snapshot's conventions:
// compact JSON header starting with "__metadata__":{"format":"pt"}, space-padded so the data
// starts at a multiple of 8, tensors back to back in the order they were added. Written to a
// temp file and renamed, so a crash never leaves a half-written shard under the final name.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace k3 {

class SafetensorsWriter {
 public:
  // Fills exactly nbytes at dst. Called once, in order, during write().
  using Fill = std::function<void(uint8_t* dst, uint64_t nbytes)>;

  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, Fill fill);
  // Convenience: copies `bytes` (must be shape x dtype bytes).
  void add_bytes(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                 std::vector<uint8_t> bytes);
  // Total data bytes added so far.
  uint64_t data_bytes() const { return data_bytes_; }
  const std::vector<std::string>& names() const { return names_; }
  // Writes `path` (via path + ".tmp" and rename). `on_tensor(nbytes)` reports progress.
  void write(const std::string& path,
             const std::function<void(uint64_t)>& on_tensor = nullptr) const;
  // The header bytes write() would emit (length prefix excluded, padding included).
  std::string header() const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
    Fill fill;
  };
  std::vector<Entry> entries_;
  std::vector<std::string> names_;
  uint64_t data_bytes_ = 0;
};

}  // namespace k3

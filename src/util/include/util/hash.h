// util/hash.h — FNV-1a (Fowler–Noll–Vo, variant 1a), the one non-cryptographic hash of the tree:
// checkpoint payload checksums, the expert-usage history's model identity, the synthetic
// generator's per-tensor seeds, the tokenizer bench's id digest. Over bytes, in order:
//   h = offset;  for each byte b: h = (h ^ b) * prime
// with the 32-bit (offset 2166136261, prime 16777619) or 64-bit (offset 14695981039346656037,
// prime 1099511628211) parameters. `h` continues a running hash over several pieces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace k3 {

inline constexpr uint32_t kFnv1a32Offset = 2166136261u;
inline constexpr uint32_t kFnv1a32Prime = 16777619u;
inline constexpr uint64_t kFnv1a64Offset = 14695981039346656037ull;
inline constexpr uint64_t kFnv1a64Prime = 1099511628211ull;

constexpr uint32_t fnv1a_32(std::string_view bytes, uint32_t h = kFnv1a32Offset) {
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * kFnv1a32Prime;
  return h;
}

constexpr uint64_t fnv1a_64(std::string_view bytes, uint64_t h = kFnv1a64Offset) {
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * kFnv1a64Prime;
  return h;
}

// The same over the `size` bytes at `data` (an object's representation).
inline uint32_t fnv1a_32_bytes(const void* data, size_t size, uint32_t h = kFnv1a32Offset) {
  return fnv1a_32(std::string_view(static_cast<const char*>(data), size), h);
}

inline uint64_t fnv1a_64_bytes(const void* data, size_t size, uint64_t h = kFnv1a64Offset) {
  return fnv1a_64(std::string_view(static_cast<const char*>(data), size), h);
}

}  // namespace k3

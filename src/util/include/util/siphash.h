// util/siphash.h — SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF", 2012):
// a keyed 64-bit MAC. Owns the one keyed hash of the tree: the tags of the disk checkpoints
// (engine/checkpoints.h), whose key is random per process and never leaves memory. Not for
// unkeyed checksums (util/hash.h has FNV-1a for those).
//
// Streaming: feed any number of pieces with update(), then final() once. The tag of a message does
// not depend on how it was split into pieces. Thread-safety: an object is used by one thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace k3 {

using SipKey = std::array<uint8_t, 16>;

class SipHash24 {
 public:
  explicit SipHash24(const SipKey& key);
  void update(const void* data, size_t size);
  // The tag of everything fed. REQUIRES: called once.
  uint64_t final();

 private:
  void compress(uint64_t m);
  uint64_t v0_, v1_, v2_, v3_;
  uint8_t tail_[8] = {};
  size_t tail_size_ = 0;
  uint64_t total_ = 0;  // bytes fed
};

// The tag of `size` bytes at `data` in one call.
uint64_t siphash24(const SipKey& key, const void* data, size_t size);

// 16 bytes from the kernel's random source (getrandom). Throws k3::Error when it fails.
SipKey random_sip_key();

}  // namespace k3

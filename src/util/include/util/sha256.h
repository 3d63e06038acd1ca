// util/sha256.h — SHA-256 (FIPS 180-4), for content identities a user can check with
// `sha256sum`: the repacked container's record of the source index it was built from
// (docs/container.md §2).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace k3 {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  // The digest; the object must not be updated afterwards.
  std::array<uint8_t, 32> finish();
  // Lower-case hex of finish().
  std::string hex();

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t used_ = 0;
  uint64_t length_ = 0;
};

// Lower-case hex SHA-256 of `bytes`.
std::string sha256_hex(std::string_view bytes);

}  // namespace k3

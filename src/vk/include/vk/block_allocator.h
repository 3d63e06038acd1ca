// vk/block_allocator.h — best-fit sub-allocation of device memory in blocks (docs/vulkan.md §2).
//
// Device memory is taken from the driver in blocks of `block_bytes` (fewer when the cap leaves
// less, more when one request is larger) and requests are placed best-fit inside them: the
// smallest free range of any block that holds the request, the lowest (block, offset) among equal
// ones. Freed ranges coalesce with their free neighbours; a block left empty goes back to the
// driver. `cap_bytes` (COLI_VK_DEVICE_CAP_MB) bounds the bytes of the blocks held, exactly. The
// allocator knows no Vulkan: `create(block, bytes)` asks the driver for a block's memory (false
// when refused) and `destroy(block)` gives it back, so the unit test (tests/vk_block_test.cpp)
// runs without a device.
// Thread-safety: none (the device serialises its callers).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

namespace k3::vk {

class BlockAllocator {
 public:
  struct Options {
    uint64_t block_bytes = 256ull << 20;  // a fresh block's size (less when the cap leaves less)
    uint64_t cap_bytes = 0;               // bytes of blocks held at most (0 = no cap)
    uint64_t alignment = 256;             // every offset and size a multiple of it (a power of 2)
  };
  struct Region {
    uint32_t block = 0;
    uint64_t offset = 0, bytes = 0;  // bytes: the request rounded up to the alignment
  };
  using Create = std::function<bool(uint32_t block, uint64_t bytes)>;
  using Destroy = std::function<void(uint32_t block)>;

  BlockAllocator(const Options& options, Create create, Destroy destroy);

  // A region of at least `bytes`: best fit in the blocks held, else in a fresh block. Nothing
  // when the cap or the driver refuses (nothing is then held for it).
  std::optional<Region> allocate(uint64_t bytes);
  // Gives a region back; a block left empty is destroyed.
  void free(const Region& region);

  uint64_t held_bytes() const { return held_; }  // bytes of the blocks held
  uint64_t used_bytes() const { return used_; }  // bytes of the regions handed out
  size_t blocks() const;                         // blocks held
  // Largest free range of any block held (0 when none): how fragmented the blocks are.
  uint64_t largest_free() const;

 private:
  struct Block {
    uint64_t bytes = 0;                  // 0: no block under this index
    std::map<uint64_t, uint64_t> free_;  // offset -> length, disjoint, not adjacent
  };
  Options options_;
  Create create_;
  Destroy destroy_;
  std::vector<Block> blocks_;
  uint64_t held_ = 0, used_ = 0;
};

}  // namespace k3::vk

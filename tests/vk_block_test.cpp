// vk_block_test — best-fit sub-allocation of device memory in blocks (vk/block_allocator.h,
// docs/vulkan.md §2) without a device: best fit over first fit, freed ranges coalescing and
// reused, empty blocks given back, the cap held exactly, a refused block holding nothing.
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "vk/block_allocator.h"

namespace {

using k3::vk::BlockAllocator;

// The driver's side: the blocks it holds, and whether it refuses the next one.
struct Driver {
  std::map<uint32_t, uint64_t> blocks;
  int created = 0;
  bool refuse = false;
  BlockAllocator make(uint64_t block, uint64_t cap, uint64_t alignment = 8) {
    return BlockAllocator(
        {block, cap, alignment},
        [this](uint32_t b, uint64_t bytes) {
          if (refuse) return false;
          EXPECT_EQ(blocks.count(b), 0u) << "block " << b << " created twice";
          blocks[b] = bytes;
          ++created;
          return true;
        },
        [this](uint32_t b) { EXPECT_EQ(blocks.erase(b), 1u) << "block " << b; });
  }
};

TEST(VkBlock, BestFitKeepsTheLargeHoleForTheLargeRequest) {
  Driver d;
  BlockAllocator a = d.make(1000, 0, 4);
  // 0..100 A, 100..400 B, 400..500 C, 500..700 D, 700..800 E, 800..1000 free.
  const auto A = a.allocate(100), B = a.allocate(300), C = a.allocate(100), D = a.allocate(200),
             E = a.allocate(100);
  ASSERT_TRUE(A && B && C && D && E);
  EXPECT_EQ(E->offset, 700u);
  a.free(*B);  // a 300 hole at 100
  a.free(*D);  // a 200 hole at 500 (and 200 free at 800)
  const auto f = a.allocate(200);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->offset, 500u);  // the tightest fit, the lowest of two equal ones (first fit: 100)
  const auto g = a.allocate(300);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->offset, 100u);  // the 300 hole is still whole
  EXPECT_EQ(a.blocks(), 1u);
  EXPECT_EQ(d.created, 1);
  EXPECT_EQ(a.used_bytes(), 1000u - 200u);
}

TEST(VkBlock, FreedRangesCoalesceAndAnEmptyBlockGoesBack) {
  Driver d;
  BlockAllocator a = d.make(1024, 0);
  std::optional<BlockAllocator::Region> r[4];
  for (auto& x : r) x = a.allocate(256);
  EXPECT_EQ(a.largest_free(), 0u);
  a.free(*r[1]);
  a.free(*r[2]);
  EXPECT_EQ(a.largest_free(), 512u);  // 256 + 256 merged
  const auto big = a.allocate(512);   // fits in the merged hole: no second block
  ASSERT_TRUE(big);
  EXPECT_EQ(big->offset, 256u);
  EXPECT_EQ(d.created, 1);
  a.free(*big);
  a.free(*r[0]);
  a.free(*r[3]);  // the last region: the block goes back to the driver
  EXPECT_EQ(a.blocks(), 0u);
  EXPECT_TRUE(d.blocks.empty());
  EXPECT_EQ(a.held_bytes(), 0u);
  EXPECT_EQ(a.used_bytes(), 0u);
  // A request larger than a block gets a block of its own size.
  const auto huge = a.allocate(5000);
  ASSERT_TRUE(huge);
  EXPECT_EQ(a.held_bytes(), 5000u);
}

TEST(VkBlock, TheCapIsHeldExactlyAndFreedSpaceIsReused) {
  Driver d;
  const uint64_t expert = 96;
  BlockAllocator a = d.make(1 << 20, expert * 2 + expert / 2);  // room for two and a half
  const auto x = a.allocate(expert), y = a.allocate(expert);
  ASSERT_TRUE(x && y);
  EXPECT_FALSE(a.allocate(expert));  // a third does not fit in the cap
  EXPECT_LE(a.held_bytes(), expert * 2 + expert / 2);
  EXPECT_EQ(a.used_bytes(), 2 * expert);
  a.free(*x);
  const auto z = a.allocate(expert);  // in x's place
  ASSERT_TRUE(z);
  EXPECT_EQ(z->offset, x->offset);
  EXPECT_EQ(d.created, 1);
  // Small requests fill the cap's remainder; nothing past it.
  const auto rest = a.allocate(expert / 2);
  ASSERT_TRUE(rest);
  EXPECT_FALSE(a.allocate(8));
  EXPECT_LE(a.held_bytes(), expert * 2 + expert / 2);
}

TEST(VkBlock, ARefusedBlockHoldsNothing) {
  Driver d;
  BlockAllocator a = d.make(1024, 0);
  d.refuse = true;
  EXPECT_FALSE(a.allocate(100));
  EXPECT_EQ(a.held_bytes(), 0u);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.blocks(), 0u);
  d.refuse = false;
  const auto r = a.allocate(100);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->bytes, 104u);  // rounded to the alignment
  EXPECT_EQ(a.held_bytes(), 1024u);
}

}  // namespace

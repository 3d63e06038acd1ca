// Best-fit sub-allocation in blocks (vk/block_allocator.h).
#include "vk/block_allocator.h"

#include <algorithm>
#include <iterator>

namespace k3::vk {

BlockAllocator::BlockAllocator(const Options& options, Create create, Destroy destroy)
    : options_(options), create_(std::move(create)), destroy_(std::move(destroy)) {
  if (options_.alignment == 0) options_.alignment = 1;
}

std::optional<BlockAllocator::Region> BlockAllocator::allocate(uint64_t bytes) {
  const uint64_t a = options_.alignment;
  const uint64_t need = std::max<uint64_t>(a, (bytes + a - 1) / a * a);
  // Best fit over the blocks held.
  Block* best_block = nullptr;
  uint32_t best_index = 0;
  std::map<uint64_t, uint64_t>::iterator best;
  for (uint32_t b = 0; b < blocks_.size(); ++b) {
    Block& block = blocks_[b];
    for (auto it = block.free_.begin(); it != block.free_.end(); ++it)
      if (it->second >= need && (!best_block || it->second < best->second)) {
        best_block = &block;
        best_index = b;
        best = it;
      }
  }
  if (!best_block) {
    // A fresh block: block_bytes, or what the cap leaves, or the request when larger.
    uint64_t size = std::max(need, options_.block_bytes / a * a);
    if (options_.cap_bytes) {
      if (held_ + need > options_.cap_bytes) return std::nullopt;
      size = std::min(size, (options_.cap_bytes - held_) / a * a);
    }
    uint32_t index = 0;
    while (index < blocks_.size() && blocks_[index].bytes) ++index;
    if (!create_(index, size)) return std::nullopt;
    if (index == blocks_.size()) blocks_.emplace_back();
    Block& block = blocks_[index];
    block.bytes = size;
    block.free_.clear();
    best = block.free_.emplace(0, size).first;
    best_block = &block;
    best_index = index;
    held_ += size;
  }
  const Region r{best_index, best->first, need};
  const uint64_t left = best->second - need;
  best_block->free_.erase(best);
  if (left) best_block->free_.emplace(r.offset + need, left);
  used_ += need;
  return r;
}

void BlockAllocator::free(const Region& r) {
  Block& block = blocks_[r.block];
  used_ -= r.bytes;
  auto it = block.free_.emplace(r.offset, r.bytes).first;
  // Coalesce with the next range, then with the previous one.
  if (auto next = std::next(it);
      next != block.free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    block.free_.erase(next);
  }
  if (it != block.free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      block.free_.erase(it);
      it = prev;
    }
  }
  if (it->first == 0 && it->second == block.bytes) {
    destroy_(r.block);
    held_ -= block.bytes;
    block = Block{};
  }
}

size_t BlockAllocator::blocks() const {
  return static_cast<size_t>(
      std::count_if(blocks_.begin(), blocks_.end(), [](const Block& b) { return b.bytes > 0; }));
}

uint64_t BlockAllocator::largest_free() const {
  uint64_t most = 0;
  for (const Block& b : blocks_)
    for (const auto& [offset, length] : b.free_) most = std::max(most, length);
  return most;
}

}  // namespace k3::vk

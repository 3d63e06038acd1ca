// io/read_ahead.cpp — io/read_ahead.h: slots, windows and the hand-over order.
//
// Range k lives in slot k % S. next() for range k first releases range k - 1's slot by starting
// range k - 1 + S in it, then waits for range k: S - 1 ranges are in flight while one is held.
#include "io/read_ahead.h"

#include <algorithm>
#include <utility>

#include "util/error.h"
#include "util/sys.h"

namespace k3 {

struct ReadAhead::Slot {
  std::vector<uint8_t> storage;  // [capacity + kDirectAlign]: `base` is its aligned start
  uint8_t* base = nullptr;
  uint64_t capacity = 0;
  uint64_t skew = 0;  // range offset - the window's aligned start: the range is at base + skew
  ReadTicket ticket;
};

ReadAhead::ReadAhead(ReadQueue& queue, int slots) : queue_(queue) {
  if (slots < 2) throw Error("read-ahead: needs at least 2 slots, got " + std::to_string(slots));
  for (int i = 0; i < slots; ++i) slots_.push_back(std::make_unique<Slot>());
}

ReadAhead::~ReadAhead() {
  withdraw();
}

void ReadAhead::withdraw() {
  for (const auto& slot : slots_) {
    queue_.cancel(slot->ticket);
    slot->ticket.wait();
  }
}

void ReadAhead::start(std::vector<ReadRange> ranges) {
  withdraw();
  ranges_ = std::move(ranges);
  next_range_ = 0;
  submitted_ = 0;
  uint64_t longest = 0;
  for (const ReadRange& r : ranges_) {
    if (r.file == nullptr) throw Error("read-ahead: range " + r.what + " has no file");
    longest = std::max(longest, r.length);
  }
  // A window is the range plus less than one block before it and less than one after it.
  const uint64_t capacity = longest + 2 * kDirectAlign;
  for (const auto& slot : slots_) {
    if (slot->capacity >= capacity) continue;
    resize_huge(slot->storage, capacity + kDirectAlign);
    const auto at = reinterpret_cast<uintptr_t>(slot->storage.data());
    slot->base = slot->storage.data() + ((kDirectAlign - at % kDirectAlign) % kDirectAlign);
    slot->capacity = capacity;
  }
  while (submitted_ < std::min(ranges_.size(), slots_.size())) submit(submitted_);
}

void ReadAhead::submit(size_t range_index) {
  const ReadRange& r = ranges_[range_index];
  Slot& slot = *slots_[range_index % slots_.size()];
  const uint64_t end = r.offset + r.length;
  const uint64_t window = r.offset / kDirectAlign * kDirectAlign;
  slot.skew = r.offset - window;
  ReadRequest requests[2];
  size_t count = 0;
  uint64_t buffered_from = r.offset;
  if (r.length > 0 && r.file->descriptor(true) >= 0) {
    // Whole blocks only, and none past the file's last whole block (O_DIRECT cannot read a
    // partial block at the end of a file).
    const uint64_t last_whole = r.file->size() / kDirectAlign * kDirectAlign;
    const uint64_t direct_end =
        std::min((end + kDirectAlign - 1) / kDirectAlign * kDirectAlign, last_whole);
    if (direct_end > r.offset) {
      requests[count++] = {r.file, slot.base, direct_end - window, window, true};
      buffered_from = direct_end;
    }
  }
  if (buffered_from < end)
    requests[count++] = {r.file, slot.base + (buffered_from - window), end - buffered_from,
                         buffered_from, false};
  queue_.submit(slot.ticket, {requests, count});
  submitted_ = range_index + 1;
}

const uint8_t* ReadAhead::next(const File& file, uint64_t offset, uint64_t length) {
  if (next_range_ >= ranges_.size())
    throw Error("read-ahead: " + file.path() + " offset " + std::to_string(offset) +
                " asked for after the schedule's last range");
  const ReadRange& r = ranges_[next_range_];
  if (r.file != &file || r.offset != offset || r.length != length)
    throw Error("read-ahead: asked for " + file.path() + " [" + std::to_string(offset) + ", +" +
                std::to_string(length) + "), the schedule's next range is " + r.file->path() +
                " [" + std::to_string(r.offset) + ", +" + std::to_string(r.length) + ") (" +
                r.what + ")");
  // The previous range's slot is free: start the range that goes into it.
  if (next_range_ > 0 && next_range_ - 1 + slots_.size() < ranges_.size())
    submit(next_range_ - 1 + slots_.size());
  Slot& slot = *slots_[next_range_ % slots_.size()];
  slot.ticket.wait();
  if (!slot.ticket.error().empty()) throw Error(slot.ticket.error() + " (reading " + r.what + ")");
  ++next_range_;
  delivered_ += length;
  return slot.base + slot.skew;
}

}  // namespace k3

// io/read_ahead.h — a known sequence of file ranges read in order, several ranges ahead of the
// consumer (k3_repack: the source is read while the previous piece is quantised and written).
// Owns: the schedule, the slot buffers (4 KiB aligned, reused across schedules) and the aligned
// O_DIRECT window planned around each range (docs/container.md §7). Does not own: the reads
// themselves (io/read_queue.h) or what the bytes become.
//
// Each range goes to a slot of its own: the whole 4 KiB blocks around it are read with O_DIRECT
// where the file allows it (no page-cache copy, no read-ahead guessing), a tail that ends past the
// file's last whole block and files without O_DIRECT (in-memory fakes, tmpfs) are read
// buffered. While the consumer holds one slot, the reads of the next `slots - 1` ranges are in
// flight.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/file.h"
#include "io/read_queue.h"

namespace k3 {

struct ReadRange {
  const File* file = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string what;  // named in errors (a tensor name)
};

class ReadAhead {
 public:
  // `queue` must outlive this object; `slots` >= 2.
  explicit ReadAhead(ReadQueue& queue, int slots = 4);
  ~ReadAhead();  // withdraws and waits for the reads in flight
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // Replaces the schedule (the reads of an earlier one are withdrawn) and starts the first
  // ranges. Slot buffers grow to the longest range and are kept for later schedules.
  void start(std::vector<ReadRange> ranges);
  // The bytes of the schedule's next range, which must be (file, offset, length): valid until
  // the following call. Throws k3::Error naming the file, offset and the range's `what` on a
  // read error (EIO, a file shorter than the range), and on a request that is not the next
  // range.
  const uint8_t* next(const File& file, uint64_t offset, uint64_t length);
  // Bytes delivered by next() since construction.
  uint64_t bytes_delivered() const { return delivered_; }

 private:
  struct Slot;
  void submit(size_t range_index);
  void withdraw();

  ReadQueue& queue_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<ReadRange> ranges_;
  size_t next_range_ = 0;  // the range next() returns
  size_t submitted_ = 0;   // ranges submitted so far
  uint64_t delivered_ = 0;
};

}  // namespace k3

// io/file.h — random-access read-only files (after leveldb's Env).
// Owns: the File interface, the POSIX implementation (pread in pieces of at most 1 GiB, EINTR
// retried, short reads reported), its O_DIRECT twin descriptor and read-ahead advice, and an
// in-memory fake for tests. Does not own: caching or aligned buffers (experts/), background and
// O_DIRECT reads (io/read_queue).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace k3 {

class File {
 public:
  virtual ~File() = default;
  virtual const std::string& path() const = 0;
  virtual uint64_t size() const = 0;
  // Reads exactly `length` bytes at `offset` into `dst`. Throws k3::Error naming the file and
  // `what` (usually a tensor name) on a short read or an I/O error. Thread-safe.
  virtual void read_exact(void* dst, uint64_t length, uint64_t offset,
                          const std::string& what) const = 0;
  // Advises the kernel that [offset, offset + length) will be read soon (buffered reads).
  virtual void will_need(uint64_t offset, uint64_t length) const { (void)offset, (void)length; }
  // The OS descriptor for asynchronous reads (io/read_queue): the O_DIRECT twin when `direct`
  // (-1 when there is none or direct reads were refused), else the buffered one; -1 for files
  // without a descriptor (in-memory fakes), which are read with read_exact instead.
  virtual int descriptor(bool direct) const {
    (void)direct;
    return -1;
  }
  // Records that the filesystem refused a direct read (EINVAL): descriptor(true) is -1 from
  // then on, so later reads of this file go buffered.
  virtual void refuse_direct() const {}
};

// The alignment of O_DIRECT reads (buffer, offset and length): 4 KiB, valid for 512e and 4Kn
// drives alike.
inline constexpr uint64_t kDirectAlign = 4096;

// Largest single pread request; larger reads are split (Linux returns short reads past 2 GiB).
inline constexpr uint64_t kMaxReadPiece = uint64_t{1} << 30;

// A read-only, shared mapping of a whole file (K3_MMAP: prepared weights used in place, as clean
// page cache). Unmapped when the last owner lets go.
class FileMapping {
 public:
  // Maps `file`. Throws k3::Error naming it when it has no descriptor or mmap fails.
  static std::shared_ptr<const FileMapping> map(const File& file);
  ~FileMapping();
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The share of the pages of bytes [offset, offset + length) that are in the page cache now
  // (mincore; 0 for an empty range or when the kernel will not say).
  double cached_fraction(uint64_t offset, uint64_t length) const;

 private:
  FileMapping(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  const uint8_t* data_;
  uint64_t size_;
};

// Opens `path` read-only. Throws k3::Error when it cannot be opened or is not a regular file
// (a FIFO, a device, a directory: refused by name without blocking on the open).
std::unique_ptr<File> open_posix_file(const std::string& path);

// A file held in memory (tests, fakes). `fail_at` >= 0 makes every read touching that byte fail
// like EIO.
class MemFile : public File {
 public:
  MemFile(std::string path, std::vector<uint8_t> bytes, int64_t fail_at = -1)
      : path_(std::move(path)), bytes_(std::move(bytes)), fail_at_(fail_at) {}
  const std::string& path() const override { return path_; }
  uint64_t size() const override { return bytes_.size(); }
  void read_exact(void* dst, uint64_t length, uint64_t offset,
                  const std::string& what) const override;

 private:
  std::string path_;
  std::vector<uint8_t> bytes_;
  int64_t fail_at_;
};

// Reads a whole (small) regular file into a string. Throws k3::Error naming the path (a FIFO or
// another non-regular file is refused without blocking).
std::string read_text_file(const std::string& path);

// Writes `bytes` to `path` atomically: a temp file beside it, fsync, then rename.
void write_file_atomic(const std::string& path, const void* bytes, size_t length);
// The same for several pieces written back to back, created with `mode` (e.g. 0600); `durable`
// false skips the fsync (scratch files that never outlive the process).
struct ByteSpan {
  const void* data;
  size_t size;
};
void write_file_atomic(const std::string& path, std::initializer_list<ByteSpan> pieces,
                       unsigned mode, bool durable);

}  // namespace k3

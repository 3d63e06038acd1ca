#include "io/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "util/error.h"

namespace k3 {
namespace {

class PosixFile : public File {
 public:
  PosixFile(std::string path, int fd, int direct_fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), direct_fd_(direct_fd), size_(size) {}
  ~PosixFile() override {
    ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
  }
  const std::string& path() const override { return path_; }
  uint64_t size() const override { return size_; }

  void read_exact(void* dst, uint64_t length, uint64_t offset,
                  const std::string& what) const override {
    auto* out = static_cast<uint8_t*>(dst);
    uint64_t done = 0;
    while (done < length) {
      const uint64_t piece = std::min(length - done, kMaxReadPiece);
      const ssize_t got = ::pread(fd_, out + done, piece, static_cast<off_t>(offset + done));
      if (got < 0) {
        if (errno == EINTR) continue;
        throw Error(path_ + ": read of " + what + " failed at offset " +
                    std::to_string(offset + done) + ": " + std::strerror(errno));
      }
      if (got == 0) {
        throw Error(path_ + ": short read of " + what + ": wanted " + std::to_string(length) +
                    " bytes at offset " + std::to_string(offset) + ", got " + std::to_string(done) +
                    " (file truncated?)");
      }
      done += static_cast<uint64_t>(got);
    }
  }

  int descriptor(bool direct) const override {
    if (!direct) return fd_;
    return direct_ok_.load(std::memory_order_relaxed) ? direct_fd_ : -1;
  }
  void refuse_direct() const override { direct_ok_.store(false, std::memory_order_relaxed); }

  void will_need(uint64_t offset, uint64_t length) const override {
    ::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(length),
                    POSIX_FADV_WILLNEED);
  }

 private:
  std::string path_;
  int fd_;
  int direct_fd_;  // O_DIRECT twin of fd_; -1 when the filesystem refuses it
  mutable std::atomic<bool> direct_ok_{true};
  uint64_t size_;
};

}  // namespace

namespace {

const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "of another kind";
}

// Opens `path` for reading only if it is a regular file. O_NONBLOCK makes the open itself return
// at once for a FIFO (a plain open blocks until a writer appears: a FIFO named like a shard hung
// the loader, issue 16); the type is then checked on the descriptor, so nothing can swap the file
// between the check and the use, and the flag is cleared for the reads.
int open_regular(const std::string& path, struct stat& st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": is " + file_type_name(st.st_mode) + ", not a regular file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

}  // namespace

std::unique_ptr<File> open_posix_file(const std::string& path) {
  struct stat st {};
  const int fd = open_regular(path, st);
  // Opened eagerly, so picking the direct descriptor later is a plain read, safe from any thread.
  // The regular file was checked above; O_NONBLOCK keeps a FIFO swapped in since from blocking.
  const int direct_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK);
  struct stat direct_st {};
  if (direct_fd >= 0 && (::fstat(direct_fd, &direct_st) != 0 || direct_st.st_ino != st.st_ino ||
                         direct_st.st_dev != st.st_dev)) {
    ::close(direct_fd);
    throw Error(path + ": the file changed while it was being opened");
  }
  return std::make_unique<PosixFile>(path, fd, direct_fd, static_cast<uint64_t>(st.st_size));
}

void MemFile::read_exact(void* dst, uint64_t length, uint64_t offset,
                         const std::string& what) const {
  if (fail_at_ >= 0 && static_cast<uint64_t>(fail_at_) >= offset &&
      static_cast<uint64_t>(fail_at_) < offset + length) {
    throw Error(path_ + ": read of " + what + " failed at offset " + std::to_string(fail_at_) +
                ": Input/output error");
  }
  if (offset > bytes_.size() || length > bytes_.size() - offset) {
    throw Error(path_ + ": short read of " + what + ": wanted " + std::to_string(length) +
                " bytes at offset " + std::to_string(offset) + ", file has " +
                std::to_string(bytes_.size()));
  }
  std::memcpy(dst, bytes_.data() + offset, length);
}

std::string read_text_file(const std::string& path) {
  struct stat st {};
  const int fd = open_regular(path, st);
  std::string text;
  text.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw Error(path + ": read failed: " + std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

void write_file_atomic(const std::string& path, const void* bytes, size_t length) {
  write_file_atomic(path, {ByteSpan{bytes, length}}, 0644, true);
}

void write_file_atomic(const std::string& path, std::initializer_list<ByteSpan> pieces,
                       unsigned mode, bool durable) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());  // a leftover temp file could carry other permissions
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) throw Error(tmp + ": cannot create: " + std::strerror(errno));
  for (const ByteSpan& piece : pieces) {
    const auto* p = static_cast<const uint8_t*>(piece.data);
    size_t done = 0;
    while (done < piece.size) {
      const ssize_t n = ::write(fd, p + done, std::min<size_t>(piece.size - done, kMaxReadPiece));
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        throw Error(tmp + ": write failed: " + std::strerror(err));
      }
      done += static_cast<size_t>(n);
    }
  }
  const int sync_rc = durable ? ::fsync(fd) : 0;
  const int close_rc = ::close(fd);
  if (sync_rc != 0 || close_rc != 0) {
    ::unlink(tmp.c_str());
    throw Error(tmp + ": flush failed: " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": rename failed: " + std::strerror(err));
  }
}

std::shared_ptr<const FileMapping> FileMapping::map(const File& file) {
  const int fd = file.descriptor(false);
  if (fd < 0) throw Error(file.path() + ": cannot be memory-mapped (no file descriptor)");
  if (file.size() == 0) throw Error(file.path() + ": cannot map an empty file");
  void* p = ::mmap(nullptr, file.size(), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw Error(file.path() + ": mmap failed: " + std::strerror(errno));
  return std::shared_ptr<const FileMapping>(
      new FileMapping(static_cast<const uint8_t*>(p), file.size()));
}

double FileMapping::cached_fraction(uint64_t offset, uint64_t length) const {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (offset >= size_ || length == 0) return 0;
  const uint64_t first = offset / page * page;
  const uint64_t end = std::min(size_, offset + length);
  // Pieces of 1 GiB at most: the residency vector stays small (a byte per page).
  constexpr uint64_t kPiece = uint64_t{1} << 30;
  std::vector<unsigned char> in_core;
  uint64_t pages = 0, cached = 0;
  for (uint64_t at = first; at < end; at += kPiece) {
    const uint64_t n = std::min(kPiece, end - at);
    in_core.resize((n + page - 1) / page);
    if (::mincore(const_cast<uint8_t*>(data_) + at, n, in_core.data()) != 0) return 0;
    for (unsigned char c : in_core) cached += c & 1;
    pages += in_core.size();
  }
  return pages == 0 ? 0 : static_cast<double>(cached) / static_cast<double>(pages);
}

FileMapping::~FileMapping() {
  ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace k3

#include "io/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>

#include "util/error.h"
#include "util/sys.h"

namespace k3 {
namespace {

// Small tensors are gathered into one buffer and written together; a tensor larger than this
// gets a buffer of its own size (Fill is called once per tensor, on the whole tensor).
constexpr uint64_t kWriteBufferBytes = uint64_t{8} << 20;

std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

uint64_t shape_bytes(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  uint64_t n = dtype_size(dtype);
  for (const int64_t d : shape) {
    if (d < 0) throw Error("safetensors writer: tensor " + name + " has a negative dimension");
    const auto ud = static_cast<uint64_t>(d);
    if (ud != 0 && n > UINT64_MAX / ud)
      throw Error("safetensors writer: tensor " + name + " shape " + shape_string(shape) +
                  " is too large");
    n *= ud;
  }
  return n;
}

// An output file under a temporary name; unlinked unless commit() succeeded.
class TempOutput {
 public:
  explicit TempOutput(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(tmp_ + ": cannot create: " + std::strerror(errno));
  }
  ~TempOutput() {
    if (direct_fd_ >= 0) ::close(direct_fd_);
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }

  // A second descriptor with O_DIRECT for whole-block writes; false where the filesystem has
  // none (the writer then stays buffered).
  bool open_direct() {
    direct_fd_ = ::open(tmp_.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    return direct_fd_ >= 0;
  }
  // Writes [p, p + n) at `offset`: with O_DIRECT when `direct` (p, n and offset 4 KiB-aligned;
  // a filesystem that refuses it with EINVAL gets this and every later write buffered).
  void write_at(const uint8_t* p, uint64_t n, uint64_t offset, bool direct) {
    uint64_t done = 0;
    while (done < n) {
      const int fd = direct && direct_ok_ ? direct_fd_ : fd_;
      const ssize_t got = ::pwrite(fd, p + done, std::min<uint64_t>(n - done, kMaxReadPiece),
                                   static_cast<off_t>(offset + done));
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && fd == direct_fd_) {
          direct_ok_ = false;
          continue;
        }
        throw Error(path_ + ": write failed: " + std::strerror(errno));
      }
      if (got == 0) throw Error(path_ + ": write made no progress");
      done += static_cast<uint64_t>(got);
    }
  }
  TempOutput(const TempOutput&) = delete;
  TempOutput& operator=(const TempOutput&) = delete;

  void write_all(const uint8_t* p, uint64_t n) {
    uint64_t done = 0;
    while (done < n) {
      const ssize_t got = ::write(fd_, p + done, std::min<uint64_t>(n - done, kMaxReadPiece));
      if (got < 0) {
        if (errno == EINTR) continue;
        throw Error(path_ + ": write failed: " + std::strerror(errno));
      }
      if (got == 0) throw Error(path_ + ": write made no progress");
      done += static_cast<uint64_t>(got);
    }
    // Start write-back of what was just written (asynchronous), so dirty pages stay bounded on a
    // long write and the final fsync finds little left to do.
    if (n >= kWriteBufferBytes)
      ::sync_file_range(fd_, static_cast<off_t>(written_), static_cast<off_t>(n),
                        SYNC_FILE_RANGE_WRITE);
    written_ += n;
  }

  // Appends `n` bytes of `source` at `offset` with copy_file_range (in-kernel, no user-space
  // copy). False when the kernel or filesystem cannot (EXDEV, EINVAL, ENOSYS, EOPNOTSUPP) before
  // anything was copied: the caller then copies through memory.
  bool copy_from(int source_fd, uint64_t offset, uint64_t n, const std::string& what) {
    uint64_t done = 0;
    auto in = static_cast<loff_t>(offset);
    while (done < n) {
      const ssize_t got = ::copy_file_range(source_fd, &in, fd_, nullptr,
                                            std::min<uint64_t>(n - done, kMaxReadPiece), 0);
      if (got < 0) {
        if (errno == EINTR) continue;
        if (done == 0 &&
            (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP))
          return false;
        throw Error(path_ + ": copying " + what + " failed: " + std::strerror(errno));
      }
      if (got == 0)
        throw Error(path_ + ": copying " + what + ": the source ended early (truncated?)");
      done += static_cast<uint64_t>(got);
    }
    if (n >= kWriteBufferBytes)
      ::sync_file_range(fd_, static_cast<off_t>(written_), static_cast<off_t>(n),
                        SYNC_FILE_RANGE_WRITE);
    written_ += n;
    return true;
  }

  void commit() {
    if (::fsync(fd_) != 0) throw Error(path_ + ": fsync failed: " + std::strerror(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) throw Error(path_ + ": close failed: " + std::strerror(errno));
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw Error(path_ + ": rename from " + tmp_ + " failed: " + std::strerror(errno));
    committed_ = true;
  }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  int direct_fd_ = -1;
  bool direct_ok_ = true;
  uint64_t written_ = 0;
  bool committed_ = false;
};

}  // namespace

void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            Fill fill) {
  if (name.empty() || name == "__metadata__")
    throw Error("safetensors writer: invalid tensor name \"" + name + "\"");
  if (std::find(names_.begin(), names_.end(), name) != names_.end())
    throw Error("safetensors writer: tensor " + name + " added twice");
  if (!fill) throw Error("safetensors writer: tensor " + name + " has no fill function");
  const uint64_t n = shape_bytes(name, dtype, shape);
  entries_.push_back(Entry{name, dtype, shape, data_bytes_, data_bytes_ + n, std::move(fill)});
  names_.push_back(name);
  data_bytes_ += n;
}

void SafetensorsWriter::add_copy(const std::string& name, DType dtype,
                                 const std::vector<int64_t>& shape, const File& source,
                                 uint64_t offset, std::atomic<uint64_t>* bytes_read) {
  add(name, dtype, shape, [&source, offset, name, bytes_read](uint8_t* dst, uint64_t n) {
    source.read_exact(dst, n, offset, "tensor " + name);
    if (bytes_read != nullptr) bytes_read->fetch_add(n, std::memory_order_relaxed);
  });
  Entry& e = entries_.back();
  e.copy_from = &source;
  e.copy_offset = offset;
  e.bytes_read = bytes_read;
}

void SafetensorsWriter::add_bytes(const std::string& name, DType dtype,
                                  const std::vector<int64_t>& shape, std::vector<uint8_t> bytes) {
  const uint64_t n = shape_bytes(name, dtype, shape);
  if (bytes.size() != n)
    throw Error("safetensors writer: tensor " + name + " shape " + shape_string(shape) + " x " +
                dtype_name(dtype) + " needs " + std::to_string(n) + " bytes, got " +
                std::to_string(bytes.size()));
  add(name, dtype, shape, [data = std::move(bytes)](uint8_t* dst, uint64_t nbytes) {
    std::memcpy(dst, data.data(), nbytes);
  });
}

void SafetensorsWriter::set_metadata(std::vector<std::pair<std::string, std::string>> entries) {
  for (const auto& [key, value] : entries)
    if (key == "format") throw Error("safetensors writer: metadata key \"format\" is reserved");
  metadata_ = std::move(entries);
}

void SafetensorsWriter::set_data_alignment(uint64_t align) {
  if (align < 8 || (align & (align - 1)) != 0)
    throw Error("safetensors writer: data alignment " + std::to_string(align) +
                " is not a power of two >= 8");
  data_alignment_ = align;
}

uint64_t SafetensorsWriter::pad_to(uint64_t align) {
  const uint64_t n = (align - data_bytes_ % align) % align;
  if (n == 0) return 0;
  add(padding_tensor_name(paddings_++), DType::kU8, {static_cast<int64_t>(n)},
      [](uint8_t* dst, uint64_t nbytes) { std::memset(dst, 0, nbytes); });
  return n;
}

std::string SafetensorsWriter::header() const {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"";
  for (const auto& [key, value] : metadata_) {
    h += ",\"";
    h += json_escape(key);
    h += "\":\"";
    h += json_escape(value);
    h += '"';
  }
  h += '}';
  for (const Entry& e : entries_) {
    h += ",\"";
    h += json_escape(e.name);
    h += "\":{\"dtype\":\"";
    h += dtype_name(e.dtype);
    h += "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) h += ',';
      h += std::to_string(e.shape[i]);
    }
    h += "],\"data_offsets\":[";
    h += std::to_string(e.begin);
    h += ',';
    h += std::to_string(e.end);
    h += "]}";
  }
  h += '}';
  // Pad with spaces so the data region (8 + header) starts at a multiple of the alignment (8 by
  // default); no padding when already aligned (the convention of the reference writer).
  h.append((data_alignment_ - (8 + h.size()) % data_alignment_) % data_alignment_, ' ');
  return h;
}

namespace {

// Writes staged buffers on a second thread while the caller fills the next one; at most one write
// is in flight. A write error is rethrown on the caller's thread at the next hand-over or at
// finish(); the destructor waits for the thread (the file must not close under it).
class BackgroundWriter {
 public:
  explicit BackgroundWriter(TempOutput& out) : out_(out) {}
  ~BackgroundWriter() {
    if (thread_.joinable()) thread_.join();
  }
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  void write(const uint8_t* p, uint64_t n) {
    start([this, p, n] { out_.write_all(p, n); });
  }
  // Runs `job` on the thread once the previous one has finished.
  void start(std::function<void()> job) {
    wait();
    thread_ = std::thread([this, job = std::move(job)] {
      try {
        job();
      } catch (...) {
        error_ = std::current_exception();
      }
    });
  }
  // Waits for the write in flight; rethrows its error.
  void wait() {
    if (thread_.joinable()) thread_.join();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  TempOutput& out_;
  std::thread thread_;
  std::exception_ptr error_;
};

}  // namespace

void SafetensorsWriter::write(const std::string& path,
                              const std::function<void(uint64_t)>& on_tensor,
                              WriterScratch* scratch) const {
  const std::string h = header();
  TempOutput out(path);
  try {
    uint8_t len[8];
    uint64_t hl = h.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(hl >> (8 * i));
    out.write_all(len, 8);
    out.write_all(reinterpret_cast<const uint8_t*>(h.data()), h.size());
    // The data region with O_DIRECT (set_direct_writes, a header ending on a block boundary):
    // staged in 4 KiB-aligned buffers, written in whole blocks on the background thread while the
    // next buffer fills; the sub-block remainder moves to the start of the next buffer and the
    // file's last partial block is written buffered. Copied tensors are read in pieces into the
    // buffers, so no tensor needs a buffer of its own size and nothing goes through the page cache
    // on the way out.
    if (direct_writes_ && (8 + h.size()) % kDirectAlign == 0 && out.open_direct()) {
      WriterScratch own_direct;
      WriterScratch& buffers = scratch != nullptr ? *scratch : own_direct;
      uint64_t offset = 8 + h.size();
      uint64_t largest = 0;
      for (const Entry& e : entries_)
        if (e.copy_from == nullptr) largest = std::max(largest, e.end - e.begin);
      const uint64_t capacity = std::max(largest, kWriteBufferBytes * 8) + kDirectAlign;
      uint8_t* base[2];
      for (int i = 0; i < 2; ++i) {
        std::vector<uint8_t>& b = buffers.buffers[i];
        if (b.size() < capacity + kDirectAlign) resize_huge(b, capacity + kDirectAlign);
        base[i] =
            reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(b.data()) + kDirectAlign - 1) &
                                       ~uintptr_t{kDirectAlign - 1});
      }
      BackgroundWriter writer(out);
      int current = 0;
      uint64_t used = 0;
      const auto flush = [&](bool last) {
        const uint64_t whole = used / kDirectAlign * kDirectAlign;
        uint8_t* full = base[current];
        if (whole > 0) {
          const uint64_t at = offset;
          writer.start([&out, full, whole, at] { out.write_at(full, whole, at, true); });
        }
        offset += whole;
        const uint64_t rest = used - whole;
        current ^= 1;  // start() waited for the other buffer's write: it is free
        if (rest > 0) std::memcpy(base[current], full + whole, rest);
        used = rest;
        if (last && rest > 0) {
          writer.wait();
          out.write_at(base[current], rest, offset, false);
          offset += rest;
          used = 0;
        }
      };
      for (const Entry& e : entries_) {
        const uint64_t n = e.end - e.begin;
        if (e.copy_from != nullptr) {
          for (uint64_t done = 0; done < n;) {
            if (used == capacity) flush(false);
            const uint64_t k = std::min(capacity - used, n - done);
            e.copy_from->read_exact(base[current] + used, k, e.copy_offset + done,
                                    "tensor " + e.name);
            if (e.bytes_read != nullptr) e.bytes_read->fetch_add(k, std::memory_order_relaxed);
            used += k;
            done += k;
          }
          if (on_tensor) on_tensor(n);
          continue;
        }
        if (used + n > capacity) flush(false);
        try {
          e.fill(base[current] + used, n);
        } catch (const Error& err) {
          throw Error(path + ": filling tensor " + e.name + ": " + err.what());
        }
        used += n;
        if (on_tensor) on_tensor(n);
      }
      flush(true);
      writer.wait();
      out.commit();
      return;
    }

    // Two staging buffers: tensors are filled into one while the other is being written, so
    // reading (or quantising) the source overlaps the copy into the page cache.
    const auto kernel_copied = [](const Entry& e) {
      return e.copy_from != nullptr && e.copy_from->descriptor(false) >= 0 &&
             e.end - e.begin >= kWriteBufferBytes / 8;
    };
    uint64_t largest = 0;
    for (const Entry& e : entries_)
      if (!kernel_copied(e)) largest = std::max(largest, e.end - e.begin);
    WriterScratch own;
    WriterScratch& buffers = scratch != nullptr ? *scratch : own;
    uint64_t want = std::min(std::max(largest, kWriteBufferBytes), data_bytes_);
    for (std::vector<uint8_t>& b : buffers.buffers)
      if (b.size() < want) resize_huge(b, want);
    BackgroundWriter writer(out);
    int current = 0;
    uint64_t used = 0;
    bool kernel_copy = true;  // until the filesystem refuses copy_file_range
    for (const Entry& e : entries_) {
      const uint64_t n = e.end - e.begin;
      if (kernel_copy && kernel_copied(e)) {
        // A large copied tensor goes file to file in the kernel, after what is staged.
        if (used > 0) {
          writer.write(buffers.buffers[current].data(), used);
          current ^= 1;
          used = 0;
        }
        writer.wait();
        if (out.copy_from(e.copy_from->descriptor(false), e.copy_offset, n, "tensor " + e.name)) {
          if (e.bytes_read != nullptr) e.bytes_read->fetch_add(n, std::memory_order_relaxed);
          if (on_tensor) on_tensor(n);
          continue;
        }
        kernel_copy = false;  // refused: this and every later tensor go through memory
      }
      if (n > want) {  // only after a refused kernel copy: stage the tensor whole
        writer.wait();
        for (std::vector<uint8_t>& b : buffers.buffers) resize_huge(b, n);
        want = n;
      }
      if (used + n > want) {
        writer.write(buffers.buffers[current].data(), used);
        current ^= 1;
        used = 0;
      }
      try {
        e.fill(buffers.buffers[current].data() + used, n);
      } catch (const Error& err) {
        throw Error(path + ": filling tensor " + e.name + ": " + err.what());
      }
      used += n;
      if (on_tensor) on_tensor(n);
    }
    writer.write(buffers.buffers[current].data(), used);
    writer.wait();
    out.commit();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& err) {
    throw Error(path + ": " + err.what());
  }
}

}  // namespace k3

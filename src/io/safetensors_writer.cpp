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

#include "io/file.h"
#include "util/crc32c.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3 {
namespace {

// The staging buffers' size: pieces are gathered into one and written together (a larger piece
// gets buffers of its own size). Buffered writes this large start their write-back at once.
constexpr uint64_t kStageBytes = uint64_t{64} << 20;
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
  TempOutput(const TempOutput&) = delete;
  TempOutput& operator=(const TempOutput&) = delete;

  // A second descriptor with O_DIRECT for whole-block writes; false where the filesystem has
  // none (the writer then stays buffered).
  bool open_direct() {
    direct_fd_ = ::open(tmp_.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    return direct_fd_ >= 0;
  }
  // Writes [p, p + n) at `offset`: with O_DIRECT when `direct` (p, n and offset 4 KiB-aligned;
  // a filesystem that refuses it with EINVAL gets this and every later write buffered).
  // Buffered writes of a staging buffer's size start their write-back at once (asynchronous),
  // so dirty pages stay bounded on a long write and the final fsync finds little left to do.
  void write_at(const uint8_t* p, uint64_t n, uint64_t offset, bool direct) {
    uint64_t done = 0;
    bool buffered = !direct || !direct_ok_;
    while (done < n) {
      const int fd = buffered ? fd_ : direct_fd_;
      const ssize_t got = ::pwrite(fd, p + done, std::min<uint64_t>(n - done, kMaxReadPiece),
                                   static_cast<off_t>(offset + done));
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && !buffered) {
          direct_ok_ = false;
          buffered = true;
          continue;
        }
        throw Error(path_ + ": write failed: " + std::strerror(errno));
      }
      if (got == 0) throw Error(path_ + ": write made no progress");
      done += static_cast<uint64_t>(got);
    }
    if (buffered && n >= kWriteBufferBytes)
      ::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(n),
                        SYNC_FILE_RANGE_WRITE);
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
  bool committed_ = false;
};

}  // namespace

void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            Fill fill, uint64_t piece_bytes) {
  if (name.empty() || name == "__metadata__")
    throw Error("safetensors writer: invalid tensor name \"" + name + "\"");
  if (std::find(names_.begin(), names_.end(), name) != names_.end())
    throw Error("safetensors writer: tensor " + name + " added twice");
  if (!fill) throw Error("safetensors writer: tensor " + name + " has no fill function");
  const uint64_t n = shape_bytes(name, dtype, shape);
  entries_.push_back(Entry{name, dtype, shape, data_bytes_, data_bytes_ + n, std::move(fill),
                           piece_bytes == 0 ? std::max<uint64_t>(n, 1) : piece_bytes});
  names_.push_back(name);
  data_bytes_ += n;
}

void SafetensorsWriter::add_bytes(const std::string& name, DType dtype,
                                  const std::vector<int64_t>& shape, std::vector<uint8_t> bytes) {
  const uint64_t n = shape_bytes(name, dtype, shape);
  if (bytes.size() != n)
    throw Error("safetensors writer: tensor " + name + " shape " + shape_string(shape) + " x " +
                dtype_name(dtype) + " needs " + std::to_string(n) + " bytes, got " +
                std::to_string(bytes.size()));
  add(name, dtype, shape, [data = std::move(bytes)](uint8_t* dst, uint64_t, uint64_t nbytes) {
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
      [](uint8_t* dst, uint64_t, uint64_t nbytes) { std::memset(dst, 0, nbytes); });
  return n;
}

void SafetensorsWriter::visit_pieces(
    const std::function<void(const Entry&, uint64_t offset, uint64_t nbytes)>& piece) const {
  for (const Entry& e : entries_) {
    const uint64_t n = e.end - e.begin;
    for (uint64_t at = 0; at < n; at += e.piece_bytes)
      piece(e, at, std::min(e.piece_bytes, n - at));
  }
}

void SafetensorsWriter::for_each_piece(
    const std::function<void(const std::string& name, uint64_t offset, uint64_t nbytes)>& piece)
    const {
  visit_pieces(
      [&](const Entry& e, uint64_t offset, uint64_t nbytes) { piece(e.name, offset, nbytes); });
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
                              const std::function<void(uint64_t)>& on_piece,
                              WriterScratch* scratch) const {
  const std::string h = header();
  const std::string record = crc32c_record_path(path);
  if (crc32c_record_ && ::unlink(record.c_str()) != 0 && errno != ENOENT)
    throw Error(record +
                ": cannot remove the record of the file being replaced: " + std::strerror(errno));
  TempOutput out(path);
  try {
    std::string prefix(8, '\0');
    for (int i = 0; i < 8; ++i)
      prefix[static_cast<size_t>(i)] = static_cast<char>(h.size() >> (8 * i));
    prefix += h;
    out.write_at(reinterpret_cast<const uint8_t*>(prefix.data()), prefix.size(), 0, false);
    // The file's CRC-32C, over the bytes in file order (the buffer writes run one at a time, in
    // order, on the writer thread: each hashes its buffer before writing it).
    const bool hash = crc32c_record_;
    uint32_t crc = hash ? crc32c(prefix.data(), prefix.size()) : 0;
    // With O_DIRECT (set_direct_writes, a header ending on a block boundary) the buffers are
    // written in whole blocks: the sub-block remainder moves to the start of the next buffer and
    // the file's last partial block is written buffered. Otherwise `block` is 1 and every buffer
    // goes out whole.
    const bool direct = direct_writes_ && prefix.size() % kDirectAlign == 0 && out.open_direct();
    const uint64_t block = direct ? kDirectAlign : 1;
    uint64_t largest = 0;
    for (const Entry& e : entries_)
      largest = std::max(largest, std::min(e.piece_bytes, e.end - e.begin));
    const uint64_t capacity = std::max(largest, std::min(kStageBytes, data_bytes_)) + block;
    WriterScratch own;
    WriterScratch& buffers = scratch != nullptr ? *scratch : own;
    uint8_t* base[2];
    for (int i = 0; i < 2; ++i) {
      std::vector<uint8_t>& b = buffers.buffers[i];
      if (b.size() < capacity + kDirectAlign) resize_huge(b, capacity + kDirectAlign);
      const auto at = reinterpret_cast<uintptr_t>(b.data());
      base[i] = b.data() + (kDirectAlign - at % kDirectAlign) % kDirectAlign;
    }
    BackgroundWriter writer(out);
    int current = 0;
    uint64_t used = 0;
    uint64_t offset = prefix.size();
    const auto flush = [&](bool last) {
      const uint64_t whole = used / block * block;
      uint8_t* full = base[current];
      if (whole > 0) {
        const uint64_t at = offset;
        writer.start([&out, &crc, hash, full, whole, at, direct] {
          if (hash) crc = crc32c(full, whole, crc);
          out.write_at(full, whole, at, direct);
        });
      }
      offset += whole;
      const uint64_t rest = used - whole;
      current ^= 1;  // start() waited for the other buffer's write: it is free
      if (rest > 0) std::memcpy(base[current], full + whole, rest);
      used = rest;
      if (last && rest > 0) {
        writer.wait();
        if (hash) crc = crc32c(base[current], rest, crc);
        out.write_at(base[current], rest, offset, false);
        used = 0;
      }
    };
    visit_pieces([&](const Entry& e, uint64_t at, uint64_t k) {
      if (used + k > capacity) flush(false);
      try {
        e.fill(base[current] + used, at, k);
      } catch (const Error& err) {
        throw Error(path + ": filling tensor " + e.name + ": " + err.what());
      }
      used += k;
      if (on_piece) on_piece(k);
    });
    flush(true);
    writer.wait();
    out.commit();
    if (hash) {
      char line[64];
      std::snprintf(line, sizeof line, "crc32c %08x %llu ", crc,
                    static_cast<unsigned long long>(file_bytes()));
      const std::string text = line + path.substr(path.find_last_of('/') + 1) + "\n";
      write_file_atomic(record, text.data(), text.size());
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& err) {
    throw Error(path + ": " + err.what());
  }
}

std::string crc32c_record_path(const std::string& path) {
  return path + ".crc32c";
}

std::string check_crc32c_record(const std::string& path) {
  const std::string record = crc32c_record_path(path);
  if (::access(record.c_str(), F_OK) != 0)
    return "it has no CRC-32C record (" + record +
           "): its write did not finish, or a k3_repack without records wrote it";
  try {
    const std::string text = read_text_file(record);
    unsigned crc = 0;
    unsigned long long bytes = 0;
    char name[512] = {0};
    int used = 0;
    const std::string file_name = path.substr(path.find_last_of('/') + 1);
    if (std::sscanf(text.c_str(), "crc32c %8x %llu %511s%n", &crc, &bytes, name, &used) != 3 ||
        text.substr(static_cast<size_t>(used)) != "\n")
      return "its CRC-32C record " + record + " is malformed";
    if (file_name != name) return "its CRC-32C record " + record + " names " + name;
    const std::unique_ptr<File> file = open_posix_file(path);
    if (file->size() != bytes)
      return "it holds " + std::to_string(file->size()) + " bytes, its CRC-32C record " +
             std::to_string(bytes);
    std::vector<uint8_t> buffer(std::min<uint64_t>(kStageBytes, file->size()));
    uint32_t have = 0;
    for (uint64_t at = 0; at < file->size();) {
      const uint64_t n = std::min<uint64_t>(buffer.size(), file->size() - at);
      file->read_exact(buffer.data(), n, at, "CRC-32C check");
      have = crc32c(buffer.data(), n, have);
      at += n;
    }
    if (have != crc) {
      char line[128];
      std::snprintf(line, sizeof line,
                    "its CRC-32C is %08x, not the %08x recorded when it was written", have, crc);
      return line;
    }
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace k3

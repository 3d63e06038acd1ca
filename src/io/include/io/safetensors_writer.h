// io/safetensors_writer.h — writes one safetensors shard in the real snapshot's conventions:
// compact JSON header starting with "__metadata__":{"format":"pt"} (plus any entries the caller
// sets), space-padded so the data starts at a multiple of 8 (or of a larger alignment), tensors
// back to back in the order they were added; alignment inside the data region is made with
// zero-filled padding tensors (docs/container.md §3), never with holes. Written to a temp file,
// fsynced and renamed, so a crash never leaves a half-written shard under the final name;
// optionally with a CRC-32C record beside it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"

namespace k3 {

// The staging buffers of SafetensorsWriter::write.
struct WriterScratch {
  std::vector<uint8_t> buffers[2];
};

class SafetensorsWriter {
 public:
  // Fills bytes [offset, offset + nbytes) of the tensor at dst. write() calls it in order over
  // the tensor, in pieces of the size given to add() (the last one shorter), once per piece.
  using Fill = std::function<void(uint8_t* dst, uint64_t offset, uint64_t nbytes)>;

  // `piece_bytes` 0: the whole tensor in one call (the staging buffers then hold it whole).
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, Fill fill,
           uint64_t piece_bytes = 0);
  // Convenience: copies `bytes` (must be shape x dtype bytes).
  void add_bytes(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                 std::vector<uint8_t> bytes);
  // Extra "__metadata__" entries written after "format":"pt", in this order (string to string).
  void set_metadata(std::vector<std::pair<std::string, std::string>> entries);
  // The data region starts at a multiple of `align` bytes of the file (default 8; a power of 2).
  void set_data_alignment(uint64_t align);
  // Adds a zero-filled U8 padding tensor (name from padding_tensor_name(), io/safetensors.h) so
  // the next tensor starts at a multiple of `align` bytes of the data region; adds nothing when
  // already aligned. Returns the padding's size in bytes.
  uint64_t pad_to(uint64_t align);
  // Calls `piece(name, offset, nbytes)` for every fill call write() will make, in its order (one
  // rule for both, so a caller can plan what the fills need, e.g. a read-ahead schedule).
  void for_each_piece(const std::function<void(const std::string& name, uint64_t offset,
                                               uint64_t nbytes)>& piece) const;
  // Total data bytes added so far.
  uint64_t data_bytes() const { return data_bytes_; }
  const std::vector<std::string>& names() const { return names_; }
  // Data written with O_DIRECT in whole 4 KiB blocks when the header ends on a block boundary
  // (set_data_alignment(4096)) and the filesystem allows it; buffered otherwise.
  void set_direct_writes(bool on) { direct_writes_ = on; }
  // write() also records the file's CRC-32C (util/crc32c.h, computed on the bytes as they are
  // written, so nothing is read back) in crc32c_record_path(path), written atomically once the
  // file is in place; the record of the file being replaced is removed first, so a file without a
  // record is one whose write did not finish. check_crc32c_record() checks a file against it.
  void set_crc32c_record(bool on) { crc32c_record_ = on; }
  // Bytes of the whole file write() produces (length prefix, header, data).
  uint64_t file_bytes() const { return 8 + header().size() + data_bytes_; }
  // Writes `path` (via path + ".tmp" and rename). `on_piece(nbytes)` reports progress after each
  // filled piece. Pieces are staged in two buffers (64 MiB, or the largest piece when larger, or
  // the data when smaller): one is filled while the other is written by a second thread.
  // `scratch` (optional) holds them for the caller, reused across files, so a long run touches
  // that memory once.
  void write(const std::string& path, const std::function<void(uint64_t)>& on_piece = nullptr,
             WriterScratch* scratch = nullptr) const;
  // The header bytes write() would emit (length prefix excluded, padding included).
  std::string header() const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
    Fill fill;
    uint64_t piece_bytes;  // > 0
  };
  void visit_pieces(
      const std::function<void(const Entry&, uint64_t offset, uint64_t nbytes)>& piece) const;
  std::vector<Entry> entries_;
  std::vector<std::string> names_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  uint64_t data_alignment_ = 8;
  bool direct_writes_ = false;
  bool crc32c_record_ = false;
  uint64_t paddings_ = 0;
  uint64_t data_bytes_ = 0;
};

// The CRC-32C record of a written file (SafetensorsWriter::set_crc32c_record): `<path>.crc32c`,
// one line "crc32c <8 hex digits> <file bytes> <file name>".
std::string crc32c_record_path(const std::string& path);
// Why the file at `path` is not the file its CRC-32C record describes ("" when it is): no record,
// a malformed one or one naming another file, the size or the checksum differing (reads the whole
// file). Throws nothing.
std::string check_crc32c_record(const std::string& path);

}  // namespace k3

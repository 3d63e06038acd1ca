// tools/repack_lib.cpp — the container writer (docs/container.md).
//
// Per source shard N (vision-only shards dropped), output "model-N-of-TOTAL.safetensors":
//   [non-expert tensors, in source data-offset order]   quantised: U8 `name` + F32 `name.qs`
//   [expert records, (layer, expert id) order]           w1p w1s w2p w2s w3p w3s, bytes unchanged
// Aligned layout: data region at 4 KiB, tensors at 64-byte offsets, every expert record starting
// on 4 KiB and padded to a multiple of 4 KiB with zero-filled U8 padding tensors (the format
// forbids holes). Packed layout: everything back to back (the anchor's layout).
#include "repack_lib.h"

#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "io/container.h"
#include "io/file.h"
#include "io/model_files.h"
#include "io/read_ahead.h"
#include "io/read_queue.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "kernels/convert.h"
#include "kernels/isa.h"
#include "kernels/quant.h"
#include "model/config.h"
#include "model/tensor_names.h"
#include "util/error.h"
#include "util/progress.h"
#include "util/sha256.h"
#include "util/sys.h"

namespace k3::repack {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kPage = 4096;            // expert record alignment (O_DIRECT block)
constexpr uint64_t kTensorAlign = 64;       // non-expert tensors (cache line; F32 sidecars aligned)
constexpr uint64_t kChunkBytes = 64 << 20;  // source bytes per quantisation / copy / compare piece
constexpr int kReadAheadSlots = 4;          // pieces held or in flight: 3 being read ahead

enum class Class { kBits, kMla, kHead, kKeep };

// The pieces of names::layer() and names::expert() around their numbers ("model.layers." and
// ".block_sparse_moe.experts."), found by building the names with sentinel numbers, so the
// spelling stays in model/tensor_names.h only.
struct NameShape {
  std::string layer_prefix;
  std::string expert_infix;
  NameShape() {
    const std::string l = names::layer(987654321, "");
    layer_prefix = l.substr(0, l.find("987654321"));
    const std::string e = names::expert(987654321, 123456789, "");
    const size_t from = e.find("987654321") + 9;
    expert_infix = e.substr(from, e.find("123456789") - from);
  }
};

const NameShape& name_shape() {
  static const NameShape shape;
  return shape;
}

// Reads the decimal number at *pos (at most 9 digits); false when there is none.
bool read_number(const std::string& s, size_t* pos, int64_t* out) {
  size_t i = *pos;
  int64_t v = 0;
  while (i < s.size() && i - *pos < 9 && s[i] >= '0' && s[i] <= '9') v = v * 10 + (s[i++] - '0');
  if (i == *pos) return false;
  *pos = i;
  *out = v;
  return true;
}

// "model.layers.L.<suffix>" -> L and suffix; false for any other name.
bool parse_layer(const std::string& name, int64_t* layer_index, std::string* suffix) {
  const std::string& prefix = name_shape().layer_prefix;
  if (name.rfind(prefix, 0) != 0) return false;
  size_t pos = prefix.size();
  if (!read_number(name, &pos, layer_index) || pos >= name.size() || name[pos] != '.') return false;
  *suffix = name.substr(pos + 1);
  return true;
}

// The quantisation class of a non-expert tensor (docs/container.md §4). `name` has no prefix.
Class classify(const std::string& name, const K3Config& config) {
  using namespace names;
  if (name == kLmHead) return Class::kHead;
  int64_t layer_index = 0;
  std::string suffix;
  if (!parse_layer(name, &layer_index, &suffix) || layer_index >= config.num_hidden_layers)
    return Class::kKeep;
  const bool kda = config.attention[static_cast<size_t>(layer_index)] == AttentionKind::kKDA;
  for (const char* s :
       {kKdaQProj, kKdaKProj, kKdaVProj, kMoeLatentDown, kMoeLatentUp, kMoeSharedGate, kMoeSharedUp,
        kMoeSharedDown, kMlpGateProj, kMlpUpProj, kMlpDownProj})
    if (suffix == s) return Class::kBits;
  for (const char* s : {kMlaQAProj, kMlaQBProj, kMlaKvAProj, kMlaKvBProj})
    if (suffix == s) return Class::kMla;
  // o_proj and g_proj have the same names in both layer kinds: the layer kind decides.
  if (suffix == kKdaOProj || suffix == kKdaGProj) return kda ? Class::kBits : Class::kMla;
  return Class::kKeep;
}

// A routed expert's tensor name -> layer, expert and which of the six it is (kExpertTensors
// order); false for any other name. The parse is checked by rebuilding the name.
bool parse_expert(const std::string& name, int64_t* layer_index, int64_t* expert_index, int* slot) {
  const std::string& prefix = name_shape().layer_prefix;
  const std::string& infix = name_shape().expert_infix;
  if (name.rfind(prefix, 0) != 0) return false;
  size_t pos = prefix.size();
  int64_t l = 0, e = 0;
  if (!read_number(name, &pos, &l) || name.compare(pos, infix.size(), infix) != 0) return false;
  pos += infix.size();
  if (!read_number(name, &pos, &e) || pos >= name.size() || name[pos] != '.') return false;
  const std::string tensor = name.substr(pos + 1);
  for (int i = 0; i < 6; ++i)
    if (tensor == names::kExpertTensors[i] &&
        names::expert(l, e, names::kExpertTensors[i]) == name) {
      *layer_index = l;
      *expert_index = e;
      *slot = i;
      return true;
    }
  return false;
}

bool is_float(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32;
}

// Widens `count` stored elements to f32; returns the index of the first non-finite one, or
// `count` (kernels/convert.h).
size_t widen(DType dtype, const uint8_t* raw, size_t count, float* out) {
  if (dtype == DType::kBF16) return widen_bf16(raw, count, out);
  if (dtype == DType::kF16) return widen_f16(raw, count, out);
  std::memcpy(out, raw, count * 4);
  return find_non_finite(out, count);
}

// What a copied tensor is checked for: nothing (integers, MXFP4 nibbles), non-finite floats, or
// the MXFP4 scale exponent 255 (NaN) that the engine refuses on every read of an expert.
enum class CopyCheck { kNone, kFinite, kE8M0 };

// Throws k3::Error naming the source tensor when `n` bytes at byte `offset` of its data hold a
// value the check refuses: a source with one is never made into a container.
void check_copied(CopyCheck check, const SafetensorsShard& shard, const TensorInfo& t,
                  const uint8_t* bytes, uint64_t offset, uint64_t n) {
  if (check == CopyCheck::kE8M0) {
    const uint8_t* bad = std::find(bytes, bytes + n, uint8_t{255});
    if (bad != bytes + n)
      throw Error(shard.path() + ": tensor " + t.name +
                  " holds exponent byte 255 (NaN in MXFP4) at element " +
                  std::to_string(offset + static_cast<uint64_t>(bad - bytes)) +
                  "; the file is damaged: restore it from the original download");
    return;
  }
  if (check != CopyCheck::kFinite) return;
  const size_t esize = dtype_size(t.dtype);
  const size_t count = n / esize;
  thread_local std::vector<float> wide;
  if (wide.size() < std::min<size_t>(count, size_t{1} << 20))
    wide.resize(std::min<size_t>(count, size_t{1} << 20));
  for (size_t done = 0; done < count;) {
    const size_t k = std::min(count - done, wide.size());
    const size_t bad = widen(t.dtype, bytes + done * esize, k, wide.data());
    if (bad != k)
      throw Error(non_finite_message(shard.path(), t, offset / esize + done + bad, wide[bad]));
    done += k;
  }
}

// Reads `length` source bytes at `offset` of the tensor's shard; the bytes stay valid until the
// next call. The write path takes them from the read-ahead (io/read_ahead.h), verification reads
// them directly.
using SourceBytes = std::function<const uint8_t*(uint64_t offset, uint64_t length)>;

// A quantised matrix being produced in pieces of whole rows: each piece's U8 bytes come from one
// source read; the scales are kept for the sidecar's fill (the writer calls fills in order).
struct Quantised {
  LocatedTensor source;
  int64_t rows = 0, cols = 0;
  bool int4 = false;
  // The engine's row quantisers (kernels/quant.h) of the best ISA here: the same bytes on all.
  const KernelTable* kernels = &kernel_table(best_isa());
  std::vector<float> scales;  // [rows] or [rows][cols / 64]
  uint64_t weight_bytes() const { return static_cast<uint64_t>(rows) * out_row_bytes(); }
  uint64_t out_row_bytes() const { return static_cast<uint64_t>(cols) / (int4 ? 2 : 1); }
  uint64_t source_row_bytes() const {
    return static_cast<uint64_t>(cols) * dtype_size(source.info->dtype);
  }
  // Rows per piece: a piece reads at most kChunkBytes of the source (at least one row).
  uint64_t piece_rows() const { return std::max<uint64_t>(1, kChunkBytes / source_row_bytes()); }
  uint64_t piece_bytes() const { return piece_rows() * out_row_bytes(); }
  // The source rows behind bytes [offset, offset + nbytes) of the U8 matrix (whole rows).
  ReadRange source_range(uint64_t offset, uint64_t nbytes) const {
    return {&source.shard->file(),
            source.info->file_offset + offset / out_row_bytes() * source_row_bytes(),
            nbytes / out_row_bytes() * source_row_bytes(), source.info->name};
  }
  // Fills bytes [offset, offset + nbytes) of the U8 matrix (whole rows) and their scales. Each
  // row is widened to f32 and quantised by one thread.
  void make(uint8_t* dst, uint64_t offset, uint64_t nbytes, const SourceBytes& read,
            std::atomic<uint64_t>* bytes_read) {
    const size_t c = static_cast<size_t>(cols);
    if (offset == 0)
      scales.assign(int4 ? static_cast<size_t>(rows) * c / 64 : static_cast<size_t>(rows), 0.0f);
    const uint64_t r0 = offset / out_row_bytes();
    const auto n = static_cast<int64_t>(nbytes / out_row_bytes());
    const ReadRange range = source_range(offset, nbytes);
    const uint8_t* raw = read(range.offset, range.length);
    bytes_read->fetch_add(range.length, std::memory_order_relaxed);
    const DType dtype = source.info->dtype;
    const size_t row_bytes = source_row_bytes();
    // The first non-finite source element (row-major index) and its value, if any: the source is
    // refused, naming it (a NaN would quantise to a NaN scale).
    uint64_t bad_index = UINT64_MAX;
    float bad_value = 0;
#pragma omp parallel if (n * cols > (1 << 16))
    {
      std::vector<float> wide(c);  // [cols]: one row in f32
#pragma omp for schedule(static)
      for (int64_t r = 0; r < n; ++r) {
        const size_t row = r0 + static_cast<size_t>(r);
        if (const size_t bad =
                widen(dtype, raw + static_cast<size_t>(r) * row_bytes, c, wide.data());
            bad != c) {
#pragma omp critical(k3_repack_non_finite)
          if (row * c + bad < bad_index) {
            bad_index = row * c + bad;
            bad_value = wide[bad];
          }
          continue;
        }
        uint8_t* out = dst + static_cast<size_t>(r) * out_row_bytes();
        if (int4)
          kernels->quantize_int4_g64_row(wide.data(), c, out, scales.data() + row * c / 64);
        else
          kernels->quantize_int8_row(wide.data(), c, reinterpret_cast<int8_t*>(out),
                                     scales.data() + row);
      }
    }
    if (bad_index != UINT64_MAX)
      throw Error(non_finite_message(source.shard->path(), *source.info, bad_index, bad_value));
  }
  // The whole matrix (verification).
  void make_all(uint8_t* dst, const SourceBytes& read, std::atomic<uint64_t>* bytes_read) {
    for (uint64_t at = 0; at < weight_bytes(); at += piece_bytes())
      make(dst + at, at, std::min(piece_bytes(), weight_bytes() - at), read, bytes_read);
  }
};

// One output file of a shard: its writer and where it goes.
struct OutputFile {
  std::string path;
  std::string name;  // file name (index weight_map value)
  SafetensorsWriter writer;
  // Where each tensor's fill reads its source: bytes [offset, offset + nbytes) of the output
  // tensor come from this range. Tensors made without reading (padding, scales) are absent.
  std::map<std::string, std::function<ReadRange(uint64_t offset, uint64_t nbytes)>> sources;
  bool has_tensors = false;
  // The source ranges the fills read, in the order the writer calls them (its own piece rule).
  std::vector<ReadRange> reads() const {
    std::vector<ReadRange> out;
    writer.for_each_piece([&](const std::string& tensor, uint64_t offset, uint64_t nbytes) {
      const auto it = sources.find(tensor);
      if (it != sources.end()) out.push_back(it->second(offset, nbytes));
    });
    return out;
  }
};

// A source shard holding text tensors, with its number (from its name, else its position).
struct SourceShard {
  int64_t number;
  const SafetensorsShard* shard;
};

// What one source shard becomes: its output files (writers with lazy fills, nothing read yet),
// the matrices quantised on the way and the tensors copied unchanged.
struct ShardPlan {
  SourceShard source;
  std::vector<std::unique_ptr<OutputFile>> files;
  std::vector<std::shared_ptr<Quantised>> quantised;
  std::vector<const TensorInfo*> copies;
};

using Log = std::function<void(const std::string&)>;

// Everything one run shares: its settings, counters, the kill hook, the container record.
struct Run {
  const Options& options;
  K3Config config;
  std::string prefix;  // the source's tensor-name prefix (stripped to classify a name)
  int bits = 8, mla_bits = 8, head_bits = 8;
  bool aligned = true;
  int64_t stripes = 0;  // --stripe directories (0: expert records stay in the main file)
  int64_t total = 0;    // output shards of the complete container
  std::vector<std::pair<std::string, std::string>> record;
  std::atomic<uint64_t> bytes_read{0};
  uint64_t produced = 0;  // output bytes produced this run (kill hook)
  // The source is read ahead of the fills (O_DIRECT windows, io_uring), into buffers reused
  // across files like the writer's staging buffers.
  std::unique_ptr<ReadQueue> queue = make_read_queue(ReadQueueOptions{});
  ReadAhead ahead{*queue, kReadAheadSlots};
  WriterScratch scratch;
  std::vector<uint8_t> raw;  // verification's reads
  explicit Run(const Options& o) : options(o) {}
  void produce(uint64_t n) {
    produced += n;
    if (options.kill_at_byte != 0 && produced >= options.kill_at_byte) ::raise(SIGKILL);
  }
  // The width a tensor of class `c` is stored at (32: unchanged).
  int width(Class c) const {
    return c == Class::kBits   ? bits
           : c == Class::kMla  ? mla_bits
           : c == Class::kHead ? head_bits
                               : 32;
  }
};

uint64_t file_size_or_zero(const std::string& path) {
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  return ec ? 0 : static_cast<uint64_t>(n);
}

// True when `path` has the size and header bytes of what `writer` would write.
bool header_matches(const std::string& path, const SafetensorsWriter& writer) {
  if (!fs::is_regular_file(path) || file_size_or_zero(path) != writer.file_bytes()) return false;
  const std::string header = writer.header();
  std::string have(8 + header.size(), '\0');
  try {
    open_posix_file(path)->read_exact(have.data(), have.size(), 0, "header");
  } catch (const Error&) {
    return false;
  }
  std::string want(8, '\0');
  for (int i = 0; i < 8; ++i)
    want[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  return have == want + header;
}

// Why the file at `path` cannot be kept as what `writer` would write ("" when it can; "absent"
// when there is none): its size or header differ, or its bytes are not the ones whose CRC-32C was
// recorded when it was written (io/safetensors_writer.h; a damaged data region shows there).
std::string why_not_kept(const std::string& path, const SafetensorsWriter& writer) {
  if (!fs::exists(path)) return "absent";
  if (!header_matches(path, writer))
    return "its size or header differ from what this run would write";
  return check_crc32c_record(path);
}

// Compares `n` bytes of `a` at `ao` with `b` at `bo` in pieces; returns the first differing
// offset (relative) or UINT64_MAX when equal.
uint64_t first_difference(const File& a, uint64_t ao, const File& b, uint64_t bo, uint64_t n) {
  std::vector<uint8_t> x, y;
  for (uint64_t done = 0; done < n;) {
    const uint64_t k = std::min<uint64_t>(kChunkBytes, n - done);
    x.resize(k);
    y.resize(k);
    a.read_exact(x.data(), k, ao + done, "verify");
    b.read_exact(y.data(), k, bo + done, "verify");
    if (std::memcmp(x.data(), y.data(), k) != 0) {
      for (uint64_t i = 0; i < k; ++i)
        if (x[i] != y[i]) return done + i;
    }
    done += k;
  }
  return UINT64_MAX;
}

// The source's text shards in number order; two with one number are refused.
std::vector<SourceShard> text_shards(const ModelFiles& source, const std::string& prefix) {
  std::vector<SourceShard> shards;
  static const std::regex shard_name(R"(^model-(\d{1,9})-of-(\d{1,9})\.safetensors$)");
  int64_t position = 0;
  for (const auto& sh : source.shards()) {
    ++position;
    bool text = false;
    for (const TensorInfo& t : sh->tensors())
      text = text ||
             !is_vision_tensor(t.name.substr(t.name.rfind(prefix, 0) == 0 ? prefix.size() : 0));
    if (!text) continue;
    std::smatch m;
    const std::string file = fs::path(sh->path()).filename().string();
    const int64_t number =
        std::regex_match(file, m, shard_name) ? std::stoll(m[1].str()) : position;
    if (number < 1 || number > 99999)
      throw Error(sh->path() + ": shard number " + std::to_string(number) + " is outside 1..99999");
    for (const SourceShard& s : shards)
      if (s.number == number)
        throw Error(sh->path() + ": shard number " + std::to_string(number) + " is also " +
                    s.shard->path() + "'s");
    shards.push_back({number, sh.get()});
  }
  std::sort(shards.begin(), shards.end(),
            [](const SourceShard& a, const SourceShard& b) { return a.number < b.number; });
  return shards;
}

// The shard numbers --shards names (all when empty), each checked to exist.
std::set<int64_t> selected_shards(const Options& options, const std::vector<SourceShard>& shards) {
  std::set<int64_t> selected(options.shards.begin(), options.shards.end());
  for (const int64_t n : selected)
    if (std::none_of(shards.begin(), shards.end(),
                     [&](const SourceShard& s) { return s.number == n; }))
      throw Error("--shards: the source has no text shard number " + std::to_string(n));
  if (selected.empty())
    for (const SourceShard& s : shards) selected.insert(s.number);
  return selected;
}

// Creates the output directories and removes the temp files of an interrupted run (a temp file
// is never renamed into place).
void prepare_output_dirs(const std::vector<std::string>& dirs) {
  static const std::regex ours(
      R"(^(model-\d{5}-of-\d{6}(-e\d+)?\.safetensors(\.crc32c)?|model\.safetensors\.index\.json)(\.tmp)?$)");
  for (const std::string& d : dirs) {
    std::error_code ec;
    fs::create_directories(d, ec);
    if (ec) throw Error(d + ": cannot create the output directory: " + ec.message());
    for (const auto& entry : fs::directory_iterator(d)) {
      const std::string n = entry.path().filename().string();
      std::smatch m;
      if (std::regex_match(n, m, ours) && m[4].matched) fs::remove(entry.path());
    }
  }
}

// A tensor copied unchanged into `out`, in pieces taken from the read-ahead, each checked.
void add_copy(Run& state, OutputFile& out, const SafetensorsShard& sh, const TensorInfo& t,
              CopyCheck check) {
  const File& file = sh.file();
  const uint64_t base = t.file_offset;
  out.writer.add(
      t.name, t.dtype, t.shape,
      [&state, &file, &sh, &t, base, check](uint8_t* dst, uint64_t offset, uint64_t n) {
        std::memcpy(dst, state.ahead.next(file, base + offset, n), n);
        state.bytes_read.fetch_add(n, std::memory_order_relaxed);
        check_copied(check, sh, t, dst, offset, n);
      },
      kChunkBytes);
  out.sources[t.name] = [&file, base, name = t.name](uint64_t offset, uint64_t n) {
    return ReadRange{&file, base + offset, n, name};
  };
}

// A matrix quantised into `out` (U8 `name` + F32 `name.qs`), its rows taken from the read-ahead.
std::shared_ptr<Quantised> add_quantised(Run& state, OutputFile& out, const SafetensorsShard& sh,
                                         const TensorInfo& t, int width) {
  auto q = std::make_shared<Quantised>();
  q->source = {&sh, &t};
  q->rows = t.shape[0];
  q->cols = t.shape[1];
  q->int4 = width == 4 && q->cols % 64 == 0;
  const std::vector<int64_t> shape = {q->rows, q->int4 ? q->cols / 2 : q->cols};
  out.writer.add(
      t.name, DType::kU8, shape,
      [q, &state](uint8_t* dst, uint64_t offset, uint64_t nbytes) {
        const File& file = q->source.shard->file();
        q->make(
            dst, offset, nbytes,
            [&](uint64_t at, uint64_t n) { return state.ahead.next(file, at, n); },
            &state.bytes_read);
      },
      q->piece_bytes());
  out.sources[t.name] = [q](uint64_t offset, uint64_t nbytes) {
    return q->source_range(offset, nbytes);
  };
  if (state.aligned) out.writer.pad_to(kTensorAlign);
  const std::vector<int64_t> scale_shape =
      q->int4 ? std::vector<int64_t>{q->rows, q->cols / 64} : std::vector<int64_t>{q->rows};
  out.writer.add(t.name + ".qs", DType::kF32, scale_shape, [q](uint8_t* dst, uint64_t, uint64_t n) {
    std::memcpy(dst, q->scales.data(), n);
    std::vector<float>().swap(q->scales);
  });
  return q;
}

// The output files of one source shard: writers with lazy fills; nothing is read yet.
ShardPlan plan_shard(Run& state, const SourceShard& src) {
  const Options& options = state.options;
  ShardPlan plan;
  plan.source = src;
  for (int64_t k = 0; k <= state.stripes; ++k) {
    auto f = std::make_unique<OutputFile>();
    f->name = output_shard_name(src.number, state.total, k);
    f->path =
        (fs::path(k == 0 ? options.dest : options.stripe[static_cast<size_t>(k - 1)]) / f->name)
            .string();
    f->writer.set_metadata(state.record);
    f->writer.set_crc32c_record(true);
    if (state.aligned) {
      f->writer.set_data_alignment(kPage);
      f->writer.set_direct_writes(true);
    }
    plan.files.push_back(std::move(f));
  }
  const SafetensorsShard& sh = *src.shard;
  const std::string& prefix = state.prefix;
  std::map<std::pair<int64_t, int64_t>, std::array<const TensorInfo*, 6>> experts;
  OutputFile& main = *plan.files[0];
  for (const TensorInfo& t : sh.tensors()) {
    const std::string name = t.name.rfind(prefix, 0) == 0 ? t.name.substr(prefix.size()) : t.name;
    if (is_vision_tensor(name)) continue;
    int64_t l = 0, e = 0;
    int slot = 0;
    if (parse_expert(name, &l, &e, &slot)) {
      auto& rec = experts[{l, e}];
      if (rec[static_cast<size_t>(slot)] != nullptr)
        throw Error(sh.path() + ": tensor " + t.name + " appears twice");
      rec[static_cast<size_t>(slot)] = &t;
      continue;
    }
    const int width = state.width(classify(name, state.config));
    if (state.aligned) main.writer.pad_to(kTensorAlign);
    if (width < 32 && is_float(t.dtype) && t.shape.size() == 2) {
      plan.quantised.push_back(add_quantised(state, main, sh, t, width));
    } else {
      add_copy(state, main, sh, t, is_float(t.dtype) ? CopyCheck::kFinite : CopyCheck::kNone);
      plan.copies.push_back(&t);
    }
    main.has_tensors = true;
  }
  // Expert records, (layer, id) order; each one read of exactly its size in the aligned layout.
  for (const auto& [key, rec] : experts) {
    for (int i = 0; i < 6; ++i)
      if (rec[static_cast<size_t>(i)] == nullptr)
        throw Error(sh.path() + ": expert " + std::to_string(key.second) + " of layer " +
                    std::to_string(key.first) + " lacks its tensor " + prefix +
                    names::expert(key.first, key.second, names::kExpertTensors[i]));
    OutputFile& out =
        state.stripes > 0 ? *plan.files[static_cast<size_t>(key.second % state.stripes + 1)] : main;
    if (state.aligned) out.writer.pad_to(kPage);
    for (int i = 0; i < 6; ++i) {  // w1p w1s w2p w2s w3p w3s: the odd ones are the scales
      const TensorInfo* t = rec[static_cast<size_t>(i)];
      add_copy(state, out, sh, *t, i % 2 == 1 ? CopyCheck::kE8M0 : CopyCheck::kNone);
      plan.copies.push_back(t);
    }
    if (state.aligned) out.writer.pad_to(kPage);
    out.has_tensors = true;
  }
  plan.files.erase(
      std::remove_if(plan.files.begin() + 1, plan.files.end(),
                     [](const std::unique_ptr<OutputFile>& f) { return !f->has_tensors; }),
      plan.files.end());
  return plan;
}

// Writes the planned shards not complete from an earlier run, with a log line each. One progress
// line covers the whole run's bytes (the shard being written named in its label), so its
// percentage and its one ETA move with every piece written, inside a shard as across shards.
void write_shards(Run& state, const std::vector<ShardPlan>& plans, Summary& summary,
                  const Log& log) {
  // Each file complete from an earlier run (size, header and CRC-32C checked) is kept; a damaged
  // one is named and rewritten.
  std::vector<std::set<const OutputFile*>> kept(plans.size());
  uint64_t run_bytes = 0;  // what this run writes (files kept from an earlier run excluded)
  for (size_t k = 0; k < plans.size(); ++k) {
    for (const auto& f : plans[k].files) {
      const std::string why = why_not_kept(f->path, f->writer);
      if (why.empty()) {
        kept[k].insert(f.get());
        continue;
      }
      if (why != "absent") summary.damaged.push_back(f->path + ": " + why);
      run_bytes += f->writer.file_bytes();
    }
  }
  std::unique_ptr<Progress> progress;
  const auto say = [&](const std::string& line) {
    if (progress)
      progress->print_above([&] { log(line); });
    else
      log(line);
  };
  for (size_t k = 0; k < plans.size(); ++k) {
    const ShardPlan& plan = plans[k];
    const auto& files = plan.files;
    uint64_t shard_bytes = 0;
    for (const auto& f : files) shard_bytes += f->writer.file_bytes();
    const std::string label = output_shard_name(plan.source.number, state.total) + " [" +
                              std::to_string(k + 1) + "/" + std::to_string(plans.size()) + "]";
    if (kept[k].size() == files.size()) {
      ++summary.shards_kept;
      say(label + ": complete from an earlier run (size, header and CRC-32C match), kept");
      continue;
    }
    if (!progress) {
      ProgressSink sink = state.options.progress.write ? state.options.progress : stderr_sink();
      progress = std::make_unique<Progress>("repack " + label, run_bytes, std::move(sink));
    }
    progress->set_label("repack " + label);
    const uint64_t read0 = state.bytes_read.load();
    const double s0 = now_seconds();
    for (const auto& f : files) {
      if (kept[k].count(f.get())) continue;
      const uint64_t header_bytes = 8 + f->writer.header().size();
      state.produce(header_bytes);
      progress->advance(header_bytes);
      state.ahead.start(f->reads());
      f->writer.write(
          f->path,
          [&](uint64_t n) {
            progress->advance(n);
            state.produce(n);
          },
          &state.scratch);
      summary.bytes_written += f->writer.file_bytes();
    }
    ++summary.shards_written;
    const double dt = std::max(1e-9, now_seconds() - s0);
    char line[256];
    std::snprintf(line, sizeof line, "%s: wrote %.3f GB (%zu file%s) in %.2f s, %.2f GB/s read",
                  label.c_str(), static_cast<double>(shard_bytes) / 1e9, files.size(),
                  files.size() == 1 ? "" : "s", dt,
                  static_cast<double>(state.bytes_read.load() - read0) / 1e9 / dt);
    say(line);
  }
  if (progress) {
    progress->set_label("repack " + state.options.dest);  // the closing line is the run's
    progress->finish();
  }
}

// The index, rebuilt from every complete output file in the output directories (so disjoint
// --shards runs add up) and written atomically. Returns how many source shards are complete.
int64_t write_index(Run& state, const std::vector<std::string>& dirs) {
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_size = 0;
  std::set<int64_t> present;
  static const std::regex output_name(R"(^model-(\d{5})-of-(\d{6})(-e\d+)?\.safetensors$)");
  for (const std::string& d : dirs) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(d)) {
      const std::string n = entry.path().filename().string();
      std::smatch m;
      if (entry.is_regular_file() && std::regex_match(n, m, output_name) &&
          std::stoll(m[2].str()) == state.total)
        names.push_back(n);
    }
    std::sort(names.begin(), names.end());
    for (const std::string& n : names) {
      const std::string path = (fs::path(d) / n).string();
      const SafetensorsShard shard(open_posix_file(path));
      for (const auto& [key, value] : state.record) {
        const auto it = shard.metadata().find(key);
        if (it == shard.metadata().end() || it->second != value)
          throw Error(path + ": written by a run with other settings (" + key + " is \"" +
                      (it == shard.metadata().end() ? std::string("absent") : it->second) +
                      "\", this run's is \"" + value +
                      "\"); use an empty directory or the same "
                      "options");
      }
      if (weight_map.contains(n)) continue;
      for (const TensorInfo& t : shard.tensors()) {
        if (is_padding_tensor(t.name)) continue;
        if (weight_map.contains(t.name))
          throw Error(path + ": tensor " + t.name + " is also in " +
                      weight_map[t.name].get<std::string>());
        weight_map[t.name] = n;
        total_size += t.nbytes;
      }
      std::smatch m;
      std::regex_match(n, m, output_name);
      if (!m[3].matched) present.insert(std::stoll(m[1].str()));
    }
  }
  nlohmann::json metadata = {{"total_size", total_size}};
  for (const auto& [key, value] : state.record) metadata[key] = value;
  const std::string index_text =
      nlohmann::json{{"metadata", metadata}, {"weight_map", weight_map}}.dump(2) + "\n";
  const Options& options = state.options;
  const std::string index_out = (fs::path(options.dest) / "model.safetensors.index.json").string();
  if (options.kill_at_byte != 0 && state.produced + index_text.size() >= options.kill_at_byte) {
    // Fault injection mid-index: part of the temp file, then the kill.
    const uint64_t part =
        options.kill_at_byte > state.produced ? options.kill_at_byte - state.produced : 0;
    FILE* f = std::fopen((index_out + ".tmp").c_str(), "wb");
    if (f != nullptr) {
      std::fwrite(index_text.data(), 1, std::min<uint64_t>(part, index_text.size()), f);
      std::fclose(f);
    }
    ::raise(SIGKILL);
  }
  const bool index_same = fs::is_regular_file(index_out) && read_text_file(index_out) == index_text;
  if (!index_same) write_file_atomic(index_out, index_text.data(), index_text.size());
  return static_cast<int64_t>(present.size());
}

// The snapshot's other files (config, generation config, tokenizer), copied atomically.
void copy_snapshot_files(const std::string& source, const std::string& dest) {
  for (const auto& entry : fs::directory_iterator(source)) {
    const std::string n = entry.path().filename().string();
    if (!entry.is_regular_file() || n.empty() || n[0] == '.' || n.ends_with(".safetensors") ||
        n.ends_with(".tmp") || n == "model.safetensors.index.json")
      continue;
    const std::string to = (fs::path(dest) / n).string();
    const std::string bytes = read_text_file(entry.path().string());
    if (fs::is_regular_file(to) && read_text_file(to) == bytes) continue;
    write_file_atomic(to, bytes.data(), bytes.size());
  }
}

// --verify-full for one output file of a source shard: every output tensor against the source
// (bytes, or the quantisation re-derived), padding all zero. Returns the tensors verified; throws
// k3::Error naming the file and tensor at the first difference.
uint64_t verify_file(Run& state, const ShardPlan& plan, const OutputFile& file) {
  const SourceShard& src = plan.source;
  std::map<std::string, const TensorInfo*> copy_by_name;
  for (const TensorInfo* t : plan.copies) copy_by_name[t->name] = t;
  std::map<std::string, std::shared_ptr<Quantised>> quant_by_name;
  for (const auto& q : plan.quantised) quant_by_name[q->source.info->name] = q;
  uint64_t verified = 0;
  if (!header_matches(file.path, file.writer))
    throw Error(file.path + ": verify: size or header differs from what this run would write");
  const SafetensorsShard out(open_posix_file(file.path));
  for (const TensorInfo& t : out.tensors()) {
    const std::string where = file.path + ": verify: tensor " + t.name;
    if (is_padding_tensor(t.name)) {
      std::vector<uint8_t> pad(t.nbytes);
      out.file().read_exact(pad.data(), pad.size(), t.file_offset, t.name);
      if (std::any_of(pad.begin(), pad.end(), [](uint8_t b) { return b != 0; }))
        throw Error(where + ": padding is not all zero");
      continue;
    }
    if (t.name.ends_with(".qs")) continue;  // checked with its matrix
    const auto q = quant_by_name.find(t.name);
    if (q != quant_by_name.end()) {
      std::vector<uint8_t> want(q->second->weight_bytes()), have(t.nbytes);
      const File& source_file = src.shard->file();
      q->second->make_all(
          want.data(),
          [&](uint64_t at, uint64_t n) {
            resize_huge(state.raw, n);
            source_file.read_exact(state.raw.data(), n, at, "tensor " + t.name);
            return state.raw.data();
          },
          &state.bytes_read);
      out.file().read_exact(have.data(), have.size(), t.file_offset, t.name);
      const TensorInfo* sidecar = out.find(t.name + ".qs");
      if (sidecar == nullptr || have != want ||
          sidecar->nbytes != q->second->scales.size() * sizeof(float))
        throw Error(where + ": quantised bytes differ from the source re-quantised");
      std::vector<float> scales(q->second->scales.size());
      out.file().read_exact(scales.data(), sidecar->nbytes, sidecar->file_offset, sidecar->name);
      if (std::memcmp(scales.data(), q->second->scales.data(), sidecar->nbytes) != 0)
        throw Error(where + ".qs: scales differ from the source re-quantised");
      std::vector<float>().swap(q->second->scales);  // the plan outlives this shard's check
      ++verified;
      continue;
    }
    const auto c = copy_by_name.find(t.name);
    if (c == copy_by_name.end()) throw Error(where + ": not a tensor of the source shard");
    if (c->second->nbytes != t.nbytes || c->second->dtype != t.dtype || c->second->shape != t.shape)
      throw Error(where + ": dtype, shape or size differ from the source");
    const uint64_t at = first_difference(out.file(), t.file_offset, src.shard->file(),
                                         c->second->file_offset, t.nbytes);
    if (at != UINT64_MAX)
      throw Error(where + ": byte " + std::to_string(at) + " differs from the source (" +
                  src.shard->path() + ")");
    ++verified;
  }
  return verified;
}

}  // namespace

std::string output_shard_name(int64_t number, int64_t total, int64_t stripe) {
  char buf[64];
  if (stripe > 0)
    std::snprintf(buf, sizeof buf, "model-%05lld-of-%06lld-e%lld.safetensors",
                  static_cast<long long>(number), static_cast<long long>(total),
                  static_cast<long long>(stripe));
  else
    std::snprintf(buf, sizeof buf, "model-%05lld-of-%06lld.safetensors",
                  static_cast<long long>(number), static_cast<long long>(total));
  return buf;
}

std::vector<int64_t> parse_shard_list(const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    static const std::regex range(R"(^\s*(\d{1,5})\s*(?:-\s*(\d{1,5})\s*)?$)");
    std::smatch m;
    if (!std::regex_match(item, m, range))
      throw Error("--shards: \"" + item + "\" is not a shard number or range (e.g. 1,3,5-8)");
    const int64_t a = std::stoll(m[1].str());
    const int64_t b = m[2].matched ? std::stoll(m[2].str()) : a;
    if (a < 1 || b < a) throw Error("--shards: \"" + item + "\" is not an increasing range >= 1");
    for (int64_t n = a; n <= b; ++n) out.push_back(n);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Summary run(const Options& options, const std::function<void(const std::string&)>& log_fn) {
  const double t0 = now_seconds();
  const Log log = [&](const std::string& line) {
    if (log_fn) log_fn(line);
  };
  for (const int b : {options.bits, options.mla_bits, options.head_bits})
    if (b != 0 && b != 4 && b != 8 && b != 32)
      throw Error("--bits/--mla-bits/--head-bits: " + std::to_string(b) +
                  " is not a supported width (4, 8 or 32)");
  if (options.bits == 0) throw Error("--bits must be 4, 8 or 32");
  if (options.layout != "aligned" && options.layout != "packed")
    throw Error("--layout must be aligned or packed, got \"" + options.layout + "\"");
  if (options.jobs > 0) omp_set_num_threads(options.jobs);

  std::error_code same_ec;
  if (fs::exists(options.dest) && fs::equivalent(options.source, options.dest, same_ec))
    throw Error(options.dest + ": the container must go to another directory than the source");
  const ModelFiles source(options.source);
  if (source.container().present)
    throw Error(options.source + ": is already a repacked container (" +
                source.shards().front()->path() + " carries a k3_container record)");
  const K3Config config = parse_k3_config(source.config_root(), options.source + "/config.json");
  const fs::path index_path = fs::path(options.source) / "model.safetensors.index.json";
  const std::string source_sha =
      fs::exists(index_path) ? sha256_hex(read_text_file(index_path.string())) : "none";

  Run state(options);
  state.config = config;
  state.prefix = source.prefix();
  state.bits = options.bits;
  state.mla_bits = options.mla_bits ? options.mla_bits : std::max(options.bits, 8);
  state.head_bits = options.head_bits ? options.head_bits : std::max(options.bits, 8);
  state.aligned = options.layout == "aligned";
  state.stripes = static_cast<int64_t>(options.stripe.size());
  state.record = {{kContainerKey, kContainerVersion},
                  {kContainerLayoutKey, options.layout},
                  {kContainerBitsKey, std::to_string(state.bits)},
                  {kContainerMlaBitsKey, std::to_string(state.mla_bits)},
                  {kContainerHeadBitsKey, std::to_string(state.head_bits)},
                  {kContainerSourceKey, source_sha},
                  {kContainerWriterKey, "k3_repack"},
                  {"k3_stripes", std::to_string(std::max<int64_t>(1, state.stripes))}};

  const std::vector<SourceShard> shards = text_shards(source, state.prefix);
  state.total = static_cast<int64_t>(shards.size());
  if (state.total == 0) throw Error(options.source + ": no shard holds text-model tensors");
  const std::set<int64_t> selected = selected_shards(options, shards);
  // Every selected shard planned before anything is written (a bad source stops the run here).
  std::vector<ShardPlan> plans;
  for (const SourceShard& src : shards)
    if (selected.count(src.number)) plans.push_back(plan_shard(state, src));
  std::vector<std::string> dirs{options.dest};
  for (const std::string& d : options.stripe) dirs.push_back(d);
  prepare_output_dirs(dirs);

  Summary summary;
  summary.shards_total = state.total;
  write_shards(state, plans, summary, log);
  summary.shards_present = write_index(state, dirs);
  copy_snapshot_files(options.source, options.dest);
  if (options.verify_full)
    for (const ShardPlan& plan : plans) {
      uint64_t verified = 0;
      for (const auto& f : plan.files) {
        try {
          verified += verify_file(state, plan, *f);
        } catch (const Error& e) {
          // Rewritten (with its CRC-32C record) and verified again; a second failure is an error.
          summary.damaged.push_back(e.what());
          state.ahead.start(f->reads());
          f->writer.write(f->path, nullptr, &state.scratch);
          summary.bytes_written += f->writer.file_bytes();
          verified += verify_file(state, plan, *f);
        }
      }
      summary.tensors_verified += verified;
      log(output_shard_name(plan.source.number, state.total) + ": verified " +
          std::to_string(verified) + " tensors against " + plan.source.shard->path());
    }
  summary.bytes_read = state.bytes_read.load();
  summary.seconds = now_seconds() - t0;
  return summary;
}

}  // namespace k3::repack

#include "model/weights.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <span>
#include <thread>

#include "experts/expert_cache.h"
#include "kernels/convert.h"
#include "model/tensor_names.h"
#include "util/error.h"
#include "util/progress.h"
#include "util/sys.h"

namespace k3 {
namespace {

const std::vector<DType> kFloatTypes = {DType::kBF16, DType::kF32, DType::kF16};

// The cancel flag of the load running on this thread (load_weights sets it for its duration), so
// every reader below polls it without threading it through each layer's loader.
thread_local const std::atomic<bool>* t_cancel = nullptr;

bool load_cancelled() {
  return t_cancel != nullptr && t_cancel->load(std::memory_order_relaxed);
}

// Throws Interrupted when the caller asked the load to stop (checked before every tensor).
void check_cancel() {
  if (load_cancelled()) throw Interrupted();
}

// The progress of the load running on this thread, advanced by the bytes of every tensor as it
// is read (piece by piece), converted or mapped, so a slice of a few layers moves during its first
// seconds rather than once per layer.
thread_local Progress* t_progress = nullptr;

void advance_load(uint64_t bytes) {
  if (t_progress != nullptr) t_progress->advance(bytes);
}

class LoadReader;
// The reader of the load running on this thread (set by load_weights, like t_cancel).
thread_local LoadReader* t_reader = nullptr;

// Sets t_cancel, t_progress and t_reader for one load_weights call and clears them however the
// call ends.
class LoadScope {
 public:
  LoadScope(const std::atomic<bool>* flag, Progress& progress, LoadReader& reader) {
    t_cancel = flag;
    t_progress = &progress;
    t_reader = &reader;
  }
  ~LoadScope() {
    t_cancel = nullptr;
    t_progress = nullptr;
    t_reader = nullptr;
  }
  LoadScope(const LoadScope&) = delete;
  LoadScope& operator=(const LoadScope&) = delete;
};

// The bytes load_weights reads or maps, the total of its progress: every tensor of layers
// [0, num_layers) but the routed experts (indexed only; read when routed), and the head's tensors
// when there is a head (the embedding is read a row at a time, later).
uint64_t planned_bytes(const ModelFiles& s, int64_t num_layers) {
  uint64_t total = 0;
  for (const auto& shard : s.shards())
    for (const TensorInfo& t : shard->tensors()) {
      if (!t.name.starts_with(s.prefix())) continue;
      const std::string name = t.name.substr(s.prefix().size());
      const int64_t l = names::layer_of(name);
      if (l < 0 || l >= num_layers || names::is_routed_expert(name)) continue;
      if (s.find(name).info != &t) continue;  // padding, or a name another shard holds first
      total += t.nbytes;
    }
  if (s.find(names::kLmHead).info != nullptr)
    for (const std::string& name :
         {std::string(names::kLmHead), std::string(names::kLmHead) + ".qs",
          std::string(names::kFinalNorm), std::string(names::kOutputAttnResNorm),
          std::string(names::kOutputAttnResProj)})
      if (const LocatedTensor t = s.find(name); t.info != nullptr) total += t.info->nbytes;
  return total;
}

// A tensor is read in blocks of whole rows of about block_bytes(load) stored bytes, on all
// threads: a block is read, widened, checked and quantised (or copied) into its final place while
// the next ones are in flight. Each thread's scratch is its ring of block buffers (and one f32
// widening), so a load holds no staging copy of a tensor, however large.
// Blocks in flight over all threads: each thread keeps 64 / threads of its own queued, 2..8, so
// 64 from 8 to 32 threads (2 a thread beyond) and 16 (8 MiB) with 2. On the 2-core EPYC, up to 32 a
// thread (32 MiB, as much as the drive probe keeps in flight) loaded the 4-layer slice cold
// in 7.1-7.9 s against 6.9-8.0 s (alternated, 3 each): the drive was not waiting on the queue.
constexpr int kLoadQueueDepth = 64;
// The block size: 512 KiB, smaller for a small load so that the rings stay a small part of its
// memory: 1/1024 of the bytes loaded, at least 64 KiB.
size_t block_bytes(uint64_t load_bytes) {
  return std::clamp<size_t>(static_cast<size_t>(load_bytes / 1024) / kDirectAlign * kDirectAlign,
                            size_t{64} << 10, size_t{512} << 10);
}

// A thread's f32 widening of a block, for float tensors that are quantised.
struct BlockScratch {
  UninitVector<float> f32;
};

// The reads of one load_weights call: the engine's read queue (io_uring or its thread pool,
// O_DIRECT with K3_DIRECT, io/read_queue.h) and, per OpenMP thread, a ring of block buffers whose
// reads are queued ahead of the block being converted. The rings are made on first use and kept for
// the whole load (no page of them is faulted twice).
class LoadReader {
 public:
  struct Slot {
    std::unique_ptr<uint8_t, decltype(&free_direct_buffer)> buffer{nullptr, &free_direct_buffer};
    uint64_t capacity = 0;  // bytes of buffer
    ReadTicket ticket;
    const uint8_t* data = nullptr;  // the block's bytes once ticket is done
  };
  struct Ring {
    std::vector<std::unique_ptr<Slot>> slots;
    BlockScratch scratch;
  };

  // Reads with `io`'s engine, O_DIRECT when io.direct (K3_DIRECT), in blocks of about
  // `block_bytes`.
  LoadReader(const CacheOptions& io, size_t block_bytes)
      : queue_(make_read_queue(read_queue_options(io))),
        direct_(io.direct),
        block_bytes_(block_bytes) {}
  size_t block_bytes() const { return block_bytes_; }

  // Thread `thread`'s ring, sized for `threads` threads. Thread-safe.
  Ring& ring(int thread, int threads) {
    const std::lock_guard<std::mutex> lock(mu_);
    if (rings_.size() <= static_cast<size_t>(thread))
      rings_.resize(static_cast<size_t>(thread) + 1);
    std::unique_ptr<Ring>& r = rings_[static_cast<size_t>(thread)];
    if (r == nullptr) {
      r = std::make_unique<Ring>();
      const int depth = std::clamp(kLoadQueueDepth / std::max(threads, 1), 2, 8);
      for (int i = 0; i < depth; ++i) r->slots.push_back(std::make_unique<Slot>());
    }
    return *r;
  }

  // Whether the tensor at [offset, offset + length) of `file` is read with O_DIRECT: with
  // K3_DIRECT on, unless most of its pages are in the page cache already (a warm restart copies
  // them from there faster than the drive delivers them). Thread-safe.
  bool direct_for(const File& file, uint64_t offset, uint64_t length) {
    if (!direct_ || file.descriptor(true) < 0) return false;
    std::shared_ptr<const FileMapping> mapping;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      auto it = mappings_.find(&file);
      if (it == mappings_.end()) {
        try {
          it = mappings_.emplace(&file, FileMapping::map(file)).first;
        } catch (const Error&) {
          it = mappings_.emplace(&file, nullptr).first;  // no residency figure: read directly
        }
      }
      mapping = it->second;
    }
    return mapping == nullptr || mapping->cached_fraction(offset, length) < 0.5;
  }

  // Queues the read of `length` bytes of `file` at `offset` into `slot` (grown when too small),
  // with O_DIRECT when `direct`.
  void submit(Slot& slot, const File& file, uint64_t offset, uint64_t length, bool direct) {
    const uint64_t need = window_bytes(length);
    if (slot.capacity < need) {
      slot.buffer.reset(allocate_direct_buffer(need));
      slot.capacity = need;
    }
    const WindowPlan plan = plan_window(file, offset, length, slot.buffer.get(), direct);
    slot.data = plan.data;
    queue_->submit(slot.ticket, std::span<const ReadRequest>(plan.requests, plan.count));
  }
  // Withdraws what `slot` still has queued and waits for what reached the drive.
  void drain(Slot& slot) {
    queue_->cancel(slot.ticket);
    slot.ticket.wait();
  }

 private:
  std::unique_ptr<ReadQueue> queue_;
  bool direct_;
  size_t block_bytes_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Ring>> rings_;
  // Read-only maps of the files read so far (for their page-cache residency only).
  std::map<const File*, std::shared_ptr<const FileMapping>> mappings_;
};

// Reads tensor `t`, seen as `rows` rows of `row_bytes` stored bytes, in blocks of whole rows on
// all threads (OpenMP): thread i takes blocks i, i + threads, ... and keeps its next ring-size
// blocks queued in t_reader while it converts the current one. A block's bytes are copied to
// `dst` + its offset when `dst` is set (its final place); then consume(first_row, n_rows, bytes,
// scratch) runs on that thread with bytes in `dst` or in the ring (it may throw k3::Error). Each
// block advances the load's progress by its bytes; the cancel flag is polled before every block.
// Throws the first failure, or Interrupted when cancelled.
template <class Consume>
void read_row_blocks(const LocatedTensor& t, size_t rows, size_t row_bytes, uint8_t* dst,
                     const Consume& consume) {
  check_cancel();
  LoadReader* reader = t_reader;
  const size_t per_block =
      std::max<size_t>(1, reader->block_bytes() / std::max<size_t>(row_bytes, 1));
  const int64_t blocks = static_cast<int64_t>((rows + per_block - 1) / per_block);
  std::string failure;
  // Read by the worker threads only (the flag itself is atomic); blocks after a cancel are skipped.
  const std::atomic<bool>* cancel = t_cancel;
  Progress* progress = t_progress;
  std::atomic<bool> stopped{false};
  const File& file = t.shard->file();
  const bool direct = reader->direct_for(file, t.info->file_offset, rows * row_bytes);
  const auto block_rows = [&](int64_t b) {
    const size_t first = static_cast<size_t>(b) * per_block;
    return std::pair<size_t, size_t>(first, std::min(per_block, rows - first));
  };
#pragma omp parallel if (blocks > 1)
  {
    const int threads = omp_get_num_threads();
    LoadReader::Ring& ring = reader->ring(omp_get_thread_num(), threads);
    const int64_t depth = static_cast<int64_t>(ring.slots.size());
    const auto queue = [&](int64_t b, LoadReader::Slot& slot) {
      const auto [first, n] = block_rows(b);
      reader->submit(slot, file, t.info->file_offset + first * row_bytes, n * row_bytes, direct);
    };
    int64_t k = 0;  // this thread's block count so far; block b sits in slot k % depth
    try {
      for (int64_t i = 0; i < depth; ++i)
        if (const int64_t b = omp_get_thread_num() + i * threads; b < blocks)
          queue(b, *ring.slots[static_cast<size_t>(i)]);
      for (int64_t b = omp_get_thread_num(); b < blocks; b += threads, ++k) {
        LoadReader::Slot& slot = *ring.slots[static_cast<size_t>(k % depth)];
        slot.ticket.wait();
        if (stopped.load(std::memory_order_relaxed)) break;
        if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
          stopped.store(true, std::memory_order_relaxed);
          break;
        }
        if (!slot.ticket.error().empty())
          throw Error(slot.ticket.error() + " (tensor " + t.info->name + ")");
        const auto [first, n] = block_rows(b);
        const uint8_t* bytes = slot.data;
        if (dst != nullptr) {
          std::memcpy(dst + first * row_bytes, slot.data, n * row_bytes);
          bytes = dst + first * row_bytes;
        }
        consume(first, n, bytes, ring.scratch);
        if (progress != nullptr) progress->advance(n * row_bytes);
        if (const int64_t next = b + depth * threads; next < blocks) queue(next, slot);
      }
    } catch (const std::exception& e) {
#pragma omp critical(k3_read_row_blocks_failure)
      if (failure.empty()) failure = e.what();
      stopped.store(true, std::memory_order_relaxed);
    }
    for (const auto& slot : ring.slots) reader->drain(*slot);
  }
  if (!failure.empty()) throw Error(failure);
  if (stopped.load()) throw Interrupted();
}

// Widens `count` stored elements of float tensor `t` (element `first` on) into f32 `out` (which
// may be `bytes` itself for an F32 tensor) and checks them: throws k3::Error naming the first
// non-finite element.
void widen_checked(const LocatedTensor& t, const uint8_t* bytes, size_t first, size_t count,
                   float* out) {
  size_t bad;  // the first non-finite element, or count
  switch (t.info->dtype) {
    case DType::kBF16:
      bad = widen_bf16(bytes, count, out);
      break;
    case DType::kF16:
      bad = widen_f16(bytes, count, out);
      break;
    default:
      if (reinterpret_cast<const uint8_t*>(out) != bytes) std::memcpy(out, bytes, count * 4);
      bad = find_non_finite(out, count);
      break;
  }
  if (bad != count)
    throw Error(non_finite_message(t.shard->path(), *t.info, first + bad, out[bad]));
}

// Reads the float tensor (BF16, F16 or F32) `t` of `rows` rows of `cols` as f32 into `out`
// [rows][cols], block by block (an F32 tensor straight into `out`).
void read_floats_into(const LocatedTensor& t, size_t rows, size_t cols, float* out) {
  const size_t esize = dtype_size(t.info->dtype);
  const bool in_place = t.info->dtype == DType::kF32;
  read_row_blocks(t, rows, cols * esize, in_place ? reinterpret_cast<uint8_t*>(out) : nullptr,
                  [&](size_t first, size_t n, const uint8_t* bytes, BlockScratch&) {
                    widen_checked(t, bytes, first * cols, n * cols, out + first * cols);
                  });
}

// Reads a float tensor (BF16, F16 or F32) of exactly `shape` and widens it to f32 (small
// vectors: norms, biases, conv taps).
std::vector<float> read_floats(const ModelFiles& snap, const std::string& name,
                               const std::vector<int64_t>& shape) {
  check_cancel();
  const LocatedTensor t = snap.require_any(name, kFloatTypes, shape);
  const size_t count = t.info->numel();
  const size_t cols = shape.empty() ? 1 : static_cast<size_t>(shape.back());
  std::vector<float> out(count);
  read_floats_into(t, cols == 0 ? 0 : count / cols, cols, out.data());
  return out;
}

// Reads the float matrix `t` ([m.rows][m.cols]) into m in `format`: f32 rows straight into m.f32,
// or each block widened in the thread's scratch and quantised into m's buffers with `kernels`'
// row quantisers (the bytes quantize_matrix gives: rows are quantised independently).
void read_float_matrix(const LocatedTensor& t, WeightFormat format, const KernelTable* kernels,
                       Matrix& m) {
  allocate_matrix(m, format);
  const size_t rows = static_cast<size_t>(m.rows), cols = static_cast<size_t>(m.cols);
  if (format == WeightFormat::kF32) {
    read_floats_into(t, rows, cols, m.f32.data());
    return;
  }
  const size_t esize = dtype_size(t.info->dtype);
  read_row_blocks(t, rows, cols * esize, nullptr,
                  [&](size_t first, size_t n, const uint8_t* bytes, BlockScratch& scratch) {
                    scratch.f32.resize(std::max(scratch.f32.size(), n * cols));
                    widen_checked(t, bytes, first * cols, n * cols, scratch.f32.data());
                    quantize_rows(m, first, n, scratch.f32.data(), *kernels);
                  });
}

// How one class of dense matrix is wanted (docs/container.md §5): the width, whether the user
// chose it (a container's stored width is kept otherwise), the option naming it in messages, and
// K3_MMAP (use a container's prepared bytes in place).
struct MatrixPolicy {
  int bits = 32;
  bool chosen = true;
  const char* option = nullptr;
  bool mmap = false;
  const KernelTable* kernels = nullptr;  // the row quantisers (set when bits < 32)
};
// Matrices that are always f32 in RAM (router, f_a/f_b, b_proj): widened, never mapped.
const MatrixPolicy kAlwaysF32{};

int stored_bits(WeightFormat f) {
  return f == WeightFormat::kInt8Row ? 8 : f == WeightFormat::kInt4G64 ? 4 : 32;
}

// A container's prepared matrix: U8 `name` plus its F32 `<name>.qs` sidecar, told apart by their
// sizes (int8: O*I bytes and O scales; int4-g64: O*I/2 bytes and O*I/64 scales).
Matrix read_prepared(const ModelFiles& snap, const LocatedTensor& t, const std::string& name,
                     int64_t rows, int64_t cols, const MatrixPolicy& policy) {
  const std::string where = t.shard->path() + ": tensor " + t.info->name;
  const LocatedTensor qs = snap.find(name + ".qs");
  if (qs.info == nullptr)
    throw Error(where + " is U8 but its scale sidecar " + t.info->name +
                ".qs is missing (not a k3_repack container tensor)");
  if (qs.info->dtype != DType::kF32)
    throw Error(qs.shard->path() + ": tensor " + qs.info->name + " has dtype " +
                dtype_name(qs.info->dtype) + ", expected F32 (scale sidecar)");
  const uint64_t o = static_cast<uint64_t>(rows), i = static_cast<uint64_t>(cols);
  WeightFormat stored;
  if (t.info->nbytes == o * i && qs.info->numel() == o)
    stored = WeightFormat::kInt8Row;
  else if (i % 64 == 0 && t.info->nbytes == o * i / 2 && qs.info->numel() == o * i / 64)
    stored = WeightFormat::kInt4G64;
  else
    throw Error(where + " holds " + std::to_string(t.info->nbytes) + " bytes with " +
                std::to_string(qs.info->numel()) + " scales; a [" + std::to_string(o) + ", " +
                std::to_string(i) + "] matrix needs " + std::to_string(o * i) + " bytes + " +
                std::to_string(o) + " scales (int8)" +
                (i % 64 == 0 ? " or " + std::to_string(o * i / 2) + " bytes + " +
                                   std::to_string(o * i / 64) + " scales (int4-g64)"
                             : std::string()));
  // The declared shapes must be the ones k3_repack writes (the byte counts alone would let a
  // relabelled [I, O] pass as [O, I]).
  const std::vector<int64_t> want_shape = {rows,
                                           stored == WeightFormat::kInt8Row ? cols : cols / 2};
  const std::vector<int64_t> want_scales = stored == WeightFormat::kInt8Row
                                               ? std::vector<int64_t>{rows}
                                               : std::vector<int64_t>{rows, cols / 64};
  if (t.info->shape != want_shape)
    throw Error(where + " has shape " + shape_string(t.info->shape) + ", expected " +
                shape_string(want_shape) + " (" + weight_format_name(stored) + " bytes of a [" +
                std::to_string(o) + ", " + std::to_string(i) +
                "] matrix); the container is damaged or not k3_repack's: repack it");
  if (qs.info->shape != want_scales)
    throw Error(qs.shard->path() + ": tensor " + qs.info->name + " has shape " +
                shape_string(qs.info->shape) + ", expected " + shape_string(want_scales) + " (" +
                weight_format_name(stored) + " scales of a [" + std::to_string(o) + ", " +
                std::to_string(i) +
                "] matrix); the container is damaged or not k3_repack's: " + "repack it");
  // What to build: the stored format, unless the user chose a width. A chosen 4 on int8 is the
  // downcast; int8 stays int8 where the width is not a multiple of 64 (as the load-time path
  // does); anything else cannot be honoured from these bytes.
  WeightFormat target = stored;
  const int have = stored_bits(stored);
  if (policy.chosen && policy.bits != have) {
    if (stored == WeightFormat::kInt8Row && policy.bits == 4) {
      if (i % 64 == 0) target = WeightFormat::kInt4G64;
    } else {
      throw Error(where + " is stored as " + weight_format_name(stored) + " in this container; " +
                  policy.option + "=" + std::to_string(policy.bits) + " cannot be made from it (" +
                  (policy.bits > have ? "the dropped precision is gone"
                                      : "only int8 -> int4 is a downcast") +
                  "): unset " + policy.option + " to use the stored " + weight_format_name(stored) +
                  ", or repack with k3_repack --bits " + std::to_string(policy.bits));
    }
  }
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.format = target;
  if (policy.mmap) {
    if (target != stored)
      throw Error(where + ": K3_MMAP=1 cannot use it in place: " + policy.option + "=" +
                  std::to_string(policy.bits) + " needs an int8 -> int4-g64 conversion at load " +
                  "(unset " + policy.option + ", or repack with --bits 4)");
    if (qs.info->file_offset % alignof(float) != 0)
      throw Error(qs.shard->path() + ": tensor " + qs.info->name + " starts at byte " +
                  std::to_string(qs.info->file_offset) +
                  ", not 4-byte aligned, so K3_MMAP=1 cannot use its floats in place (repack with "
                  "the aligned layout)");
    const auto weights_map = t.shard->mapping();
    const auto scales_map = qs.shard->mapping();
    const uint8_t* bytes = weights_map->data() + t.info->file_offset;
    if (stored == WeightFormat::kInt8Row)
      m.mapped_q8 = reinterpret_cast<const int8_t*>(bytes);
    else
      m.mapped_q4 = bytes;
    m.mapped_scales = reinterpret_cast<const float*>(scales_map->data() + qs.info->file_offset);
    // Checked once here: the kernels use the mapped scales as they are.
    if (const size_t bad = find_non_finite(m.mapped_scales, qs.info->numel());
        bad != qs.info->numel())
      throw Error(non_finite_message(qs.shard->path(), *qs.info, bad, m.mapped_scales[bad]));
    m.mapped_bytes_ = t.info->nbytes + qs.info->nbytes;
    advance_load(m.mapped_bytes_);
    m.mapping = std::make_shared<
        std::pair<std::shared_ptr<const FileMapping>, std::shared_ptr<const FileMapping>>>(
        weights_map, scales_map);
    return m;
  }
  // The scales, then the weight bytes straight into their final buffers (or, for the downcast,
  // int8 row blocks re-quantised into them).
  const auto none = [](size_t, size_t, const uint8_t*, BlockScratch&) {};  // read in place
  UninitVector<float> scales(qs.info->numel());
  read_row_blocks(qs, 1, qs.info->nbytes, reinterpret_cast<uint8_t*>(scales.data()), none);
  if (const size_t bad = find_non_finite(scales.data(), scales.size()); bad != scales.size())
    throw Error(non_finite_message(qs.shard->path(), *qs.info, bad, scales[bad]));
  if (target == stored) {
    allocate_matrix(m, stored);
    if (stored == WeightFormat::kInt4G64)
      read_row_blocks(t, o, i / 2, m.q4.data(), none);
    else
      read_row_blocks(t, o, i, reinterpret_cast<uint8_t*>(m.q8.data()), none);
    m.scales = std::move(scales);
    return m;
  }
  allocate_matrix(m, WeightFormat::kInt4G64);
  read_row_blocks(t, o, i, nullptr,
                  [&](size_t first, size_t n, const uint8_t* bytes, BlockScratch&) {
                    for (size_t r = 0; r < n; ++r) {
                      const size_t row = first + r;
                      downcast_int8_row_to_int4_g64(reinterpret_cast<const int8_t*>(bytes) + r * i,
                                                    scales[row], i, m.q4.data() + row * i / 2,
                                                    m.scales.data() + row * i / 64);
                    }
                  });
  return m;
}

// Reads a [rows][cols] matrix in the policy's width: a container's prepared bytes as they are
// (or downcast), a float tensor widened and quantised as at load (32 keeps f32).
Matrix read_matrix(const ModelFiles& snap, const std::string& name, int64_t rows, int64_t cols,
                   const MatrixPolicy& policy = kAlwaysF32) {
  check_cancel();
  const LocatedTensor t = snap.find(name);
  if (t.info != nullptr && t.info->dtype == DType::kU8) {
    if (policy.option == nullptr)
      throw Error(t.shard->path() + ": tensor " + t.info->name +
                  " is U8, but this matrix is always kept in f32 (a container stores it in its "
                  "source dtype)");
    return read_prepared(snap, t, name, rows, cols, policy);
  }
  if (policy.mmap) {
    const LocatedTensor f = snap.require_any(name, kFloatTypes, {rows, cols});
    if (!(f.info->dtype == DType::kF32 && policy.bits == 32))
      throw Error(f.shard->path() + ": tensor " + f.info->name + ": K3_MMAP=1 cannot use it in " +
                  "place: it is stored as " + dtype_name(f.info->dtype) + " and " + policy.option +
                  "=" + std::to_string(policy.bits) +
                  " needs a conversion at load (repack with k3_repack at that width)");
    Matrix m;
    m.rows = rows;
    m.cols = cols;
    auto mapping = f.shard->mapping();
    m.mapped_f32 = reinterpret_cast<const float*>(mapping->data() + f.info->file_offset);
    m.mapped_bytes_ = f.info->nbytes;
    if (f.info->file_offset % alignof(float) != 0)
      throw Error(f.shard->path() + ": tensor " + f.info->name +
                  " is not 4-byte aligned; K3_MMAP=1 cannot use it in place");
    m.mapping = std::move(mapping);
    advance_load(f.info->nbytes);
    return m;
  }
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  const LocatedTensor f = snap.require_any(name, kFloatTypes, {rows, cols});
  read_float_matrix(f, quantized_format(policy.bits, cols), policy.kernels, m);
  return m;
}

// Conv taps are [channels, 1, K] in the checkpoint; [channels, K] is accepted (same bytes).
std::vector<float> read_conv(const ModelFiles& snap, const std::string& name, int64_t channels,
                             int64_t width) {
  const LocatedTensor t = snap.find(name);
  if (t.info != nullptr && t.info->shape.size() == 2)
    return read_floats(snap, name, {channels, width});
  return read_floats(snap, name, {channels, 1, width});
}

// AttnRes pseudo-query with its scoring-norm weight folded in: w = res_norm ⊙ res_proj[0].
std::vector<float> read_res_query(const ModelFiles& snap, const std::string& norm_name,
                                  const std::string& proj_name, int64_t hidden) {
  std::vector<float> norm = read_floats(snap, norm_name, {hidden});
  const std::vector<float> proj = read_floats(snap, proj_name, {1, hidden});
  for (int64_t i = 0; i < hidden; ++i) norm[static_cast<size_t>(i)] *= proj[static_cast<size_t>(i)];
  return norm;
}

KdaWeights load_kda(const ModelFiles& s, const K3Config& c, int64_t l, const MatrixPolicy& bits) {
  using namespace names;
  const int64_t D = c.hidden_size, P = c.kda_projection_size(), dk = c.kda_head_dim,
                H = c.kda_num_heads, K = c.short_conv_kernel_size;
  KdaWeights w;
  w.q_proj = read_matrix(s, layer(l, kKdaQProj), P, D, bits);
  w.k_proj = read_matrix(s, layer(l, kKdaKProj), P, D, bits);
  w.v_proj = read_matrix(s, layer(l, kKdaVProj), P, D, bits);
  w.q_conv = read_conv(s, layer(l, kKdaQConv), P, K);
  w.k_conv = read_conv(s, layer(l, kKdaKConv), P, K);
  w.v_conv = read_conv(s, layer(l, kKdaVConv), P, K);
  w.f_a_proj = read_matrix(s, layer(l, kKdaFAProj), dk, D);
  w.f_b_proj = read_matrix(s, layer(l, kKdaFBProj), P, dk);
  w.b_proj = read_matrix(s, layer(l, kKdaBProj), H, D);
  // A_log is per head: the first num_heads entries are used, the padding must be zero.
  const LocatedTensor a_log_t = s.find(layer(l, kKdaALog));
  const int64_t a_len =
      (a_log_t.info && a_log_t.info->shape.size() == 1) ? a_log_t.info->shape[0] : std::max(dk, H);
  if (a_len < H)
    throw Error(s.dir() + ": tensor " + s.prefix() + layer(l, kKdaALog) + " has " +
                std::to_string(a_len) + " entries, fewer than the " + std::to_string(H) +
                " KDA heads");
  const std::vector<float> a_log = read_floats(s, layer(l, kKdaALog), {a_len});
  for (int64_t i = H; i < a_len; ++i)
    if (a_log[static_cast<size_t>(i)] != 0.0f)
      throw Error(s.dir() + ": tensor " + s.prefix() + layer(l, kKdaALog) + " entry " +
                  std::to_string(i) +
                  " is non-zero; entries past num_heads must be zero padding (per-head A_log)");
  w.a_exp.resize(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h)
    w.a_exp[static_cast<size_t>(h)] = std::exp(a_log[static_cast<size_t>(h)]);
  w.dt_bias = read_floats(s, layer(l, kKdaDtBias), {P});
  w.g_proj = read_matrix(s, layer(l, kKdaGProj), P, D, bits);
  w.o_norm = read_floats(s, layer(l, kKdaONorm), {dk});
  w.o_proj = read_matrix(s, layer(l, kKdaOProj), D, P, bits);
  return w;
}

MlaWeights load_mla(const ModelFiles& s, const K3Config& c, int64_t l, const MatrixPolicy& bits) {
  using namespace names;
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  MlaWeights w;
  w.q_a_proj = read_matrix(s, layer(l, kMlaQAProj), c.q_lora_rank, D, bits);
  w.q_a_norm = read_floats(s, layer(l, kMlaQALayernorm), {c.q_lora_rank});
  w.q_b_proj = read_matrix(s, layer(l, kMlaQBProj), H * c.qk_head_dim(), c.q_lora_rank, bits);
  w.kv_a_proj = read_matrix(s, layer(l, kMlaKvAProj), c.kv_lora_rank + c.qk_rope_head_dim, D, bits);
  w.kv_a_norm = read_floats(s, layer(l, kMlaKvALayernorm), {c.kv_lora_rank});
  w.kv_b_proj = read_matrix(s, layer(l, kMlaKvBProj), H * (c.qk_nope_head_dim + c.v_head_dim),
                            c.kv_lora_rank, bits);
  w.g_proj = read_matrix(s, layer(l, kMlaGProj), H * c.v_head_dim, D, bits);
  w.o_proj = read_matrix(s, layer(l, kMlaOProj), D, H * c.v_head_dim, bits);
  return w;
}

DenseMlpWeights load_dense(const ModelFiles& s, const K3Config& c, int64_t l,
                           const MatrixPolicy& bits) {
  using namespace names;
  DenseMlpWeights w;
  w.gate_proj = read_matrix(s, layer(l, kMlpGateProj), c.intermediate_size, c.hidden_size, bits);
  w.up_proj = read_matrix(s, layer(l, kMlpUpProj), c.intermediate_size, c.hidden_size, bits);
  w.down_proj = read_matrix(s, layer(l, kMlpDownProj), c.hidden_size, c.intermediate_size, bits);
  return w;
}

// Registers where layer l's routed experts are (no byte is read).
void add_layer_experts(const ModelFiles& s, const K3Config& c, int64_t l, ExpertStore& experts) {
  using namespace names;
  const int64_t E = c.num_experts, R = c.routed_expert_hidden_size, I = c.moe_intermediate_size;
  const std::vector<int64_t> shapes[6] = {{I, R / 2},  {I, R / 32}, {R, I / 2},
                                          {R, I / 32}, {I, R / 2},  {I, R / 32}};
  for (int64_t e = 0; e < E; ++e) {
    check_cancel();
    ExpertTensors t;
    for (size_t i = 0; i < 6; ++i)
      t[i] = s.require(expert(l, e, kExpertTensors[i]), DType::kU8, shapes[i]);
    experts.add(l, e, t);
  }
}

MoeWeights load_moe(const ModelFiles& s, const K3Config& c, int64_t l, const MatrixPolicy& bits,
                    ExpertStore& experts) {
  using namespace names;
  const int64_t D = c.hidden_size, E = c.num_experts, R = c.routed_expert_hidden_size,
                S = c.shared_intermediate_size();
  MoeWeights w;
  w.router = read_matrix(s, layer(l, kMoeRouter), E, D);
  w.router_bias = read_floats(s, layer(l, kMoeRouterBias), {E});
  w.latent_down = read_matrix(s, layer(l, kMoeLatentDown), R, D, bits);
  w.latent_norm = read_floats(s, layer(l, kMoeLatentNorm), {R});
  w.latent_up = read_matrix(s, layer(l, kMoeLatentUp), D, R, bits);
  if (S > 0) {
    w.shared_gate = read_matrix(s, layer(l, kMoeSharedGate), S, D, bits);
    w.shared_up = read_matrix(s, layer(l, kMoeSharedUp), S, D, bits);
    w.shared_down = read_matrix(s, layer(l, kMoeSharedDown), D, S, bits);
  }
  add_layer_experts(s, c, l, experts);
  return w;
}

}  // namespace

void EmbeddingReader::row(int64_t token_id, float* out, std::vector<uint8_t>& raw) const {
  if (token_id < 0 || token_id >= vocab_size_)
    throw Error("token id " + std::to_string(token_id) + " is outside the vocabulary [0, " +
                std::to_string(vocab_size_) + ")");
  const size_t esize = dtype_size(table_.info->dtype);
  const uint64_t row_bytes = static_cast<uint64_t>(hidden_size_) * esize;
  raw.resize(row_bytes);
  try {
    table_.shard->file().read_exact(
        raw.data(), row_bytes,
        table_.info->file_offset + static_cast<uint64_t>(token_id) * row_bytes, table_.info->name);
  } catch (const Error& err) {
    throw Error(std::string(err.what()) + " (row " + std::to_string(token_id) + ")");
  }
  const size_t n = static_cast<size_t>(hidden_size_);
  size_t bad;  // the row is converted here, at its first use: checked here too
  switch (table_.info->dtype) {
    case DType::kBF16:
      bad = widen_bf16(raw.data(), n, out);
      break;
    case DType::kF16:
      bad = widen_f16(raw.data(), n, out);
      break;
    default:
      std::memcpy(out, raw.data(), row_bytes);
      bad = find_non_finite(out, n);
      break;
  }
  if (bad != n)
    throw Error(non_finite_message(table_.shard->path(), *table_.info,
                                   static_cast<uint64_t>(token_id) * n + bad, out[bad]));
}

ClassWidths effective_widths(const LoadOptions& load, const ContainerInfo& container) {
  const auto width = [&](int requested, bool chosen, int stored) {
    return container.present && !chosen ? stored : requested;
  };
  return {width(load.bits, load.bits_chosen, container.bits),
          width(load.mla_bits, load.mla_bits_chosen, container.mla_bits),
          width(load.head_bits, load.head_bits_chosen, container.head_bits)};
}

std::unique_ptr<ExpertStore> load_expert_store(const ModelFiles& files, const K3Config& c,
                                               int64_t num_layers) {
  auto store = std::make_unique<ExpertStore>(
      ExpertGeometry{c.routed_expert_hidden_size, c.moe_intermediate_size});
  for (int64_t l = 0; l < num_layers; ++l)
    if (c.ffn[static_cast<size_t>(l)] == FfnKind::kMoE) add_layer_experts(files, c, l, *store);
  return store;
}

ModelWeights load_weights(const ModelFiles& s, const K3Config& c, int64_t num_layers,
                          const LoadOptions& precision, const KernelTable& kernels,
                          const std::function<void(double)>& on_progress,
                          const std::atomic<bool>* cancel) {
  using namespace names;
  const int64_t D = c.hidden_size;
  const ClassWidths widths = effective_widths(precision, s.container());
  const auto policy = [&](int bits, bool chosen, const char* option) {
    MatrixPolicy p;
    p.bits = bits;
    p.chosen = chosen;
    p.option = option;
    p.mmap = precision.mmap;
    p.kernels = &kernels;
    return p;
  };
  const MatrixPolicy bits_policy = policy(widths.bits, precision.bits_chosen, "K3_BITS");
  const MatrixPolicy mla_policy = policy(widths.mla_bits, precision.mla_bits_chosen, "K3_MLA_BITS");
  const MatrixPolicy head_policy =
      policy(widths.head_bits, precision.head_bits_chosen, "K3_HEAD_BITS");
  ModelWeights mw;
  mw.experts = std::make_unique<ExpertStore>(
      ExpertGeometry{c.routed_expert_hidden_size, c.moe_intermediate_size});
  const uint64_t load_bytes = planned_bytes(s, num_layers);
  mw.file_bytes = load_bytes;
  Progress progress("loading " + s.dir(), load_bytes, on_progress);
  LoadReader reader(precision.cache, block_bytes(load_bytes));
  const LoadScope load_scope(cancel, progress, reader);
  mw.layers.resize(static_cast<size_t>(num_layers));
  for (int64_t l = 0; l < num_layers; ++l) {
    LayerWeights& lw = mw.layers[static_cast<size_t>(l)];
    lw.input_norm = read_floats(s, layer(l, kInputLayernorm), {D});
    lw.post_attn_norm = read_floats(s, layer(l, kPostAttentionLayernorm), {D});
    lw.attn_res_query = read_res_query(s, layer(l, kAttnResNorm), layer(l, kAttnResProj), D);
    lw.mlp_res_query = read_res_query(s, layer(l, kMlpResNorm), layer(l, kMlpResProj), D);
    if (c.attention[static_cast<size_t>(l)] == AttentionKind::kKDA)
      lw.kda = load_kda(s, c, l, bits_policy);
    else
      lw.mla = load_mla(s, c, l, mla_policy);
    if (c.ffn[static_cast<size_t>(l)] == FfnKind::kDense)
      lw.dense = load_dense(s, c, l, bits_policy);
    else
      lw.moe = load_moe(s, c, l, bits_policy, *mw.experts);
    // K3_LOAD_DELAY_MS: a long load on a small model (tests of a stopped load), in slices that
    // poll the cancel flag like the reads do.
    for (int64_t waited = 0; waited < precision.load_delay_ms && !load_cancelled(); waited += 10)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Globals. A partial snapshot (validation with K3_X0) may lack them: then no embedding/head.
  check_cancel();
  if (s.find(kEmbedTokens).info != nullptr) {
    mw.embedding.emplace(s.require_any(kEmbedTokens, kFloatTypes, {c.vocab_size, D}), c.vocab_size,
                         D);
  }
  if (s.find(kLmHead).info != nullptr) {
    mw.lm_head = read_matrix(s, kLmHead, c.vocab_size, D, head_policy);
    mw.final_norm = read_floats(s, kFinalNorm, {D});
    mw.output_res_query = read_res_query(s, kOutputAttnResNorm, kOutputAttnResProj, D);
  }
  progress.finish();
  return mw;
}

}  // namespace k3

namespace k3 {
namespace {

// The one list of a layer's dense matrices, for both constnesses.
template <class Weights, class Visit>
void visit_matrices(Weights& weights, const Visit& visit) {
  for (auto& l : weights.layers) {
    if (l.kda)
      for (auto* m : {&l.kda->q_proj, &l.kda->k_proj, &l.kda->v_proj, &l.kda->f_a_proj,
                      &l.kda->f_b_proj, &l.kda->b_proj, &l.kda->g_proj, &l.kda->o_proj})
        visit(*m);
    if (l.mla)
      for (auto* m : {&l.mla->q_a_proj, &l.mla->q_b_proj, &l.mla->kv_a_proj, &l.mla->kv_b_proj,
                      &l.mla->g_proj, &l.mla->o_proj})
        visit(*m);
    if (l.dense)
      for (auto* m : {&l.dense->gate_proj, &l.dense->up_proj, &l.dense->down_proj}) visit(*m);
    if (l.moe)
      for (auto* m : {&l.moe->router, &l.moe->latent_down, &l.moe->latent_up, &l.moe->shared_gate,
                      &l.moe->shared_up, &l.moe->shared_down})
        visit(*m);
  }
  if (weights.lm_head) visit(*weights.lm_head);
}

}  // namespace

void for_each_matrix(const ModelWeights& weights, const std::function<void(const Matrix&)>& visit) {
  visit_matrices(weights, visit);
}

void for_each_matrix(ModelWeights& weights, const std::function<void(Matrix&)>& visit) {
  visit_matrices(weights, visit);
}

}  // namespace k3

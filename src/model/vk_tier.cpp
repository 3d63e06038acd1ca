#include "model/vk_tier.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "model/state.h"
#include "util/error.h"
#include "vk/mxfp4_device.h"

namespace k3 {

namespace {

constexpr uint64_t kHalvingTokens = 1024;  // heat halves every this many tokens
constexpr float kSeedHeat = 32.0f;         // a layer's hottest expert in the history
// The prompt's streaming cost model (docs/vulkan.md §5): the CPU's f32 MXFP4 expert rate and the
// upload rate assumed before the tier measured its own uploads.
constexpr double kCpuFlops = 50e9;
constexpr double kAssumedUploadBytesPerS = 4e9;

vk::ExpertBytes bytes_of(const ExpertView& v) {
  return {v.gate_packed, v.gate_scale, v.up_packed, v.up_scale, v.down_packed, v.down_scale};
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

VkTierBudget size_vk_tier_budget(const VulkanOptions& options, uint64_t expert_bytes,
                                 std::optional<uint64_t> free_bytes, uint64_t heap_bytes,
                                 bool cpu_device, uint64_t dense_bytes) {
  if (options.tier_gb > 0) return {options.tier_gb * 1e9, "COLI_VK_TIER_GB"};
  const double dense = static_cast<double>(dense_bytes);
  if (options.device_cap_mb > 0)
    return {std::max(0.0, static_cast<double>(static_cast<uint64_t>(options.device_cap_mb) << 20) -
                              dense),
            "COLI_VK_DEVICE_CAP_MB"};
  double room = static_cast<double>(free_bytes ? *free_bytes : heap_bytes);
  if (cpu_device) room /= 4;
  // VK_EXT_memory_budget was read when the device opened, before the dense upload.
  double bytes = std::max(0.0, room - dense - options.reserve_gb * 1e9);
  // The prompt's staging regions come out of the same memory.
  if (options.prefill != "off")
    bytes = std::max(0.0, bytes - static_cast<double>(options.prefill_slots) *
                                      static_cast<double>(expert_bytes));
  return {bytes, free_bytes ? "VK_EXT_memory_budget" : "heap"};
}

struct VkTier::Groups {
  std::vector<vk::Mxfp4Device::Group> list;
};

VkTier::VkTier(const K3Config& config, const VulkanOptions& options, ExpertCache& cache,
               const std::vector<int64_t>& moe_layers, std::function<void(const std::string&)> note,
               const std::vector<const WeightMatrix*>& dense)
    : config_(config),
      options_(options),
      cache_(cache),
      note_(std::move(note)),
      groups_(std::make_unique<Groups>()) {
  vk::DeviceOptions dev;
  dev.gemm_rows = static_cast<uint32_t>(options.gemm_rows);
  dev.device_cap_bytes = static_cast<uint64_t>(options.device_cap_mb) << 20;
  dev.validation = options.validation;
  dev.staged = options.staged == "auto" ? -1 : options.staged == "1" ? 1 : 0;
  device_ = vk::Mxfp4Device::open(dev, {static_cast<uint32_t>(config.routed_expert_hidden_size),
                                        static_cast<uint32_t>(config.moe_intermediate_size),
                                        static_cast<float>(config.activation_situ_beta),
                                        static_cast<float>(config.activation_situ_linear_beta)});
  stats_.device = device_->name();
  E_ = static_cast<size_t>(config.num_experts);
  const size_t L = static_cast<size_t>(config.num_hidden_layers);
  heat_.assign(L * E_, 0.0f);
  slot_of_.assign(L * E_, -1);
  if (!moe_layers.empty()) first_moe_layer_ = moe_layers.front();
  if (options.dense == "on" || (options.dense == "auto" && device_->is_discrete()))
    upload_dense(dense);
  // The budget in whole experts.
  const double expert = static_cast<double>(device_->expert_bytes());
  const VkTierBudget sized =
      size_vk_tier_budget(options, device_->expert_bytes(), device_->memory_budget(),
                          device_->memory_bytes(), device_->is_cpu(), stats_.dense_bytes);
  const double bytes = sized.bytes;
  stats_.budget_source = sized.source;
  budget_ = static_cast<uint64_t>(bytes / expert);
  budget_ = std::min<uint64_t>(budget_, moe_layers.size() * E_);
  stats_.budget = budget_;
  if (note_)
    note_(budget_ == 0 ? "Vulkan tier on " + device_->name() + ": no room for one expert (" +
                             std::to_string(device_->expert_bytes()) + " B) in " +
                             std::to_string(static_cast<uint64_t>(bytes)) + " B (sized by " +
                             stats_.budget_source +
                             "); set COLI_VK_TIER_GB (or lower COLI_VK_TIER_RESERVE_GB)"
                       : "Vulkan tier on " + device_->name() + ": " + std::to_string(budget_) +
                             " experts (sized by " + stats_.budget_source + ")");
  thread_ = std::thread([this] { uploader(); });
  // Heat from the history: 32 for a layer's hottest, proportionally below.
  struct Hot {
    float heat;
    int64_t layer, expert;
  };
  std::vector<Hot> hot;
  for (int64_t l : moe_layers) {
    const std::vector<uint64_t> usage = cache.usage(l);
    const uint64_t top = usage.empty() ? 0 : *std::max_element(usage.begin(), usage.end());
    if (top == 0) continue;
    for (size_t e = 0; e < usage.size(); ++e)
      if (usage[e] > 0) {
        const float h = kSeedHeat * static_cast<float>(usage[e]) / static_cast<float>(top);
        heat(l, static_cast<int64_t>(e)) = h;
        hot.push_back({h, l, static_cast<int64_t>(e)});
      }
  }
  // Warm start: hottest first over all layers. Each batch is read through the RAM cache (its
  // reads in parallel), copied, and handed to the uploader, which uploads it while the next
  // batch is read.
  std::sort(hot.begin(), hot.end(), [](const Hot& a, const Hot& b) {
    return a.heat != b.heat     ? a.heat > b.heat
           : a.layer != b.layer ? a.layer < b.layer
                                : a.expert < b.expert;
  });
  if (hot.size() > budget_) hot.resize(budget_);
  std::stable_sort(hot.begin(), hot.end(),
                   [](const Hot& a, const Hot& b) { return a.layer < b.layer; });
  ExpertBatch batch;
  try {
    for (size_t i = 0; i < hot.size();) {
      std::vector<int64_t> ids;
      const int64_t layer = hot[i].layer;
      for (; i < hot.size() && hot[i].layer == layer && ids.size() < ExpertBatch::kMaxBatch; ++i)
        ids.push_back(hot[i].expert);
      std::sort(ids.begin(), ids.end());
      cache.acquire(layer, ids, ExpertUse::kChunk, batch);
      std::vector<Job> jobs;
      for (size_t j = 0; j < ids.size(); ++j)
        jobs.push_back(copy_job(layer, ids[j], batch.view(j)));
      batch.release();
      queue(std::move(jobs));
    }
    wait_uploads();
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(up_mu_);
      stop_ = true;
    }
    up_cv_.notify_all();
    thread_.join();
    throw;
  }
  publish();
}

VkTier::~VkTier() {
  {
    std::lock_guard<std::mutex> lock(up_mu_);
    stop_ = true;
  }
  up_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

float& VkTier::heat(int64_t layer, int64_t expert) {
  return heat_[static_cast<size_t>(layer) * E_ + static_cast<size_t>(expert)];
}

int32_t& VkTier::slot(int64_t layer, int64_t expert) {
  return slot_of_[static_cast<size_t>(layer) * E_ + static_cast<size_t>(expert)];
}

bool VkTier::holds(int64_t layer, int64_t expert) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slot_of_[static_cast<size_t>(layer) * E_ + static_cast<size_t>(expert)] >= 0;
}

VkTierStats VkTier::stats() const {
  VkTierStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
    s.residents = residents_.size();
  }
  s.blocks = device_->blocks();
  s.validation_errors = device_->validation_errors();
  return s;
}

uint64_t VkTier::stream_rows() const {
  if (options_.prefill == "off") return 0;
  if (options_.prefill == "on") return 1;
  // auto: never on a CPU device (it computes on the CPU's own cores). Else a group streams when
  // rows x (CPU time per row) > upload time: the CPU's 6 R I flops per row at kCpuFlops against
  // the expert's bytes at the upload rate this tier measured (kAssumedUploadBytesPerS before).
  if (device_->is_cpu()) return 0;
  double rate = kAssumedUploadBytesPerS;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stats_.upload_s > 0 && stats_.upload_bytes > 0)
      rate = static_cast<double>(stats_.upload_bytes) / stats_.upload_s;
  }
  const double cpu_row = 6.0 * static_cast<double>(config_.routed_expert_hidden_size) *
                         static_cast<double>(config_.moe_intermediate_size) / kCpuFlops;
  const double upload = static_cast<double>(device_->expert_bytes()) / rate;
  return static_cast<uint64_t>(std::floor(upload / cpu_row)) + 1;
}

void VkTier::upload_dense(const std::vector<const WeightMatrix*>& dense) {
  using Format = vk::Mxfp4Device::DenseFormat;
  const uint64_t before = device_->bytes_in_use();
  uint64_t skipped = 0;
  for (const WeightMatrix* w : dense) {
    // The shader's 32-input groups (64 for int4, which the format already guarantees).
    if (w->cols % 32 != 0) {
      ++skipped;
      continue;
    }
    vk::Mxfp4Device::DenseMatrix m;
    m.rows = static_cast<uint32_t>(w->rows);
    m.cols = static_cast<uint32_t>(w->cols);
    switch (w->format) {
      case WeightFormat::kF32:
        m.format = Format::kF32;
        m.weights = w->f32_data();
        break;
      case WeightFormat::kInt8Row:
        m.format = Format::kInt8Row;
        m.weights = w->q8_data();
        m.scales = w->scale_data();
        break;
      case WeightFormat::kInt4G64:
        m.format = Format::kInt4G64;
        m.weights = w->q4_data();
        m.scales = w->scale_data();
        break;
    }
    const int32_t slot = device_->upload_dense(m);
    if (slot < 0) {
      if (note_)
        note_("Vulkan dense: the device refused more after " + std::to_string(dense_slot_.size()) +
              " of " + std::to_string(dense.size()) + " matrices; the CPU computes the rest");
      break;
    }
    dense_slot_.emplace(w, slot);
  }
  stats_.dense_matrices = dense_slot_.size();
  stats_.dense_bytes = device_->bytes_in_use() - before;
  if (note_ && !dense_slot_.empty())
    note_("Vulkan dense: " + std::to_string(dense_slot_.size()) + " dense matrices on " +
          device_->name() + " (" + std::to_string(stats_.dense_bytes >> 20) +
          " MiB), for prompt chunks of " + std::to_string(options_.dense_rows) + "+ rows" +
          (skipped ? " (" + std::to_string(skipped) + " with a width off 32 stay on the CPU)"
                   : std::string()));
}

bool VkTier::dense_matmul(const WeightMatrix& W, const float* X, size_t n, float* Y) {
  if (off_ || n < static_cast<size_t>(options_.dense_rows)) return false;
  const auto it = dense_slot_.find(&W);
  if (it == dense_slot_.end()) return false;
  const auto start = std::chrono::steady_clock::now();
  const size_t cols = static_cast<size_t>(W.cols), rows = static_cast<size_t>(W.rows);
  // Dispatches of at most 64 MiB of activations (a row's bits do not depend on the split).
  const size_t per = std::max<size_t>(1, (size_t{64} << 20) / ((cols + rows) * sizeof(float)));
  for (size_t t = 0; t < n; t += per) {
    const size_t m = std::min(per, n - t);
    if (inject_loss_.exchange(false) ||
        !device_->dense_matmul(it->second, X + t * cols, static_cast<uint32_t>(m), Y + t * rows)) {
      turn_off("the device was lost (" + device_->name() + ")");
      return false;  // the CPU computes the whole matrix
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.dense_matmuls;
  stats_.dense_rows += n;
  stats_.dense_s += seconds_since(start);
  return true;
}

void VkTier::turn_off(const std::string& why) {
  off_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.off = true;
    std::fill(slot_of_.begin(), slot_of_.end(), -1);
    residents_.clear();
  }
  held_.clear();
  streamed_.clear();
  if (note_)
    note_("Vulkan tier off: " + why + "; the CPU computes every routed expert" +
          (dense_slot_.empty() ? "" : " and dense matrix"));
}

VkTier::Job VkTier::copy_job(int64_t layer, int64_t expert, const ExpertView& v) const {
  const size_t R = static_cast<size_t>(config_.routed_expert_hidden_size),
               I = static_cast<size_t>(config_.moe_intermediate_size);
  const size_t mat = I * R / 2, groups = I * R / 32;
  Job job{layer, expert, std::vector<uint8_t>(3 * mat + 3 * groups)};
  uint8_t* p = job.bytes.data();
  for (const uint8_t* src : {v.gate_packed, v.up_packed, v.down_packed}) {
    std::memcpy(p, src, mat);
    p += mat;
  }
  for (const uint8_t* src : {v.gate_scale, v.up_scale, v.down_scale}) {
    std::memcpy(p, src, groups);
    p += groups;
  }
  return job;
}

void VkTier::queue(std::vector<Job>&& jobs) {
  if (jobs.empty()) return;
  {
    std::lock_guard<std::mutex> lock(up_mu_);
    for (Job& j : jobs) jobs_.push_back(std::move(j));
    busy_ += jobs.size();
  }
  jobs.clear();
  up_cv_.notify_one();
}

void VkTier::wait_uploads() {
  std::unique_lock<std::mutex> lock(up_mu_);
  idle_cv_.wait(lock, [&] { return busy_ == 0; });
}

void VkTier::uploader() {
  const size_t R = static_cast<size_t>(config_.routed_expert_hidden_size),
               I = static_cast<size_t>(config_.moe_intermediate_size);
  const size_t mat = I * R / 2, groups = I * R / 32;
  std::unique_lock<std::mutex> lock(up_mu_);
  for (;;) {
    up_cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    if (const int ms = delay_ms_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    const auto t0 = std::chrono::steady_clock::now();
    int32_t s = -1;
    if (off_) {
      s = -1;
    } else if (refuse_.load() > 0) {
      --refuse_;
    } else {
      const uint8_t* p = job.bytes.data();
      try {
        s = device_->upload(
            {p, p + 3 * mat, p + mat, p + 3 * mat + groups, p + 2 * mat, p + 3 * mat + 2 * groups});
      } catch (const std::exception&) {
        s = -1;  // out of host memory for the staging copy: refused like a full device
      }
    }
    const double seconds = seconds_since(t0);
    lock.lock();
    done_.push_back({job.layer, job.expert, s, s >= 0 ? device_->expert_bytes() : 0, seconds});
    if (--busy_ == 0) idle_cv_.notify_all();
  }
}

void VkTier::publish() {
  std::vector<Done> done;
  {
    std::lock_guard<std::mutex> lock(up_mu_);
    done.swap(done_);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const Done& d : done) {
    pending_ -= pending_ > 0 ? 1 : 0;
    if (d.slot < 0 || stats_.off) {
      if (d.slot >= 0) device_->release(d.slot);
      if (!stats_.off) ++stats_.refused;
      if (slot(d.layer, d.expert) == kPending) slot(d.layer, d.expert) = -1;
      continue;
    }
    slot(d.layer, d.expert) = d.slot;
    residents_.push_back({d.layer, d.expert, d.slot});
    ++stats_.uploads;
    stats_.upload_bytes += d.bytes;
    stats_.upload_s += d.seconds;
  }
}

void VkTier::release_streamed() {
  for (int32_t s : streamed_) device_->release(s);
  streamed_.clear();
}

void VkTier::issue(const MoeStep& step, std::span<GroupOwner> owner, GroupOwner self) {
  claimed_.clear();
  if (stats_.off) return;
  // The previous step's promotions go to the uploader (their victims' memory is free now: no
  // batch is in flight); what it finished becomes resident. In sync mode this step waits for
  // them, so residency depends only on the routing.
  queue(std::move(held_));
  held_.clear();
  if (options_.sync) wait_uploads();
  publish();
  if (step.layer == first_moe_layer_) {
    // A new token (or prefill chunk): the rate limit restarts; heat halves every 1024 tokens.
    promotions_left_ = options_.rate;
    const uint64_t before = tokens_ / kHalvingTokens;
    tokens_ += step.rows;
    if (tokens_ / kHalvingTokens != before)
      for (float& h : heat_) h *= 0.5f;
  }
  size_t pairs = 0;
  first_row_.clear();
  std::vector<vk::Mxfp4Device::Group>& groups = groups_->list;
  groups.clear();
  uint64_t total = 0;
  for (size_t g = 0; g < step.groups(); ++g) {
    heat(step.layer, step.ids[g]) += static_cast<float>(step.pairs(g));
    total += step.pairs(g);
    if (owner[g] != kUnowned) continue;
    const int32_t s = slot(step.layer, step.ids[g]);
    if (s < 0 || pairs + step.pairs(g) > device_->max_pairs()) continue;
    owner[g] = self;
    claimed_.push_back(g);
    first_row_.push_back(pairs);
    groups.push_back({s, static_cast<uint32_t>(step.pairs(g))});
    pairs += step.pairs(g);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.pairs_total += total;
  }
  if (step.use == ExpertUse::kChunk) {
    try {
      stream_cold(step, owner, self, pairs);
    } catch (const Error& e) {
      // A read of a cold expert failed: the CPU executor takes the streamed groups (reading the
      // expert again, and saying so if it fails again). They are the last ones claimed.
      const size_t keep = claimed_.size() - streamed_.size();
      for (size_t i = keep; i < claimed_.size(); ++i) owner[claimed_[i]] = kUnowned;
      claimed_.resize(keep);
      first_row_.resize(keep);
      groups.resize(keep);
      pairs = keep ? first_row_.back() + groups.back().rows : 0;
      release_streamed();
    }
  }
  if (claimed_.empty()) return;
  z_.resize(pairs * step.R);
  out_.resize(pairs * step.R);
  for (size_t i = 0; i < claimed_.size(); ++i) {
    const size_t g = claimed_[i], p0 = step.starts[g];
    for (size_t j = 0; j < step.pairs(g); ++j)
      std::memcpy(z_.data() + (first_row_[i] + j) * step.R,
                  step.z + step.picks[p0 + j].row * step.R, step.R * sizeof(float));
  }
  try {
    device_->issue(groups, z_.data());
  } catch (const Error& e) {
    // The device could not take the batch (its activations refused, a failed submit): the CPU
    // computes these groups and the tier stops.
    for (size_t g : claimed_) owner[g] = kUnowned;
    claimed_.clear();
    release_streamed();
    turn_off(e.what());
  }
}

// A prompt chunk's cold experts with at least stream_rows() rows: read through the RAM cache,
// uploaded to staging regions (outside the budget, never made resident: a long prompt does not
// flush the decode set), computed in this step's batch and freed after it; at most
// COLI_VK_PREFILL_SLOTS per step. The groups are appended to the batch after the residents'
// (the sum's order is the step's, whichever group computed first).
void VkTier::stream_cold(const MoeStep& step, std::span<GroupOwner> owner, GroupOwner self,
                         size_t& pairs) {
  const uint64_t min_rows = stream_rows();
  if (min_rows == 0) return;
  std::vector<size_t> cold;
  size_t upto = pairs;
  for (size_t g = 0; g < step.groups(); ++g)
    if (owner[g] == kUnowned && step.pairs(g) >= min_rows &&
        cold.size() < static_cast<size_t>(options_.prefill_slots) &&
        upto + step.pairs(g) <= device_->max_pairs()) {
      cold.push_back(g);
      upto += step.pairs(g);
    }
  if (cold.empty()) return;
  upto = pairs;
  ExpertBatch batch;
  bool full = false;
  for (size_t i = 0; i < cold.size() && !full;) {
    std::vector<int64_t> ids;
    const size_t first = i;
    for (; i < cold.size() && ids.size() < ExpertBatch::kMaxBatch; ++i)
      ids.push_back(step.ids[cold[i]]);
    cache_.acquire(step.layer, ids, ExpertUse::kChunk, batch);
    for (size_t j = 0; j < ids.size(); ++j) {
      const int32_t s = device_->upload(bytes_of(batch.view(j)));
      if (s < 0) {  // the cap or the driver: the CPU takes the rest
        full = true;
        break;
      }
      const size_t g = cold[first + j];
      streamed_.push_back(s);
      owner[g] = self;
      claimed_.push_back(g);
      first_row_.push_back(upto);
      groups_->list.push_back({s, static_cast<uint32_t>(step.pairs(g))});
      upto += step.pairs(g);
    }
    batch.release();
  }
  pairs = upto;
}

bool VkTier::finish(const MoeStep& step, std::span<const GroupOwner> owner, GroupOwner self,
                    PairSink& sink) {
  if (options_.sync && !stats_.off) decide(step);
  if (claimed_.empty()) return true;
  const bool lost = inject_loss_.exchange(false);
  const auto t0 = std::chrono::steady_clock::now();
  const bool joined = device_->join(out_.data());
  const double waited = seconds_since(t0);
  if (!joined || lost) {
    claimed_.clear();
    streamed_.clear();  // a lost device holds nothing
    turn_off("the device was lost (" + device_->name() + ")");
    return false;
  }
  const size_t resident_groups = claimed_.size() - streamed_.size();
  uint64_t pairs = 0, streamed_pairs = 0;
  for (size_t i = 0; i < claimed_.size(); ++i) {
    sink.deliver(claimed_[i], out_.data() + first_row_[i] * step.R, true);
    (i < resident_groups ? pairs : streamed_pairs) += step.pairs(claimed_[i]);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.join_wait_s += waited;
    stats_.experts_served += resident_groups;
    stats_.pairs_served += pairs + streamed_pairs;
    stats_.streamed_experts += streamed_.size();
    stats_.streamed_pairs += streamed_pairs;
  }
  release_streamed();
  claimed_.clear();
  return true;
}

void VkTier::offered(int64_t layer, int64_t expert, const ExpertView& view) {
  if (stats_.off || budget_ == 0 || slot(layer, expert) != -1) return;
  if (options_.sync) {
    // Decided at the end of the step in id order: the CPU applies experts as their reads land.
    candidates_.push_back(expert);
    return;
  }
  if (admit(layer, expert)) held_.push_back(copy_job(layer, expert, view));
}

void VkTier::decide(const MoeStep& step) {
  std::sort(candidates_.begin(), candidates_.end());
  candidates_.erase(std::unique(candidates_.begin(), candidates_.end()), candidates_.end());
  std::vector<int64_t> winners;
  for (int64_t e : candidates_)
    if (slot(step.layer, e) == -1 && admit(step.layer, e)) winners.push_back(e);
  candidates_.clear();
  ExpertBatch batch;
  for (size_t i = 0; i < winners.size(); i += ExpertBatch::kMaxBatch) {
    const std::span<const int64_t> ids(winners.data() + i,
                                       std::min(winners.size() - i, ExpertBatch::kMaxBatch));
    try {
      cache_.acquire(step.layer, ids, step.use, batch);
      for (size_t j = 0; j < ids.size(); ++j)
        held_.push_back(copy_job(step.layer, ids[j], batch.view(j)));
    } catch (const Error&) {
      // A read failed (the CPU read these bytes a moment ago): these promotions are dropped.
      std::lock_guard<std::mutex> lock(mu_);
      for (int64_t e : ids)
        if (std::none_of(held_.begin(), held_.end(),
                         [&](const Job& j) { return j.layer == step.layer && j.expert == e; })) {
          slot(step.layer, e) = -1;
          --pending_;
        }
    }
    batch.release();
  }
}

bool VkTier::admit(int64_t layer, int64_t expert) {
  if (residents_.size() + pending_ < budget_) {
    if (promotions_left_ <= 0) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.skipped;
      return false;
    }
  } else {
    // Full: the coldest resident gives way when this expert is hotter by the margin.
    if (residents_.empty()) return false;  // the budget is all in flight
    size_t coldest = 0;
    for (size_t i = 1; i < residents_.size(); ++i)
      if (heat(residents_[i].layer, residents_[i].expert) <
          heat(residents_[coldest].layer, residents_[coldest].expert))
        coldest = i;
    const float cold = heat(residents_[coldest].layer, residents_[coldest].expert);
    if (!(heat(layer, expert) > 1.25f * cold + 4.0f)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (promotions_left_ <= 0) {
      ++stats_.skipped;
      return false;
    }
    const Resident r = residents_[coldest];
    residents_.erase(residents_.begin() + static_cast<std::ptrdiff_t>(coldest));
    slot(r.layer, r.expert) = -1;
    device_->release(r.slot);  // freed once the batch in flight (if any) is done
    ++stats_.evictions;
  }
  --promotions_left_;
  ++pending_;
  std::lock_guard<std::mutex> lock(mu_);
  slot(layer, expert) = kPending;
  ++stats_.promotions;
  return true;
}

}  // namespace k3

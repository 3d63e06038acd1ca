#include "model/vk_tier.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "model/state.h"
#include "util/error.h"
#include "vk/mxfp4_device.h"

namespace k3 {

namespace {

constexpr uint64_t kHalvingTokens = 1024;  // heat halves every this many tokens
constexpr float kSeedHeat = 32.0f;         // a layer's hottest expert in the history

vk::ExpertBytes bytes_of(const ExpertView& v) {
  return {v.gate_packed, v.gate_scale, v.up_packed, v.up_scale, v.down_packed, v.down_scale};
}

}  // namespace

struct VkTier::Groups {
  std::vector<vk::Mxfp4Device::Group> list;
};

VkTier::VkTier(const K3Config& config, const VulkanOptions& options, ExpertCache& cache,
               const std::vector<int64_t>& moe_layers, std::function<void(const std::string&)> note)
    : config_(config),
      options_(options),
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
  // The budget in whole experts.
  double bytes = options.tier_gb * 1e9;
  if (bytes <= 0 && options.device_cap_mb > 0) bytes = static_cast<double>(dev.device_cap_bytes);
  if (bytes <= 0) {
    double heap = static_cast<double>(device_->memory_bytes());
    if (device_->is_cpu()) heap /= 4;
    bytes = std::max(0.0, heap - options.reserve_gb * 1e9);
  }
  budget_ = static_cast<uint64_t>(bytes / static_cast<double>(device_->expert_bytes()));
  budget_ = std::min<uint64_t>(budget_, moe_layers.size() * E_);
  stats_.budget = budget_;
  if (budget_ == 0 && note_)
    note_("Vulkan tier on " + device_->name() + ": no room for one expert (" +
          std::to_string(device_->expert_bytes()) + " B) in " +
          std::to_string(static_cast<uint64_t>(bytes)) +
          " B; set COLI_VK_TIER_GB (or lower COLI_VK_TIER_RESERVE_GB)");
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
  // Warm start: hottest first over all layers, read through the RAM cache.
  std::sort(hot.begin(), hot.end(), [](const Hot& a, const Hot& b) {
    return a.heat != b.heat     ? a.heat > b.heat
           : a.layer != b.layer ? a.layer < b.layer
                                : a.expert < b.expert;
  });
  if (hot.size() > budget_) hot.resize(budget_);
  std::stable_sort(hot.begin(), hot.end(),
                   [](const Hot& a, const Hot& b) { return a.layer < b.layer; });
  ExpertBatch batch;
  for (size_t i = 0; i < hot.size();) {
    std::vector<int64_t> ids;
    const int64_t layer = hot[i].layer;
    for (; i < hot.size() && hot[i].layer == layer && ids.size() < ExpertBatch::kMaxBatch; ++i)
      ids.push_back(hot[i].expert);
    std::sort(ids.begin(), ids.end());
    cache.acquire(layer, ids, ExpertUse::kChunk, batch);
    for (size_t j = 0; j < ids.size(); ++j) upload(layer, ids[j], batch.view(j));
    batch.release();
  }
}

VkTier::~VkTier() = default;

float& VkTier::heat(int64_t layer, int64_t expert) {
  return heat_[static_cast<size_t>(layer) * E_ + static_cast<size_t>(expert)];
}

bool VkTier::holds(int64_t layer, int64_t expert) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slot_of_[static_cast<size_t>(layer) * E_ + static_cast<size_t>(expert)] >= 0;
}

VkTierStats VkTier::stats() const {
  VkTierStats s = stats_;
  s.residents = residents_.size();
  s.validation_errors = device_->validation_errors();
  return s;
}

void VkTier::turn_off(const std::string& why) {
  stats_.off = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::fill(slot_of_.begin(), slot_of_.end(), -1);
  }
  residents_.clear();
  if (note_) note_("Vulkan tier off: " + why + "; the CPU computes every routed expert");
}

bool VkTier::upload(int64_t layer, int64_t expert, const ExpertView& view) {
  const int32_t slot = device_->upload(bytes_of(view));
  if (slot < 0) {
    ++stats_.refused;
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    slot_of_[static_cast<size_t>(layer) * E_ + static_cast<size_t>(expert)] = slot;
  }
  residents_.push_back({layer, expert, slot});
  ++stats_.uploads;
  return true;
}

void VkTier::issue(const MoeStep& step, std::span<GroupOwner> owner, GroupOwner self) {
  claimed_.clear();
  if (stats_.off) return;
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
  for (size_t g = 0; g < step.groups(); ++g) {
    heat(step.layer, step.ids[g]) += static_cast<float>(step.pairs(g));
    stats_.pairs_total += step.pairs(g);
    if (owner[g] != kUnowned) continue;
    const int32_t slot =
        slot_of_[static_cast<size_t>(step.layer) * E_ + static_cast<size_t>(step.ids[g])];
    if (slot < 0 || pairs + step.pairs(g) > device_->max_pairs()) continue;
    owner[g] = self;
    claimed_.push_back(g);
    first_row_.push_back(pairs);
    groups.push_back({slot, static_cast<uint32_t>(step.pairs(g))});
    pairs += step.pairs(g);
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
    turn_off(e.what());
  }
}

bool VkTier::finish(const MoeStep& step, std::span<const GroupOwner> owner, GroupOwner self,
                    PairSink& sink) {
  if (claimed_.empty()) return true;
  const bool lost = inject_loss_.exchange(false);
  const auto wait_start = std::chrono::steady_clock::now();
  const bool joined = device_->join(out_.data());
  stats_.join_wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
  if (!joined || lost) {
    claimed_.clear();
    turn_off("the device was lost (" + device_->name() + ")");
    return false;
  }
  for (size_t i = 0; i < claimed_.size(); ++i) {
    sink.deliver(claimed_[i], out_.data() + first_row_[i] * step.R, true);
    ++stats_.experts_served;
    stats_.pairs_served += step.pairs(claimed_[i]);
  }
  claimed_.clear();
  return true;
}

void VkTier::offered(int64_t layer, int64_t expert, const ExpertView& view) {
  if (stats_.off || budget_ == 0 || holds(layer, expert)) return;
  if (residents_.size() < budget_) {
    if (promotions_left_ <= 0) {
      ++stats_.skipped;
      return;
    }
    if (upload(layer, expert, view)) --promotions_left_;
    return;
  }
  // Full: the coldest resident gives way when this expert is hotter by the margin.
  size_t coldest = 0;
  for (size_t i = 1; i < residents_.size(); ++i)
    if (heat(residents_[i].layer, residents_[i].expert) <
        heat(residents_[coldest].layer, residents_[coldest].expert))
      coldest = i;
  const float cold = heat(residents_[coldest].layer, residents_[coldest].expert);
  if (!(heat(layer, expert) > 1.25f * cold + 4.0f)) return;
  if (promotions_left_ <= 0) {
    ++stats_.skipped;
    return;
  }
  const Resident r = residents_[coldest];
  residents_.erase(residents_.begin() + static_cast<std::ptrdiff_t>(coldest));
  {
    std::lock_guard<std::mutex> lock(mu_);
    slot_of_[static_cast<size_t>(r.layer) * E_ + static_cast<size_t>(r.expert)] = -1;
  }
  device_->release(r.slot);
  ++stats_.evictions;
  if (upload(layer, expert, view)) --promotions_left_;
}

}  // namespace k3

// model/vk_tier.h — the Vulkan expert tier as an executor of the MoE step (docs/vulkan.md §5,
// model/expert_executor.h): routed experts resident on a Vulkan device (vk/mxfp4_device.h) are
// computed there, in f32 (the K3_IDOT=0 numerics), while the CPU executor reads and computes the
// others; the step sums every row in the CPU-only order.
//
// Residency: a budget of whole experts, COLI_VK_TIER_GB (else COLI_VK_DEVICE_CAP_MB, else the
// device's largest local heap less COLI_VK_TIER_RESERVE_GB; a quarter of it on a CPU or integrated
// device, whose memory is system RAM). Warm start: the routing history's hottest experts, hottest
// first over all layers, read through the RAM cache and uploaded at load. Adaptation (LFRU): each
// routing adds 1 to an expert's heat, heat halves every 1024 tokens, history seeds it (32 for a
// layer's hottest, proportionally below); an expert the CPU executor computed from RAM is
// promoted when there is room, or when its heat exceeds the coldest resident's by 1.25x + 4 (which
// is then evicted); at most COLI_VK_TIER_RATE promotions per token, uploaded on the engine
// thread. Exclusive caching: the RAM cache gives up a slot whose expert the device holds first.
// A failed join (device lost) or submit turns the tier off with a note; the step's pairs go to
// the CPU executor and the request succeeds.
// Thread-safety: one MoE step at a time, issue() then finish() on one thread (the engine runs one
// sequence at a time: engine/service.h); holds() from any thread (the RAM cache's eviction).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "experts/expert_cache.h"
#include "model/config.h"
#include "model/expert_executor.h"
#include "options/options.h"

namespace k3 {

namespace vk {
class Mxfp4Device;
}

struct VkTierStats {
  std::string device;                  // the device's name
  uint64_t pairs_served = 0;           // (row, expert) pairs computed on the device
  uint64_t experts_served = 0;         // expert groups computed on the device
  uint64_t pairs_total = 0;            // routed pairs of every step the tier saw
  uint64_t uploads = 0;                // experts uploaded (warm start included)
  uint64_t evictions = 0;              // residents evicted for a hotter expert
  uint64_t refused = 0;                // uploads the device refused (the budget stays)
  uint64_t skipped = 0;                // promotions left out by the rate limit
  uint64_t residents = 0, budget = 0;  // experts resident / the budget in experts
  bool off = false;                    // turned off (device lost)
  double join_wait_seconds = 0;        // finish() waiting for the device's batch
  uint64_t validation_errors = 0;      // VulkanOptions::validation: the layer's errors
};

class VkTier final : public ExpertExecutor {
 public:
  // Opens the device and sizes the budget; warm-starts from `cache`'s routing history over
  // `moe_layers`. Throws k3::Error when no device can be opened (the message says why).
  VkTier(const K3Config& config, const VulkanOptions& options, ExpertCache& cache,
         const std::vector<int64_t>& moe_layers, std::function<void(const std::string&)> note);
  ~VkTier() override;

  const char* name() const override { return "vulkan"; }
  void issue(const MoeStep& step, std::span<GroupOwner> owner, GroupOwner self) override;
  bool finish(const MoeStep& step, std::span<const GroupOwner> owner, GroupOwner self,
              PairSink& sink) override;
  void offered(int64_t layer, int64_t expert, const ExpertView& view) override;

  // True when (layer, expert) is resident on the device. Thread-safe.
  bool holds(int64_t layer, int64_t expert) const;
  VkTierStats stats() const;
  // The device fails its next join, as a lost device would (tests).
  void inject_device_loss() const { inject_loss_ = true; }

 private:
  struct Resident {
    int64_t layer, expert;
    int32_t slot;
  };
  bool upload(int64_t layer, int64_t expert, const ExpertView& view);
  float& heat(int64_t layer, int64_t expert);
  void turn_off(const std::string& why);

  const K3Config& config_;
  VulkanOptions options_;
  std::function<void(const std::string&)> note_;
  std::unique_ptr<vk::Mxfp4Device> device_;
  int64_t first_moe_layer_ = -1;
  size_t E_ = 0;
  std::vector<float> heat_;       // [layers][E]
  std::vector<int32_t> slot_of_;  // [layers][E]: device slot, or -1
  std::vector<Resident> residents_;
  mutable std::mutex mu_;        // guards slot_of_ (holds() from the RAM cache)
  uint64_t budget_ = 0;          // experts
  uint64_t tokens_ = 0;          // tokens seen (heat halving)
  int64_t promotions_left_ = 0;  // this token's
  // The step in flight: its claimed groups, their first row in out_, gathered rows.
  std::vector<size_t> claimed_, first_row_;
  std::vector<float> z_, out_;
  struct Groups;  // the batch's vk::Mxfp4Device::Group list (reused)
  std::unique_ptr<Groups> groups_;
  mutable std::atomic<bool> inject_loss_{false};
  VkTierStats stats_;
};

}  // namespace k3

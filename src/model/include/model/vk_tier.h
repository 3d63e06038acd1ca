// model/vk_tier.h — the Vulkan expert tier as an executor of the MoE step (docs/vulkan.md §5,
// model/expert_executor.h): routed experts resident on a Vulkan device (vk/mxfp4_device.h) are
// computed there, in f32 (the K3_IDOT=0 numerics), while the CPU executor reads and computes the
// others; the step sums every row in the CPU-only order.
//
// Residency: a budget of whole experts, sized by COLI_VK_TIER_GB, else COLI_VK_DEVICE_CAP_MB, else
// VK_EXT_memory_budget's free device-local memory, else the device's largest local heap, less
// COLI_VK_TIER_RESERVE_GB (a quarter of it on a CPU device, whose memory is system RAM; the
// prompt's staging slots set aside when COLI_VK_PREFILL may stream). Warm start: the routing
// history's hottest experts, hottest first over all layers, read through the RAM cache (in
// parallel) while the uploader thread uploads the previous batch. Adaptation (LFRU): each routing
// adds 1 to an expert's heat, heat halves every 1024 tokens, history seeds it (32 for a layer's
// hottest, proportionally below); an expert the CPU executor computed from RAM is promoted when
// there is room, or when its heat exceeds the coldest resident's by 1.25x + 4 (which is then
// evicted); at most COLI_VK_TIER_RATE promotions per forward step. The engine thread copies a
// promotion's bytes once; an uploader thread writes them to the device; the expert serves once
// its upload completed, from the next MoE step on (COLI_VK_TIER_SYNC: the next step waits for the
// uploads, so residency depends only on the routing). Exclusive caching: the RAM cache gives up
// a slot whose expert the device holds first. Prompt chunks (COLI_VK_PREFILL) stream cold
// experts with enough rows through staging regions, never promoting them. A failed join (device
// lost) or submit turns the tier off with a note; the step's pairs go to the CPU executor and the
// request succeeds. Dense matrices (COLI_VK_DENSE, docs/vulkan.md §6): uploaded at load in their
// RAM format, they compute a sequence's prompt chunks of at least COLI_VK_DENSE_ROWS rows on the
// device (f32 activations); their bytes come out of the experts' automatic budget.
// Thread-safety: one MoE step at a time, issue() then finish() on one thread (the engine runs one
// sequence at a time: engine/service.h); holds() and stats() from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "experts/expert_cache.h"
#include "kernels/quant.h"
#include "model/compute.h"
#include "model/config.h"
#include "model/expert_executor.h"
#include "options/options.h"

namespace k3 {

namespace vk {
class Mxfp4Device;
}

// The tier's figures: the one source of what reports (the [VK] line, /stats, /metrics) show.
struct VkTierStats {
  std::string device;                  // the device's name
  std::string budget_source;           // what sized the budget: COLI_VK_TIER_GB,
                                       // COLI_VK_DEVICE_CAP_MB, VK_EXT_memory_budget or heap
  uint64_t pairs_served = 0;           // (row, expert) pairs computed on the device
  uint64_t experts_served = 0;         // expert groups computed on the device
  uint64_t pairs_total = 0;            // routed pairs of every step the tier saw
  uint64_t promotions = 0;             // uploads queued for the uploader (warm start excluded)
  uint64_t uploads = 0;                // experts made resident (warm start included)
  uint64_t upload_bytes = 0;           // bytes those uploads wrote (f32 scales included)
  double upload_s = 0;                 // seconds the uploader spent writing them
  uint64_t evictions = 0;              // residents evicted for a hotter expert
  uint64_t refused = 0;                // uploads the device refused (the budget stays)
  uint64_t skipped = 0;                // promotions left out by the rate limit
  uint64_t residents = 0, budget = 0;  // experts resident / the budget in experts
  uint64_t blocks = 0;                 // device memory blocks held (residents, staging)
  uint64_t streamed_pairs = 0;         // prompt pairs computed through staging slots
  uint64_t streamed_experts = 0;       // expert groups streamed so (never made resident)
  double join_wait_s = 0;              // seconds finish() waited for the device
  uint64_t dense_matrices = 0;         // COLI_VK_DENSE: dense matrices held on the device
  uint64_t dense_bytes = 0;            // their device bytes
  uint64_t dense_matmuls = 0;          // prompt-chunk matmuls computed there
  uint64_t dense_rows = 0;             // rows of those matmuls
  double dense_s = 0;                  // seconds the engine thread spent in them
  bool off = false;                    // turned off (device lost)
  uint64_t validation_errors = 0;      // VulkanOptions::validation: the layer's errors
};

// The tier's budget in bytes and what sized it: COLI_VK_TIER_GB, else COLI_VK_DEVICE_CAP_MB, else
// VK_EXT_memory_budget's `free_bytes` (when the device offers it) or the largest device-local
// heap, a quarter of it on a CPU device, less COLI_VK_TIER_RESERVE_GB and, unless
// COLI_VK_PREFILL=off, the prompt's staging regions.
struct VkTierBudget {
  double bytes = 0;
  std::string source;  // "COLI_VK_TIER_GB", "COLI_VK_DEVICE_CAP_MB", "VK_EXT_memory_budget", "heap"
};
// `dense_bytes` (the dense matrices already on the device) come out of every size but
// COLI_VK_TIER_GB's.
VkTierBudget size_vk_tier_budget(const VulkanOptions& options, uint64_t expert_bytes,
                                 std::optional<uint64_t> free_bytes, uint64_t heap_bytes,
                                 bool cpu_device, uint64_t dense_bytes = 0);

class VkTier final : public ExpertExecutor, public DenseExecutor {
 public:
  // Opens the device, uploads `dense` when COLI_VK_DENSE says so (on; auto: a discrete GPU) and
  // sizes the budget; warm-starts from `cache`'s routing history over `moe_layers`. Throws
  // k3::Error when no device can be opened (the message says why).
  VkTier(const K3Config& config, const VulkanOptions& options, ExpertCache& cache,
         const std::vector<int64_t>& moe_layers, std::function<void(const std::string&)> note,
         const std::vector<const WeightMatrix*>& dense = {});
  ~VkTier() override;

  const char* name() const override { return "vulkan"; }
  void issue(const MoeStep& step, std::span<GroupOwner> owner, GroupOwner self) override;
  bool finish(const MoeStep& step, std::span<const GroupOwner> owner, GroupOwner self,
              PairSink& sink) override;
  void offered(int64_t layer, int64_t expert, const ExpertView& view) override;
  bool dense_matmul(const WeightMatrix& W, const float* X, size_t n, float* Y) override;
  // This tier as the dense executor of prompt chunks, or null when it holds no dense matrix.
  DenseExecutor* dense_executor() { return dense_slot_.empty() ? nullptr : this; }

  // True when (layer, expert) is resident on the device. Thread-safe.
  bool holds(int64_t layer, int64_t expert) const;
  VkTierStats stats() const;
  // Rows of one expert from which a prompt chunk streams it (COLI_VK_PREFILL; 0 = never): the
  // cost model of docs/vulkan.md §5.
  uint64_t stream_rows() const;
  // Tests: the device fails its next join, as a lost device would; the next `n` uploads are
  // refused, as a full device would refuse them; each upload waits `ms` first (a slow bus).
  void inject_device_loss() const { inject_loss_ = true; }
  void refuse_uploads(int n) { refuse_ = n; }
  void delay_uploads(int ms) { delay_ms_ = ms; }

 private:
  struct Resident {
    int64_t layer, expert;
    int32_t slot;
  };
  // An expert's bytes on their way to the uploader (copied once from the RAM cache).
  struct Job {
    int64_t layer, expert;
    std::vector<uint8_t> bytes;  // gate, up, down packed then their scales (ue8m0)
  };
  struct Done {
    int64_t layer, expert;
    int32_t slot;  // -1: refused
    uint64_t bytes;
    double seconds;
  };
  static constexpr int32_t kPending = -2;  // slot_of_: queued for the uploader
  Job copy_job(int64_t layer, int64_t expert, const ExpertView& view) const;
  void queue(std::vector<Job>&& jobs);
  void wait_uploads();
  void publish();
  void uploader();
  void release_streamed();
  bool admit(int64_t layer, int64_t expert);
  void decide(const MoeStep& step);
  void stream_cold(const MoeStep& step, std::span<GroupOwner> owner, GroupOwner self,
                   size_t& pairs);
  int32_t& slot(int64_t layer, int64_t expert);
  float& heat(int64_t layer, int64_t expert);
  void turn_off(const std::string& why);
  void upload_dense(const std::vector<const WeightMatrix*>& dense);

  const K3Config& config_;
  VulkanOptions options_;
  ExpertCache& cache_;
  std::function<void(const std::string&)> note_;
  std::unique_ptr<vk::Mxfp4Device> device_;
  int64_t first_moe_layer_ = -1;
  size_t E_ = 0;
  std::vector<float> heat_;       // [layers][E]
  std::vector<int32_t> slot_of_;  // [layers][E]: device slot, kPending, or -1
  std::vector<Resident> residents_;
  std::unordered_map<const WeightMatrix*, int32_t> dense_slot_;  // COLI_VK_DENSE: device slots
  mutable std::mutex mu_;            // guards slot_of_ (holds() from the RAM cache) and stats_
  uint64_t budget_ = 0;              // experts
  uint64_t pending_ = 0;             // promotions queued, not yet published
  uint64_t tokens_ = 0;              // tokens seen (heat halving)
  int64_t promotions_left_ = 0;      // this step's
  std::vector<Job> held_;            // promotions of this step, handed to the uploader at the next
  std::vector<int64_t> candidates_;  // COLI_VK_TIER_SYNC: this step's offers, decided in finish()
  // The uploader thread and its queue (up_mu_).
  std::mutex up_mu_;
  std::condition_variable up_cv_, idle_cv_;
  std::deque<Job> jobs_;
  std::vector<Done> done_;
  size_t busy_ = 0;  // jobs queued or being uploaded
  bool stop_ = false;
  std::atomic<int> refuse_{0}, delay_ms_{0};
  std::atomic<bool> off_{false};
  std::thread thread_;
  // The step in flight: its claimed groups, their first row in out_, gathered rows.
  std::vector<size_t> claimed_, first_row_;
  std::vector<int32_t> streamed_;  // staging slots of this step's streamed experts
  std::vector<float> z_, out_;
  struct Groups;  // the batch's vk::Mxfp4Device::Group list (reused)
  std::unique_ptr<Groups> groups_;
  mutable std::atomic<bool> inject_loss_{false};
  VkTierStats stats_;
};

}  // namespace k3

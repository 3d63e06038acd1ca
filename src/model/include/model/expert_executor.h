// model/expert_executor.h — the seam between a MoE step and whoever computes its routed experts
// (docs/architecture.md §3.10).
//
// A MoE layer step has a set of (row, expert) pairs: the union of its rows' choices, grouped by
// expert in ascending id (ExpertCache reads a layer's experts in disk-offset order, which for the
// release is id order). Executors take whole groups; each returns one output row per pair,
// W2 SiTU(W1 z, W3 z) for that pair's row z. The step (latent_moe_forward) adds every row to its
// sum in one place, the PairSink, in the group order, whichever executor computed it and whenever
// it arrived, so which executor took a group never changes a sum's order (the CPU-only order).
//
// The step asks the extra executors (ModelSetup::executors: a device tier, remote ranks) first,
// in their order, and the RAM cache + CPU kernels last; the last takes every group nobody took.
// Every executor issue()s before any finish()es, so the extra ones compute while the CPU works:
//   for each executor in order: issue(step, owner)     (claims groups, starts; returns at once)
//   the CPU executor's finish(), the shared experts, then each extra one's finish()
//   groups an executor could not deliver (finish() false): computed by the CPU executor
// One step at a time: issue() and finish() of a step are called on one thread, in that order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "experts/expert_source.h"

namespace k3 {

struct MoePick;  // model/state.h

// One MoE layer step as the executors see it (valid from issue() to the end of finish()).
struct MoeStep {
  int64_t layer = -1;
  ExpertUse use = ExpertUse::kToken;
  std::span<const int64_t> ids;  // group g computes expert ids[g]; ascending
  std::span<const size_t>
      starts;  // [groups + 1]: group g's pairs are picks[starts[g], starts[g+1])
  std::span<const MoePick> picks;  // (expert, row, weight) by expert, then row
  // [rows][R] the latent rows (f32). An executor on the integer-dot path (K3_IDOT=1) quantises
  // them itself: quantize_q8_32 gives the same bits on every ISA (kernels/quant.h).
  const float* z = nullptr;
  size_t rows = 0;  // rows of the step
  size_t R = 0;     // routed_expert_hidden_size
  size_t I = 0;     // moe_intermediate_size
  size_t groups() const { return ids.size(); }
  size_t pairs(size_t g) const { return starts[g + 1] - starts[g]; }
};

// Where an executor hands a group's output rows: [pairs(g)][R], in the group's pair order.
class PairSink {
 public:
  // `stable`: the rows stay valid until the step ends (the executor's own buffer); otherwise they
  // are read before deliver() returns. Each group is delivered exactly once.
  virtual void deliver(size_t g, const float* rows, bool stable) = 0;

 protected:
  ~PairSink() = default;
};

// Who owns a group of the step: the index of its executor, or kUnowned.
using GroupOwner = uint8_t;
constexpr GroupOwner kUnowned = 0xff;

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  // Short name for reports ("cpu", "vulkan").
  virtual const char* name() const = 0;
  // Claims the unowned groups it will compute (owner[g] = self) and starts computing them; may
  // return before they are done. Claims nothing when it cannot serve the step.
  virtual void issue(const MoeStep& step, std::span<GroupOwner> owner, GroupOwner self) = 0;
  // Delivers every group it claimed to `sink`, waiting for them. Returns false when it failed
  // (a lost device, a dropped connection): the groups it has not delivered are then computed by
  // the CPU executor, and the step still succeeds.
  virtual bool finish(const MoeStep& step, std::span<const GroupOwner> owner, GroupOwner self,
                      PairSink& sink) = 0;
  // The CPU executor computed expert `expert` of `layer` from these bytes (in RAM for the
  // duration of the call): a tier may copy them to promote the expert. Default: ignored.
  virtual void offered(int64_t layer, int64_t expert, const ExpertView& view) {}
};

}  // namespace k3

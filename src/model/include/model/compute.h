// model/compute.h — what a forward pass computes with: the kernel table of the chosen ISA, the
// MXFP4 path, and per-stage timers (--stats / K3_STATS).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "util/sys.h"

namespace k3 {

class ExpertExecutor;  // model/expert_executor.h

// Another device for the dense matrices of prompt chunks (COLI_VK_DENSE: model/vk_tier.h).
class DenseExecutor {
 public:
  // Y [n][W.rows] = W X for X [n][W.cols] when this executor takes W at n rows; false: it does
  // not (too few rows, W not on the device, the device lost), and the CPU computes it.
  virtual bool dense_matmul(const WeightMatrix& W, const float* X, size_t n, float* Y) = 0;

 protected:
  ~DenseExecutor() = default;
};

enum class Stage {
  kEmbed,
  kAttnRes,
  kKda,
  kMla,
  kRouter,
  kExperts,
  kShared,
  kDense,
  kHead,
  kCount
};

const char* stage_name(Stage stage);

// Seconds spent per stage. Owned by a sequence's state; not thread-safe.
struct StageStats {
  double seconds[static_cast<int>(Stage::kCount)] = {};
  uint64_t expert_reads =
      0;  // routed experts applied (a chunk applies each distinct expert once, to all its rows)
  void add(Stage stage, double s) { seconds[static_cast<int>(stage)] += s; }
  double total() const;
  // "attention(KDA) 1.23 s 40% | MLA ... " over the stages that took any time.
  std::string summary() const;
  void reset() { *this = StageStats{}; }
};

// Times a scope into a stage.
class StageTimer {
 public:
  StageTimer(StageStats& stats, Stage stage)
      : stats_(stats), stage_(stage), start_(now_seconds()) {}
  ~StageTimer() { stats_.add(stage_, now_seconds() - start_); }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

 private:
  StageStats& stats_;
  Stage stage_;
  double start_;
};

struct Compute {
  const KernelTable* kernels = nullptr;
  bool idot = false;          // MXFP4 experts on the integer-dot path
  double expert_top_p = 0.0;  // K3_TOPP: keep routed experts up to this cumulative weight (0 = all)
  // K3_KDA_CHUNKED: a prompt chunk's KDA recurrence in the chunk (WY / UT) form (model/kda.h);
  // not bit-identical to the token recurrence, which single rows keep.
  bool kda_chunked = false;
  // Executors asked for a MoE step's experts before the RAM cache + CPU kernels, in this order
  // (model/expert_executor.h); empty: the CPU computes every expert.
  std::span<ExpertExecutor* const> executors;
  // Dense matrices of a sequence's prompt chunks elsewhere (null: on the CPU). Never set for a
  // batched decode step, whose rows must equal their one-row runs.
  DenseExecutor* dense = nullptr;
};

// The many-row forms of a forward pass. Each output row is bit-identical to the one-row call on
// that row alone (what a pass of one row computes): the many-row kernel is used
// where its per-row result does not depend on the number of rows (see row_stable below and
// chunked_prefill_test), the rows are looped otherwise.
//   Y[t] = W X[t] for t < n.  X: [n][W.cols], Y: [n][W.rows]. With `only`, the rows of those
//   ranges of Y only (matmul_row_ranges), unless the dense executor takes the n rows: then all.
void matmul_chunk(const Compute& compute, const WeightMatrix& W, const float* X, size_t n, float* Y,
                  const std::vector<RowRange>* only = nullptr);
//   Y_j = W_j X for several matrices sharing X [n][cols] (jobs[j].Y: [n][W_j.rows]), each
//   matrix's matmul_chunk. (One row through matmul_batch, one parallel region for all of them,
//   measured no faster on decode: kept out, so n = 1 is no special path.)
void matmul_jobs(const Compute& compute, const MatmulJob* jobs, size_t count, const float* X,
                 size_t n);
// True when matmul(W, X, n) gives every row the bits of matmul(W, X[t], 1) on this kernel table.
bool row_stable(const KernelTable& kernels, const WeightMatrix& W);

}  // namespace k3

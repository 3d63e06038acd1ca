// model/compute.h — what a forward pass computes with: the kernel table of the chosen ISA, the
// MXFP4 path, and per-stage timers (--stats / K3_STATS).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "util/sys.h"

namespace k3 {

enum class Stage { kEmbed, kAttnRes, kKda, kMla, kRouter, kExperts, kShared, kDense, kHead, kCount };

const char* stage_name(Stage stage);

// Seconds spent per stage. Owned by a sequence's state; not thread-safe.
struct StageStats {
  double seconds[static_cast<int>(Stage::kCount)] = {};
  void add(Stage stage, double s) { seconds[static_cast<int>(stage)] += s; }
  double total() const;
  // "attention(KDA) 1.23 s 40% | MLA ... " over the stages that took any time.
  std::string summary() const;
  void reset() { *this = StageStats{}; }
};

// Times a scope into a stage.
class StageTimer {
 public:
  StageTimer(StageStats& stats, Stage stage) : stats_(stats), stage_(stage), start_(now_seconds()) {}
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
  bool idot = false;  // MXFP4 experts on the integer-dot path
};

}  // namespace k3

#include "model/compute.h"

#include <cstdio>

namespace k3 {

const char* stage_name(Stage stage) {
  switch (stage) {
    case Stage::kEmbed:
      return "embed";
    case Stage::kAttnRes:
      return "attn-res";
    case Stage::kKda:
      return "kda";
    case Stage::kMla:
      return "mla";
    case Stage::kRouter:
      return "router";
    case Stage::kExperts:
      return "experts";
    case Stage::kShared:
      return "shared";
    case Stage::kDense:
      return "dense";
    case Stage::kHead:
      return "head";
    case Stage::kCount:
      break;
  }
  return "?";
}

double StageStats::total() const {
  double t = 0;
  for (double s : seconds) t += s;
  return t;
}

std::string StageStats::summary() const {
  const double all = total();
  std::string out;
  for (int i = 0; i < static_cast<int>(Stage::kCount); ++i) {
    if (seconds[i] <= 0) continue;
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %.3f s %.0f%%", out.empty() ? "" : " | ",
                  stage_name(static_cast<Stage>(i)), seconds[i],
                  all > 0 ? 100.0 * seconds[i] / all : 0.0);
    out += buf;
  }
  return out;
}

bool row_stable(const KernelTable& k, const WeightMatrix& W) {
  // f32, int8 and the integer-dot paths accumulate each (row, output) pair in an order that does
  // not depend on the row count. int4 on f32 activations takes a different decode and summation
  // order for one row, a few rows and many rows on AVX2 / AVX-512 (kernels/impl/dense_*.cpp).
  return W.format != WeightFormat::kInt4G64 || W.int8_activations || k.isa == Isa::kScalar;
}

void matmul_chunk(const Compute& compute, const WeightMatrix& W, const float* X, size_t n, float* Y,
                  const std::vector<RowRange>* only) {
  if (compute.dense && compute.dense->dense_matmul(W, X, n, Y)) return;
  const KernelTable& kt = *compute.kernels;
  const size_t rows = static_cast<size_t>(W.rows), cols = static_cast<size_t>(W.cols);
  const RowRange all{0, rows};
  const std::span<const RowRange> ranges =
      only ? std::span<const RowRange>(*only) : std::span<const RowRange>(&all, 1);
  if (row_stable(kt, W)) {
    matmul_row_ranges(kt, W, X, n, ranges, Y);
    return;
  }
  for (size_t t = 0; t < n; ++t) matmul_row_ranges(kt, W, X + t * cols, 1, ranges, Y + t * rows);
}

void matmul_jobs(const Compute& compute, const MatmulJob* jobs, size_t count, const float* X,
                 size_t n) {
  for (size_t j = 0; j < count; ++j) matmul_chunk(compute, *jobs[j].W, X, n, jobs[j].Y);
}

}  // namespace k3

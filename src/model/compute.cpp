#include "model/compute.h"

#include <cstdio>

namespace k3 {

const char* stage_name(Stage stage) {
  switch (stage) {
    case Stage::kEmbed: return "embed";
    case Stage::kAttnRes: return "attn-res";
    case Stage::kKda: return "kda";
    case Stage::kMla: return "mla";
    case Stage::kRouter: return "router";
    case Stage::kExperts: return "experts";
    case Stage::kShared: return "shared";
    case Stage::kDense: return "dense";
    case Stage::kHead: return "head";
    case Stage::kCount: break;
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
    std::snprintf(buf, sizeof buf, "%s%s %.3f s %.0f%%", out.empty() ? "" : " | ", stage_name(static_cast<Stage>(i)),
                  seconds[i], all > 0 ? 100.0 * seconds[i] / all : 0.0);
    out += buf;
  }
  return out;
}

}  // namespace k3

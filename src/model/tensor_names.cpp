#include "model/tensor_names.h"

namespace k3::names {

std::string layer(int64_t layer_index, const char* suffix) {
  return "model.layers." + std::to_string(layer_index) + "." + suffix;
}

std::string expert(int64_t layer_index, int64_t expert_index, const char* suffix) {
  return "model.layers." + std::to_string(layer_index) + ".block_sparse_moe.experts." +
         std::to_string(expert_index) + "." + suffix;
}

int64_t layer_of(const std::string& name) {
  static const std::string kLayers = "model.layers.";
  if (!name.starts_with(kLayers)) return -1;
  int64_t layer_index = 0;
  size_t i = kLayers.size();
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && i < kLayers.size() + 9; ++i)
    layer_index = layer_index * 10 + (name[i] - '0');
  if (i == kLayers.size() || i >= name.size() || name[i] != '.') return -1;
  return layer_index;
}

bool is_routed_expert(const std::string& name) {
  return layer_of(name) >= 0 && name.find(".block_sparse_moe.experts.") != std::string::npos;
}

}  // namespace k3::names

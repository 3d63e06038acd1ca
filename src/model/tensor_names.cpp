#include "model/tensor_names.h"

namespace k3::names {

std::string layer(int64_t layer_index, const char* suffix) {
  return "model.layers." + std::to_string(layer_index) + "." + suffix;
}

std::string expert(int64_t layer_index, int64_t expert_index, const char* suffix) {
  return "model.layers." + std::to_string(layer_index) + ".block_sparse_moe.experts." +
         std::to_string(expert_index) + "." + suffix;
}

}  // namespace k3::names

// io/json_sax.h — the value types of nlohmann::json's SAX events, shared by the SAX readers of
// this module (the index in model_files.cpp, shard headers in safetensors.cpp), which stream
// files too large to hold as a DOM at the release's ~500k tensors (docs/architecture.md §2.3).
#pragma once

#include <nlohmann/json.hpp>

namespace k3 {

struct JsonSaxTypes {
  using number_integer_t = nlohmann::json::number_integer_t;
  using number_unsigned_t = nlohmann::json::number_unsigned_t;
  using number_float_t = nlohmann::json::number_float_t;
  using string_t = nlohmann::json::string_t;
  using binary_t = nlohmann::json::binary_t;
};

}  // namespace k3

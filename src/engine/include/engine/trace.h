// engine/trace.h — the K3_TRACE recorder: collects per-position, per-layer tensors during a
// prefill and writes them as one safetensors file whose names match the golden fixture
// (`logits` [T,V], `layer.{i}.attn_in|attn_out|mlp_in|mlp_out|layer_out` [T,D],
// `layer.{i}.topk_ids` I64 / `topk_weights` F32 [T,k], `final_hidden` [T,D], `prompt_ids` [T]).
// Observing never changes a computed value: it only copies.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace k3 {

class TraceRecorder : public LayerObserver {
 public:
  TraceRecorder(int64_t hidden_size, int64_t top_k) : hidden_(hidden_size), top_k_(top_k) {}
  void on_tensor(int64_t layer, Site site, const float* data) override;
  void on_routing(int64_t layer, const Routing& routing) override;

  // Writes the trace. `logits`: [T][vocab] (may be empty when the model has no head).
  void write(const std::string& path, const std::vector<int64_t>& prompt_ids,
             const std::vector<float>& logits, int64_t vocab_size) const;

 private:
  int64_t hidden_;
  int64_t top_k_;
  std::map<std::string, std::vector<float>> rows_;     // name -> [T][hidden]
  std::map<std::string, std::vector<int64_t>> ids_;    // layer.{i}.topk_ids -> [T][k]
  std::map<std::string, std::vector<float>> weights_;  // layer.{i}.topk_weights -> [T][k]
};

// Raw little-endian f32 files of the validation flags (--x0 input rows, --logits): read whole
// (throws k3::Error when the size is not a multiple of 4) and written atomically.
std::vector<float> read_f32_file(const std::string& path);
void write_f32_file(const std::string& path, const std::vector<float>& data);

}  // namespace k3

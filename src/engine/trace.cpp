#include "engine/trace.h"

#include <cstring>

#include "io/file.h"
#include "io/safetensors_writer.h"
#include "util/error.h"

namespace k3 {
namespace {

const char* site_name(LayerObserver::Site site) {
  switch (site) {
    case LayerObserver::Site::kAttnIn:
      return "attn_in";
    case LayerObserver::Site::kAttnOut:
      return "attn_out";
    case LayerObserver::Site::kMlpIn:
      return "mlp_in";
    case LayerObserver::Site::kMlpOut:
      return "mlp_out";
    case LayerObserver::Site::kLayerOut:
      return "layer_out";
    case LayerObserver::Site::kFinalHidden:
      return "final_hidden";
  }
  return "?";
}

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace

void TraceRecorder::on_tensor(int64_t layer, Site site, const float* data) {
  const std::string name =
      layer < 0 ? site_name(site) : "layer." + std::to_string(layer) + "." + site_name(site);
  auto& rows = rows_[name];
  rows.insert(rows.end(), data, data + hidden_);
}

void TraceRecorder::on_routing(int64_t layer, const Routing& routing) {
  const std::string base = "layer." + std::to_string(layer) + ".";
  auto& ids = ids_[base + "topk_ids"];
  ids.insert(ids.end(), routing.ids.begin(), routing.ids.end());
  auto& w = weights_[base + "topk_weights"];
  w.insert(w.end(), routing.weights.begin(), routing.weights.end());
  // K3_TOPP may keep fewer than top_k experts: the row is padded with id -1, weight 0.
  for (size_t j = routing.ids.size(); j < static_cast<size_t>(top_k_); ++j) {
    ids.push_back(-1);
    w.push_back(0.0f);
  }
}

void TraceRecorder::write(const std::string& path, const std::vector<int64_t>& prompt_ids,
                          const std::vector<float>& logits, int64_t vocab_size) const {
  const int64_t T = static_cast<int64_t>(prompt_ids.size());
  SafetensorsWriter writer;
  writer.add_bytes("prompt_ids", DType::kI64, {T}, as_bytes(prompt_ids));
  if (!logits.empty()) writer.add_bytes("logits", DType::kF32, {T, vocab_size}, as_bytes(logits));
  for (const auto& [name, rows] : rows_) {
    if (static_cast<int64_t>(rows.size()) != T * hidden_)
      throw Error(path + ": trace tensor " + name + " has " +
                  std::to_string(rows.size() / static_cast<size_t>(hidden_)) + " rows, expected " +
                  std::to_string(T));
    writer.add_bytes(name, DType::kF32, {T, hidden_}, as_bytes(rows));
  }
  for (const auto& [name, ids] : ids_)
    writer.add_bytes(name, DType::kI64, {T, top_k_}, as_bytes(ids));
  for (const auto& [name, w] : weights_)
    writer.add_bytes(name, DType::kF32, {T, top_k_}, as_bytes(w));
  writer.write(path);
}

std::vector<float> read_f32_file(const std::string& path) {
  const std::string bytes = read_text_file(path);
  if (bytes.size() % 4 != 0)
    throw Error(path + ": size " + std::to_string(bytes.size()) +
                " is not a multiple of 4 (raw f32 expected)");
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

void write_f32_file(const std::string& path, const std::vector<float>& data) {
  write_file_atomic(path, data.data(), data.size() * sizeof(float));
}

}  // namespace k3

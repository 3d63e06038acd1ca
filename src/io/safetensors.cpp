#include "io/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "util/error.h"

namespace k3 {
namespace {

struct DTypeRow {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeRow kDTypes[] = {
    {DType::kBF16, "BF16", 2},      {DType::kF16, "F16", 2},        {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},        {DType::kI64, "I64", 8},        {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},        {DType::kI8, "I8", 1},          {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},      {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kF8E8M0, "F8_E8M0", 1},
};

const DTypeRow& row_of(DType dtype) {
  for (const auto& r : kDTypes)
    if (r.dtype == dtype) return r;
  throw Error("internal: unknown dtype");
}

// Multiplies with an overflow check; false on overflow.
bool mul_checked(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  *out = a * b;
  return true;
}

}  // namespace

size_t dtype_size(DType dtype) {
  return row_of(dtype).size;
}
const char* dtype_name(DType dtype) {
  return row_of(dtype).name;
}

bool parse_dtype(const std::string& name, DType* out) {
  for (const auto& r : kDTypes) {
    if (name == r.name) {
      *out = r.dtype;
      return true;
    }
  }
  return false;
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::string padding_tensor_name(uint64_t n) {
  return kPaddingTensorPrefix + std::to_string(n);
}

bool is_padding_tensor(const std::string& name) {
  return name.rfind(kPaddingTensorPrefix, 0) == 0;
}

std::string non_finite_message(const std::string& path, const TensorInfo& t, uint64_t index,
                               float value) {
  std::string text = path + ": tensor " + t.name + " holds " +
                     (std::isnan(value) ? "NaN"
                      : value > 0       ? "+Inf"
                                        : "-Inf") +
                     " at element " + std::to_string(index);
  if (t.shape.size() > 1) {
    std::vector<int64_t> at(t.shape.size());
    uint64_t rest = index;
    for (size_t d = t.shape.size(); d-- > 0;) {
      const auto n = static_cast<uint64_t>(std::max<int64_t>(t.shape[d], 1));
      at[d] = static_cast<int64_t>(rest % n);
      rest /= n;
    }
    text += " (index " + shape_string(at) + " of shape " + shape_string(t.shape) + ")";
  }
  return text +
         "; a non-finite weight makes every output NaN, so the file is damaged: restore it from "
         "the "
         "original download";
}

namespace {

// The keys of the top-level object and the first one seen twice (SAX events of nlohmann::json).
struct TopLevelKeys {
  using number_integer_t = nlohmann::json::number_integer_t;
  using number_unsigned_t = nlohmann::json::number_unsigned_t;
  using number_float_t = nlohmann::json::number_float_t;
  using string_t = nlohmann::json::string_t;
  using binary_t = nlohmann::json::binary_t;

  int depth = 0;
  std::set<std::string> seen;
  std::string duplicate;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(number_integer_t) { return true; }
  bool number_unsigned(number_unsigned_t) { return true; }
  bool number_float(number_float_t, const string_t&) { return true; }
  bool string(string_t&) { return true; }
  bool binary(binary_t&) { return true; }
  bool start_object(std::size_t) { return ++depth, true; }
  bool end_object() { return --depth, true; }
  bool start_array(std::size_t) { return ++depth, true; }
  bool end_array() { return --depth, true; }
  bool key(string_t& name) {
    if (depth == 1 && !seen.insert(name).second && duplicate.empty()) duplicate = name;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    throw e;
  }
};

}  // namespace

std::vector<TensorInfo> parse_safetensors_header(const std::string& header_json, uint64_t file_size,
                                                 const std::string& path,
                                                 SafetensorsMetadata* metadata) {
  const uint64_t data_start = 8 + header_json.size();
  if (data_start > file_size) {
    throw Error(path + ": header of " + std::to_string(header_json.size()) +
                " bytes runs past the end of the file (" + std::to_string(file_size) + " bytes)");
  }
  const uint64_t data_size = file_size - data_start;
  // The format (huggingface/safetensors README): the header is a JSON object, optionally
  // followed by space padding, every tensor name appears once.
  if (header_json.empty() || header_json.front() != '{')
    throw Error(path + ": header is not JSON text of an object (it does not start with '{')");
  // Two passes: a SAX pass that only records the top-level keys (a name that appears twice is an
  // error, where a DOM would keep the last one silently), then the DOM without a callback.
  // (nlohmann's callback parser scans the whole parent object at the end of every child object:
  // quadratic in the tensor count, seconds for the release's ~5,400-tensor layer shards.)
  TopLevelKeys keys;
  nlohmann::json root;
  try {
    nlohmann::json::sax_parse(header_json, &keys);
    root = nlohmann::json::parse(header_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": header is not valid JSON: " + e.what());
  }
  const std::string& duplicate = keys.duplicate;
  if (!duplicate.empty())
    throw Error(path + ": tensor " + duplicate + " appears twice in the header");
  if (!root.is_object()) throw Error(path + ": header is not a JSON object");

  std::vector<TensorInfo> tensors;
  tensors.reserve(root.size());
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw Error(path + ": \"__metadata__\" is not an object of strings");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string())
          throw Error(path + ": \"__metadata__\" entry " + key + " is not a string");
        if (metadata != nullptr) (*metadata)[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor " + name;
    if (!entry.is_object()) throw Error(where + ": entry is not an object");
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string())
      throw Error(where + ": missing or non-string \"dtype\"");
    if (shape_it == entry.end() || !shape_it->is_array())
      throw Error(where + ": missing or non-array \"shape\"");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2)
      throw Error(where + ": \"data_offsets\" must be an array of two integers");

    TensorInfo info;
    info.name = name;
    const std::string dtype_text = dtype_it->get<std::string>();
    if (!parse_dtype(dtype_text, &info.dtype))
      throw Error(where + ": unknown dtype \"" + dtype_text + "\"");

    uint64_t numel = 1;
    for (const auto& dim : *shape_it) {
      if (!dim.is_number_unsigned() && !(dim.is_number_integer() && dim.get<int64_t>() >= 0))
        throw Error(where + ": shape entries must be non-negative integers");
      const uint64_t d = dim.get<uint64_t>();
      if (d > (uint64_t{1} << 48) || !mul_checked(numel, d, &numel))
        throw Error(where + ": shape " + shape_it->dump() + " is too large");
      info.shape.push_back(static_cast<int64_t>(d));
    }
    for (const auto& off : *offsets_it) {
      if (!off.is_number_unsigned() && !(off.is_number_integer() && off.get<int64_t>() >= 0))
        throw Error(where + ": data_offsets must be non-negative integers");
    }
    const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
    const uint64_t end = (*offsets_it)[1].get<uint64_t>();
    if (end < begin)
      throw Error(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                  ") end before they begin");
    if (end > data_size)
      throw Error(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                  ") lie outside the data region of " + std::to_string(data_size) +
                  " bytes (file truncated?)");
    uint64_t expected = 0;
    if (!mul_checked(numel, dtype_size(info.dtype), &expected) || expected != end - begin)
      throw Error(where + ": shape " + shape_string(info.shape) + " x " + dtype_text + " needs " +
                  std::to_string(expected) + " bytes but data_offsets hold " +
                  std::to_string(end - begin));
    info.file_offset = data_start + begin;
    info.nbytes = end - begin;
    tensors.push_back(std::move(info));
  }
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.file_offset != b.file_offset ? a.file_offset < b.file_offset : a.nbytes < b.nbytes;
  });
  for (size_t i = 1; i < tensors.size(); ++i) {
    const TensorInfo& prev = tensors[i - 1];
    const TensorInfo& cur = tensors[i];
    if (cur.file_offset < prev.file_offset + prev.nbytes)
      throw Error(path + ": tensors " + prev.name + " and " + cur.name + " overlap");
    if (cur.file_offset > prev.file_offset + prev.nbytes)
      throw Error(path + ": " + std::to_string(cur.file_offset - prev.file_offset - prev.nbytes) +
                  " bytes between tensors " + prev.name + " and " + cur.name +
                  " belong to no tensor (the format allows no holes)");
  }
  // The data region is exactly the tensors' bytes: no hole before the first one, nothing after
  // the last one.
  const uint64_t first = tensors.empty() ? data_start : tensors.front().file_offset;
  const uint64_t last =
      tensors.empty() ? data_start : tensors.back().file_offset + tensors.back().nbytes;
  if (first != data_start)
    throw Error(path + ": the first tensor, " + tensors.front().name + ", starts " +
                std::to_string(first - data_start) +
                " bytes into the data region (the format allows no holes)");
  if (last != file_size)
    throw Error(path + ": " + std::to_string(file_size - last) +
                " bytes after the last tensor belong to no tensor (file longer than its header "
                "says)");
  return tensors;
}

SafetensorsShard::SafetensorsShard(std::unique_ptr<File> file) : file_(std::move(file)) {
  const std::string& p = file_->path();
  if (file_->size() < 8)
    throw Error(p + ": too small to be a safetensors file (" + std::to_string(file_->size()) +
                " bytes)");
  uint8_t len_bytes[8];
  file_->read_exact(len_bytes, 8, 0, "header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes)
    throw Error(p + ": header length " + std::to_string(header_len) + " exceeds the cap of " +
                std::to_string(kMaxHeaderBytes) + " bytes");
  if (header_len > file_->size() - 8)
    throw Error(p + ": header length " + std::to_string(header_len) +
                " runs past the end of the file (" + std::to_string(file_->size()) + " bytes)");
  std::string header(header_len, '\0');
  file_->read_exact(header.data(), header_len, 8, "header");
  tensors_ = parse_safetensors_header(header, file_->size(), p, &metadata_);
  data_start_ = 8 + header_len;
  // A sorted index, not a map: 4 bytes a tensor instead of a node and a copy of the name (the
  // release has ~500k tensors).
  by_name_.resize(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_[i] = static_cast<uint32_t>(i);
  std::sort(by_name_.begin(), by_name_.end(),
            [&](uint32_t a, uint32_t b) { return tensors_[a].name < tensors_[b].name; });
}

const TensorInfo* SafetensorsShard::find(const std::string& name) const {
  const auto it =
      std::lower_bound(by_name_.begin(), by_name_.end(), name,
                       [&](uint32_t i, const std::string& n) { return tensors_[i].name < n; });
  return it == by_name_.end() || tensors_[*it].name != name ? nullptr : &tensors_[*it];
}

std::shared_ptr<const FileMapping> SafetensorsShard::mapping() const {
  const std::lock_guard<std::mutex> lock(mapping_mutex_);
  if (!mapping_) mapping_ = FileMapping::map(*file_);
  return mapping_;
}

void SafetensorsShard::read(const TensorInfo& info, void* dst) const {
  file_->read_exact(dst, info.nbytes, info.file_offset, "tensor " + info.name);
  bytes_read_.fetch_add(info.nbytes, std::memory_order_relaxed);
}

}  // namespace k3

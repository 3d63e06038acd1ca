#include "io/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "json_sax.h"
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

// One pass of nlohmann's SAX events over a header, building the TensorInfo of each entry when the
// entry ends, with the checks and messages of the format's rules (docs/architecture.md §2.2).
// Messages are not thrown while streaming: invalid JSON wins, then a name that appears twice,
// then the failing entry whose name sorts first (the order a DOM walk had).
class HeaderReader : public JsonSaxTypes {
 public:
  HeaderReader(const std::string& path, uint64_t data_start, uint64_t data_size,
               SafetensorsMetadata* metadata)
      : path_(path), data_start_(data_start), data_size_(data_size), metadata_(metadata) {}

  std::vector<TensorInfo> tensors;
  std::vector<std::string> failed_names;  // entries that failed (for the repeated-name check)
  int metadata_entries = 0;
  std::string error_name, error;  // the failing entry that sorts first, and its message

  bool null() { return scalar(Number{false, 0, "null"}, nullptr); }
  bool boolean(bool v) { return scalar(Number{false, 0, v ? "true" : "false"}, nullptr); }
  bool number_integer(number_integer_t v) {  // "-0" is a non-negative integer too
    return v >= 0 ? scalar(Number{true, static_cast<uint64_t>(v), {}}, nullptr)
                  : scalar(Number{false, 0, std::to_string(v)}, nullptr);
  }
  bool number_unsigned(number_unsigned_t v) { return scalar(Number{true, v, {}}, nullptr); }
  bool number_float(number_float_t, const string_t& text) {
    return scalar(Number{false, 0, text}, nullptr);
  }
  bool binary(binary_t&) { return scalar(Number{false, 0, "binary"}, nullptr); }
  bool string(string_t& v) {  // its JSON text only where it can be an element of a shape
    return scalar(Number{false, 0, depth_ == 3 ? nlohmann::json(v).dump() : std::string()}, &v);
  }

  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& name) {
    if (depth_ == 1) {
      entry_ = Entry{};
      entry_.name = std::move(name);
      field_ = Field::kOther;
    } else if (depth_ == 2) {
      field_ = entry_.name == "__metadata__" ? Field::kMetadata
               : name == "dtype"             ? Field::kDtype
               : name == "shape"             ? Field::kShape
               : name == "data_offsets"      ? Field::kOffsets
                                             : Field::kOther;
      if (field_ == Field::kMetadata) metadata_key_ = std::move(name);
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    throw e;
  }

 private:
  struct Number {
    bool ok;  // a non-negative integer
    uint64_t value;
    std::string text;  // when not ok: as JSON (a nested container: [...] / {...}), for messages
  };
  // What one entry held; a repeated member counts as its last value, as in a DOM.
  struct Entry {
    std::string name;
    bool is_object = false;
    bool has_dtype = false, dtype_is_string = false;
    std::string dtype;
    bool has_shape = false, shape_is_array = false;
    std::vector<Number> shape;
    bool has_offsets = false, offsets_is_array = false;
    std::vector<Number> offsets;
    std::map<std::string, bool> metadata_is_string;  // __metadata__ members (last value wins)
  };
  enum class Field { kOther, kDtype, kShape, kOffsets, kMetadata };

  // A value that is not a container: at depth 1 an entry that is not an object; at depth 2 a
  // member of an entry; at depth 3 an element of shape / data_offsets.
  bool scalar(Number n, string_t* text) {
    if (depth_ == 1) {
      finish();
    } else if (depth_ == 2) {
      member(text != nullptr);
      if (field_ == Field::kDtype && text != nullptr) entry_.dtype = std::move(*text);
      if (field_ == Field::kMetadata && text != nullptr && metadata_ != nullptr)
        (*metadata_)[metadata_key_] = *text;
    } else if (depth_ == 3) {
      element(std::move(n));
    }
    return true;
  }

  bool open(bool object) {
    if (depth_ == 1) {
      entry_.is_object = object;
    } else if (depth_ == 2) {
      member(false);
      if (!object && field_ == Field::kShape) entry_.shape_is_array = true;
      if (!object && field_ == Field::kOffsets) entry_.offsets_is_array = true;
    } else if (depth_ == 3) {
      element(Number{false, 0, object ? "{...}" : "[...]"});  // one element, not a number
    }
    ++depth_;
    return true;
  }

  bool close() {
    if (--depth_ == 1) finish();
    return true;
  }

  // A member of the current entry begins (is_string: it is a string).
  void member(bool is_string) {
    switch (field_) {
      case Field::kDtype:
        entry_.has_dtype = true;
        entry_.dtype_is_string = is_string;
        break;
      case Field::kShape:
        entry_.has_shape = true;
        entry_.shape_is_array = false;
        entry_.shape.clear();
        break;
      case Field::kOffsets:
        entry_.has_offsets = true;
        entry_.offsets_is_array = false;
        entry_.offsets.clear();
        break;
      case Field::kMetadata:
        entry_.metadata_is_string[metadata_key_] = is_string;
        break;
      case Field::kOther:
        break;
    }
  }

  void element(Number&& n) {
    if (field_ == Field::kShape) entry_.shape.push_back(std::move(n));
    if (field_ == Field::kOffsets) entry_.offsets.push_back(std::move(n));
  }

  void fail(const std::string& message) {
    failed_names.push_back(entry_.name);
    if (error.empty() || entry_.name < error_name) {
      error_name = entry_.name;
      error = message;
    }
  }

  // The entry ended: check it as the format requires and keep its TensorInfo.
  void finish() {
    Entry& e = entry_;
    if (e.name == "__metadata__") {
      ++metadata_entries;
      if (!e.is_object) return fail(path_ + ": \"__metadata__\" is not an object of strings");
      for (const auto& [key, is_string] : e.metadata_is_string)  // in key order, as a DOM walk
        if (!is_string) return fail(path_ + ": \"__metadata__\" entry " + key + " is not a string");
      return;
    }
    const auto where = [&] { return path_ + ": tensor " + e.name; };
    if (!e.is_object) return fail(where() + ": entry is not an object");
    if (!e.has_dtype || !e.dtype_is_string)
      return fail(where() + ": missing or non-string \"dtype\"");
    if (!e.has_shape || !e.shape_is_array)
      return fail(where() + ": missing or non-array \"shape\"");
    if (!e.has_offsets || !e.offsets_is_array || e.offsets.size() != 2)
      return fail(where() + ": \"data_offsets\" must be an array of two integers");
    TensorInfo info;
    if (!parse_dtype(e.dtype, &info.dtype))
      return fail(where() + ": unknown dtype \"" + e.dtype + "\"");
    uint64_t numel = 1;
    info.shape.reserve(e.shape.size());
    for (const Number& dim : e.shape) {
      if (!dim.ok) return fail(where() + ": shape entries must be non-negative integers");
      if (dim.value > (uint64_t{1} << 48) || !mul_checked(numel, dim.value, &numel)) {
        std::string text = "[";  // the shape as JSON, as a DOM would dump it
        for (size_t i = 0; i < e.shape.size(); ++i)
          text.append(i ? "," : "")
              .append(e.shape[i].ok ? std::to_string(e.shape[i].value) : e.shape[i].text);
        return fail(where() + ": shape " + text + "] is too large");
      }
      info.shape.push_back(static_cast<int64_t>(dim.value));
    }
    for (const Number& off : e.offsets)
      if (!off.ok) return fail(where() + ": data_offsets must be non-negative integers");
    const uint64_t begin = e.offsets[0].value, end = e.offsets[1].value;
    if (end < begin)
      return fail(where() + ": data_offsets [" + std::to_string(begin) + ", " +
                  std::to_string(end) + ") end before they begin");
    if (end > data_size_)
      return fail(where() + ": data_offsets [" + std::to_string(begin) + ", " +
                  std::to_string(end) + ") lie outside the data region of " +
                  std::to_string(data_size_) + " bytes (file truncated?)");
    uint64_t expected = 0;
    if (!mul_checked(numel, dtype_size(info.dtype), &expected) || expected != end - begin)
      return fail(where() + ": shape " + shape_string(info.shape) + " x " + e.dtype + " needs " +
                  std::to_string(expected) + " bytes but data_offsets hold " +
                  std::to_string(end - begin));
    info.name = std::move(e.name);
    info.file_offset = data_start_ + begin;
    info.nbytes = end - begin;
    tensors.push_back(std::move(info));
  }

  const std::string& path_;
  uint64_t data_start_, data_size_;
  SafetensorsMetadata* metadata_;
  int depth_ = 0;
  Entry entry_;
  Field field_ = Field::kOther;
  std::string metadata_key_;
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
  // One SAX pass, no DOM (the release has ~500k tensors in 93 layer shards; nlohmann's callback
  // parser, once used here to catch a repeated name, rescanned the parent object at the end of
  // every child: quadratic in a shard's tensors).
  HeaderReader reader(path, data_start, data_size, metadata);
  try {
    nlohmann::json::sax_parse(header_json, &reader);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": header is not valid JSON: " + e.what());
  }
  std::vector<TensorInfo>& tensors = reader.tensors;
  // Name order first: the same order a DOM walk gave, so ties of the offset sort below (empty
  // tensors) come out as before. A name seen twice (also among failed entries) is refused.
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  {
    std::vector<std::string_view> names;
    names.reserve(tensors.size() + reader.failed_names.size() + 2);
    for (const TensorInfo& t : tensors) names.push_back(t.name);
    for (const std::string& n : reader.failed_names) names.push_back(n);
    if (reader.metadata_entries > 1) names.insert(names.end(), 2, "__metadata__");
    std::sort(names.begin(), names.end());
    const auto twice = std::adjacent_find(names.begin(), names.end());
    if (twice != names.end())
      throw Error(path + ": tensor " + std::string(*twice) + " appears twice in the header");
  }
  if (!reader.error.empty()) throw Error(reader.error);
  std::stable_sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
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

#include "io/model_files.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "json_sax.h"
#include "util/error.h"

namespace k3 {
namespace fs = std::filesystem;

bool is_vision_tensor(const std::string& name) {
  return name.rfind("vision_tower", 0) == 0 || name.rfind("mm_projector", 0) == 0;
}

namespace {

// SAX events of model.safetensors.index.json: each weight_map entry is handed to `on_entry` as
// it streams by; the string members of "metadata" are kept (the container record is among
// them). Invalid JSON throws at once; an entry that fails (not a string, or `on_entry` threw)
// is recorded and thrown by check(), after the caller has checked the container record, as a
// DOM walk would order them: the failing entry whose name sorts first.
class IndexReader : public JsonSaxTypes {
 public:
  using Entry = std::function<void(const std::string& name, const std::string& file)>;

  IndexReader(std::string path, Entry on_entry)
      : path_(std::move(path)), on_entry_(std::move(on_entry)) {}

  SafetensorsMetadata metadata;  // string members of the top-level "metadata" object
  bool container_key = false;    // "metadata" holds kContainerKey (of any type)

  // Reads `text`; then refuses a top-level member that appears twice (which of the two a reader
  // takes is not defined).
  void run(const std::string& text) {
    try {
      nlohmann::json::sax_parse(text, this);
    } catch (const nlohmann::json::exception& e) {
      throw Error(path_ + ": not valid JSON: " + e.what());
    }
    if (!repeated_.empty()) throw Error(path_ + ": \"" + repeated_ + "\" appears twice");
  }
  // A missing or non-object weight_map, then the failing entry whose name sorts first.
  void check() const {
    if (!weight_map_) throw Error(path_ + ": missing \"weight_map\" object");
    if (!error_.empty()) throw Error(error_);
  }

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(number_integer_t) { return value(); }
  bool number_unsigned(number_unsigned_t) { return value(); }
  bool number_float(number_float_t, const string_t&) { return value(); }
  bool binary(binary_t&) { return value(); }
  bool string(string_t& v) {
    if (depth_ == 2 && where_ == Where::kWeightMap) try {
        on_entry_(key_, v);
      } catch (const Error& e) {
        record(e.what());
      }
    else if (depth_ == 2 && where_ == Where::kMetadata)
      metadata[key_] = v;
    else
      value();
    return true;
  }
  bool start_object(std::size_t) {
    if (depth_ == 1)
      where_ = top_key_ == "weight_map" ? Where::kWeightMap
               : top_key_ == "metadata" ? Where::kMetadata
                                        : Where::kOther;
    if (depth_ == 1 && where_ == Where::kWeightMap) weight_map_ = true;
    value();
    ++depth_;
    return true;
  }
  bool end_object() {
    if (--depth_ == 1) where_ = Where::kOther;
    return true;
  }
  bool start_array(std::size_t) {
    value();
    ++depth_;
    return true;
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool key(string_t& name) {
    if (depth_ == 1 && !seen_.insert(name).second && repeated_.empty()) repeated_ = name;
    if (depth_ == 1) top_key_ = name;
    if (depth_ == 2) key_ = name;
    if (depth_ == 2 && where_ == Where::kMetadata && name == kContainerKey) container_key = true;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    throw e;  // run() names the file
  }

 private:
  enum class Where { kOther, kWeightMap, kMetadata };

  // A value other than a string (an object or array at its start): refused as a weight_map
  // entry, which must be a file name; anywhere else it needs no check.
  bool value() {
    if (depth_ == 2 && where_ == Where::kWeightMap)
      record(path_ + ": weight_map[" + key_ + "] is not a string");
    return true;
  }

  // Keeps the failing entry whose name sorts first; of two failing entries with one name, the
  // later (in pass 2, for a name listed twice, the one that says so).
  void record(const std::string& message) {
    if (error_.empty() || key_ <= error_name_) {
      error_name_ = key_;
      error_ = message;
    }
  }

  std::string path_;
  Entry on_entry_;
  int depth_ = 0;
  Where where_ = Where::kOther;
  std::string top_key_, key_;
  bool weight_map_ = false;
  std::set<std::string> seen_;  // top-level member names
  std::string repeated_;        // the first one seen twice
  std::string error_name_, error_;
};

}  // namespace

ModelFiles::ModelFiles(const std::string& dir, std::vector<std::string> extra_dirs)
    : extra_dirs_(std::move(extra_dirs)), dir_(dir) {
  for (const std::string& extra : extra_dirs_)
    if (!fs::is_directory(extra))
      throw Error(extra + ": K3_DIRS names a directory that does not exist");
  if (!fs::is_directory(dir)) throw Error(dir + ": not a model directory");
  const std::string config_path = (fs::path(dir) / "config.json").string();
  try {
    config_root_ =
        std::make_shared<const nlohmann::json>(nlohmann::json::parse(read_text_file(config_path)));
  } catch (const nlohmann::json::exception& e) {
    throw Error(config_path + ": not valid JSON: " + e.what());
  }
  if (!config_root_->is_object()) throw Error(config_path + ": not a JSON object");

  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    // Streamed twice (SAX), never held as a DOM: the release's index lists ~500k tensors, whose
    // DOM took ~110 MB at its peak. Pass 1 gathers the shards that hold text tensors and the
    // container record; pass 2, with those shards open, checks each listed tensor.
    const std::string path = index_path.string();
    const std::string text = read_text_file(path);
    std::set<std::string> text_shards;  // shards that hold at least one text tensor
    IndexReader first(path, [&](const std::string& name, const std::string& file) {
      if (file.find('/') != std::string::npos || file == ".." || file.empty())
        throw Error(path + ": weight_map[" + name + "] names a path outside the snapshot: " + file);
      if (!is_vision_tensor(name)) text_shards.insert(file);
    });
    first.run(text);
    // A container's index carries its record too: an unknown format version is refused here,
    // before any shard is opened.
    if (first.container_key) parse_container_info(first.metadata, path);
    first.check();
    for (const auto& f : text_shards) open_shard(f);  // a shard of only vision tensors: never
    index_tensors();
    std::vector<bool> listed(by_name_.size());  // by_name_[i] has had its weight_map entry
    std::set<std::string> vision_listed;        // vision names (their shards are not opened)
    IndexReader second(path, [&](const std::string& name, const std::string& file) {
      // A name listed twice: which entry a reader takes is not defined, so it is refused, and
      // this message wins over the other entry's (IndexReader::record).
      const auto twice = [&] {
        return Error(path + ": weight_map lists tensor " + name + " twice");
      };
      if (is_vision_tensor(name)) {
        if (!vision_listed.insert(name).second) throw twice();
        return;
      }
      const LocatedTensor* t = lookup(name);
      if (t == nullptr)
        throw Error(path + ": tensor " + name + " is listed in " + file +
                    " but that shard does not hold it");
      const size_t at = static_cast<size_t>(t - by_name_.data());
      if (listed[at]) throw twice();
      listed[at] = true;
      const std::string holder = fs::path(t->shard->path()).filename().string();
      if (holder != file)
        throw Error(path + ": tensor " + name + " is listed in " + file +
                    " but that shard does not hold it (" + holder + " does)");
    });
    second.run(text);
    second.check();
  } else {
    std::vector<std::string> files;  // each name once: the first directory holding it wins
    std::vector<std::string> dirs{dir};
    dirs.insert(dirs.end(), extra_dirs_.begin(), extra_dirs_.end());
    for (const std::string& d : dirs)
      for (const auto& entry : fs::directory_iterator(d)) {
        const std::string n = entry.path().filename().string();
        if (entry.is_regular_file() && n.size() > 12 && n.ends_with(".safetensors") &&
            std::find(files.begin(), files.end(), n) == files.end())
          files.push_back(n);
      }
    std::sort(files.begin(), files.end());
    if (files.empty())
      throw Error(dir + ": no *.safetensors shards and no model.safetensors.index.json");
    for (const auto& f : files) open_shard(f);
    index_tensors();
  }

  // Every shard carries the container record, or none does; the record is the same in all.
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ContainerInfo info = parse_container_info(shards_[i]->metadata(), shards_[i]->path());
    if (i == 0) {
      container_ = info;
    } else if (!(info == container_)) {
      throw Error(shards_[i]->path() + ": " +
                  (info.present != container_.present
                       ? std::string("mixes repacked-container shards and plain shards (") +
                             shards_[0]->path() + ")"
                       : "container record differs from " + shards_[0]->path() +
                             "'s (shards of two different repacks)"));
    }
  }

  // The real snapshot nests the text model under "language_model."; flat fixtures do not.
  if (lookup("language_model.model.layers.0.input_layernorm.weight") != nullptr)
    prefix_ = "language_model.";
}

void ModelFiles::open_shard(const std::string& file_name) {
  std::string path = (fs::path(dir_) / file_name).string();
  if (!fs::exists(path))
    for (const std::string& extra : extra_dirs_)
      if (fs::exists(fs::path(extra) / file_name)) {
        path = (fs::path(extra) / file_name).string();
        break;
      }
  auto shard = std::make_unique<SafetensorsShard>(open_posix_file(path));
  for (const auto& t : shard->tensors())
    if (!is_padding_tensor(t.name))  // alignment filler, not a weight
      by_name_.push_back(LocatedTensor{shard.get(), &t});
  shards_.push_back(std::move(shard));
}

void ModelFiles::index_tensors() {
  // Stable: of two tensors with one name, the one from the shard opened first comes first.
  std::stable_sort(
      by_name_.begin(), by_name_.end(),
      [](const LocatedTensor& a, const LocatedTensor& b) { return a.info->name < b.info->name; });
  for (size_t i = 1; i < by_name_.size(); ++i)
    if (by_name_[i].info->name == by_name_[i - 1].info->name)
      throw Error(by_name_[i].shard->path() + ": tensor " + by_name_[i].info->name +
                  " also appears in " + by_name_[i - 1].shard->path());
}

const LocatedTensor* ModelFiles::lookup(const std::string& full_name) const {
  const auto it = std::lower_bound(
      by_name_.begin(), by_name_.end(), full_name,
      [](const LocatedTensor& t, const std::string& n) { return t.info->name < n; });
  return it == by_name_.end() || it->info->name != full_name ? nullptr : &*it;
}

const nlohmann::json& ModelFiles::text_config() const {
  const auto it = config_root_->find("text_config");
  if (it != config_root_->end() && it->is_object()) return *it;
  return *config_root_;
}

LocatedTensor ModelFiles::find(const std::string& name) const {
  const LocatedTensor* t = lookup(prefix_ + name);
  return t == nullptr ? LocatedTensor{} : *t;
}

LocatedTensor ModelFiles::require_any(const std::string& name, const std::vector<DType>& dtypes,
                                      const std::vector<int64_t>& shape) const {
  const LocatedTensor t = find(name);
  if (t.info == nullptr)
    throw Error(dir_ + ": tensor " + prefix_ + name + " is missing from the snapshot");
  if (std::find(dtypes.begin(), dtypes.end(), t.info->dtype) == dtypes.end()) {
    std::string want;
    for (DType d : dtypes) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
    throw Error(t.shard->path() + ": tensor " + t.info->name + " has dtype " +
                dtype_name(t.info->dtype) + ", expected " + want);
  }
  if (t.info->shape != shape)
    throw Error(t.shard->path() + ": tensor " + t.info->name + " has shape " +
                shape_string(t.info->shape) + ", expected " + shape_string(shape));
  return t;
}

LocatedTensor ModelFiles::require(const std::string& name, DType dtype,
                                  const std::vector<int64_t>& shape) const {
  return require_any(name, {dtype}, shape);
}

}  // namespace k3

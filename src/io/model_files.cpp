#include "io/model_files.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "util/error.h"

namespace k3 {
namespace fs = std::filesystem;

bool is_vision_tensor(const std::string& name) {
  return name.rfind("vision_tower", 0) == 0 || name.rfind("mm_projector", 0) == 0;
}

ModelFiles::ModelFiles(const std::string& dir, std::vector<std::string> extra_dirs)
    : extra_dirs_(std::move(extra_dirs)), dir_(dir) {
  for (const std::string& extra : extra_dirs_)
    if (!fs::is_directory(extra))
      throw Error(extra + ": K3_DIRS names a directory that does not exist");
  if (!fs::is_directory(dir)) throw Error(dir + ": not a model directory");
  const std::string config_path = (fs::path(dir) / "config.json").string();
  try {
    config_root_ = nlohmann::json::parse(read_text_file(config_path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(config_path + ": not valid JSON: " + e.what());
  }
  if (!config_root_.is_object()) throw Error(config_path + ": not a JSON object");

  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(read_text_file(index_path.string()));
    } catch (const nlohmann::json::exception& e) {
      throw Error(index_path.string() + ": not valid JSON: " + e.what());
    }
    // A container's index carries its record too: an unknown format version is refused here,
    // before any shard is opened.
    const auto meta = index.find("metadata");
    if (meta != index.end() && meta->is_object() && meta->contains(kContainerKey)) {
      SafetensorsMetadata record;
      for (const auto& [key, value] : meta->items())
        if (value.is_string()) record[key] = value.get<std::string>();
      parse_container_info(record, index_path.string());
    }
    const auto wm = index.find("weight_map");
    if (!index.is_object() || wm == index.end() || !wm->is_object())
      throw Error(index_path.string() + ": missing \"weight_map\" object");
    // Shards that hold at least one text tensor; a shard of only vision tensors is never opened.
    std::set<std::string> text_shards;
    for (const auto& [name, file] : wm->items()) {
      if (!file.is_string())
        throw Error(index_path.string() + ": weight_map[" + name + "] is not a string");
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f == ".." || f.empty())
        throw Error(index_path.string() + ": weight_map[" + name +
                    "] names a path outside the snapshot: " + f);
      if (!is_vision_tensor(name)) text_shards.insert(f);
    }
    for (const auto& f : text_shards) open_shard(f);
    for (const auto& [name, file] : wm->items()) {
      if (is_vision_tensor(name)) continue;
      const auto it = by_name_.find(name);
      if (it == by_name_.end() ||
          fs::path(it->second.shard->path()).filename().string() != file.get<std::string>())
        throw Error(index_path.string() + ": tensor " + name + " is listed in " +
                    file.get<std::string>() + " but that shard does not hold it");
    }
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
  if (by_name_.count("language_model.model.layers.0.input_layernorm.weight"))
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
  for (const auto& t : shard->tensors()) {
    if (is_padding_tensor(t.name)) continue;  // alignment filler, not a weight
    const auto [it, inserted] = by_name_.emplace(t.name, LocatedTensor{shard.get(), &t});
    if (!inserted)
      throw Error(path + ": tensor " + t.name + " also appears in " + it->second.shard->path());
  }
  shards_.push_back(std::move(shard));
}

const nlohmann::json& ModelFiles::text_config() const {
  const auto it = config_root_.find("text_config");
  if (it != config_root_.end() && it->is_object()) return *it;
  return config_root_;
}

LocatedTensor ModelFiles::find(const std::string& name) const {
  const auto it = by_name_.find(prefix_ + name);
  return it == by_name_.end() ? LocatedTensor{} : it->second;
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

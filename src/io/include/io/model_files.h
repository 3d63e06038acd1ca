// io/model_files.h — a Hugging Face snapshot directory: config.json, the shard index and shards.
// Owns: finding a tensor by name across shards (index json when present, else every
// *.safetensors), the `language_model.` prefix, the text_config object. Never reads tensors of
// the vision shards: with an index, shards holding only vision tensors are not even opened.
// Does not own: the meaning of tensors (model/) or widening (kernels/).
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "io/container.h"
#include "io/safetensors.h"

namespace k3 {

struct LocatedTensor {
  const SafetensorsShard* shard = nullptr;
  const TensorInfo* info = nullptr;
};

class ModelFiles {
 public:
  // Opens `dir`: reads config.json and the shard headers of every shard holding text tensors.
  // Shards are looked up in `dir`, then in each of `extra_dirs` (K3_DIRS: a model split over
  // several drives, each shard on exactly one; a name found earlier wins); config and tokenizer
  // are read from `dir` only. Throws k3::Error naming the file on any problem.
  explicit ModelFiles(const std::string& dir, std::vector<std::string> extra_dirs = {});
  // Held in place (shards point into it); never copied or moved, so config_root_ is never null.
  ModelFiles(const ModelFiles&) = delete;
  ModelFiles& operator=(const ModelFiles&) = delete;

  const std::string& dir() const { return dir_; }
  // The whole config.json and its text part (text_config, or the root when absent).
  const nlohmann::json& config_root() const { return *config_root_; }
  const nlohmann::json& text_config() const;
  // "language_model." for the real layout, "" for flat fixtures.
  const std::string& prefix() const { return prefix_; }

  // Looks up `prefix() + name`. nullptr-shard result when absent.
  LocatedTensor find(const std::string& name) const;
  // Like find, but throws when absent, or when dtype/shape differ from the expected ones.
  LocatedTensor require(const std::string& name, DType dtype,
                        const std::vector<int64_t>& shape) const;
  // Like require, but accepts any of `dtypes`.
  LocatedTensor require_any(const std::string& name, const std::vector<DType>& dtypes,
                            const std::vector<int64_t>& shape) const;
  // Reads the raw bytes of a tensor into `dst` (nbytes of it).
  static void read(const LocatedTensor& t, void* dst) { t.shard->read(*t.info, dst); }

  const std::vector<std::unique_ptr<SafetensorsShard>>& shards() const { return shards_; }
  // The repacked container's record (io/container.h), the same in every shard; `present` false
  // for a Hugging Face snapshot. Shards that disagree, or a mix of container and plain shards,
  // are refused at open.
  const ContainerInfo& container() const { return container_; }

 private:
  void open_shard(const std::string& file_name);
  // Sorts by_name_ and refuses a name held by two shards (naming both).
  void index_tensors();
  std::vector<std::string> extra_dirs_;

  std::string dir_;
  // Behind a pointer so that this header needs only json_fwd.hpp: json.hpp is ~2 s of compile in
  // every file that includes it (docs/testing.md §6).
  std::shared_ptr<const nlohmann::json> config_root_;
  std::string prefix_;
  std::vector<std::unique_ptr<SafetensorsShard>> shards_;
  // Every tensor of the opened shards (padding excepted), in name order after the constructor:
  // 16 bytes a tensor, the names stay in the shards' TensorInfo.
  std::vector<LocatedTensor> by_name_;
  const LocatedTensor* lookup(const std::string& full_name) const;
  ContainerInfo container_;
};

// True for tensor names that belong to the vision tower or its projector.
bool is_vision_tensor(const std::string& name);

}  // namespace k3

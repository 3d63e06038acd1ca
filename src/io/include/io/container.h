// io/container.h — the repacked container's identity record (docs/container.md §2): the
// "__metadata__" keys k3_repack writes into every shard and the index, and their check on open.
// Owns: the key names, the format version this build reads and writes, the parsed record. Does
// not own: the layout (tools/repack_lib.h) or what the engine does with the bits (model/weights).
#pragma once

#include <string>

#include "io/safetensors.h"

namespace k3 {

inline constexpr const char* kContainerKey = "k3_container";     // format version
inline constexpr const char* kContainerVersion = "1";            // the one this build knows
inline constexpr const char* kContainerLayoutKey = "k3_layout";  // "aligned" | "packed"
inline constexpr const char* kContainerBitsKey = "k3_bits";      // --bits class
inline constexpr const char* kContainerMlaBitsKey = "k3_mla_bits";
inline constexpr const char* kContainerHeadBitsKey = "k3_head_bits";
inline constexpr const char* kContainerSourceKey = "k3_source_index_sha256";
inline constexpr const char* kContainerWriterKey = "k3_writer";

// What a container's record says; `present` false for a Hugging Face snapshot.
struct ContainerInfo {
  bool present = false;
  std::string layout;
  int bits = 0, mla_bits = 0, head_bits = 0;
  std::string source_index_sha256;
  std::string writer;
  bool operator==(const ContainerInfo&) const = default;
};

// Reads the record from one shard's (or the index's) metadata. Throws k3::Error naming `path`
// for an unknown format version or a malformed field; `present` false when the key is absent.
ContainerInfo parse_container_info(const SafetensorsMetadata& metadata, const std::string& path);

}  // namespace k3

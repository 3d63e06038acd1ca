#include "io/container.h"

#include "util/error.h"

namespace k3 {
namespace {

int bits_field(const SafetensorsMetadata& m, const char* key, const std::string& path) {
  const auto it = m.find(key);
  if (it == m.end()) throw Error(path + ": container record lacks \"" + std::string(key) + "\"");
  if (it->second != "4" && it->second != "8" && it->second != "32")
    throw Error(path + ": container record \"" + std::string(key) + "\" is \"" + it->second +
                "\", expected 4, 8 or 32");
  return std::stoi(it->second);
}

}  // namespace

ContainerInfo parse_container_info(const SafetensorsMetadata& m, const std::string& path) {
  ContainerInfo info;
  const auto version = m.find(kContainerKey);
  if (version == m.end()) return info;
  if (version->second != kContainerVersion)
    throw Error(path + ": written by an unknown k3_repack container format version \"" +
                version->second + "\" (this build reads version " + kContainerVersion +
                "); repack the Hugging Face snapshot with this build's k3_repack");
  info.present = true;
  const auto layout = m.find(kContainerLayoutKey);
  if (layout == m.end() || (layout->second != "aligned" && layout->second != "packed"))
    throw Error(path + ": container record \"" + std::string(kContainerLayoutKey) +
                "\" must be aligned or packed");
  info.layout = layout->second;
  info.bits = bits_field(m, kContainerBitsKey, path);
  info.mla_bits = bits_field(m, kContainerMlaBitsKey, path);
  info.head_bits = bits_field(m, kContainerHeadBitsKey, path);
  const auto source = m.find(kContainerSourceKey);
  if (source != m.end()) info.source_index_sha256 = source->second;
  const auto writer = m.find(kContainerWriterKey);
  if (writer != m.end()) info.writer = writer->second;
  return info;
}

}  // namespace k3

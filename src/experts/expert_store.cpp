#include "experts/expert_store.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"

namespace k3 {

void ExpertStore::add(int64_t layer, int64_t expert, const ExpertTensors& tensors) {
  const uint64_t want[6] = {geometry_.gate_packed_bytes(), geometry_.gate_scale_bytes(),
                            geometry_.down_packed_bytes(), geometry_.down_scale_bytes(),
                            geometry_.gate_packed_bytes(), geometry_.gate_scale_bytes()};
  Entry e{tensors, true};
  for (int i = 0; i < 6; ++i) {
    const LocatedTensor& t = tensors[static_cast<size_t>(i)];
    if (t.info == nullptr)
      throw Error("expert " + std::to_string(expert) + " of layer " + std::to_string(layer) + ": tensor missing");
    if (t.info->nbytes != want[i])
      throw Error(t.shard->path() + ": tensor " + t.info->name + " holds " + std::to_string(t.info->nbytes) +
                  " bytes, expected " + std::to_string(want[i]) + " for this expert geometry");
    if (i > 0) {
      const LocatedTensor& prev = tensors[static_cast<size_t>(i - 1)];
      if (t.shard != prev.shard || t.info->file_offset != prev.info->file_offset + prev.info->nbytes)
        e.contiguous = false;
    }
  }
  entries_[{layer, expert}] = e;
}

const ExpertStore::Entry& ExpertStore::entry(int64_t layer, int64_t expert) const {
  const auto it = entries_.find({layer, expert});
  if (it == entries_.end())
    throw Error("expert " + std::to_string(expert) + " of layer " + std::to_string(layer) + " is not registered");
  return it->second;
}

bool ExpertStore::contiguous(int64_t layer, int64_t expert) const { return entry(layer, expert).contiguous; }

ExpertView ExpertStore::view(const uint8_t* bytes) const {
  ExpertView v;
  v.gate_packed = bytes;
  v.gate_scale = v.gate_packed + geometry_.gate_packed_bytes();
  v.down_packed = v.gate_scale + geometry_.gate_scale_bytes();
  v.down_scale = v.down_packed + geometry_.down_packed_bytes();
  v.up_packed = v.down_scale + geometry_.down_scale_bytes();
  v.up_scale = v.up_packed + geometry_.gate_packed_bytes();
  return v;
}

void ExpertStore::load_all() {
  const uint64_t each = geometry_.expert_bytes();
  arena_.resize(each * entries_.size());
  size_t i = 0;
  std::vector<uint8_t> buffer;
  for (auto& [key, e] : entries_) {
    e.resident = nullptr;
    read(key.first, key.second, buffer);
    std::copy(buffer.begin(), buffer.end(), arena_.begin() + static_cast<std::ptrdiff_t>(i * each));
    e.resident = arena_.data() + i * each;
    ++i;
  }
}

ExpertView ExpertStore::read(int64_t layer, int64_t expert, std::vector<uint8_t>& buffer) const {
  const Entry& e = entry(layer, expert);
  if (e.resident) return view(e.resident);
  buffer.resize(geometry_.expert_bytes());
  uint8_t* parts[6];
  uint64_t offset = 0;
  for (size_t i = 0; i < 6; ++i) {
    parts[i] = buffer.data() + offset;
    offset += e.tensors[i].info->nbytes;
  }
  // The message naming the expert is built only on failure: this runs for every routed expert
  // of every token.
  const auto what = [&] { return "expert " + std::to_string(expert) + " of layer " + std::to_string(layer); };
  try {
    if (e.contiguous) {
      const LocatedTensor& first = e.tensors[0];
      first.shard->file().read_exact(buffer.data(), buffer.size(), first.info->file_offset, first.info->name);
    } else {
      for (size_t i = 0; i < 6; ++i) {
        const LocatedTensor& t = e.tensors[i];
        t.shard->file().read_exact(parts[i], t.info->nbytes, t.info->file_offset, t.info->name);
      }
    }
  } catch (const Error& err) {
    throw Error(std::string(err.what()) + " (" + what() + ")");
  }
  for (size_t i : {size_t{1}, size_t{3}, size_t{5}}) {
    const uint8_t* s = parts[i];
    const uint64_t n = e.tensors[i].info->nbytes;
    if (std::find(s, s + n, uint8_t{255}) != s + n)
      throw Error(e.tensors[i].shard->path() + ": tensor " + e.tensors[i].info->name +
                  " holds exponent byte 255 (NaN in MXFP4); " + what() + " is unusable");
  }
  return view(buffer.data());
}

}  // namespace k3

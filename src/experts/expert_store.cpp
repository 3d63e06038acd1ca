#include "experts/expert_store.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"

namespace k3 {

void ExpertStore::add(int64_t layer, int64_t expert, const ExpertTensors& tensors) {
  const uint64_t want[6] = {geometry_.gate_packed_bytes(), geometry_.gate_scale_bytes(),
                            geometry_.down_packed_bytes(), geometry_.down_scale_bytes(),
                            geometry_.gate_packed_bytes(), geometry_.gate_scale_bytes()};
  if (layer < 0 || expert < 0)
    throw Error("expert " + std::to_string(expert) + " of layer " + std::to_string(layer) +
                ": negative index");
  Entry e{tensors, true, true};
  for (int i = 0; i < 6; ++i) {
    const LocatedTensor& t = tensors[static_cast<size_t>(i)];
    if (t.info == nullptr)
      throw Error("expert " + std::to_string(expert) + " of layer " + std::to_string(layer) +
                  ": tensor missing");
    if (t.info->nbytes != want[i])
      throw Error(t.shard->path() + ": tensor " + t.info->name + " holds " +
                  std::to_string(t.info->nbytes) + " bytes, expected " + std::to_string(want[i]) +
                  " for this expert geometry");
    if (i > 0) {
      const LocatedTensor& prev = tensors[static_cast<size_t>(i - 1)];
      if (t.shard != prev.shard ||
          t.info->file_offset != prev.info->file_offset + prev.info->nbytes)
        e.contiguous = false;
    }
  }
  const auto l = static_cast<size_t>(layer), x = static_cast<size_t>(expert);
  if (entries_.size() <= l) entries_.resize(l + 1);
  if (entries_[l].size() <= x) entries_[l].resize(x + 1);
  if (!entries_[l][x].registered) ++registered_;
  entries_[l][x] = e;
}

bool ExpertStore::has(int64_t layer, int64_t expert) const {
  const auto l = static_cast<size_t>(layer), x = static_cast<size_t>(expert);
  return layer >= 0 && expert >= 0 && l < entries_.size() && x < entries_[l].size() &&
         entries_[l][x].registered;
}

const ExpertStore::Entry& ExpertStore::entry(int64_t layer, int64_t expert) const {
  if (!has(layer, expert))
    throw Error("expert " + std::to_string(expert) + " of layer " + std::to_string(layer) +
                " is not registered");
  return entries_[static_cast<size_t>(layer)][static_cast<size_t>(expert)];
}

bool ExpertStore::contiguous(int64_t layer, int64_t expert) const {
  return entry(layer, expert).contiguous;
}

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

bool ExpertStore::load_all(const std::atomic<bool>* cancel) {
  const uint64_t each = geometry_.expert_bytes();
  arena_.resize(each * registered_);
  size_t i = 0;
  for (size_t layer = 0; layer < entries_.size(); ++layer)
    for (size_t expert = 0; expert < entries_[layer].size(); ++expert) {
      Entry& e = entries_[layer][expert];
      if (!e.registered) continue;
      const auto key = std::make_pair(static_cast<int64_t>(layer), static_cast<int64_t>(expert));
      if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) return false;
      // Buffered, straight into the arena (no alignment needed).
      uint8_t* dst = arena_.data() + i * each;
      const ReadPlan plan = plan_read(key.first, key.second, dst, false);
      std::string error;
      try {
        for (size_t r = 0; r < plan.count; ++r) {
          const ReadRequest& q = plan.requests[r];
          q.file->read_exact(q.dst, q.length, q.offset, e.tensors[0].info->name);
        }
      } catch (const Error& err) {
        error = err.what();
      }
      finish_read(key.first, key.second, dst, error);
      e.resident = dst;
      ++i;
    }
  return true;
}

namespace {

std::string expert_name(int64_t layer, int64_t expert) {
  return "expert " + std::to_string(expert) + " of layer " + std::to_string(layer);
}

}  // namespace

ExpertStore::Location ExpertStore::location(int64_t layer, int64_t expert) const {
  const LocatedTensor& first = entry(layer, expert).tensors[0];
  return {&first.shard->file(), first.info->file_offset};
}

void ExpertStore::advise(int64_t layer, int64_t expert) const {
  const Entry& e = entry(layer, expert);
  for (const LocatedTensor& t : e.tensors) {
    t.shard->file().will_need(t.info->file_offset, t.info->nbytes);
    if (e.contiguous) {
      t.shard->file().will_need(t.info->file_offset, geometry_.expert_bytes());
      break;
    }
  }
}

// Checks the three scale tensors of an expert whose bytes start at `bytes` for exponent 255.
void ExpertStore::validate(const Entry& e, const uint8_t* bytes, int64_t layer,
                           int64_t expert) const {
  uint64_t offset = 0;
  for (size_t i = 0; i < 6; ++i) {
    const uint64_t n = e.tensors[i].info->nbytes;
    if (i % 2 == 1) {
      const uint8_t* s = bytes + offset;
      if (std::find(s, s + n, uint8_t{255}) != s + n)
        throw Error(e.tensors[i].shard->path() + ": tensor " + e.tensors[i].info->name +
                    " holds exponent byte 255 (NaN in MXFP4); " + expert_name(layer, expert) +
                    " is unusable");
    }
    offset += n;
  }
}

ExpertStore::ReadPlan ExpertStore::plan_read(int64_t layer, int64_t expert, uint8_t* slot,
                                             bool direct) const {
  const Entry& e = entry(layer, expert);
  const uint64_t bytes = geometry_.expert_bytes();
  ReadPlan plan;
  plan.data = slot;
  if (!e.contiguous) {
    uint64_t at = 0;
    for (const LocatedTensor& t : e.tensors) {
      plan.requests[plan.count++] = {&t.shard->file(), slot + at, t.info->nbytes,
                                     t.info->file_offset, false};
      at += t.info->nbytes;
    }
    return plan;
  }
  const WindowPlan window =
      plan_window(e.tensors[0].shard->file(), e.tensors[0].info->file_offset, bytes, slot, direct);
  for (size_t i = 0; i < window.count; ++i) plan.requests[plan.count++] = window.requests[i];
  plan.data = window.data;
  return plan;
}

void ExpertStore::finish_read(int64_t layer, int64_t expert, const uint8_t* data,
                              const std::string& error) const {
  if (!error.empty()) throw Error(error + " (" + expert_name(layer, expert) + ")");
  validate(entry(layer, expert), data, layer, expert);
}

}  // namespace k3

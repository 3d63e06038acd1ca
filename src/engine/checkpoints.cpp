#include "engine/checkpoints.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "io/file.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/sys.h"

namespace k3 {
namespace {

constexpr uint64_t kMagic = 0x504B4333u;  // "3CKP" little-endian
constexpr uint64_t kVersion = 1;

struct FileHeader {
  uint64_t magic = kMagic;
  uint64_t version = kVersion;
  uint64_t position = 0;
  uint64_t float_count = 0;
  uint64_t checksum = 0;  // FNV-1a 64 of the payload bytes
};

}  // namespace

CheckpointStore::CheckpointStore(const CheckpointPolicy& policy) : policy_(policy) {
  if (policy_.slots < 0 || policy_.slots > 8)
    throw Error("checkpoints: " + std::to_string(policy_.slots) + " slots is outside [0, 8]");
  slots_.resize(static_cast<size_t>(policy_.slots));
  if (!policy_.dir.empty() && policy_.slots > 0) {
    if (::mkdir(policy_.dir.c_str(), 0700) != 0 && errno != EEXIST)
      throw Error(policy_.dir +
                  ": cannot create the checkpoint directory: " + std::strerror(errno));
    struct stat st {};
    if (::stat(policy_.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw Error(policy_.dir + ": the checkpoint directory is not a directory");
    if (st.st_uid == ::getuid() && (st.st_mode & 0077) != 0) ::chmod(policy_.dir.c_str(), 0700);
  }
}

CheckpointStore::~CheckpointStore() {
  if (!policy_.dir.empty() && !policy_.keep_files)
    for (size_t s = 0; s < slots_.size(); ++s) ::unlink(slot_path(static_cast<int>(s)).c_str());
}

std::string CheckpointStore::describe() const {
  if (!enabled()) return "off";
  const std::string n = std::to_string(slots_.size()) + (slots_.size() == 1 ? " slot" : " slots");
  return policy_.dir.empty() ? "ram, " + n : "disk " + policy_.dir + ", " + n;
}

std::string CheckpointStore::slot_path(int slot) const {
  return policy_.dir + "/k3_ckpt_" + std::to_string(slot) + ".bin";
}

bool CheckpointStore::holds(int64_t position, std::span<const int64_t> ids) const {
  for (const Slot& s : slots_)
    if (s.used && s.position == position &&
        std::equal(s.ids.begin(), s.ids.end(), ids.begin(), ids.end()))
      return true;
  return false;
}

bool CheckpointStore::save(const Session& session) {
  if (!enabled() || session.position() < 1) return false;
  const std::vector<int64_t>& ids = session.tokens();
  for (Slot& s : slots_)
    if (s.used && s.position == session.position() && s.ids == ids) {
      s.stamp = ++clock_;
      return true;
    }
  size_t target = slots_.size();
  for (size_t i = 0; i < slots_.size() && target == slots_.size(); ++i)
    if (!slots_[i].used) target = i;
  if (target == slots_.size())
    target = static_cast<size_t>(
        std::min_element(slots_.begin(), slots_.end(),
                         [](const Slot& a, const Slot& b) { return a.stamp < b.stamp; }) -
        slots_.begin());
  Slot& slot = slots_[target];
  slot.used = false;
  try {
    session.save_state(scratch_);
    if (policy_.dir.empty()) {
      slot.kda = scratch_.kda;
    } else if (!write_file(static_cast<int>(target), scratch_)) {
      return false;
    }
    slot.ids = ids;
  } catch (
      const std::exception& e) {  // std::bad_alloc, k3::Error: drop the checkpoint, keep serving
    std::fprintf(stderr, "[K3-CKPT] checkpoint at position %lld dropped: %s\n",
                 static_cast<long long>(session.position()), e.what());
    slot.kda.clear();
    return false;
  }
  slot.position = session.position();
  slot.stamp = ++clock_;
  slot.saved_at = now_seconds();
  slot.used = true;
  ++counters_.saves;
  return true;
}

int64_t CheckpointStore::restore_best(Session& session, std::span<const int64_t> prompt,
                                      int64_t live) {
  for (;;) {
    int best = -1;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (!s.used || s.position < 1 || s.position > live ||
          s.position > static_cast<int64_t>(prompt.size()))
        continue;
      if (!std::equal(s.ids.begin(), s.ids.end(), prompt.begin())) continue;
      if (best < 0 || s.position > slots_[static_cast<size_t>(best)].position)
        best = static_cast<int>(i);
    }
    if (best < 0) return 0;
    Slot& slot = slots_[static_cast<size_t>(best)];
    const double t0 = now_seconds();
    if (policy_.dir.empty()) {
      scratch_.kda = slot.kda;
    } else if (!read_file(best, session.state_floats(), scratch_)) {
      slot.used = false;  // rejected: try the next deepest
      ++counters_.rejected;
      continue;
    }
    scratch_.position = slot.position;
    scratch_.ids = slot.ids;
    session.restore_state(scratch_);
    slot.stamp = ++clock_;
    ++counters_.restores;
    counters_.restore_seconds += now_seconds() - t0;
    return slot.position;
  }
}

void CheckpointStore::clear() {
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i] = Slot{};
    if (!policy_.dir.empty()) ::unlink(slot_path(static_cast<int>(i)).c_str());
  }
}

std::vector<CheckpointStore::SlotInfo> CheckpointStore::list() const {
  std::vector<SlotInfo> out;
  const double now = now_seconds();
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].used)
      out.push_back({static_cast<int>(i), slots_[i].position, now - slots_[i].saved_at});
  return out;
}

int CheckpointStore::used() const {
  return static_cast<int>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.used; }));
}

bool CheckpointStore::write_file(int slot, const SavedState& saved) {
  FileHeader header;
  header.position = static_cast<uint64_t>(saved.position);
  header.float_count = saved.kda.size();
  header.checksum = fnv1a_64_bytes(saved.kda.data(), saved.kda.size() * sizeof(float));
  try {
    write_file_atomic(slot_path(slot),
                      {ByteSpan{&header, sizeof header},
                       ByteSpan{saved.kda.data(), saved.kda.size() * sizeof(float)}},
                      0600, false);
  } catch (const Error& e) {
    std::fprintf(stderr, "[K3-CKPT] checkpoint at position %lld dropped: %s\n",
                 static_cast<long long>(saved.position), e.what());
    return false;
  }
  return true;
}

bool CheckpointStore::read_file(int slot, size_t floats, SavedState& saved) {
  const std::string path = slot_path(slot);
  const Slot& meta = slots_[static_cast<size_t>(slot)];
  auto reject = [&](const std::string& why) {
    std::fprintf(stderr, "[K3-CKPT] %s rejected: %s\n", path.c_str(), why.c_str());
    return false;
  };
  try {
    std::unique_ptr<File> file = open_posix_file(path);
    FileHeader header;
    if (file->size() < sizeof header) return reject("shorter than its header");
    file->read_exact(&header, sizeof header, 0, "checkpoint header");
    if (header.magic != kMagic || header.version != kVersion) return reject("bad magic or version");
    if (header.position != static_cast<uint64_t>(meta.position))
      return reject("position does not match");
    if (header.float_count != floats) return reject("float count does not match");
    if (header.float_count > (file->size() - sizeof header) / sizeof(float) ||
        file->size() != sizeof header + header.float_count * sizeof(float))
      return reject("size does not match its header");
    saved.kda.resize(header.float_count);
    file->read_exact(saved.kda.data(), header.float_count * sizeof(float), sizeof header,
                     "checkpoint payload");
    if (fnv1a_64_bytes(saved.kda.data(), saved.kda.size() * sizeof(float)) != header.checksum)
      return reject("checksum mismatch");
  } catch (const Error& e) {
    return reject(e.what());
  }
  return true;
}

}  // namespace k3

#include "engine/checkpoints.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "io/file.h"
#include "util/error.h"
#include "util/siphash.h"
#include "util/sys.h"

namespace k3 {
namespace {

constexpr uint64_t kMagic = 0x504B4333u;  // "3CKP" little-endian
constexpr uint64_t kVersion = 2;          // 2: a keyed tag instead of an unkeyed checksum

struct FileHeader {
  uint64_t magic = kMagic;
  uint64_t version = kVersion;
  uint64_t position = 0;
  uint64_t float_count = 0;
  uint64_t tag = 0;  // SipHash-2-4 under the store's key, see tag_of()
};

// The private subdirectory for this store's files inside `dir` (docs/serving.md §3.10.4). `dir`
// is never changed: created 0700 when missing, otherwise only checked. It must be a directory
// owned by us or root; one that other users may write to is refused unless it is sticky (like
// /tmp), where nobody else can rename or remove what we create, and then a loud warning says so.
// The subdirectory is made by mkdtemp (mode 0700, a fresh random name every start), so no file of
// another user or another server can be there.
std::string private_subdirectory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw Error(dir + ": cannot create the checkpoint directory: " + std::strerror(errno));
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error(dir + ": the checkpoint directory is not a directory");
  if (st.st_uid != ::getuid() && st.st_uid != 0)
    throw Error(dir + ": the checkpoint directory belongs to uid " + std::to_string(st.st_uid) +
                ", not to this user (uid " + std::to_string(::getuid()) +
                "); its owner could replace the checkpoints. Use a directory of your own");
  const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
  if (others_write && (st.st_mode & S_ISVTX) == 0)
    throw Error(dir + ": the checkpoint directory is writable by other users (mode " +
                [&] {
                  char m[8];
                  std::snprintf(m, sizeof m, "%04o", static_cast<unsigned>(st.st_mode & 07777));
                  return std::string(m);
                }() +
                ") and not sticky, so they could swap what is written there; use a private " +
                "directory (it is never chmod-ed for you)");
  if (others_write)
    std::fprintf(stderr,
                 "[K3-CKPT] WARNING: %s is shared with other users (mode %04o); the checkpoints go "
                 "to a private 0700 subdirectory of it and carry a keyed tag\n",
                 dir.c_str(), static_cast<unsigned>(st.st_mode & 07777));
  std::string name = dir + "/k3-ckpt-XXXXXX";
  if (::mkdtemp(name.data()) == nullptr)
    throw Error(dir + ": cannot create a private checkpoint subdirectory: " + std::strerror(errno));
  struct stat sub {};
  if (::lstat(name.c_str(), &sub) != 0 || !S_ISDIR(sub.st_mode) || sub.st_uid != ::geteuid() ||
      (sub.st_mode & 0077) != 0)
    throw Error(name + ": the private checkpoint subdirectory is not ours or not 0700");
  return name;
}

}  // namespace

CheckpointStore::CheckpointStore(const CheckpointPolicy& policy) : policy_(policy) {
  if (policy_.slots < 0 || policy_.slots > 8)
    throw Error("checkpoints: " + std::to_string(policy_.slots) + " slots is outside [0, 8]");
  slots_.resize(static_cast<size_t>(policy_.slots));
  if (!policy_.dir.empty() && policy_.slots > 0) {
    key_ = random_sip_key();
    files_dir_ = private_subdirectory(policy_.dir);
  }
}

CheckpointStore::~CheckpointStore() {
  if (files_dir_.empty() || policy_.keep_files) return;
  for (size_t s = 0; s < slots_.size(); ++s) ::unlink(slot_path(static_cast<int>(s)).c_str());
  ::rmdir(files_dir_.c_str());  // fails harmlessly when something else was put there
}

std::string CheckpointStore::describe() const {
  if (!enabled()) return "off";
  const std::string n = std::to_string(slots_.size()) + (slots_.size() == 1 ? " slot" : " slots");
  return files_dir_.empty() ? "ram, " + n : "disk " + files_dir_ + ", " + n;
}

std::string CheckpointStore::slot_path(int slot) const {
  return files_dir_ + "/k3_ckpt_" + std::to_string(slot) + ".bin";
}

bool CheckpointStore::holds(int64_t position, std::span<const int64_t> ids) const {
  for (const Slot& s : slots_)
    if (s.used && s.position == position &&
        std::equal(s.ids.begin(), s.ids.end(), ids.begin(), ids.end()))
      return true;
  return false;
}

void CheckpointStore::protect(std::span<const int64_t> positions, std::span<const int64_t> prompt) {
  kept_positions_.clear();
  for (int64_t p : positions)
    if (p >= 1 && p <= static_cast<int64_t>(prompt.size())) kept_positions_.push_back(p);
  std::sort(kept_positions_.begin(), kept_positions_.end());
  kept_positions_.erase(std::unique(kept_positions_.begin(), kept_positions_.end()),
                        kept_positions_.end());
  const size_t deepest = kept_positions_.empty() ? 0 : static_cast<size_t>(kept_positions_.back());
  kept_ids_.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(deepest));
}

bool CheckpointStore::kept(int64_t position, std::span<const int64_t> ids) const {
  return std::binary_search(kept_positions_.begin(), kept_positions_.end(), position) &&
         static_cast<int64_t>(ids.size()) == position &&
         std::equal(ids.begin(), ids.end(), kept_ids_.begin());
}

bool CheckpointStore::save(const Session& session) {
  if (!enabled() || session.position() < 1) return false;
  const std::vector<int64_t>& ids = session.tokens();
  for (Slot& s : slots_)
    if (s.used && s.position == session.position() && s.ids == ids) {
      s.stamp = ++clock_;
      return true;
    }
  // The first empty slot, else the least recently used of those not kept, else (for a kept
  // checkpoint only) the least recently used kept one.
  const bool keep_new = kept(session.position(), ids);
  size_t target = slots_.size();
  for (size_t i = 0; i < slots_.size() && target == slots_.size(); ++i)
    if (!slots_[i].used) target = i;
  for (int pass = 0; pass < 2 && target == slots_.size(); ++pass) {
    if (pass == 1 && !keep_new) return false;  // every slot holds a kept checkpoint
    for (size_t i = 0; i < slots_.size(); ++i)
      if ((pass == 1 || !kept(slots_[i].position, slots_[i].ids)) &&
          (target == slots_.size() || slots_[i].stamp < slots_[target].stamp))
        target = i;
  }
  Slot& slot = slots_[target];
  slot.used = false;
  slot.serial = ++serial_;  // a file written for an earlier save never matches this one
  try {
    session.save_state(scratch_);
    if (files_dir_.empty()) {
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
    if (files_dir_.empty()) {
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
  kept_positions_.clear();
  kept_ids_.clear();
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i] = Slot{};
    if (!files_dir_.empty()) ::unlink(slot_path(static_cast<int>(i)).c_str());
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

uint64_t CheckpointStore::tag_of(int slot, const Slot& meta, const FileHeaderFields& fields,
                                 const float* payload) const {
  // Everything that makes the file this checkpoint: the slot, the save's serial (per store, in
  // memory only), the position, the ids it was taken after and the state itself.
  SipHash24 h(key_);
  const uint64_t head[5] = {kMagic, static_cast<uint64_t>(slot), meta.serial, fields.position,
                            fields.float_count};
  h.update(head, sizeof head);
  h.update(meta.ids.data(), meta.ids.size() * sizeof(int64_t));
  h.update(payload, fields.float_count * sizeof(float));
  return h.final();
}

bool CheckpointStore::write_file(int slot, const SavedState& saved) {
  FileHeader header;
  header.position = static_cast<uint64_t>(saved.position);
  header.float_count = saved.kda.size();
  Slot& meta = slots_[static_cast<size_t>(slot)];
  meta.ids = saved.ids;  // the tag covers them (set again by save())
  header.tag = tag_of(slot, meta, {header.position, header.float_count}, saved.kda.data());
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
    if (tag_of(slot, meta, {header.position, header.float_count}, saved.kda.data()) != header.tag)
      return reject("its keyed tag does not match (changed or swapped since it was written)");
  } catch (const Error& e) {
    return reject(e.what());
  }
  return true;
}

}  // namespace k3

namespace k3 {
namespace {

constexpr uint64_t kPrefixVersion = 3;  // 3: stands alone (ids and MLA rows in the payload)
constexpr const char* kKeyFile = "k3_prefix.key";
constexpr const char* kPrefixStem = "k3_prefix_";

struct PrefixHeader {
  uint64_t magic = kMagic;
  uint64_t version = kPrefixVersion;
  uint64_t position = 0;
  uint64_t kda_floats = 0;
  uint64_t row_floats = 0;  // all positions' rows together
  uint64_t identity = 0;
  uint64_t tag = 0;  // SipHash-2-4 of the fields above, the ids and both payloads
};

uint64_t prefix_tag(const SipKey& key, const PrefixHeader& h, const int64_t* ids, const float* kda,
                    const float* rows) {
  SipHash24 sip(key);
  const uint64_t head[6] = {h.magic, h.version, h.position, h.kda_floats, h.row_floats, h.identity};
  sip.update(head, sizeof head);
  sip.update(ids, h.position * sizeof(int64_t));
  sip.update(kda, h.kda_floats * sizeof(float));
  sip.update(rows, h.row_floats * sizeof(float));
  return sip.final();
}

// The cache directory: created 0700 when missing; an existing one must be ours and writable by
// nobody else (its files are trusted only through their tags, but a shared directory would let
// others fill or empty the cache).
void check_cache_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw Error(
        dir + ": cannot create the prefix cache directory (--cache-dir): " + std::strerror(errno));
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error(dir + ": the prefix cache directory (--cache-dir) is not a directory");
  if (st.st_uid != ::geteuid())
    throw Error(dir + ": the prefix cache directory (--cache-dir) belongs to uid " +
                std::to_string(st.st_uid) + ", not to this user; use a directory of your own");
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    throw Error(dir + ": the prefix cache directory (--cache-dir) is writable by other users; " +
                "use a private directory (chmod 700; it is never chmod-ed for you)");
}

// The key: 16 random bytes in a 0600 file of ours, made on first use (O_EXCL: two servers
// starting together end up with the same one).
SipKey load_or_create_key(const std::string& dir) {
  const std::string path = dir + "/" + kKeyFile;
  SipKey key{};
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) {
    key = random_sip_key();
    const bool ok =
        ::write(fd, key.data(), key.size()) == static_cast<ssize_t>(key.size()) && ::fsync(fd) == 0;
    ::close(fd);
    if (!ok) {
      ::unlink(path.c_str());
      throw Error(path + ": cannot write the prefix cache key: " + std::strerror(errno));
    }
    return key;
  }
  if (errno != EEXIST)
    throw Error(path + ": cannot create the prefix cache key: " + std::strerror(errno));
  fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open the prefix cache key: " + std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const ssize_t got = stat_ok ? ::read(fd, key.data(), key.size()) : -1;
  ::close(fd);
  if (!stat_ok || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 0077) != 0 ||
      st.st_size != static_cast<off_t>(key.size()) || got != static_cast<ssize_t>(key.size()))
    throw Error(path + ": the prefix cache key must be a 16-byte regular file of this user, mode " +
                "0600; remove it (the cache is then rebuilt) or fix its mode");
  return key;
}

}  // namespace

PrefixCache::PrefixCache(const std::string& dir, uint64_t max_bytes, const std::string& identity)
    : dir_(dir), max_bytes_(max_bytes) {
  check_cache_dir(dir_);
  key_ = load_or_create_key(dir_);
  identity_ = siphash24(key_, identity.data(), identity.size());
  scan();
  evict();
}

std::string PrefixCache::describe() const {
  char buf[96];
  std::snprintf(buf, sizeof buf, ", %zu entr%s, %.2f of %.2f GB", entries_.size(),
                entries_.size() == 1 ? "y" : "ies", static_cast<double>(bytes()) / 1e9,
                static_cast<double>(max_bytes_) / 1e9);
  return "disk " + dir_ + buf;
}

uint64_t PrefixCache::bytes() const {
  uint64_t n = 0;
  for (const Entry& e : entries_) n += e.bytes;
  return n;
}

void PrefixCache::scan() {
  DIR* d = ::opendir(dir_.c_str());
  if (!d) throw Error(dir_ + ": cannot list the prefix cache directory: " + std::strerror(errno));
  std::vector<std::pair<double, Entry>> found;
  while (const dirent* de = ::readdir(d)) {
    const std::string name = de->d_name;
    if (name.rfind(kPrefixStem, 0) != 0) continue;
    const std::string path = dir_ + "/" + name;
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".bin") != 0) {
      ::unlink(path.c_str());  // a temp file left by a write cut short
      continue;
    }
    Entry e;
    e.path = path;
    std::string why;
    try {
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid())
        throw Error("not a regular file of this user");
      std::unique_ptr<File> file = open_posix_file(path);
      PrefixHeader h;
      if (file->size() < sizeof h) throw Error("shorter than its header");
      file->read_exact(&h, sizeof h, 0, "prefix cache header");
      if (h.magic != kMagic || h.version != kPrefixVersion) throw Error("bad magic or version");
      if (h.identity != identity_)
        throw Error("written for another model or another cache (identity does not match)");
      const uint64_t rest = file->size() - sizeof h;
      if (h.position > rest / sizeof(int64_t) ||
          rest != h.position * sizeof(int64_t) + (h.kda_floats + h.row_floats) * sizeof(float))
        throw Error("size does not match its header (truncated?)");
      e.ids.resize(h.position);
      file->read_exact(e.ids.data(), h.position * sizeof(int64_t), sizeof h, "prefix cache ids");
      e.bytes = file->size();
      found.emplace_back(
          static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec),
          std::move(e));
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "[K3-PREFIX] %s refused and removed: %s\n", path.c_str(), ex.what());
      ::unlink(path.c_str());
      ++counters_.rejected;
    }
  }
  ::closedir(d);
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [mtime, e] : found) {
    e.stamp = ++clock_;
    entries_.push_back(std::move(e));
  }
}

void PrefixCache::drop(size_t index, const char* why) {
  std::fprintf(stderr, "[K3-PREFIX] %s %s\n", entries_[index].path.c_str(), why);
  ::unlink(entries_[index].path.c_str());
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(index));
}

void PrefixCache::evict() {
  while (!entries_.empty() && bytes() > max_bytes_) {
    size_t lru = 0;
    for (size_t i = 1; i < entries_.size(); ++i)
      if (entries_[i].stamp < entries_[lru].stamp) lru = i;
    ::unlink(entries_[lru].path.c_str());
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(lru));
    ++counters_.evicted;
  }
}

bool PrefixCache::save(const Session& session) {
  if (session.position() < 1) return false;
  const std::vector<int64_t>& ids = session.tokens();
  for (Entry& e : entries_)
    if (e.ids == ids) {
      e.stamp = ++clock_;
      ::utimensat(AT_FDCWD, e.path.c_str(), nullptr, 0);  // the LRU order survives a restart
      return true;
    }
  try {
    session.save_state(scratch_, true);
    PrefixHeader h;
    h.position = static_cast<uint64_t>(scratch_.position);
    h.kda_floats = scratch_.kda.size();
    h.row_floats = scratch_.rows.size();
    h.identity = identity_;
    h.tag = prefix_tag(key_, h, scratch_.ids.data(), scratch_.kda.data(), scratch_.rows.data());
    const uint64_t size =
        sizeof h + h.position * sizeof(int64_t) + (h.kda_floats + h.row_floats) * sizeof(float);
    if (size > max_bytes_) return false;  // never fits: not written
    char name[64];
    std::snprintf(
        name, sizeof name, "%s%016llx.bin", kPrefixStem,
        static_cast<unsigned long long>(siphash24(key_, ids.data(), ids.size() * sizeof(int64_t))));
    Entry e;
    e.path = dir_ + "/" + name;
    write_file_atomic(e.path,
                      {ByteSpan{&h, sizeof h},
                       ByteSpan{scratch_.ids.data(), scratch_.ids.size() * sizeof(int64_t)},
                       ByteSpan{scratch_.kda.data(), scratch_.kda.size() * sizeof(float)},
                       ByteSpan{scratch_.rows.data(), scratch_.rows.size() * sizeof(float)}},
                      0600, true);
    e.ids = ids;
    e.bytes = size;
    e.stamp = ++clock_;
    entries_.push_back(std::move(e));
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "[K3-PREFIX] prefix at position %lld not cached: %s\n",
                 static_cast<long long>(session.position()), ex.what());
    return false;
  }
  ++counters_.saves;
  evict();
  return true;
}

bool PrefixCache::read(const Entry& entry, size_t kda_floats, size_t row_floats, SavedState& out,
                       std::string& why) const {
  try {
    std::unique_ptr<File> file = open_posix_file(entry.path);
    PrefixHeader h;
    const uint64_t position = entry.ids.size();
    if (file->size() < sizeof h) return why = "shorter than its header", false;
    file->read_exact(&h, sizeof h, 0, "prefix cache header");
    if (h.magic != kMagic || h.version != kPrefixVersion || h.identity != identity_ ||
        h.position != position)
      return why = "its header changed since the start", false;
    if (h.kda_floats != kda_floats || h.row_floats != position * row_floats)
      return why = "its state sizes do not match this engine", false;
    if (file->size() !=
        sizeof h + position * sizeof(int64_t) + (h.kda_floats + h.row_floats) * sizeof(float))
      return why = "size does not match its header (truncated?)", false;
    out.position = static_cast<int64_t>(position);
    out.ids.resize(position);
    out.kda.resize(h.kda_floats);
    out.rows.resize(h.row_floats);
    uint64_t at = sizeof h;
    file->read_exact(out.ids.data(), position * sizeof(int64_t), at, "prefix cache ids");
    at += position * sizeof(int64_t);
    file->read_exact(out.kda.data(), h.kda_floats * sizeof(float), at, "prefix cache state");
    at += h.kda_floats * sizeof(float);
    file->read_exact(out.rows.data(), h.row_floats * sizeof(float), at, "prefix cache rows");
    if (out.ids != entry.ids) return why = "its ids changed since the start", false;
    if (prefix_tag(key_, h, out.ids.data(), out.kda.data(), out.rows.data()) != h.tag)
      return why = "its keyed tag does not match (damaged, or not written by this cache)", false;
  } catch (const std::exception& ex) {
    why = ex.what();
    return false;
  }
  return true;
}

int64_t PrefixCache::restore_best(Session& session, std::span<const int64_t> prompt,
                                  int64_t deeper_than) {
  for (;;) {
    int best = -1;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const std::vector<int64_t>& ids = entries_[i].ids;
      const int64_t p = static_cast<int64_t>(ids.size());
      if (p <= deeper_than || p >= static_cast<int64_t>(prompt.size()) || p > session.capacity())
        continue;
      if (!std::equal(ids.begin(), ids.end(), prompt.begin())) continue;
      if (best < 0 || p > static_cast<int64_t>(entries_[static_cast<size_t>(best)].ids.size()))
        best = static_cast<int>(i);
    }
    if (best < 0) return 0;
    Entry& entry = entries_[static_cast<size_t>(best)];
    std::string why;
    if (!read(entry, session.state_floats(), session.row_floats(), scratch_, why)) {
      ++counters_.rejected;
      drop(static_cast<size_t>(best), ("refused and removed: " + why).c_str());
      continue;
    }
    session.restore_state(scratch_);
    entry.stamp = ++clock_;
    ::utimensat(AT_FDCWD, entry.path.c_str(), nullptr, 0);
    ++counters_.restores;
    return static_cast<int64_t>(entry.ids.size());
  }
}

}  // namespace k3

// checkpoints_test — the disk checkpoint store's directory and its keyed tags (issue 16,
// defect 5; docs/serving.md §3.10.4): the directory given is never chmod-ed, the files go to a
// private 0700 subdirectory of it, a directory other users may write to is refused unless it is
// sticky, and a file changed or swapped in — even with a checksum recomputed to match — is
// rejected on restore instead of trusted. Also the slot policy for kept checkpoints (protect()).
#include "engine/checkpoints.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "test_util.h"
#include "util/error.h"
#include "util/hash.h"

namespace k3 {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

const Engine& tiny_engine() {
  static const Engine engine(testing::kTinyDir, LoadOptions{});
  return engine;
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<unsigned>(st.st_mode & 07777);
}

CheckpointPolicy disk(const std::string& dir) {
  CheckpointPolicy p;
  p.slots = 2;
  p.dir = dir;
  return p;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(CheckpointDir, AnExistingDirectoryIsNeverChmodedAndTheFilesGoToAPrivateSubdirectory) {
  const testing::TempDir root("ckpt-dir");
  const std::string dir = root.file("shared");
  fs::create_directory(dir);
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  std::string sub;
  {
    CheckpointStore store(disk(dir));
    EXPECT_EQ(mode_of(dir), 0755u) << "the directory the user named was changed";
    sub = store.files_dir();
    EXPECT_EQ(fs::path(sub).parent_path(), fs::path(dir));
    EXPECT_EQ(mode_of(sub), 0700u);
    EXPECT_EQ(fs::path(store.slot_path(0)).parent_path(), fs::path(sub));
    EXPECT_HAS(store.describe(), sub);
    Session s(tiny_engine(), 16);
    const std::vector<int64_t> ids = {1, 2, 3};
    s.prefill(ids);
    ASSERT_TRUE(store.save(s));
    EXPECT_EQ(mode_of(store.slot_path(0)), 0600u);
    // A second store (another server on the same directory) gets a subdirectory of its own.
    CheckpointStore other(disk(dir));
    EXPECT_NE(other.files_dir(), sub);
  }
  EXPECT_FALSE(fs::exists(sub)) << "the private subdirectory outlived its store";
  EXPECT_TRUE(fs::exists(dir));
  EXPECT_EQ(mode_of(dir), 0755u);
}

TEST(CheckpointDir, ADirectoryOthersCanWriteIsRefusedUnlessSticky) {
  const testing::TempDir root("ckpt-open");
  const std::string dir = root.file("open");
  fs::create_directory(dir);
  for (const unsigned mode : {0777u, 0775u, 0757u}) {
    ASSERT_EQ(::chmod(dir.c_str(), mode), 0);
    const std::string msg = error_of([&] { CheckpointStore store(disk(dir)); });
    EXPECT_HAS(msg, dir);
    EXPECT_HAS(msg, "writable by other users");
    EXPECT_EQ(mode_of(dir), mode) << "refused, and still not chmod-ed";
    EXPECT_TRUE(fs::is_empty(dir));
  }
  // Sticky (like /tmp): nobody else can rename or remove what we create; accepted with a warning.
  ASSERT_EQ(::chmod(dir.c_str(), 01777), 0);
  {
    CheckpointStore store(disk(dir));
    EXPECT_EQ(mode_of(dir), 01777u);
    EXPECT_EQ(mode_of(store.files_dir()), 0700u);
  }
  EXPECT_TRUE(fs::is_empty(dir));
  // Not a directory at all.
  spit(root.file("file"), "x");
  EXPECT_HAS(error_of([&] { CheckpointStore store(disk(root.file("file"))); }), "not a directory");
}

// `coli serve --ckpt-dir` naming a refused directory stops the start before the model loads, and
// says what failed: the checkpoint directory, not "cannot load <model>" (issue 28, item 11).
TEST(CheckpointDir, ColiServeNamesARefusedDirectoryNotALoadFailure) {
  const testing::TempDir root("ckpt-serve");
  const std::string file = root.file("file"), open = root.file("open");
  spit(file, "x");
  fs::create_directory(open);
  ASSERT_EQ(::chmod(open.c_str(), 0777), 0);
  const std::string coli = std::string(K3_BINARY_DIR) + "/apps/coli serve " + K3_SOURCE_DIR +
                           "/tests/data/k3-tiny --port 0 --ckpt-dir ";
  for (const auto& [dir, why] :
       {std::pair<std::string, std::string>{file, "the checkpoint directory is not a directory"},
        {open, "the checkpoint directory is writable by other users (mode 0777)"}}) {
    const testing::CommandResult r = testing::run_split("timeout 60 " + coli + dir);
    EXPECT_EQ(r.status, 3) << r.err;
    EXPECT_HAS(r.err, "coli: checkpoint directory (--ckpt-dir): " + dir + ": " + why);
    EXPECT_EQ(r.err.find("cannot load"), std::string::npos) << r.err;
  }
}

// Two checkpoints at the same position after different ids, each in its own slot.
struct TwoPhotos {
  const testing::TempDir root{"ckpt-mac"};
  CheckpointStore store{disk(root.path())};
  Session session{tiny_engine(), 16};
  const std::vector<int64_t> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
  TwoPhotos() {
    session.prefill(a);
    EXPECT_TRUE(store.save(session));
    session.reset();
    session.prefill(b);
    EXPECT_TRUE(store.save(session));
  }
  // Restores for the prompt a + [9] with the session's record at a (so slot 0 is usable).
  int64_t restore_a() {
    session.reset();
    session.prefill(a);
    const std::vector<int64_t> prompt = {1, 2, 3, 4, 9};
    return store.restore_best(session, prompt, 4);
  }
};

TEST(CheckpointMac, UntouchedFilesRestore) {
  TwoPhotos t;
  EXPECT_EQ(t.restore_a(), 4);
  EXPECT_EQ(t.store.counters().rejected, 0);
}

TEST(CheckpointMac, AFileSwappedInFromAnotherSlotIsRejected) {
  TwoPhotos t;
  // b's state in a's slot: same position, same size, an intact header and payload.
  spit(t.store.slot_path(0), slurp(t.store.slot_path(1)));
  EXPECT_EQ(t.restore_a(), 0) << "a swapped checkpoint was trusted";
  EXPECT_EQ(t.store.counters().rejected, 1);
}

TEST(CheckpointMac, AnEditWithItsChecksumRecomputedIsRejected) {
  TwoPhotos t;
  std::string bytes = slurp(t.store.slot_path(0));
  constexpr size_t kHeader = 40;  // magic, version, position, float count, tag (u64 each)
  ASSERT_GT(bytes.size(), kHeader + 64);
  bytes[kHeader + 17] ^= 0x40;
  // Whatever unkeyed checksum the last header word held, an editor can recompute it.
  const uint64_t fnv = fnv1a_64_bytes(bytes.data() + kHeader, bytes.size() - kHeader);
  std::memcpy(bytes.data() + 32, &fnv, sizeof fnv);
  spit(t.store.slot_path(0), bytes);
  EXPECT_EQ(t.restore_a(), 0) << "an edited checkpoint was trusted";
  EXPECT_EQ(t.store.counters().rejected, 1);
}

// Kept checkpoints (CheckpointStore::protect, what coli chat asks for through
// ServiceRequest::keep): a checkpoint not kept never evicts a kept one, kept ones replace the least
// recently used of the others, and the set is per prompt (a new set releases the old one).
TEST(CheckpointKeep, ACheckpointNotKeptNeverEvictsAKeptOne) {
  CheckpointPolicy ram;
  ram.slots = 2;
  CheckpointStore store(ram);
  Session session(tiny_engine(), 16);
  const std::vector<int64_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int64_t> keep = {2, 4};
  store.protect(keep, prompt);
  auto feed_to = [&](int64_t position) {
    const int64_t from = session.position();
    session.prefill(
        std::span(prompt).subspan(static_cast<size_t>(from), static_cast<size_t>(position - from)));
  };
  auto held = [&](int64_t position) {
    return store.holds(position, std::span(prompt).first(static_cast<size_t>(position)));
  };
  feed_to(1);
  EXPECT_TRUE(store.save(session));  // an empty slot
  feed_to(2);
  EXPECT_TRUE(store.save(session));  // kept, into the other empty slot
  feed_to(4);
  EXPECT_TRUE(store.save(session));  // kept: replaces the one at 1, which is not
  EXPECT_FALSE(held(1));
  feed_to(6);
  EXPECT_FALSE(store.save(session)) << "a checkpoint not kept evicted a kept one";
  EXPECT_TRUE(held(2));
  EXPECT_TRUE(held(4));
  // Kept positions of another prompt: the old ones are plain LRU again (the one at 2 is older).
  const std::vector<int64_t> keep6 = {6};
  store.protect(keep6, prompt);
  EXPECT_TRUE(store.save(session));
  EXPECT_TRUE(held(6));
  EXPECT_FALSE(held(2));
  EXPECT_TRUE(held(4));
  // Every slot kept and a kept one to save: the least recently used kept one goes.
  const std::vector<int64_t> keep_all = {4, 6, 8};
  store.protect(keep_all, prompt);
  feed_to(8);
  EXPECT_TRUE(store.save(session));
  EXPECT_TRUE(held(8));
  EXPECT_FALSE(held(4));
  EXPECT_TRUE(held(6));
}

}  // namespace
}  // namespace k3

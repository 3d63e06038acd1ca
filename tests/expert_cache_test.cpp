// The routed-expert cache over fake and real files: eviction order, pins, tiny budgets, the RAM
// clamp, the routing history (load, save, refusal, malformed lines), read errors surfacing as
// k3::Error naming the expert, O_DIRECT alignment, and streaming logits identical to resident.
#include "experts/expert_cache.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/engine.h"
#include "engine/internal.h"
#include "io/file.h"
#include "io/safetensors_writer.h"
#include "synth_lib.h"
#include "test_util.h"
#include "util/error.h"

namespace {

using k3::ExpertCache;
using k3::testing::TempDir;

constexpr int64_t kExperts = 8;
const k3::ExpertGeometry kGeometry{32, 32};  // 1632 bytes per expert

uint8_t expert_byte(int64_t layer, int64_t expert, int tensor, uint64_t k) {
  return static_cast<uint8_t>((layer * 31 + expert * 7 + tensor * 3 + static_cast<int64_t>(k)) %
                              200);
}

std::string tensor_name(int64_t layer, int64_t expert, int tensor) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "l%lld.e%lld.t%d", static_cast<long long>(layer),
                static_cast<long long>(expert), tensor);
  return buf;
}

// A shard holding experts of `layers` (kExperts each), after a `lead`-byte pad tensor.
std::string write_shard(const std::string& path, const std::vector<int64_t>& layers, int64_t lead) {
  k3::SafetensorsWriter w;
  if (lead > 0)
    w.add("pad", k3::DType::kU8, {lead},
          [](uint8_t* d, uint64_t, uint64_t n) { std::memset(d, 1, n); });
  const uint64_t sizes[6] = {kGeometry.gate_packed_bytes(), kGeometry.gate_scale_bytes(),
                             kGeometry.down_packed_bytes(), kGeometry.down_scale_bytes(),
                             kGeometry.gate_packed_bytes(), kGeometry.gate_scale_bytes()};
  for (int64_t l : layers)
    for (int64_t e = kExperts - 1; e >= 0; --e)  // not in id order on disk
      for (int i = 0; i < 6; ++i)
        w.add(tensor_name(l, e, i), k3::DType::kU8, {static_cast<int64_t>(sizes[i])},
              [=](uint8_t* d, uint64_t, uint64_t n) {
                for (uint64_t k = 0; k < n; ++k) d[k] = expert_byte(l, e, i, k);
              });
  w.write(path);
  return path;
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

struct Fixture {
  std::unique_ptr<k3::SafetensorsShard> shard;
  k3::ExpertStore store{kGeometry};
  std::vector<int64_t> layers;
  // `file` replaces the shard's file (fakes); default: a MemFile of the written bytes.
  Fixture(const std::string& dir, std::vector<int64_t> moe_layers, int64_t fail_expert = -1,
          int64_t fail_layer = -1, bool posix = false, int64_t lead = 0)
      : layers(std::move(moe_layers)) {
    const std::string path = write_shard(dir + "/experts.safetensors", layers, lead);
    if (posix) {
      shard = std::make_unique<k3::SafetensorsShard>(k3::open_posix_file(path));
    } else {
      std::vector<uint8_t> bytes = file_bytes(path);
      int64_t fail_at = -1;
      if (fail_expert >= 0) {
        const k3::SafetensorsShard probe(std::make_unique<k3::MemFile>(path, bytes));
        fail_at = static_cast<int64_t>(
            probe.find(tensor_name(fail_layer, fail_expert, 3))->file_offset + 5);
      }
      shard = std::make_unique<k3::SafetensorsShard>(
          std::make_unique<k3::MemFile>(path, std::move(bytes), fail_at));
    }
    for (int64_t l : layers)
      for (int64_t e = 0; e < kExperts; ++e) {
        k3::ExpertTensors t;
        for (int i = 0; i < 6; ++i) {
          t[static_cast<size_t>(i)].shard = shard.get();
          t[static_cast<size_t>(i)].info = shard->find(tensor_name(l, e, i));
        }
        store.add(l, e, t);
      }
  }
  // The budget for `slots` slots in every layer.
  double gb_for(int64_t slots) const {
    return static_cast<double>(store.slot_bytes() * layers.size() * static_cast<uint64_t>(slots)) /
           1e9;
  }
};

// A cache's options and the facts beside them.
struct CacheConfig {
  k3::CacheOptions options;
  k3::ExpertCacheSetup setup;
  // The setup for the fixture's MoE layers.
  k3::ExpertCacheSetup over(const std::vector<int64_t>& layers) const {
    k3::ExpertCacheSetup s = setup;
    s.moe_layers = layers;
    s.num_experts = kExperts;
    return s;
  }
};

CacheConfig quiet(std::vector<std::string>* notes = nullptr) {
  CacheConfig o;
  o.setup.memory_limit = int64_t{1} << 40;
  o.options.pin = false;
  o.setup.note = [notes](const std::string& line) {
    if (notes) notes->push_back(line);
  };
  return o;
}

void expect_bytes(const k3::ExpertView& v, int64_t layer, int64_t expert) {
  for (uint64_t k = 0; k < kGeometry.gate_packed_bytes(); ++k)
    ASSERT_EQ(v.gate_packed[k], expert_byte(layer, expert, 0, k));
  for (uint64_t k = 0; k < kGeometry.down_scale_bytes(); ++k)
    ASSERT_EQ(v.down_scale[k], expert_byte(layer, expert, 3, k));
  for (uint64_t k = 0; k < kGeometry.gate_scale_bytes(); ++k)
    ASSERT_EQ(v.up_scale[k], expert_byte(layer, expert, 5, k));
}

void touch(ExpertCache& cache, int64_t layer, std::vector<int64_t> ids,
           ExpertCache::Use use = ExpertCache::Use::kToken) {
  k3::ExpertBatch batch;
  cache.acquire(layer, ids, use, batch);
  ASSERT_EQ(batch.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) expect_bytes(batch.view(i), layer, ids[i]);
}

TEST(ExpertCache, LruEvictionOrderWithinALayer) {
  TempDir dir("cache-lru");
  Fixture f(dir.path(), {1, 2});
  CacheConfig o = quiet();
  o.options.expert_gb = f.gb_for(3);
  ExpertCache cache(f.store, o.options, o.over(f.layers));
  ASSERT_EQ(cache.slots_per_layer(), 3);
  touch(cache, 1, {0});
  touch(cache, 1, {1});
  touch(cache, 1, {2});
  EXPECT_EQ(cache.cached(1), (std::vector<int64_t>{2, 1, 0}));
  touch(cache, 1, {0});  // hit: 0 becomes most recent
  touch(cache, 1, {3});  // evicts 1, the least recent
  EXPECT_EQ(cache.cached(1), (std::vector<int64_t>{3, 0, 2}));
  EXPECT_TRUE(cache.cached(2).empty());  // layers do not share slots
  const k3::ExpertCacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 4u);
  EXPECT_EQ(s.bytes_read, 4 * kGeometry.expert_bytes());
}

// Exclusive caching with a device tier (set_held_elsewhere, docs/vulkan.md §5): the slot whose
// expert the device holds is given up first, not the least recent one.
TEST(ExpertCache, ExpertHeldElsewhereIsEvictedFirst) {
  TempDir dir("cache-held");
  Fixture f(dir.path(), {1, 2});
  CacheConfig o = quiet();
  o.options.expert_gb = f.gb_for(3);
  ExpertCache cache(f.store, o.options, o.over(f.layers));
  cache.set_held_elsewhere([](int64_t layer, int64_t expert) { return layer == 1 && expert == 2; });
  touch(cache, 1, {0});
  touch(cache, 1, {1});
  touch(cache, 1, {2});
  touch(cache, 1, {3});  // evicts 2 (held by the device), not 0 (the least recent)
  EXPECT_EQ(cache.cached(1), (std::vector<int64_t>{3, 1, 0}));
  cache.set_held_elsewhere(nullptr);
  touch(cache, 1, {4});  // plain LRU again: 0 goes
  EXPECT_EQ(cache.cached(1), (std::vector<int64_t>{4, 3, 1}));
}

TEST(ExpertCache, TinyBudgetKeepsOneSlotAndServesWholeBatches) {
  TempDir dir("cache-tiny");
  Fixture f(dir.path(), {1, 2, 3});
  CacheConfig o = quiet();
  o.options.expert_gb = 0.000001;
  ExpertCache cache(f.store, o.options, o.over(f.layers));
  EXPECT_EQ(cache.slots_per_layer(), 1);
  // Four experts of one token, one slot: all four stay valid while the batch runs.
  touch(cache, 2, {5, 1, 7, 3});
  EXPECT_EQ(cache.cached(2).size(), 1u);
  EXPECT_EQ(cache.stats().transient, 3u);
  touch(cache, 2, {5, 1, 7, 3});
}

TEST(ExpertCache, PrefillMissesEnterAtTheTailAndDoNotFlushDecode) {
  TempDir dir("cache-prefill");
  Fixture f(dir.path(), {1});
  CacheConfig o = quiet();
  o.options.expert_gb = f.gb_for(3);
  ExpertCache cache(f.store, o.options, o.over(f.layers));
  touch(cache, 1, {0, 1});  // the decode working set
  touch(cache, 1, {4, 5, 6, 7}, ExpertCache::Use::kChunk);
  std::vector<int64_t> have = cache.cached(1);
  EXPECT_EQ(have.size(), 3u);
  EXPECT_EQ(have[0], 1);
  EXPECT_EQ(have[1], 0);  // still there
  touch(cache, 1, {6, 2},
        ExpertCache::Use::kChunk);  // 6 was one-off: only the probation slot turns over
  have = cache.cached(1);
  EXPECT_NE(std::find(have.begin(), have.end(), 0), have.end());
  EXPECT_NE(std::find(have.begin(), have.end(), 1), have.end());
}

TEST(ExpertCache, BudgetClampedToMemoryAndRefusedBelowOneSlot) {
  TempDir dir("cache-clamp");
  Fixture f(dir.path(), {1, 2});
  std::vector<std::string> notes;
  CacheConfig o = quiet(&notes);
  o.options.expert_gb = 100;
  o.setup.memory_limit = static_cast<int64_t>(f.store.slot_bytes() * 2 * 5);
  ExpertCache cache(f.store, o.options, o.over(f.layers));
  EXPECT_EQ(cache.slots_per_layer(), 5);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("K3_EXPERT_GB=100"), std::string::npos) << notes[0];
  o.setup.memory_limit =
      static_cast<int64_t>(f.store.slot_bytes());  // less than one slot per layer
  EXPECT_THROW(ExpertCache(f.store, o.options, o.over(f.layers)), k3::Error);
}

TEST(ExpertCache, ReadErrorsNameFileLayerAndExpert) {
  TempDir dir("cache-eio");
  Fixture f(dir.path(), {1, 2}, /*fail_expert=*/6, /*fail_layer=*/2);
  CacheConfig o = quiet();
  o.options.expert_gb = f.gb_for(2);
  for (bool pipe : {true, false}) {
    o.options.pipe = pipe;
    ExpertCache cache(f.store, o.options, o.over(f.layers));
    k3::ExpertBatch batch;
    try {
      // Piped: the error surfaces at the failed expert's view (on this thread); else at acquire.
      cache.acquire(2, std::vector<int64_t>{1, 6}, ExpertCache::Use::kToken, batch);
      EXPECT_TRUE(pipe);
      expect_bytes(batch.view(0), 2, 1);
      batch.view(1);
      FAIL() << "no error";
    } catch (const k3::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("experts.safetensors"), std::string::npos) << m;
      EXPECT_NE(m.find("expert 6 of layer 2"), std::string::npos) << m;
      EXPECT_NE(m.find("Input/output error"), std::string::npos) << m;
    }
    if (!pipe) {
      EXPECT_EQ(batch.size(), 0u);
    }
    batch.release();
    EXPECT_EQ(cache.cached(2), std::vector<int64_t>{1});  // the failed read was not kept
    touch(cache, 2, {1, 0});                              // the cache is still usable
    touch(cache, 1, {6});
    EXPECT_THROW(touch(cache, 2, {6}), k3::Error);  // and the failure is not cached either
  }
}

TEST(ExpertCache, ShrunkFileIsAShortReadErrorBothWays) {
  for (bool direct : {true, false}) {
    TempDir dir("cache-shrink");
    Fixture f(dir.path(), {1}, -1, -1, /*posix=*/true, /*lead=*/4093);
    const k3::TensorInfo* last = f.shard->find(tensor_name(1, 0, 0));  // written last
    std::filesystem::resize_file(dir.file("experts.safetensors"), last->file_offset + 100);
    CacheConfig o = quiet();
    o.options.direct = direct;
    ExpertCache cache(f.store, o.options, o.over(f.layers));
    k3::ExpertBatch batch;
    try {
      cache.acquire(1, std::vector<int64_t>{0}, ExpertCache::Use::kToken, batch);
      batch.view(0);
      FAIL() << "no error";
    } catch (const k3::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("short read"), std::string::npos) << m;
      EXPECT_NE(m.find("expert 0 of layer 1"), std::string::npos) << m;
    }
  }
}

TEST(ExpertCache, DirectReadsAreByteExactAtUnalignedOffsetsAndAtEndOfFile) {
  for (int64_t lead : {0, 1, 4093, 4096, 5000}) {
    TempDir dir("cache-direct");
    Fixture f(dir.path(), {1, 2}, -1, -1, /*posix=*/true, lead);
    for (int variant = 0; variant < 4; ++variant) {
      const bool direct = variant % 2 == 0;
      CacheConfig o = quiet();
      o.options.direct = direct;
      o.options.io_engine = variant < 2 ? "uring" : "threads";
      o.setup.read_extent_bytes = 4096;  // experts split over several extents in flight
      o.options.expert_gb = f.gb_for(kExperts);
      ExpertCache cache(f.store, o.options, o.over(f.layers));
      for (int64_t l : f.layers)
        touch(cache, l, {0, 1, 2, 3, 4, 5, 6, 7});  // expert 0 of layer 2 ends the file
      EXPECT_EQ(cache.stats().misses, 16u);
    }
  }
}

TEST(ExpertCache, HistoryRoundTripPinsAndRefusals) {
  TempDir dir("cache-history");
  Fixture f(dir.path(), {1, 2});
  const std::string path = dir.file(".coli_usage");
  CacheConfig o = quiet();
  o.options.expert_gb = f.gb_for(4);
  o.setup.history_path = o.setup.history_save_path = path;
  o.setup.history_layers = 3;
  o.setup.model_identity = "model A";
  {
    ExpertCache cache(f.store, o.options, o.over(f.layers));
    for (int i = 0; i < 100000; ++i) {
      cache.record(1, std::vector<int64_t>{3, 5});
      cache.record(2, std::vector<int64_t>{7});
    }
    EXPECT_TRUE(cache.save_history());
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const std::string text = k3::read_text_file(path);
  EXPECT_EQ(text.rfind("-1 3 8\n-2 1 ", 0), 0u) << text;
  EXPECT_NE(text.find("\n1 3 100000\n1 5 100000\n2 7 100000\n"), std::string::npos) << text;
  {
    o.options.pin = true;
    ExpertCache cache(f.store, o.options, o.over(f.layers));
    EXPECT_EQ(cache.history_total(), 300000u);
    EXPECT_EQ(cache.pinned(1), 2);  // half of 4 slots, the two most used
    EXPECT_EQ(cache.pinned(2), 1);
    EXPECT_EQ(cache.stats().misses, 0u);  // start-up reads are not counted
    for (int64_t e : {0, 1, 2, 4, 6, 7}) touch(cache, 1, {e});
    const std::vector<int64_t> have = cache.cached(1);
    EXPECT_NE(std::find(have.begin(), have.end(), 3), have.end());
    EXPECT_NE(std::find(have.begin(), have.end(), 5), have.end());
  }
  {
    // Another model's file: refused, counted as nothing, never overwritten.
    std::vector<std::string> notes;
    CacheConfig other = o;
    other.setup.note = [&](const std::string& l) { notes.push_back(l); };
    other.setup.model_identity = "model B";
    ExpertCache cache(f.store, other.options, other.over(f.layers));
    EXPECT_EQ(cache.history_total(), 0u);
    EXPECT_EQ(cache.pinned(1), 0);
    ASSERT_FALSE(notes.empty());
    EXPECT_NE(notes[0].find("refused"), std::string::npos) << notes[0];
    cache.record(1, std::vector<int64_t>{0});
    EXPECT_FALSE(cache.save_history());
    EXPECT_EQ(k3::read_text_file(path), text);
    other.setup.model_identity = "model A";
    other.setup.history_layers = 4;  // other geometry
    notes.clear();
    ExpertCache geometry(f.store, other.options, other.over(f.layers));
    EXPECT_EQ(geometry.history_total(), 0u);
    ASSERT_FALSE(notes.empty());
  }
  {
    // Malformed lines are skipped with one note; the rest is kept.
    std::ofstream(path) << text << "1 2\n1 2 3 4\nx y z\n9 1 1\n1 99 1\n1 2 -5\n-7 1 1\n1 2 10\n";
    std::vector<std::string> notes;
    CacheConfig o2 = o;
    o2.options.pin = false;
    o2.setup.note = [&](const std::string& l) { notes.push_back(l); };
    ExpertCache cache(f.store, o2.options, o2.over(f.layers));
    EXPECT_EQ(cache.history_total(), 300010u);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_NE(notes[0].find("6 malformed"), std::string::npos) << notes[0];
  }
  {
    // An empty history is a zero-byte file.
    std::ofstream(path).close();
    ExpertCache cache(f.store, o.options, o.over(f.layers));
    EXPECT_EQ(cache.history_total(), 0u);
  }
}

TEST(ExpertCache, PrefetchStagesReadsWithoutEvictingAndCountsRecall) {
  TempDir dir("cache-prefetch");
  Fixture f(dir.path(), {1, 2}, -1, -1, /*posix=*/true, /*lead=*/777);
  CacheConfig o = quiet();
  o.options.expert_gb = f.gb_for(3);
  ExpertCache cache(f.store, o.options, o.over(f.layers));
  touch(cache, 1, {0, 1});
  const std::vector<int64_t> before = cache.cached(1);
  cache.prefetch(1, std::vector<int64_t>{2, 3, 0});  // 0 is cached: not read again
  EXPECT_EQ(cache.stats().prefetch_issued, 2u);
  EXPECT_EQ(cache.cached(1), before);           // staged reads evict nothing
  cache.routed(1, std::vector<int64_t>{5, 2});  // 3 was a wrong guess: cancelled
  touch(cache, 1, {2, 5});                      // 2 was read ahead, 5 was not predicted
  k3::ExpertCacheStats s = cache.stats();
  EXPECT_EQ(s.prefetch_used, 1u);
  EXPECT_EQ(s.predicted_total, 2u);
  EXPECT_EQ(s.predicted_hits, 1u);
  EXPECT_EQ(s.misses, 5u);  // 0, 1, then 2 and 3 read ahead, then 5
  cache.finish_layer(1);
  touch(cache, 1, {3});
  s = cache.stats();
  EXPECT_EQ(s.prefetch_used, 1u);
  EXPECT_EQ(s.predicted_total, 2u);  // no prediction for this step
  EXPECT_EQ(s.misses, 6u);           // a dropped guess is read again when really needed
  // A new prediction replaces the old one (its reads are dropped, not waited for).
  std::vector<int64_t> many;
  for (int64_t e = 0; e < kExperts; ++e) many.push_back(e);
  cache.prefetch(2, many);
  cache.prefetch(2, std::vector<int64_t>{4});
  cache.routed(2, std::vector<int64_t>{4, 6});
  touch(cache, 2, {4, 6});
  s = cache.stats();
  EXPECT_EQ(s.prefetch_used, 2u);
  EXPECT_EQ(s.predicted_hits, 2u);
  EXPECT_EQ(s.predicted_total, 4u);
  EXPECT_GT(s.busy_seconds, 0.0);
  const std::vector<ExpertCache::LayerRecall> by_layer = cache.recall_by_layer();
  ASSERT_EQ(by_layer.size(), 2u);
  EXPECT_EQ(by_layer[0].layer, 1);
  EXPECT_EQ(by_layer[0].predicted_hits, 1u);
  EXPECT_EQ(by_layer[1].predicted_total, 2u);
  cache.finish_layer(2);
}

TEST(ExpertCache, SharedInFlightReadsAndSlotsHeldByAnotherBatch) {
  TempDir dir("cache-shared");
  Fixture f(dir.path(), {1}, -1, -1, /*posix=*/true, /*lead=*/4096);
  CacheConfig o = quiet();
  o.options.expert_gb = f.gb_for(1);
  ExpertCache cache(f.store, o.options, o.over(f.layers));
  k3::ExpertBatch a, b;
  cache.acquire(1, std::vector<int64_t>{2, 3}, ExpertCache::Use::kToken, a);
  cache.acquire(1, std::vector<int64_t>{3, 4}, ExpertCache::Use::kToken, b);  // 3 is read once
  EXPECT_EQ(cache.stats().misses, 3u);
  expect_bytes(b.view(0), 1, 3);
  expect_bytes(a.view(1), 1, 3);
  expect_bytes(a.view(0), 1, 2);  // arrived (only an arrived miss is promoted)
  a.release();                    // promotes 2 into the only slot
  EXPECT_EQ(cache.cached(1), std::vector<int64_t>{2});
  k3::ExpertBatch c;
  cache.acquire(1, std::vector<int64_t>{2}, ExpertCache::Use::kToken, c);  // holds the slot
  b.release();  // 3 and 4 cannot take a held slot
  EXPECT_EQ(cache.cached(1), std::vector<int64_t>{2});
  expect_bytes(c.view(0), 1, 2);
  EXPECT_EQ(cache.stats().transient, 2u);  // 3 and 4 could not take the held slot
}

TEST(ExpertCache, RefusedBatchHoldsNothing) {
  TempDir dir("cache-refused");
  Fixture f(dir.path(), {1});
  ExpertCache cache(f.store, quiet().options, quiet().over(f.layers));
  {
    k3::ExpertBatch batch;
    EXPECT_THROW(cache.acquire(0, std::vector<int64_t>{1}, ExpertCache::Use::kToken, batch),
                 k3::Error);  // dense layer
    EXPECT_EQ(batch.size(), 0u);
    EXPECT_THROW(
        cache.acquire(1, std::vector<int64_t>{1, kExperts}, ExpertCache::Use::kToken, batch),
        k3::Error);
    EXPECT_EQ(batch.size(), 0u);
    cache.acquire(1, std::vector<int64_t>{1}, ExpertCache::Use::kToken, batch);  // still usable
    expect_bytes(batch.view(0), 1, 1);
  }  // and destroyed without throwing
  EXPECT_THROW(cache.routed(0, std::vector<int64_t>{1}), k3::Error);
}

TEST(ExpertCache, HistoryDecayRoundsAndKeepsOnes) {
  EXPECT_EQ(k3::decayed(100000, 0.5), 50000u);
  EXPECT_EQ(k3::decayed(3, 0.5), 2u);  // 1.5 rounds half away from zero
  EXPECT_EQ(k3::decayed(1, 0.01), 1u);
  EXPECT_EQ(k3::decayed(0, 0.5), 0u);
  EXPECT_EQ(k3::decayed(7, 1.0), 7u);
  TempDir dir("cache-decay");
  Fixture f(dir.path(), {1});
  CacheConfig o = quiet();
  o.setup.history_save_path = dir.file(".coli_usage");
  o.options.usage_decay = 0.99;
  ExpertCache cache(f.store, o.options, o.over(f.layers));
  for (int i = 0; i < 1000; ++i) cache.record(1, std::vector<int64_t>{2});
  cache.record(1, std::vector<int64_t>{5});
  ASSERT_TRUE(cache.save_history());
  const std::string text = k3::read_text_file(o.setup.history_save_path);
  EXPECT_NE(text.find("\n1 2 990\n1 5 1\n"), std::string::npos) << text;
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return static_cast<unsigned>(st.st_mode & 07777);
}

// Where locate_history puts the history for the state directory `state` (a model directory that
// does not matter: only its name is hashed).
k3::ExpertCacheSetup located(const std::string& state) {
  k3::CacheOptions options;
  options.state_dir = state;
  k3::ExpertCacheSetup setup;
  k3::locate_history(options, "/nonexistent-model", &setup);
  return setup;
}

// K3_STATE_DIR / --state-dir naming an existing directory never changes its mode (issue 28: a
// shared 1777 directory was set to 0700, locking every other user out): one only its owner may
// write to is used as it is, a shared sticky one gets a private 0700 subdirectory of ours, one
// others may write to without the sticky bit is refused with the reason; a missing one is created
// 0700; the history file is 0600.
TEST(StateDir, AnExistingDirectoryKeepsItsMode) {
  TempDir root("state-dir");
  const std::string own = root.file("own"), shared = root.file("shared"), open = root.file("open"),
                    fresh = root.file("fresh/state");
  for (const std::string& d : {own, shared, open}) std::filesystem::create_directory(d);
  ASSERT_EQ(::chmod(own.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);
  ASSERT_EQ(::chmod(open.c_str(), 0777), 0);

  const k3::ExpertCacheSetup in_own = located(own);
  EXPECT_EQ(mode_of(own), 0755u) << "the state directory the user named was chmod-ed";
  EXPECT_EQ(std::filesystem::path(in_own.history_save_path).parent_path(),
            std::filesystem::path(own));
  EXPECT_EQ(in_own.history_unsaved, "");

  const k3::ExpertCacheSetup in_shared = located(shared);
  EXPECT_EQ(mode_of(shared), 01777u) << "the shared state directory was chmod-ed";
  const std::string sub = shared + "/kimi_k3-" + std::to_string(::geteuid());
  EXPECT_EQ(std::filesystem::path(in_shared.history_save_path).parent_path(),
            std::filesystem::path(sub));
  EXPECT_EQ(mode_of(sub), 0700u);
  EXPECT_EQ(located(shared).history_save_path, in_shared.history_save_path) << "a second run";

  const k3::ExpertCacheSetup in_open = located(open);
  EXPECT_EQ(mode_of(open), 0777u);
  EXPECT_EQ(in_open.history_save_path, "");
  EXPECT_HAS(in_open.history_unsaved, open + " is writable by other users (mode 0777)");
  EXPECT_TRUE(std::filesystem::is_empty(open));

  // A subdirectory of the shared one that is not a private directory of ours is not used.
  TempDir other("state-dir-other");
  const std::string shared2 = root.file("shared2");
  std::filesystem::create_directory(shared2);
  ASSERT_EQ(::chmod(shared2.c_str(), 01777), 0);
  std::filesystem::create_directory_symlink(other.path(),
                                            shared2 + "/kimi_k3-" + std::to_string(::geteuid()));
  const k3::ExpertCacheSetup in_link = located(shared2);
  EXPECT_EQ(in_link.history_save_path, "");
  EXPECT_HAS(in_link.history_unsaved, "is not a directory of this user closed to others");

  const k3::ExpertCacheSetup in_fresh = located(fresh);
  EXPECT_EQ(mode_of(fresh), 0700u) << "a state directory we create is private";
  EXPECT_EQ(std::filesystem::path(in_fresh.history_save_path).parent_path(),
            std::filesystem::path(fresh));

  // The history saved there is readable by its owner only.
  Fixture f(root.path(), {1});
  CacheConfig o = quiet();
  o.setup.history_save_path = in_own.history_save_path;
  ExpertCache cache(f.store, o.options, o.over(f.layers));
  cache.record(1, std::vector<int64_t>{2});
  ASSERT_TRUE(cache.save_history());
  EXPECT_EQ(mode_of(in_own.history_save_path), 0600u);
  EXPECT_EQ(mode_of(own), 0755u);
}

// End to end: a synthetic checkpoint streamed through a one-slot cache gives the logits of the
// resident run, bit for bit, token at a time and chunked.
TEST(ExpertCacheEndToEnd, OneSlotStreamingMatchesExpertsInMemory) {
  TempDir dir("cache-e2e");
  k3::synth::SynthSpec spec = k3::synth::preset_spec("tiny");
  k3::synth::apply_overrides(&spec, -1, 64);
  spec.progress = false;
  k3::synth::write_checkpoint(spec, dir.path());
  k3::LoadOptions resident;
  resident.experts_in_memory = true;
  k3::LoadOptions streamed;
  streamed.cache.expert_gb = 0.000001;
  streamed.cache.state_dir = dir.path() + "/state";
  // Read-ahead of the next layer's predicted experts and waiting for all reads change timing only.
  k3::LoadOptions ahead = streamed;
  ahead.cache.prefetch = true;
  ahead.cache.io_engine = "threads";
  k3::LoadOptions unpiped = streamed;
  unpiped.cache.pipe = false;
  const k3::Engine a(dir.path(), resident), b(dir.path(), streamed), p(dir.path(), ahead),
      u(dir.path(), unpiped);
  ASSERT_EQ(k3::internal::model(b).experts().slots_per_layer(), 1);
  std::vector<int64_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 11) % spec.vocab_size);
  for (int64_t chunk : {1, 16}) {
    k3::Session sa(a, 48), sb(b, 48);
    sa.set_prefill_chunk(chunk);
    sb.set_prefill_chunk(chunk);
    k3::Session sp(p, 48), su(u, 48);
    sp.set_prefill_chunk(chunk);
    su.set_prefill_chunk(chunk);
    const std::vector<float> la = sa.prefill(prompt), lb = sb.prefill(prompt),
                             lp = sp.prefill(prompt), lu = su.prefill(prompt);
    ASSERT_EQ(la.size(), lb.size());
    EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << "chunk " << chunk;
    EXPECT_EQ(std::memcmp(la.data(), lp.data(), la.size() * sizeof(float)), 0)
        << "prefetch, chunk " << chunk;
    EXPECT_EQ(std::memcmp(la.data(), lu.data(), la.size() * sizeof(float)), 0)
        << "unpiped, chunk " << chunk;
    for (int64_t id : {3, 1, 4}) {
      const std::vector<float> da = sa.step(id), db = sb.step(id), dp = sp.step(id);
      EXPECT_EQ(std::memcmp(da.data(), db.data(), da.size() * sizeof(float)), 0)
          << "decode, chunk " << chunk;
      EXPECT_EQ(std::memcmp(da.data(), dp.data(), da.size() * sizeof(float)), 0)
          << "decode, prefetch, chunk " << chunk;
    }
  }
  const k3::ExpertCacheStats s = k3::internal::model(b).experts().stats();
  EXPECT_GT(s.misses, 0u);
  const k3::ExpertCacheStats sp = k3::internal::model(p).experts().stats();
  EXPECT_GT(sp.prefetch_issued, 0u);
  EXPECT_GT(sp.predicted_total, 0u);
  EXPECT_STREQ(sp.io_engine, "threads");
  b.save_history();
  // Saved in the state directory, one file per model; the model directory is left untouched.
  int saved = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() + "/state"))
    saved += entry.path().extension() == ".coli_usage" ? 1 : 0;
  EXPECT_EQ(saved, 1);
  EXPECT_FALSE(std::filesystem::exists(dir.file(".coli_usage")));
}

}  // namespace

// memory_split_test — the memory a model holds (issue 33 items 1 and 2): a load writes every
// resident matrix once, in place, so the process grows by the resident weights and little more
// (no f32 copy of a matrix, no staging copy of a tensor); a session's MLA cache is resident only
// for the positions fed; and Engine::memory() splits the resident memory into parts that are
// present, add up and come back to zero with their sessions.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/internal.h"
#include "engine/sampler.h"
#include "io/model_files.h"
#include "model/config.h"
#include "model/model.h"
#include "model/state.h"
#include "test_util.h"
#include "util/sys.h"
#include "util/uninit_vector.h"

namespace {

using k3::testing::kTinyDir;

const std::string kMini = std::string(K3_SOURCE_DIR) + "/assets/k3-mini";

struct LoadFigures {
  uint64_t before = 0;    // resident bytes before the load
  uint64_t peak = 0;      // peak resident bytes after it (getrusage ru_maxrss)
  uint64_t resident = 0;  // Model::resident_bytes()
};

// Loads `dir`'s weights (default precision: int4 / int8 / int8 head) in a child process, so the
// peak is the load's alone, and returns what it measured.
LoadFigures load_in_child(const std::string& dir) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    LoadFigures f;
    f.before = k3::current_rss_bytes();
    {
      const k3::ModelFiles files(dir);
      const k3::K3Config config = k3::parse_k3_config(files.config_root(), dir + "/config.json");
      k3::ModelSetup setup;
      setup.isa = k3::best_isa();
      const k3::Model model(files, config, k3::LoadOptions{}, setup);
      f.resident = model.resident_bytes();
      f.peak = k3::peak_rss_bytes();
    }
    const ssize_t wrote = ::write(fds[1], &f, sizeof f);
    ::_exit(wrote == static_cast<ssize_t>(sizeof f) ? 0 : 1);
  }
  ::close(fds[1]);
  LoadFigures f;
  const ssize_t got = ::read(fds[0], &f, sizeof f);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(got, static_cast<ssize_t>(sizeof f));
  return f;
}

// k3-mini's lm_head is 163840 x 128: 84 MB as f32, 21 MB as int8. Loading it through an f32
// copy (or zero-filling buffers that are then overwritten, in pages freed and faulted again)
// grew the process by ~110 MB for ~23 MB of weights; written in place it grows by the weights,
// a block of scratch and the files' metadata.
TEST(MemorySplit, LoadGrowsByTheResidentWeightsOnly) {
  const LoadFigures f = load_in_child(kMini);
  ASSERT_GT(f.resident, 10u << 20);
  ASSERT_GE(f.peak, f.before);
  const uint64_t growth = f.peak - f.before;
  std::printf("k3-mini load: resident weights %.1f MB, peak growth %.1f MB\n",
              static_cast<double>(f.resident) / 1e6, static_cast<double>(growth) / 1e6);
  EXPECT_LE(growth, f.resident + f.resident / 10 + (8u << 20))
      << "the load's transient memory exceeds the resident weights by more than the margin";
}

TEST(MemorySplit, PartsArePresentAddUpAndLeaveWithTheirSessions) {
  const k3::Engine engine(kTinyDir, k3::LoadOptions{});
  const k3::MemorySplit idle = engine.memory();
  ASSERT_TRUE(idle.process_known);
  EXPECT_EQ(idle.dense_weights, engine.info().resident_bytes);
  EXPECT_GT(idle.dense_weights, 0u);
  EXPECT_EQ(idle.kda_state, 0u);
  EXPECT_EQ(idle.mla_cache, 0u);
  EXPECT_EQ(idle.activations, 0u);
  EXPECT_GT(idle.expert_slots_budget, 0u);
  {
    k3::Session session(engine, 64);
    const std::vector<int64_t> prompt = {1, 5, 9, 14, 2, 7, 3, 11, 4};
    session.prefill(prompt);
    session.step(8);
    const k3::MemorySplit m = engine.memory();
    EXPECT_EQ(m.dense_weights, idle.dense_weights);
    EXPECT_GT(m.kda_state, 0u);
    EXPECT_EQ(m.kda_state, session.state_floats() * sizeof(float));
    // The MLA rows of the ten positions fed, every MLA layer.
    EXPECT_EQ(m.mla_cache, 10 * session.row_floats() * sizeof(float));
    EXPECT_GT(m.activations, 0u);
    EXPECT_GT(m.expert_cache, 0u);
    EXPECT_GT(m.expert_slots_used, 0u);
    EXPECT_LE(m.expert_slots_used, m.expert_slots_budget);
    EXPECT_LE(m.accounted(), m.rss);
    EXPECT_LE(m.anonymous + m.file_backed, m.rss + (1u << 20));  // smaps_rollup vs statm
    // The peak (getrusage's high-water mark) is never reported below the resident set read just
    // before it (/metrics once showed 47.149 MB of peak against 47.317 MB now). peak_rss_bytes()
    // takes the larger of the two, so this fails only if that goes or the set shrinks between
    // the two reads (src/engine/engine.cpp, Engine::memory).
    EXPECT_GE(m.peak_rss, m.rss);
    const std::string line = k3::describe_memory(m);
    for (const char* part : {"dense ", "experts ", " slots), KDA ", ", MLA ", ", activations ",
                             ", I/O ", "; anon ", ", file-backed "})
      EXPECT_NE(line.find(part), std::string::npos) << part << " in: " << line;
  }
  const k3::MemorySplit after = engine.memory();
  EXPECT_EQ(after.kda_state, 0u);
  EXPECT_EQ(after.mla_cache, 0u);
  EXPECT_EQ(after.activations, 0u);
}

// A prompt's chunks grow the session's scratch to chunk rows (0.76 MB a row at the release's
// dimensions) that decode never uses: release_prefill_buffers() gives them back, and what follows
// (decode steps, a later prompt that grows them again) is bit-identical to a session that kept
// them.
TEST(MemorySplit, PromptScratchIsGivenBackAndWhatFollowsIsUnchanged) {
  const k3::Engine engine(kTinyDir, k3::LoadOptions{});
  const k3::ModelFiles files(kTinyDir);
  const k3::K3Config config = k3::parse_k3_config(files.config_root(), kTinyDir + "/config.json");
  const std::vector<int64_t> prompt = {1, 5, 9, 14, 2, 7, 3, 11, 4};
  k3::Session released(engine, 64), kept(engine, 64);
  for (k3::Session* s : {&released, &kept}) {
    s->set_prefill_chunk(8);
    s->prefill(prompt);
  }
  const uint64_t grown = engine.memory().activations;
  released.release_prefill_buffers();
  const uint64_t after = engine.memory().activations;
  // At least seven of the eight rows of the per-row buffers are gone.
  EXPECT_GE(grown - after, 7 * k3::Workspace::row_bytes(config)) << grown << " -> " << after;
  released.release_prefill_buffers();  // nothing left to give: no change
  EXPECT_EQ(engine.memory().activations, after);
  EXPECT_EQ(released.logits(), kept.logits());
  for (int64_t id : {8, 3, 12}) EXPECT_EQ(released.step(id), kept.step(id)) << "step " << id;
  const std::vector<int64_t> follow_up = {6, 2, 9, 1, 13, 5, 10, 4, 7, 2, 8};
  EXPECT_EQ(released.prefill(follow_up), kept.prefill(follow_up));
  EXPECT_EQ(released.step(5), kept.step(5));
}

// generate() gives a prompt's scratch back once the prompt is in, and when a cancel cuts it: the
// session is left holding what one row needs, however long the chunk was.
TEST(MemorySplit, GenerateGivesThePromptScratchBack) {
  const k3::Engine engine(kTinyDir, k3::LoadOptions{});
  const k3::ModelFiles files(kTinyDir);
  const k3::K3Config config = k3::parse_k3_config(files.config_root(), kTinyDir + "/config.json");
  const uint64_t row = k3::Workspace::row_bytes(config);
  const std::vector<int64_t> prompt = {1, 5, 9, 14, 2, 7, 3, 11, 4};
  uint64_t one_row = 0;  // a session fed one token
  {
    k3::Session one(engine, 64);
    one.prefill(std::vector<int64_t>{1});
    one_row = engine.memory().activations;
  }
  k3::Sampler sampler(k3::SamplingOptions{}, 1);
  k3::GenerateSettings settings;
  settings.max_new_tokens = 2;
  k3::Session done(engine, 64);
  done.set_prefill_chunk(8);
  const k3::GenerateResult r =
      k3::generate(done, prompt, sampler, settings, [](int64_t) { return true; });
  EXPECT_EQ(r.finish, k3::FinishReason::length);
  EXPECT_LT(engine.memory().activations, one_row + 2 * row);
  const uint64_t before_cut = engine.memory().activations;
  std::atomic<bool> cancel{true};  // polled before the first layer, after the rows are grown
  settings.cancel = &cancel;
  k3::Session cut(engine, 64);
  cut.set_prefill_chunk(8);
  const k3::GenerateResult c =
      k3::generate(cut, prompt, sampler, settings, [](int64_t) { return true; });
  EXPECT_TRUE(c.cancelled_in_prefill);
  cut.reset();  // what an owner does after a cut prefill; it also brings the figures up to date
  EXPECT_LT(engine.memory().activations - before_cut, one_row + 2 * row);
}

// The attention's and the feed-forward's per-row scratch are views into one arena (model/state.h):
// each phase's views start at the arena's first aligned float and never overlap each other, every
// view is 64-byte aligned and inside the arena, and the arena is the largest phase, not the sum.
TEST(MemorySplit, PhaseScratchSharesOneArena) {
  const k3::ModelFiles files(kMini);
  const k3::K3Config config = k3::parse_k3_config(files.config_root(), kMini + "/config.json");
  k3::Workspace ws;
  const size_t rows = 5;
  ws.reserve(config, rows);
  const auto bytes_of = [](auto view) { return view.size() * sizeof(view[0]); };
  const auto* arena = reinterpret_cast<const char*>(ws.phase_arena.data());
  const auto* arena_end = arena + ws.phase_arena.size();
  using Range = std::pair<const char*, const char*>;
  const auto range = [&](auto view) {
    const auto* p = reinterpret_cast<const char*>(view.data());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    EXPECT_GE(p, arena);
    EXPECT_LE(p + bytes_of(view), arena_end);
    return Range{p, p + bytes_of(view)};
  };
  const std::vector<Range> kda = {range(ws.kda_q),    range(ws.kda_k),        range(ws.kda_v),
                                  range(ws.kda_gate), range(ws.kda_decay),    range(ws.kda_out),
                                  range(ws.kda_beta), range(ws.kda_decay_low)};
  const std::vector<Range> mla = {range(ws.mla_cq), range(ws.mla_q), range(ws.mla_ckv),
                                  range(ws.mla_gate), range(ws.mla_ctx)};
  const std::vector<Range> ff = {
      range(ws.moe_z),   range(ws.moe_acc), range(ws.moe_z_q8), range(ws.moe_z_d), range(ws.ex_z),
      range(ws.ex_down), range(ws.ex_z_q8), range(ws.ex_z_d),   range(ws.ex_gate), range(ws.ex_up),
      range(ws.ex_h_q8), range(ws.ex_h_d),  range(ws.mlp_gate), range(ws.mlp_up)};
  size_t largest = 0;
  for (const auto* phase : {&kda, &mla, &ff}) {
    EXPECT_EQ(phase->front().first, kda.front().first);  // every phase starts at the same place
    size_t sum = 0;
    for (size_t i = 0; i < phase->size(); ++i) {
      sum += static_cast<size_t>((*phase)[i].second - (*phase)[i].first);
      for (size_t j = 0; j < i; ++j)
        EXPECT_TRUE((*phase)[i].first >= (*phase)[j].second ||
                    (*phase)[j].first >= (*phase)[i].second)
            << "views " << j << " and " << i << " of a phase overlap";
    }
    largest = std::max(largest, sum);
  }
  EXPECT_EQ(ws.kda_q.size(), rows * static_cast<size_t>(config.kda_projection_size()));
  // The largest phase plus each view's rounding to 64 bytes and the arena's own alignment.
  const size_t most_views = std::max({kda.size(), mla.size(), ff.size()});
  EXPECT_LE(ws.phase_arena.size(), largest + most_views * 63 + 63);
}

// A session is sized for its whole context, but the MLA rows past the position fed are never
// touched: a 500,000-position session of k3-tiny (240 MB of MLA rows) costs next to nothing until
// it is fed (the first huge page of each layer's buffers: 2 MiB each).
TEST(MemorySplit, MlaCacheIsResidentOnlyForThePositionsFed) {
  const k3::Engine engine(kTinyDir, k3::LoadOptions{});
  const int64_t capacity = 500'000;
  const uint64_t before = k3::current_rss_bytes();
  k3::Session session(engine, capacity);
  const uint64_t reserved = session.row_floats() * sizeof(float) * capacity;
  ASSERT_GT(reserved, 200u << 20);
  session.prefill(std::vector<int64_t>{1, 5, 9});
  const uint64_t after = k3::current_rss_bytes();
  const uint64_t growth = after > before ? after - before : 0;
  std::printf("session of %lld positions: %.1f MB of MLA rows reserved, RSS grew %.1f MB\n",
              static_cast<long long>(capacity), static_cast<double>(reserved) / 1e6,
              static_cast<double>(growth) / 1e6);
  EXPECT_LT(growth, reserved / 10);
  EXPECT_EQ(engine.memory().mla_cache, 3 * session.row_floats() * sizeof(float));
}

// An ids-in, ids-out run (kimi_k3 --ids) needs no vocabulary: with keep_tokenizer false the
// tokenizer is still read, checked and shown to before_weights, then freed before the weights
// (2.8 MB for the release's), and the <|end_of_msg|> stop it gives is kept in EngineInfo.
TEST(MemorySplit, AnIdsRunHoldsNoTokenizerButKeepsItsStop) {
  k3::EngineOptions kept_options;
  kept_options.model_dir = kMini;
  const k3::Engine kept(kept_options);
  ASSERT_NE(kept.tokenizer(), nullptr);
  const std::optional<int32_t> end_of_message = kept.tokenizer()->special_id("<|end_of_msg|>");
  ASSERT_TRUE(end_of_message.has_value());
  EXPECT_EQ(kept.info().end_of_message_id, *end_of_message);

  k3::EngineOptions ids_options = kept_options;
  ids_options.keep_tokenizer = false;
  bool shown = false;
  ids_options.before_weights = [&](const k3::EngineInfo&, const k3::text::Tokenizer* tokenizer) {
    shown = tokenizer != nullptr;
  };
  const k3::Engine ids_only(ids_options);
  EXPECT_TRUE(shown);
  EXPECT_EQ(ids_only.tokenizer(), nullptr);
  EXPECT_EQ(ids_only.info().end_of_message_id, *end_of_message);
  const std::vector<int64_t> stops = k3::stop_ids(ids_only);
  EXPECT_EQ(stops, k3::stop_ids(kept));
  EXPECT_NE(std::find(stops.begin(), stops.end(), int64_t{*end_of_message}), stops.end());
}

// A large buffer is mapped in whole 2 MiB pieces, but only the pieces it fills are huge pages: a
// huge page over the partial last piece would make all of it resident (on the 4-layer slice the
// dense matrices' last pieces held 41.6 MB beyond their bytes). Written in full, a buffer of
// 4 MiB + 100 KiB holds its own pages and no more (not the 6 MiB of three huge pages).
TEST(MemorySplit, LargeBufferTailIsNotAHugePage) {
  constexpr size_t kPage = 4096, kHuge = size_t{2} << 20;
  const size_t bytes = k3::kHugeBufferBytes + 100 * 1024;
  const size_t mapped = (bytes + kHuge - 1) / kHuge * kHuge;
  auto* p = static_cast<unsigned char*>(k3::allocate_buffer(bytes));
  ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % kHuge, 0u);
  for (size_t i = 0; i < bytes; i += kPage) p[i] = 1;
  p[bytes - 1] = 1;
  std::vector<unsigned char> resident(mapped / kPage);
  ASSERT_EQ(::mincore(p, mapped, resident.data()), 0);
  const size_t pages = static_cast<size_t>(
      std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return r & 1; }));
  k3::free_buffer(p, bytes);
  EXPECT_EQ(pages, (bytes + kPage - 1) / kPage) << "of " << mapped / kPage << " pages mapped";
}

}  // namespace

// batched_decode_test — k3::Batch (Model::forward_batch): B sessions decoding in one forward pass
// against each session decoding alone. B = 2, 3, 4 with prompts of different lengths, sequences
// joining after a prefill between steps and one leaving early (the batch grows and shrinks):
// every step's logits memcmp-identical to the solo run's, at exact (K3_BITS=32, K3_IDOT=0), at
// the defaults (bits 4, idot 1), at bits 4 idot 0 and with the AVX2 kernels, on the k3-tiny
// fixture and on a synthetic checkpoint with many experts. Each distinct expert of a step is
// applied once for all its rows (counted against the solo runs' routing); a session's cancel flag
// does not stop a batched step, the batch's does; bad steps are refused before any state moves.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kernels/isa.h"
#include "test_util.h"
#include "util/error.h"

namespace {

using k3::testing::kTinyDir;

using k3::testing::TempDir;

std::vector<int64_t> ids_of(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> ids(n);
  for (auto& id : ids) id = static_cast<int64_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One sequence of the scenario: its prompt, the ids it decodes (fed in order, one per step) and
// the batch step it joins at (it is prefilled between the batch's steps, then decodes batched).
struct Sequence {
  std::vector<int64_t> prompt;
  std::vector<int64_t> decode;
  size_t join = 0;
};

constexpr int64_t kCapacity = 64;

// The sequences of a batch of B: prompts of 5, 17, 33 and 9 tokens (prefilled in chunks of 7, so
// the positions differ and are not chunk multiples); sequence 1 decodes 2 tokens, the others 5,
// so from step 2 on the batch runs without it; sequence 2 joins at step 1 and sequence 3 at step
// 2 (their prompts are read while the others decode).
std::vector<Sequence> scenario(size_t B, int64_t vocab) {
  const size_t prompt_len[] = {5, 17, 33, 9};
  const size_t decode_len[] = {5, 2, 5, 5};
  const size_t join[] = {0, 0, 1, 2};
  std::vector<Sequence> seqs(B);
  for (size_t i = 0; i < B; ++i) {
    seqs[i].prompt = ids_of(prompt_len[i], vocab, static_cast<uint32_t>(100 + i));
    seqs[i].decode = ids_of(decode_len[i], vocab, static_cast<uint32_t>(200 + i));
    seqs[i].join = join[i];
  }
  return seqs;
}

// The routed experts each MoE layer chose for one token: layer -> ids.
using LayerPicks = std::map<int64_t, std::vector<int64_t>>;

class RoutingRecorder : public k3::LayerObserver {
 public:
  void on_tensor(int64_t, Site, const float*) override {}
  void on_routing(int64_t layer, const Routing& r) override {
    routing[layer].assign(r.ids.begin(), r.ids.end());
  }
  LayerPicks routing;
};

// Each decode step of a sequence run alone: logits [vocab] and routing.
struct Solo {
  std::vector<std::vector<float>> logits;
  std::vector<LayerPicks> routing;
};

Solo solo(const k3::Engine& engine, const Sequence& seq, uint64_t* expert_reads) {
  k3::Session s(engine, kCapacity);
  s.set_prefill_chunk(7);
  s.prefill(seq.prompt);
  const uint64_t before = s.stats().expert_reads;
  Solo out;
  for (int64_t id : seq.decode) {
    RoutingRecorder rec;
    k3::PrefillHooks hooks;
    hooks.observer = &rec;
    out.logits.push_back(s.prefill(std::span<const int64_t>(&id, 1), hooks));  // a step
    out.routing.push_back(std::move(rec.routing));
  }
  *expert_reads += s.stats().expert_reads - before;
  return out;
}

struct ExpertReads {
  uint64_t batched = 0;   // applied by the batched steps
  uint64_t alone = 0;     // applied by the same steps run solo
  uint64_t distinct = 0;  // per batched step and MoE layer, the distinct experts its rows chose
};

// Runs the scenario of B sequences alone and batched; every step's logits must be the same bits.
ExpertReads check_batch(const k3::Engine& engine, size_t B, const std::string& label) {
  const std::vector<Sequence> seqs = scenario(B, engine.info().vocab_size);
  ExpertReads reads;
  std::vector<Solo> want;
  for (const Sequence& seq : seqs) want.push_back(solo(engine, seq, &reads.alone));

  std::vector<std::unique_ptr<k3::Session>> sessions;
  for (size_t i = 0; i < B; ++i) {
    sessions.push_back(std::make_unique<k3::Session>(engine, kCapacity));
    sessions.back()->set_prefill_chunk(7);
  }
  k3::Batch batch(engine);
  size_t compared = 0;
  for (size_t step = 0;; ++step) {
    std::vector<k3::Session*> active;
    std::vector<int64_t> ids;
    std::vector<size_t> which;
    for (size_t i = 0; i < B; ++i) {
      if (step == seqs[i].join) sessions[i]->prefill(seqs[i].prompt);
      const size_t k = step - seqs[i].join;  // the sequence's own decode step
      if (step >= seqs[i].join && k < seqs[i].decode.size()) {
        active.push_back(sessions[i].get());
        ids.push_back(seqs[i].decode[k]);
        which.push_back(i);
      }
    }
    if (active.empty()) break;
    batch.step(active, ids);
    std::map<int64_t, std::set<int64_t>> chosen;  // layer -> experts of this step's rows
    for (size_t r = 0; r < active.size(); ++r)
      for (const auto& [layer, experts] : want[which[r]].routing[step - seqs[which[r]].join])
        chosen[layer].insert(experts.begin(), experts.end());
    for (const auto& entry : chosen) reads.distinct += entry.second.size();
    for (size_t r = 0; r < active.size(); ++r) {
      const size_t i = which[r];
      const size_t k = step - seqs[i].join;
      EXPECT_TRUE(same_bits(active[r]->logits(), want[i].logits[k]))
          << label << " B=" << B << ": sequence " << i << " step " << k << " (batch step " << step
          << " of " << active.size() << " rows)";
      EXPECT_EQ(active[r]->position(), static_cast<int64_t>(seqs[i].prompt.size() + k + 1));
      ++compared;
    }
  }
  size_t steps = 0;
  for (const Sequence& seq : seqs) steps += seq.decode.size();
  EXPECT_EQ(compared, steps) << label;
  for (size_t i = 0; i < B; ++i) {
    std::vector<int64_t> record = seqs[i].prompt;
    record.insert(record.end(), seqs[i].decode.begin(), seqs[i].decode.end());
    EXPECT_EQ(sessions[i]->tokens(), record) << label << " sequence " << i;
  }
  reads.batched = batch.stats().expert_reads;
  return reads;
}

void check_all(const std::string& dir, const k3::LoadOptions& load, const std::string& label) {
  const k3::Engine engine(dir, load);
  for (size_t B : {2, 3, 4}) check_batch(engine, B, label);
}

TEST(BatchedDecode, FixtureExact) {
  check_all(kTinyDir, k3::LoadOptions::exact(), "k3-tiny exact");
}
TEST(BatchedDecode, FixtureDefaultPrecision) {
  check_all(kTinyDir, k3::LoadOptions{}, "k3-tiny defaults");
}
TEST(BatchedDecode, FixtureAvx2) {
  if (!k3::isa_supported(k3::Isa::kAvx2)) GTEST_SKIP() << "this CPU has no AVX2";
  k3::LoadOptions load;
  load.isa = "avx2";
  check_all(kTinyDir, load, "k3-tiny avx2");
  load = k3::LoadOptions::exact();
  load.isa = "avx2";
  check_all(kTinyDir, load, "k3-tiny avx2 exact");
}
// K3_KDA_CHUNKED: the prompts (chunks of 7) take the chunk form, and a batched step's rows, one
// per sequence, keep the token recurrence: each still the bits of its sequence run alone.
TEST(BatchedDecode, FixtureKdaChunked) {
  k3::LoadOptions load = k3::LoadOptions::exact();
  load.kda_chunked = true;
  check_all(kTinyDir, load, "k3-tiny exact kda_chunked");
}

// A synthetic checkpoint with many experts (tiny preset, 64 experts top-4): the rows of a step
// share some experts and not others.
class BatchedSynth : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("batch-synth");
    k3::testing::write_tiny_synth(dir_->path(), 64, 5);
  }
  static void TearDownTestSuite() { delete dir_; }
  static TempDir* dir_;
};
TempDir* BatchedSynth::dir_ = nullptr;

TEST_F(BatchedSynth, ExactAndDefaults) {
  check_all(dir_->path(), k3::LoadOptions::exact(), "synth exact");
  check_all(dir_->path(), k3::LoadOptions{}, "synth defaults");
}

TEST_F(BatchedSynth, Int4FloatActivations) {
  // bits 4 with idot 0: the int4 kernel that is not row-stable (its rows run one at a time).
  k3::LoadOptions load;
  load.idot = false;
  check_all(dir_->path(), load, "synth bits 4 idot 0");
}

TEST_F(BatchedSynth, SharedExpertsAreReadOncePerStep) {
  const k3::Engine engine(dir_->path(), k3::LoadOptions{});
  const ExpertReads reads = check_batch(engine, 4, "synth reads");
  // Solo: every decode step applies top-k experts per MoE layer; batched, each distinct expert
  // the step's rows chose is applied once (and some rows share experts).
  EXPECT_GT(reads.distinct, 0u);
  EXPECT_EQ(reads.batched, reads.distinct);
  EXPECT_LT(reads.batched, reads.alone);
}

TEST(BatchedDecode, OneSessionsCancelFlagLeavesTheOthersAndTheBatchFlagStopsTheStep) {
  const k3::Engine engine(kTinyDir, k3::LoadOptions{});
  const std::vector<int64_t> pa = {1, 2, 3}, pb = {4, 5, 6, 7, 8};
  k3::Session a(engine, 16), b(engine, 16), solo_a(engine, 16), solo_b(engine, 16);
  a.prefill(pa);
  b.prefill(pb);
  solo_a.prefill(pa);
  solo_b.prefill(pb);
  // a's request is cancelled: its flag is not the batch's business (the caller drops it
  // between steps); this step still completes for both.
  std::atomic<bool> cancel_a{true}, shutdown{false};
  a.set_interrupt(&cancel_a);
  k3::Batch batch(engine);
  batch.set_interrupt(&shutdown);
  batch.step(std::vector<k3::Session*>{&a, &b}, std::vector<int64_t>{9, 10});
  EXPECT_TRUE(same_bits(a.logits(), solo_a.step(9)));
  EXPECT_TRUE(same_bits(b.logits(), solo_b.step(10)));
  // The batch's flag stops the step; the sessions resume from their saved states.
  k3::SavedState saved_b;
  b.save_state(saved_b);
  shutdown = true;
  EXPECT_THROW(batch.step(std::vector<k3::Session*>{&b}, std::vector<int64_t>{11}),
               k3::Interrupted);
  shutdown = false;
  b.restore_state(saved_b);
  batch.step(std::vector<k3::Session*>{&b}, std::vector<int64_t>{11});
  EXPECT_TRUE(same_bits(b.logits(), solo_b.step(11)));
}

TEST(BatchedDecode, BadStepsAreRefusedBeforeAnyStateMoves) {
  const k3::Engine engine(kTinyDir, k3::LoadOptions{});
  const int64_t V = engine.info().vocab_size;
  k3::Session a(engine, 8), b(engine, 8), full(engine, 2);
  a.prefill(std::vector<int64_t>{1, 2});
  b.prefill(std::vector<int64_t>{3});
  full.prefill(std::vector<int64_t>{4, 5});
  k3::Batch batch(engine);
  auto refused = [&](std::vector<k3::Session*> s, std::vector<int64_t> ids, const char* what) {
    EXPECT_HAS(k3::testing::error_of([&] { batch.step(s, ids); }), what);
    EXPECT_EQ(a.position(), 2);
    EXPECT_EQ(b.position(), 1);
    EXPECT_EQ(a.tokens().size(), 2u);
  };
  refused({&a, &b}, {1}, "2 sessions but 1 token ids");
  refused({&a, &b}, {1, V}, "outside the vocabulary");
  refused({&a, &a}, {1, 2}, "twice");
  refused({&a, &b, &full}, {1, 2, 3}, "context is full");
  const k3::Engine other(kTinyDir, k3::LoadOptions{});
  k3::Session stranger(other, 8);
  refused({&a, &stranger}, {1, 2}, "another engine");
  // The sessions still decode as if nothing happened.
  batch.step(std::vector<k3::Session*>{&a, &b}, std::vector<int64_t>{6, 7});
  k3::Session solo(engine, 8);
  solo.prefill(std::vector<int64_t>{1, 2});
  EXPECT_TRUE(same_bits(a.logits(), solo.step(6)));
}

// The logits of a restricted feed against the full head's: the bits of every id in a block of 16
// holding an allowed one, -infinity elsewhere.
void expect_restricted(const std::vector<float>& full, const std::vector<float>& got,
                       const std::vector<uint64_t>& allowed, const std::string& what) {
  ASSERT_EQ(full.size(), got.size()) << what;
  const auto is_allowed = [&](size_t id) { return (allowed[id / 64] >> (id % 64)) & 1; };
  size_t kept = 0;
  for (size_t id = 0; id < full.size(); ++id) {
    bool near = false;
    for (size_t j = id / 16 * 16; j < id / 16 * 16 + 16 && j < full.size(); ++j)
      near = near || is_allowed(j);
    if (near) {
      ++kept;
      ASSERT_EQ(k3::testing::bits_of(got[id]), k3::testing::bits_of(full[id]))
          << what << ": id " << id;
    } else {
      ASSERT_EQ(got[id], -std::numeric_limits<float>::infinity()) << what << ": id " << id;
    }
  }
  EXPECT_LT(kept, full.size() / 2) << what;
}

std::vector<uint64_t> mask_of(std::initializer_list<size_t> ids, size_t vocab) {
  std::vector<uint64_t> mask((vocab + 63) / 64, 0);
  for (size_t id : ids) mask[id / 64] |= uint64_t{1} << (id % 64);
  return mask;
}

// Session::restrict_next_logits (a grammar's allowed ids, src/engine/service.cpp): the allowed
// ids' logits keep the full head's bits for one feed; a Batch step restricts its head when every
// session asked (to the union of their ids), else computes the whole head; a mask covering most
// of the vocabulary computes the whole head; reset() drops a pending restriction. Every head
// format (f32; int8 and int4 on float and on int8 activations, int4 on float activations taking
// per-row-count code on AVX2 / AVX-512) and the AVX2 kernels.
TEST(BatchedDecode, RestrictedLogitsKeepTheFullHeadsBitsOnTheAllowedIds) {
  struct Head {
    const char* name;
    int bits;
    bool idot;
    const char* isa;
  };
  for (const Head& h : {Head{"f32", 32, false, "auto"}, Head{"int8", 8, false, "auto"},
                        Head{"int8 idot", 8, true, "auto"}, Head{"int4", 4, false, "auto"},
                        Head{"int4 idot", 4, true, "auto"}, Head{"int4 avx2", 4, false, "avx2"}}) {
    if (std::string(h.isa) == "avx2" && !k3::isa_supported(k3::Isa::kAvx2)) continue;
    k3::LoadOptions load;
    load.head_bits = h.bits;
    load.head_bits_chosen = true;
    load.idot = h.idot;
    load.isa = h.isa;
    const k3::Engine engine(kTinyDir, load);
    const size_t V = static_cast<size_t>(engine.info().vocab_size);
    const std::vector<uint64_t> allowed = mask_of({3, 17, 18, 500, V - 1}, V);
    const std::vector<uint64_t> other = mask_of({40, 41, 900}, V);
    std::vector<uint64_t> both = allowed;
    for (size_t w = 0; w < both.size(); ++w) both[w] |= other[w];
    const std::vector<int64_t> prompt = ids_of(9, static_cast<int64_t>(V), 7);
    const std::vector<int64_t> prompt2 = ids_of(4, static_cast<int64_t>(V), 8);

    k3::Session solo(engine, 32), part(engine, 32);
    solo.prefill(prompt);
    part.prefill(prompt);
    part.restrict_next_logits(allowed);
    expect_restricted(solo.step(42), part.step(42), allowed, std::string(h.name) + " step");
    EXPECT_TRUE(same_bits(solo.step(43), part.step(43))) << h.name << ": one feed only";
    part.restrict_next_logits(std::vector<uint64_t>((V + 63) / 64, ~uint64_t{0}));
    EXPECT_TRUE(same_bits(solo.step(44), part.step(44))) << h.name << ": every id allowed";

    k3::Session a(engine, 32), b(engine, 32), solo_b(engine, 32);
    a.prefill(prompt);
    b.prefill(prompt2);
    solo.reset();
    solo.prefill(prompt);
    solo_b.prefill(prompt2);
    k3::Batch batch(engine);
    a.restrict_next_logits(allowed);
    b.restrict_next_logits(other);
    batch.step(std::vector<k3::Session*>{&a, &b}, std::vector<int64_t>{42, 43});
    expect_restricted(solo.step(42), a.logits(), both, std::string(h.name) + " batch row 0");
    expect_restricted(solo_b.step(43), b.logits(), both, std::string(h.name) + " batch row 1");
    a.restrict_next_logits(allowed);  // b did not ask: the whole head for both
    batch.step(std::vector<k3::Session*>{&a, &b}, std::vector<int64_t>{44, 45});
    EXPECT_TRUE(same_bits(solo.step(44), a.logits())) << h.name;
    EXPECT_TRUE(same_bits(solo_b.step(45), b.logits())) << h.name;

    k3::Session fresh(engine, 32);
    part.restrict_next_logits(allowed);
    part.reset();
    EXPECT_TRUE(same_bits(fresh.prefill(prompt), part.prefill(prompt))) << h.name << ": reset";
  }
}

// What share of the head a restricted step computes: whole blocks of 16 ids, adjacent blocks
// counted once, the last block cut at the vocabulary's end, the whole head past half of it.
TEST(BatchedDecode, RestrictedHeadShareCountsBlocksOf16) {
  const size_t V = 1000;  // 62.5 blocks
  EXPECT_EQ(k3::restricted_head_share(mask_of({3}, V), V), 16.0 / 1000);
  EXPECT_EQ(k3::restricted_head_share(mask_of({3, 15, 16, 500}, V), V), 48.0 / 1000);
  EXPECT_EQ(k3::restricted_head_share(mask_of({999}, V), V), 8.0 / 1000);  // block 992..999
  EXPECT_EQ(k3::restricted_head_share(mask_of({0, 16, 32}, V), V), 48.0 / 1000);
  auto every_16th = [&](size_t blocks) {  // one id in each of the first `blocks` blocks
    std::vector<uint64_t> mask((V + 63) / 64, 0);
    for (size_t id = 0; id < 16 * blocks; id += 16) mask[id / 64] |= uint64_t{1} << (id % 64);
    return mask;
  };
  EXPECT_EQ(k3::restricted_head_share(every_16th(31), V), 496.0 / 1000);
  EXPECT_EQ(k3::restricted_head_share(every_16th(32), V), 1.0);  // 512 rows: over half
  EXPECT_EQ(k3::restricted_head_share(std::vector<uint64_t>(16, 0), V), 0.0);  // none allowed
  EXPECT_EQ(k3::restricted_head_share({}, V), 1.0);  // an empty mask restricts nothing
  EXPECT_EQ(k3::restricted_head_share(std::vector<uint64_t>(1, 1), V), 16.0 / 1000);  // short
  std::vector<uint64_t> past = mask_of({5}, V);  // ids 1008..1023: a block past the vocabulary
  past.back() |= ~uint64_t{0} << (1008 % 64);
  EXPECT_EQ(k3::restricted_head_share(past, V), 16.0 / 1000);
  past.back() |= ~uint64_t{0} << (1000 % 64);  // ids 1000..1007: in block 992..1007, 8 rows inside
  EXPECT_EQ(k3::restricted_head_share(past, V), 24.0 / 1000);
}

}  // namespace

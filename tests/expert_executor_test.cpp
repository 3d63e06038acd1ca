// expert_executor_test — the MoE step's executor seam (model/expert_executor.h,
// docs/architecture.md §3.10): a second executor that takes a share of the routed pairs, delivers
// them late, out of order or not at all (a failed finish) leaves every logit bit-identical to the
// CPU-only run, decode and chunked prefill, at the default precision and at exact.
#include "model/expert_executor.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/model_files.h"
#include "kernels/quant.h"
#include "model/config.h"
#include "model/latent_moe.h"
#include "model/model.h"
#include "model/state.h"
#include "test_util.h"

namespace {

using k3::testing::kTinyDir;

// An executor in the shape of a device tier: it keeps a copy of every expert the CPU executor
// offers, claims the groups whose expert it holds (those with an id of the chosen parity), and
// computes them in finish() with the CPU kernels from its copy, delivering the groups last to
// first from its own buffer (stable). `fail` makes finish() deliver only its first group and
// report a failure, as a lost device would.
class CopyingExecutor final : public k3::ExpertExecutor {
 public:
  CopyingExecutor(const k3::K3Config& c, k3::LoadOptions load, int parity, bool fail)
      : c_(c), parity_(parity), fail_(fail) {
    compute_.kernels = &k3::kernel_table(k3::Isa::kScalar);
    compute_.idot = load.idot;
    geometry_.hidden = c.routed_expert_hidden_size;
    geometry_.intermediate = c.moe_intermediate_size;
  }
  void use_isa(k3::Isa isa) { compute_.kernels = &k3::kernel_table(isa); }
  const char* name() const override { return "copying"; }

  void issue(const k3::MoeStep& step, std::span<k3::GroupOwner> owner,
             k3::GroupOwner self) override {
    for (size_t g = 0; g < step.groups(); ++g)
      if (owner[g] == k3::kUnowned && step.ids[g] % 2 == parity_ &&
          held_.count({step.layer, step.ids[g]}))
        owner[g] = self;
  }

  bool finish(const k3::MoeStep& step, std::span<const k3::GroupOwner> owner, k3::GroupOwner self,
              k3::PairSink& sink) override {
    const size_t R = step.R, I = step.I;
    out_.assign(step.picks.size() * R, 0.0f);
    bool first = true;
    for (size_t g = step.groups(); g-- > 0;) {
      if (owner[g] != self) continue;
      if (fail_ && !first) return false;
      first = false;
      const size_t m = step.pairs(g), p0 = step.starts[g];
      std::vector<float> z(m * R), gate(m * I), up(m * I), hd(m * I / 32), zd(m * R / 32);
      std::vector<int8_t> zq(m * R), hq(m * I);
      for (size_t j = 0; j < m; ++j)
        std::memcpy(z.data() + j * R, step.z + step.picks[p0 + j].row * R, R * sizeof(float));
      if (compute_.idot)
        k3::quantize_q8_32(*compute_.kernels, z.data(), m, R, zq.data(), zd.data());
      const std::vector<uint8_t>& bytes = held_.at({step.layer, step.ids[g]});
      k3::apply_expert(c_, compute_, view_of(bytes), m, z.data(), zq.data(), zd.data(), gate.data(),
                       up.data(), hq.data(), hd.data(), out_.data() + p0 * R);
      sink.deliver(g, out_.data() + p0 * R, true);
      served_ += m;
    }
    return true;
  }

  void offered(int64_t layer, int64_t expert, const k3::ExpertView& v) override {
    if (held_.count({layer, expert})) return;
    std::vector<uint8_t> bytes;
    for (auto [p, n] : parts(v)) bytes.insert(bytes.end(), p, p + n);
    held_[{layer, expert}] = std::move(bytes);
  }

  uint64_t served() const { return served_; }

 private:
  std::vector<std::pair<const uint8_t*, size_t>> parts(const k3::ExpertView& v) const {
    const k3::ExpertGeometry& g = geometry_;
    return {{v.gate_packed, g.gate_packed_bytes()}, {v.gate_scale, g.gate_scale_bytes()},
            {v.up_packed, g.gate_packed_bytes()},   {v.up_scale, g.gate_scale_bytes()},
            {v.down_packed, g.down_packed_bytes()}, {v.down_scale, g.down_scale_bytes()}};
  }
  k3::ExpertView view_of(const std::vector<uint8_t>& b) const {
    const k3::ExpertGeometry& g = geometry_;
    k3::ExpertView v;
    const uint8_t* p = b.data();
    v.gate_packed = p;
    v.gate_scale = p += g.gate_packed_bytes();
    v.up_packed = p += g.gate_scale_bytes();
    v.up_scale = p += g.gate_packed_bytes();
    v.down_packed = p += g.gate_scale_bytes();
    v.down_scale = p += g.down_packed_bytes();
    return v;
  }

  const k3::K3Config& c_;
  k3::Compute compute_;
  k3::ExpertGeometry geometry_;
  int parity_;
  bool fail_;
  std::map<std::pair<int64_t, int64_t>, std::vector<uint8_t>> held_;
  std::vector<float> out_;
  uint64_t served_ = 0;
};

struct Logits {
  std::vector<float> logits;  // every prompt row's logits, then each decode step's
};

// A prompt of 9 tokens in chunks of `chunk`, then 4 decode steps; twice over (the second pass
// finds the experts the executor copied in the first).
Logits run(const k3::Model& model, size_t chunk) {
  const k3::K3Config& c = model.config();
  const size_t D = static_cast<size_t>(c.hidden_size), V = static_cast<size_t>(c.vocab_size);
  const std::vector<int64_t> prompt = {5, 17, 3, 99, 42, 7, 7, 61, 12};
  Logits out;
  for (int pass = 0; pass < 2; ++pass) {
    k3::ModelState st = model.new_state(32, chunk);
    std::vector<float> x, h, logits(V);
    auto forward = [&](const std::vector<int64_t>& ids) {
      x.assign(ids.size() * D, 0.0f);
      h.assign(ids.size() * D, 0.0f);
      for (size_t t = 0; t < ids.size(); ++t) model.embed(st, ids[t], x.data() + t * D);
      model.forward(st, x.data(), ids.size(), h.data(), nullptr);
      for (size_t t = 0; t < ids.size(); ++t) {
        model.head(st, h.data() + t * D, logits.data());
        out.logits.insert(out.logits.end(), logits.begin(), logits.end());
      }
    };
    for (size_t t0 = 0; t0 < prompt.size(); t0 += chunk)
      forward({prompt.begin() + static_cast<std::ptrdiff_t>(t0),
               prompt.begin() + static_cast<std::ptrdiff_t>(std::min(prompt.size(), t0 + chunk))});
    for (int64_t id : {8, 1, 30, 2}) forward({id});
  }
  return out;
}

class ExpertExecutorSeam : public ::testing::TestWithParam<bool> {};

TEST_P(ExpertExecutorSeam, AnyShareAnyOrderAnyFailureGivesTheCpuBits) {
  k3::LoadOptions load = GetParam() ? k3::LoadOptions::exact() : k3::LoadOptions{};
  const k3::ModelFiles files(kTinyDir, {});
  const k3::K3Config config = k3::parse_k3_config(files.config_root(), kTinyDir + "/config.json");
  k3::ModelSetup plain;
  plain.isa = k3::Isa::kScalar;
  const k3::Model cpu_only(files, config, load, plain);
  for (size_t chunk : {size_t{1}, size_t{4}}) {
    const Logits want = run(cpu_only, chunk);
    ASSERT_FALSE(want.logits.empty());
    for (int parity : {0, 1}) {
      {
        const bool fail = parity == 1;
        auto executor = std::make_shared<CopyingExecutor>(config, load, parity, fail);
        k3::ModelSetup setup = plain;
        setup.executors.push_back(executor);
        const k3::Model model(files, config, load, setup);
        const Logits got = run(model, chunk);
        const std::string what = std::string(GetParam() ? "exact" : "default") + " chunk " +
                                 std::to_string(chunk) + " parity " + std::to_string(parity) +
                                 (fail ? " failing" : "");
        ASSERT_EQ(want.logits.size(), got.logits.size()) << what;
        EXPECT_EQ(0, std::memcmp(want.logits.data(), got.logits.data(),
                                 want.logits.size() * sizeof(float)))
            << what;
        // The executor really computed pairs (a failing one still delivers one group per step).
        EXPECT_GT(executor->served(), 0u) << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precision, ExpertExecutorSeam, ::testing::Bool());

}  // namespace

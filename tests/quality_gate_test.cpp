// The real-text quality gate (docs/testing.md §5): every precision setting a user can pick, run on
// the trained tiny K3 (assets/k3-mini) over the held-out fixtures (tests/data/k3-mini), must stay
// within the bounds of tests/data/k3-mini/quality_bounds.json (the measured figures plus a
// margin, written by `k3_bench quality --write-bounds`) and within its setting's fixed ceiling
// (tools/quality_lib.cpp, settings()). Every row is also judged against the second oracle (the
// training model's float64 logits, oracle.safetensors): for the exact row that is the check
// that matters, its figures against the exact reference being a re-run of itself. A K3_TOPP row
// must drop routed picks. The same measurement and check (tools/quality_lib.h) then see a
// corrupted copy of the model fail: one ue8m0 scale byte of a routed expert the held-out text
// uses, two swapped MXFP4 nibbles, one flipped BF16 byte. Nothing is skipped: a missing model,
// fixture or bounds file is a failure naming the path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include "io/model_files.h"
#include "model/tensor_names.h"
#include "quality_lib.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
namespace q = k3::quality;

const std::string kModel = std::string(K3_SOURCE_DIR) + "/assets/k3-mini";
const std::string kFixtures = std::string(K3_SOURCE_DIR) + "/tests/data/k3-mini";
const std::string kBounds = kFixtures + "/quality_bounds.json";

// The cache settings of every run: all experts in memory (the model is small), no pins from a
// routing history (nothing of a user's state enters the figures).
k3::LoadOptions base_options() {
  k3::LoadOptions load;
  load.experts_in_memory = true;
  load.cache.pin = false;
  return load;
}

bool inputs_present() {
  bool ok = true;
  for (const std::string& path :
       {kModel + "/config.json", kModel + "/model.safetensors.index.json",
        kFixtures + "/heldout_text.u32", kFixtures + "/heldout_prompts.jsonl",
        kFixtures + "/oracle.safetensors", kBounds}) {
    if (!fs::exists(path)) {
      ADD_FAILURE() << path
                    << " is missing: the gate needs the trained model (assets/k3-mini), its "
                       "fixtures (tools/train/make_fixtures.py) and the bounds (k3_bench quality "
                       "--write-bounds "
                    << kBounds << ")";
      ok = false;
    }
  }
  return ok;
}

// The exact reference, computed once per test process.
const q::Reference& reference() {
  static const q::Fixtures fixtures = q::Fixtures::load(kFixtures);
  static const q::Reference ref(kModel, fixtures, base_options());
  return ref;
}

void print(const q::Row& r) {
  std::printf("%s\n", q::summary(r).c_str());
  std::fflush(stdout);
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += "\n  " + l;
  return s;
}

TEST(QualityGate, EveryPrecisionSettingWithinItsBound) {
  if (!inputs_present()) return;
  const q::Bounds bounds = q::read_bounds(kBounds);
  for (const auto& [name, bound] : bounds)
    EXPECT_NO_THROW(q::setting(name)) << kBounds << " has a row for an unknown setting";
  const q::Reference& ref = reference();
  std::printf("reference: %s, %lld positions, %.1f s\n", ref.row().describe.c_str(),
              static_cast<long long>(ref.row().positions), ref.row().seconds);
  for (const q::Setting& s : q::settings()) {
    const auto it = bounds.find(s.name);
    if (it == bounds.end()) {
      ADD_FAILURE() << kBounds << " has no row \"" << s.name << "\" (regenerate it: k3_bench "
                    << "quality --write-bounds " << kBounds << ")";
      continue;
    }
    const q::Row row = ref.measure(s);
    print(row);
    const std::vector<std::string> v = q::violations(row, it->second);
    EXPECT_TRUE(v.empty()) << s.name << " (" << s.env() << ") is outside its bound:" << joined(v)
                           << "\n(after retraining, regenerate the bounds: k3_bench quality "
                              "--write-bounds "
                           << kBounds << ")";
  }
}

// The fixed ceilings and the expert-drop rule, on rows made up here (no engine): a row inside its
// bound file's figures but outside its ceiling fails, a K3_TOPP row that keeps every pick fails,
// and --write-bounds refuses to write bounds for such rows.
TEST(QualityGate, CeilingsAndTheExpertDropAreChecked) {
  q::Row ok;
  ok.setting = "defaults";
  ok.ppl = 100;
  ok.ppl_ratio = 1.01;
  ok.kl_mean = 0.01;
  ok.top1 = ok.greedy = ok.oracle_top1 = 0.9;
  ok.oracle_kl_mean = 0.01;
  ok.experts_kept = 1;
  EXPECT_TRUE(q::ceiling_violations(ok).empty()) << joined(q::ceiling_violations(ok));
  q::Row far = ok;
  far.kl_mean = 0.05;                        // int4 class ceiling 0.03
  far.oracle_top1 = 0.5;                     // ceiling 0.85
  const q::Bound loose{1e9, 1, 0, 0, 1, 0};  // a bounds row that would pass anything
  const std::vector<std::string> v = q::violations(far, loose);
  ASSERT_EQ(v.size(), 2u) << joined(v);
  EXPECT_HAS(v[0], "kl_mean 0.05 > ceiling 0.03");
  EXPECT_HAS(v[1], "oracle_top1 0.5 < ceiling 0.85");
  q::Row topp = ok;
  topp.setting = "defaults_topp0.7";
  const std::vector<std::string> kept_all = q::ceiling_violations(topp);
  ASSERT_EQ(kept_all.size(), 1u) << joined(kept_all);
  EXPECT_HAS(kept_all[0], "K3_TOPP=0.7 dropped no routed pick");
  topp.experts_kept = 0.75;
  EXPECT_TRUE(q::ceiling_violations(topp).empty());
  q::Row dropped = ok;
  dropped.experts_kept = 0.9;  // no K3_TOPP: every pick must be made
  EXPECT_EQ(q::ceiling_violations(dropped).size(), 1u);
  k3::testing::TempDir dir("quality-bounds");
  const std::string path = dir.file("bounds.json");
  const std::string error = k3::testing::error_of([&] { q::write_bounds(path, {ok, far}, 64); });
  EXPECT_HAS(error, "outside their ceiling");
  EXPECT_HAS(error, "defaults: kl_mean 0.05 > ceiling 0.03");
  EXPECT_FALSE(fs::exists(path));
  q::write_bounds(path, {ok, topp}, 64);
  EXPECT_EQ(q::read_bounds(path).at("defaults_topp0.7").oracle_top1_min, 0.9 - 2.0 / 64);
}

// A copy of the model in `dir`: every file a symlink to the original except the shard holding
// `tensor`, which is copied and handed to `patch` as (bytes of the shard, offset and size of the
// tensor in it). Returns what `patch` says it changed.
std::string patched_copy(const k3::testing::TempDir& dir, const std::string& tensor,
                         const std::function<std::string(std::string&, size_t, size_t)>& patch) {
  const k3::ModelFiles files(kModel);
  const k3::LocatedTensor t = files.find(tensor);
  if (!t.shard) {
    ADD_FAILURE() << kModel << " has no tensor " << tensor;
    return "";
  }
  const fs::path shard = fs::path(t.shard->path()).filename();
  std::string what;
  for (const fs::directory_entry& e : fs::directory_iterator(kModel)) {
    const fs::path to = fs::path(dir.path()) / e.path().filename();
    if (e.path().filename() != shard) {
      fs::create_symlink(fs::absolute(e.path()), to);
      continue;
    }
    std::ifstream in(e.path(), std::ios::binary);
    std::string bytes{std::istreambuf_iterator<char>(in), {}};
    what = patch(bytes, t.info->file_offset, t.info->nbytes);
    std::ofstream out(to, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good()) << to;
  }
  return shard.string() + ": " + tensor + ": " + what;
}

// The exact setting on the corrupted copy, against the uncorrupted exact reference and the exact
// row's bound: the gate must fail.
void expect_gate_fails(const std::string& model_dir, const std::string& what) {
  const q::Bounds bounds = q::read_bounds(kBounds);
  ASSERT_TRUE(bounds.count("exact")) << kBounds << " has no row \"exact\"";
  const q::Row row = reference().measure(q::setting("exact"), model_dir);
  std::printf("corrupted (%s):\n  ", what.c_str());
  print(row);
  const std::vector<std::string> v = q::violations(row, bounds.at("exact"));
  std::printf("  the gate says:%s\n", v.empty() ? " (nothing: it passed)" : joined(v).c_str());
  EXPECT_FALSE(v.empty()) << "the gate passed a corrupted model (" << what << ")";
}

// The most used routed expert of the first MoE layer over the held-out windows.
std::pair<int64_t, int64_t> busiest_expert() {
  const auto& use = reference().expert_use();
  for (size_t l = 0; l < use.size(); ++l)
    if (!use[l].empty())
      return {static_cast<int64_t>(l),
              std::max_element(use[l].begin(), use[l].end()) - use[l].begin()};
  ADD_FAILURE() << "the reference routed no token to any expert";
  return {0, 0};
}

// |value| of an e2m1 code (docs/quant_formats.md §1).
double e2m1(int code) {
  static const double kValues[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8 ? -1 : 1) * kValues[code & 7];
}

TEST(QualityGate, FailsOnACorruptedCopy) {
  if (!inputs_present()) return;
  const auto [layer, expert] = busiest_expert();
  std::printf(
      "busiest expert of layer %lld over the held-out windows: %lld (%lld picks)\n",
      static_cast<long long>(layer), static_cast<long long>(expert),
      static_cast<long long>(
          reference().expert_use()[static_cast<size_t>(layer)][static_cast<size_t>(expert)]));
  {
    SCOPED_TRACE("one ue8m0 scale byte + 2 (x4)");
    k3::testing::TempDir dir("quality-scale");
    const std::string what =
        patched_copy(dir, k3::names::expert(layer, expert, "w1.weight_scale"),
                     [](std::string& bytes, size_t offset, size_t) {
                       bytes[offset] = static_cast<char>(static_cast<uint8_t>(bytes[offset]) + 2);
                       return std::string("byte 0 + 2");
                     });
    expect_gate_fails(dir.path(), what);
  }
  {
    SCOPED_TRACE("two MXFP4 nibbles swapped");
    k3::testing::TempDir dir("quality-nibbles");
    const std::string what =
        patched_copy(dir, k3::names::expert(layer, expert, "w1.weight_packed"),
                     [](std::string& bytes, size_t offset, size_t size) {
                       // The byte whose two weights differ most (a swap of equal nibbles changes
                       // nothing).
                       size_t best = offset;
                       double gap = -1;
                       for (size_t i = offset; i < offset + size; ++i) {
                         const auto b = static_cast<uint8_t>(bytes[i]);
                         const double d = std::fabs(e2m1(b & 15) - e2m1(b >> 4));
                         if (d > gap) gap = d, best = i;
                       }
                       const auto b = static_cast<uint8_t>(bytes[best]);
                       bytes[best] = static_cast<char>((b << 4) | (b >> 4));
                       return "byte " + std::to_string(best - offset) + " nibbles swapped";
                     });
    expect_gate_fails(dir.path(), what);
  }
  {
    SCOPED_TRACE("one BF16 byte of a dense weight flipped");
    k3::testing::TempDir dir("quality-bf16");
    const std::string what = patched_copy(
        dir, k3::names::layer(0, k3::names::kMlpDownProj),
        [](std::string& bytes, size_t offset, size_t size) {
          // The sign byte of the largest weight of layer 0's dense MLP down projection.
          size_t best = offset;
          float largest = -1;
          for (size_t i = offset; i + 1 < offset + size; i += 2) {
            const uint32_t bits =
                (static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 1])) << 24) |
                (static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << 16);
            float v;
            std::memcpy(&v, &bits, sizeof v);
            if (std::fabs(v) > largest) largest = std::fabs(v), best = i;
          }
          bytes[best + 1] = static_cast<char>(static_cast<uint8_t>(bytes[best + 1]) ^ 0x80);
          return "element " + std::to_string((best - offset) / 2) + " sign flipped (|w| " +
                 std::to_string(largest) + ")";
        });
    expect_gate_fails(dir.path(), what);
  }
}

}  // namespace

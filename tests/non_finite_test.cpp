// non_finite_test — a NaN or an infinity in the weights is refused, naming the file, the tensor,
// the value and the element (issue 28, item 3): a BF16 dense matrix, the lm_head, a layernorm and
// an F32 tensor of a snapshot at load; an embedding row when it is first converted; a container's
// F32 scale sidecar at load, copying and with K3_MMAP=1; and k3_repack refuses such a source
// (floats, and the MXFP4 scale byte 255) without publishing a container.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "io/model_files.h"
#include "model/tensor_names.h"
#include "repack_lib.h"
#include "synth_lib.h"
#include "test_util.h"
#include "util/error.h"

namespace k3 {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::poisoned_copy;
using testing::TempDir;

// Little-endian bytes of one value.
const std::string kBf16NaN("\xC0\x7F", 2);
const std::string kBf16PlusInf("\x80\x7F", 2);
const std::string kBf16MinusInf("\x80\xFF", 2);
const std::string kF32NaN("\x00\x00\xC0\x7F", 4);

// The tiny synthetic checkpoint (D 64, 8 layers, V 1024), written once per test process.
const std::string& tiny() {
  static const TempDir dir("non-finite-tiny");
  static const bool written = [] {
    synth::SynthSpec spec = synth::preset_spec("tiny");
    spec.progress = false;
    synth::write_checkpoint(spec, dir.path());
    return true;
  }();
  (void)written;
  return dir.path();
}

std::string prefixed(const std::string& model, const std::string& name) {
  return ModelFiles(model).prefix() + name;
}

struct Poison {
  std::string tensor;  // without the prefix
  uint64_t index;
  std::string bytes;
  std::string value;  // as the message says it
  std::string where;  // the element's multi-dimensional index, "" for a vector
};

TEST(NonFinite, SnapshotWeightsAreRefusedAtLoadNamingTheTensorAndElement) {
  using namespace names;
  const std::vector<Poison> cases = {
      // A BF16 dense matrix (layer 0 is the dense MLP), quantised at load (K3_BITS=4 default).
      {layer(0, kMlpGateProj), 1234, kBf16NaN, "NaN", "(index [19, 18] of shape [96, 64])"},
      // The head, kept at K3_HEAD_BITS.
      {kLmHead, 64 * 1000 + 7, kBf16MinusInf, "-Inf", "(index [1000, 7] of shape [1024, 64])"},
      // A layernorm weight (a vector).
      {layer(2, kInputLayernorm), 63, kBf16PlusInf, "+Inf", ""},
      // A tensor stored as F32 (read without conversion).
      {layer(0, kKdaDtBias), 5, kF32NaN, "NaN", ""},
  };
  for (const Poison& p : cases) {
    SCOPED_TRACE(p.tensor);
    TempDir dir("non-finite-load");
    const std::string shard = poisoned_copy(tiny(), dir.path(), p.tensor, p.index, p.bytes);
    const std::string msg = error_of([&] { Engine e(dir.path(), LoadOptions{}); });
    EXPECT_HAS(msg, shard + ": tensor " + prefixed(tiny(), p.tensor) + " holds " + p.value +
                        " at element " + std::to_string(p.index));
    EXPECT_HAS(msg, p.where);
    EXPECT_HAS(msg, "damaged");
  }
}

// The embedding table is not resident: a row is converted, and checked, when a prompt uses it.
TEST(NonFinite, AnEmbeddingRowIsRefusedWhenItIsConverted) {
  TempDir dir("non-finite-embed");
  const std::string shard =
      poisoned_copy(tiny(), dir.path(), names::kEmbedTokens, 7 * 64 + 5, kBf16NaN);
  const Engine engine(dir.path(), LoadOptions{});
  Session fine(engine, 16);
  fine.prefill(std::vector<int64_t>{6, 8});
  Session poisoned(engine, 16);
  const std::string msg = error_of([&] { poisoned.prefill(std::vector<int64_t>{6, 7}); });
  EXPECT_HAS(msg, shard + ": tensor " + prefixed(tiny(), names::kEmbedTokens) +
                      " holds NaN at element 453 (index [7, 5] of shape [1024, 64])");
}

// The tiny checkpoint repacked (8-bit, aligned), once per test process.
const std::string& container() {
  static const TempDir dir("non-finite-box");
  static const std::string box = [] {
    repack::Options o;
    o.source = tiny();
    o.dest = dir.path() + "/box";
    repack::run(o);
    return o.dest;
  }();
  return box;
}

TEST(NonFinite, AContainerScaleSidecarIsRefusedCopyingAndMapped) {
  const std::string scales = names::layer(0, names::kKdaQProj) + ".qs";
  TempDir dir("non-finite-qs");
  const std::string shard = poisoned_copy(container(), dir.path(), scales, 3, kF32NaN);
  for (const bool mmap : {false, true}) {
    SCOPED_TRACE(mmap ? "K3_MMAP=1" : "copying");
    LoadOptions o;
    o.mmap = mmap;
    const std::string msg = error_of([&] { Engine e(dir.path(), o); });
    EXPECT_HAS(msg,
               shard + ": tensor " + prefixed(container(), scales) + " holds NaN at element 3");
  }
}

TEST(NonFinite, RepackRefusesANonFiniteSourceAndPublishesNothing) {
  using namespace names;
  const std::vector<Poison> cases = {
      // Quantised on the way (the "bits" class).
      {layer(0, kKdaQProj), 70, kBf16NaN, "NaN", "(index [1, 6] of shape"},
      // Copied unchanged (a norm), and at --bits 32 every matrix is.
      {layer(3, kPostAttentionLayernorm), 9, kBf16PlusInf, "+Inf", ""},
  };
  for (const Poison& p : cases) {
    SCOPED_TRACE(p.tensor);
    TempDir dir("non-finite-repack");
    const std::string src = dir.file("src"), box = dir.file("box");
    fs::create_directory(src);
    const std::string shard = poisoned_copy(tiny(), src, p.tensor, p.index, p.bytes);
    repack::Options o;
    o.source = src;
    o.dest = box;
    const std::string msg = error_of([&] { repack::run(o); });
    EXPECT_HAS(msg, shard + ": tensor " + prefixed(tiny(), p.tensor) + " holds " + p.value +
                        " at element " + std::to_string(p.index));
    EXPECT_HAS(msg, p.where);
    EXPECT_FALSE(fs::exists(box + "/model.safetensors.index.json"));
    const std::string name = fs::path(shard).filename().string();
    EXPECT_FALSE(
        fs::exists(box + "/" + name.substr(0, name.find("-of-")) + "-of-000009.safetensors"))
        << "the shard made from the damaged source was published";
  }
  // A routed expert's MXFP4 scale byte 255 (NaN), which the engine refuses on every read.
  TempDir dir("non-finite-repack-e8m0");
  const std::string src = dir.file("src"), box = dir.file("box");
  fs::create_directory(src);
  const std::string scale = expert(1, 2, kExpertTensors[3]);
  const std::string shard = poisoned_copy(tiny(), src, scale, 17, std::string("\xFF", 1));
  repack::Options o;
  o.source = src;
  o.dest = box;
  EXPECT_HAS(error_of([&] { repack::run(o); }),
             shard + ": tensor " + prefixed(tiny(), scale) +
                 " holds exponent byte 255 (NaN in MXFP4) at element 17");
  EXPECT_FALSE(fs::exists(box + "/model.safetensors.index.json"));
}

}  // namespace
}  // namespace k3

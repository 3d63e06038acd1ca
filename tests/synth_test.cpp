// synth_test — the safetensors writer and the synthetic checkpoint generator (tools/synth_lib).
// The tiny preset must reproduce tests/data/k3-tiny's layout byte for byte everywhere except the
// tensor data: shard names, shard headers (names, dtypes, shapes, offsets, padding), index,
// config.json and generation_config.json.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "io/file.h"
#include "io/model_files.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/config.h"
#include "model/tensor_names.h"
#include "synth_lib.h"
#include "test_util.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace {

using k3::testing::TempDir;

using k3::testing::kTinyDir;

// A fresh directory under the build tree, removed at destruction.

std::string slurp(const std::string& path) {
  return k3::read_text_file(path);
}

// The header JSON bytes (padding included) of a safetensors file.
std::string header_bytes(const std::string& path) {
  const std::string all = slurp(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(all[static_cast<size_t>(i)]);
  return all.substr(8, n);
}

std::vector<std::string> shard_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("model-") && n.ends_with(".safetensors")) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> all_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

struct Described {
  std::string name;
  k3::DType dtype;
  std::vector<int64_t> shape;
  bool operator==(const Described&) const = default;
};

// Tensors of one shard in data order.
std::vector<Described> describe(const std::string& path) {
  k3::SafetensorsShard shard(k3::open_posix_file(path));
  std::vector<Described> out;
  for (const auto& t : shard.tensors()) out.push_back({t.name, t.dtype, t.shape});
  return out;
}

float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Widened values of a F32 or BF16 tensor.
std::vector<float> read_floats(const k3::LocatedTensor& t) {
  std::vector<uint8_t> raw(t.info->nbytes);
  k3::ModelFiles::read(t, raw.data());
  std::vector<float> out(t.info->numel());
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.info->dtype == k3::DType::kF32) {
      std::memcpy(&out[i], raw.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      out[i] = bf16_to_f32(h);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsWriter

TEST(SafetensorsWriter, RoundTripSeveralDtypes) {
  TempDir dir("writer");
  const std::string path = dir.file("a.safetensors");
  std::vector<uint8_t> f32(2 * 3 * 4), bf16(5 * 2), u8(7), i64(8);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = static_cast<uint8_t>(200 - i);
  for (size_t i = 0; i < u8.size(); ++i) u8[i] = static_cast<uint8_t>(i);
  for (size_t i = 0; i < i64.size(); ++i) i64[i] = static_cast<uint8_t>(0xA0 + i);

  k3::SafetensorsWriter w;
  w.add_bytes("zeta.f32", k3::DType::kF32, {2, 3}, f32);
  w.add_bytes("alpha.bf16", k3::DType::kBF16, {5}, bf16);
  w.add("mid.u8", k3::DType::kU8, {7, 1}, [&](uint8_t* dst, uint64_t offset, uint64_t n) {
    ASSERT_EQ(offset, 0u);
    ASSERT_EQ(n, 7u);
    std::memcpy(dst, u8.data(), n);
  });
  w.add_bytes("scalar.i64", k3::DType::kI64, {}, i64);
  EXPECT_EQ(w.data_bytes(), 24u + 10u + 7u + 8u);
  EXPECT_EQ(w.names(),
            (std::vector<std::string>{"zeta.f32", "alpha.bf16", "mid.u8", "scalar.i64"}));

  uint64_t reported = 0;
  int calls = 0;
  w.write(path, [&](uint64_t n) {
    reported += n;
    ++calls;
  });
  EXPECT_EQ(reported, w.data_bytes());
  EXPECT_EQ(calls, 4);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(all_files(dir.path()), std::vector<std::string>{"a.safetensors"});

  // Header: compact, metadata first, tensors in the order added, space padded to 8.
  const std::string h = header_bytes(path);
  EXPECT_EQ(h, w.header());
  EXPECT_EQ((8 + h.size()) % 8, 0u);
  EXPECT_TRUE(
      h.starts_with("{\"__metadata__\":{\"format\":\"pt\"},\"zeta.f32\":{\"dtype\":\"F32\","
                    "\"shape\":[2,3],\"data_offsets\":[0,24]},\"alpha.bf16\":"));
  const size_t end = h.find_last_not_of(' ');
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(h[end], '}');
  EXPECT_LT(h.size() - end - 1, 8u);
  EXPECT_NE(h.find("\"scalar.i64\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[41,49]}"),
            std::string::npos);
  EXPECT_EQ(fs::file_size(path), 8 + h.size() + w.data_bytes());

  k3::SafetensorsShard shard(k3::open_posix_file(path));
  ASSERT_EQ(shard.tensors().size(), 4u);
  const std::vector<std::pair<std::string, const std::vector<uint8_t>*>> want = {
      {"zeta.f32", &f32}, {"alpha.bf16", &bf16}, {"mid.u8", &u8}, {"scalar.i64", &i64}};
  for (size_t i = 0; i < want.size(); ++i) {
    const k3::TensorInfo& t = shard.tensors()[i];
    EXPECT_EQ(t.name, want[i].first);
    std::vector<uint8_t> got(t.nbytes);
    shard.read(t, got.data());
    EXPECT_EQ(got, *want[i].second) << t.name;
  }
  EXPECT_EQ(shard.find("zeta.f32")->dtype, k3::DType::kF32);
  EXPECT_EQ(shard.find("zeta.f32")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(shard.find("alpha.bf16")->dtype, k3::DType::kBF16);
  EXPECT_EQ(shard.find("mid.u8")->shape, (std::vector<int64_t>{7, 1}));
}

// Fills in pieces: each tensor's fill is called in order over the tensor with exactly the piece
// size (the last one shorter), and every byte arrives, with O_DIRECT writes (whole blocks, the
// remainder carried to the next staging buffer, the file's partial last block buffered) and
// without, on a filesystem that has O_DIRECT and on /dev/shm (tmpfs, which may refuse it). The
// data is larger than one staging buffer (64 MiB), so buffers are handed over several times.
TEST(SafetensorsWriter, PieceFillsArriveInOrderWithAndWithoutODirect) {
  TempDir dir("writer-pieces");
  struct Tensor {
    std::string name;
    uint64_t bytes, piece;
  };
  const std::vector<Tensor> tensors = {
      {"big", (uint64_t{70} << 20) + 100, (1 << 20) + 7}, {"small", 1000, 0}, {"tail", 5000, 333}};
  const auto pattern = [](size_t tensor, uint64_t i) {
    return static_cast<uint8_t>(i * 131 + (i >> 12) + tensor * 77);
  };
  std::vector<std::string> where = {dir.path()};
  if (fs::is_directory("/dev/shm")) where.push_back("/dev/shm");
  k3::WriterScratch scratch;  // reused by every write, as k3_repack does
  for (const std::string& d : where)
    for (const bool direct : {true, false}) {
      SCOPED_TRACE(d + (direct ? " direct" : " buffered"));
      k3::SafetensorsWriter w;
      w.set_metadata({{"k3_note", "pieces"}});
      w.set_data_alignment(4096);
      w.set_direct_writes(direct);
      std::vector<uint64_t> next(tensors.size(), 0);  // each tensor's next expected offset
      using Piece = std::tuple<std::string, uint64_t, uint64_t>;  // name, offset, bytes
      std::vector<Piece> filled;                                  // every fill call, in order
      for (size_t t = 0; t < tensors.size(); ++t) {
        const Tensor& spec = tensors[t];
        w.add(
            spec.name, k3::DType::kU8, {static_cast<int64_t>(spec.bytes)},
            [&, t](uint8_t* dst, uint64_t offset, uint64_t n) {
              const Tensor& s = tensors[t];
              EXPECT_EQ(offset, next[t]) << s.name;
              EXPECT_EQ(n, std::min(s.piece == 0 ? s.bytes : s.piece, s.bytes - offset)) << s.name;
              for (uint64_t k = 0; k < n; ++k) dst[k] = pattern(t, offset + k);
              next[t] = offset + n;
              filled.emplace_back(s.name, offset, n);
            },
            spec.piece);
        if (t == 0) w.pad_to(4096);
      }
      const std::string out = d + "/k3_writer_pieces_" + std::to_string(::getpid());
      uint64_t reported = 0;
      w.write(
          out, [&](uint64_t n) { reported += n; }, &scratch);
      for (size_t t = 0; t < tensors.size(); ++t) EXPECT_EQ(next[t], tensors[t].bytes);
      // for_each_piece lists exactly those calls (the padding's fill included), in their order.
      std::vector<Piece> listed;
      w.for_each_piece([&](const std::string& name, uint64_t offset, uint64_t n) {
        if (name != k3::padding_tensor_name(0)) listed.emplace_back(name, offset, n);
      });
      EXPECT_GT(filled.size(), 70u);
      EXPECT_EQ(listed, filled);
      EXPECT_EQ(reported, w.data_bytes());
      EXPECT_EQ(fs::file_size(out), w.file_bytes());
      EXPECT_FALSE(fs::exists(out + ".tmp"));
      const k3::SafetensorsShard shard(k3::open_posix_file(out));
      EXPECT_EQ(shard.metadata().at("k3_note"), "pieces");
      EXPECT_EQ(shard.data_start() % 4096, 0u);
      EXPECT_EQ(shard.find("small")->file_offset % 4096, 0u);
      EXPECT_NE(shard.find(k3::padding_tensor_name(0)), nullptr);
      for (size_t t = 0; t < tensors.size(); ++t) {
        const k3::TensorInfo* info = shard.find(tensors[t].name);
        ASSERT_NE(info, nullptr) << tensors[t].name;
        std::vector<uint8_t> got(info->nbytes);
        shard.read(*info, got.data());
        uint64_t bad = got.size();
        for (uint64_t i = 0; i < got.size() && bad == got.size(); ++i)
          if (got[i] != pattern(t, i)) bad = i;
        EXPECT_EQ(bad, got.size()) << tensors[t].name << ": first wrong byte";
      }
      fs::remove(out);
    }
}

TEST(SafetensorsWriter, PaddingMatchesEveryFixtureShard) {
  // Rebuilding each fixture shard's tensor table must reproduce its header bytes exactly.
  for (const std::string& f : shard_files(kTinyDir)) {
    const std::string path = (fs::path(kTinyDir) / f).string();
    k3::SafetensorsShard shard(k3::open_posix_file(path));
    k3::SafetensorsWriter w;
    for (const auto& t : shard.tensors())
      w.add(t.name, t.dtype, t.shape, [](uint8_t*, uint64_t, uint64_t) {});
    EXPECT_EQ(w.header(), header_bytes(path)) << f;
  }
}

TEST(SafetensorsWriter, PaddingRule) {
  // 8 + header length is a multiple of 8, with 0..7 spaces; none when already aligned.
  for (int len = 1; len <= 24; ++len) {
    k3::SafetensorsWriter w;
    w.add_bytes(std::string(static_cast<size_t>(len), 'x'), k3::DType::kU8, {1}, {7});
    const std::string h = w.header();
    const size_t body = h.find_last_not_of(' ') + 1;
    EXPECT_EQ((8 + h.size()) % 8, 0u);
    EXPECT_EQ(h.size() - body, (8 - (8 + body) % 8) % 8);
  }
}

TEST(SafetensorsWriter, FailureLeavesNothingBehind) {
  TempDir dir("writer-fail");
  const std::string path = dir.file("b.safetensors");
  k3::SafetensorsWriter w;
  w.add_bytes("ok", k3::DType::kU8, {4}, {1, 2, 3, 4});
  w.add("bad", k3::DType::kU8, {4}, [](uint8_t*, uint64_t, uint64_t) { throw k3::Error("boom"); });
  try {
    w.write(path);
    FAIL() << "expected k3::Error";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(all_files(dir.path()).empty());

  k3::SafetensorsWriter ok;
  ok.add_bytes("ok", k3::DType::kU8, {1}, {1});
  const std::string missing = dir.file("no/such/dir/c.safetensors");
  try {
    ok.write(missing);
    FAIL() << "expected k3::Error";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("c.safetensors"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsWriter, RejectsBadInput) {
  k3::SafetensorsWriter w;
  EXPECT_THROW(w.add_bytes("x", k3::DType::kF32, {2}, {1, 2, 3}), k3::Error);
  w.add_bytes("y", k3::DType::kU8, {1}, {1});
  EXPECT_THROW(w.add_bytes("y", k3::DType::kU8, {1}, {1}), k3::Error);
  EXPECT_THROW(w.add_bytes("__metadata__", k3::DType::kU8, {1}, {1}), k3::Error);
}

// ---------------------------------------------------------------------------------------------
// Synthetic checkpoints

class SynthTiny : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("synth-tiny");
    k3::synth::SynthSpec spec = k3::synth::preset_spec("tiny");
    spec.progress = false;
    k3::synth::write_checkpoint(spec, dir_->path());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static TempDir* dir_;
};
TempDir* SynthTiny::dir_ = nullptr;

TEST_F(SynthTiny, SameFilesAsFixture) {
  EXPECT_EQ(shard_files(dir_->path()), shard_files(kTinyDir));
  EXPECT_EQ(shard_files(dir_->path()).size(), 10u);
  EXPECT_EQ(all_files(dir_->path()),
            (std::vector<std::string>{
                "config.json", "generation_config.json", "model-00001-of-000010.safetensors",
                "model-00002-of-000010.safetensors", "model-00003-of-000010.safetensors",
                "model-00004-of-000010.safetensors", "model-00005-of-000010.safetensors",
                "model-00006-of-000010.safetensors", "model-00007-of-000010.safetensors",
                "model-00008-of-000010.safetensors", "model-00009-of-000010.safetensors",
                "model-00010-of-000010.safetensors", "model.safetensors.index.json"}));
}

TEST_F(SynthTiny, OpensWithSnapshotAndMatchesFixtureTensors) {
  k3::ModelFiles synth(dir_->path());
  k3::ModelFiles fixture(kTinyDir);
  EXPECT_EQ(synth.prefix(), "language_model.");
  // Same text tensors (ModelFiles never opens the vision shard), same dtypes and shapes.
  std::map<std::string, Described> a, b;
  for (const auto& s : synth.shards())
    for (const auto& t : s->tensors()) a[t.name] = {t.name, t.dtype, t.shape};
  for (const auto& s : fixture.shards())
    for (const auto& t : s->tensors()) b[t.name] = {t.name, t.dtype, t.shape};
  EXPECT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b);
  EXPECT_NE(synth.find(k3::names::kEmbedTokens).info, nullptr);
  EXPECT_NE(synth.find(k3::names::expert(7, 15, k3::names::kExpertTensors[5])).info, nullptr);
}

TEST_F(SynthTiny, ShardOrderAndHeadersMatchFixture) {
  for (const std::string& f : shard_files(kTinyDir)) {
    const std::string mine = dir_->file(f);
    const std::string theirs = (fs::path(kTinyDir) / f).string();
    // Tensor order per shard: F32, BF16, U8, by name; experts lexicographic.
    EXPECT_EQ(describe(mine), describe(theirs)) << f;
    // Headers byte-identical (offsets, compact JSON, padding) and the same file size.
    EXPECT_EQ(header_bytes(mine), header_bytes(theirs)) << f;
    EXPECT_EQ(fs::file_size(mine), fs::file_size(theirs)) << f;
  }
  // Spot-check the convention directly on layer 1 (KDA + MoE).
  const auto t = describe(dir_->file("model-00002-of-000010.safetensors"));
  auto group = [](k3::DType d) { return d == k3::DType::kF32 ? 0 : d == k3::DType::kBF16 ? 1 : 2; };
  for (size_t i = 1; i < t.size(); ++i) {
    const int g0 = group(t[i - 1].dtype), g1 = group(t[i].dtype);
    EXPECT_TRUE(g0 < g1 || (g0 == g1 && t[i - 1].name < t[i].name)) << t[i].name;
  }
  const std::string e = "language_model.model.layers.1.block_sparse_moe.experts.";
  const auto it = std::find_if(t.begin(), t.end(),
                               [](const Described& d) { return d.dtype == k3::DType::kU8; });
  ASSERT_NE(it, t.end());
  EXPECT_EQ(it->name, e + "0.w1.weight_packed");
  EXPECT_EQ((it + 6)->name, e + "1.w1.weight_packed");
  EXPECT_EQ((it + 12)->name, e + "10.w1.weight_packed");
  EXPECT_EQ((it + 13)->name, e + "10.w1.weight_scale");
  EXPECT_EQ((it + 14)->name, e + "10.w2.weight_packed");
  EXPECT_EQ(t.back().name, e + "9.w3.weight_scale");
}

TEST_F(SynthTiny, IndexAndConfigsMatchFixture) {
  const auto index = nlohmann::json::parse(slurp(dir_->file("model.safetensors.index.json")));
  const auto fixture_index =
      nlohmann::json::parse(slurp(kTinyDir + "/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"], fixture_index["weight_map"]);
  uint64_t total = 0;
  for (const std::string& f : shard_files(dir_->path())) {
    k3::SafetensorsShard shard(k3::open_posix_file(dir_->file(f)));
    for (const auto& t : shard.tensors()) {
      total += t.nbytes;
      EXPECT_EQ(index["weight_map"][t.name], f) << t.name;
    }
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(total, 1453248u);
  EXPECT_EQ(total, k3::synth::total_tensor_bytes(k3::synth::preset_spec("tiny")));
  // Same formatting as the fixture, so the whole files are identical.
  EXPECT_EQ(slurp(dir_->file("model.safetensors.index.json")),
            slurp(kTinyDir + "/model.safetensors.index.json"));
  EXPECT_EQ(slurp(dir_->file("generation_config.json")),
            slurp(kTinyDir + "/generation_config.json"));
  EXPECT_EQ(slurp(dir_->file("config.json")), slurp(kTinyDir + "/config.json"));

  const auto root = nlohmann::json::parse(slurp(dir_->file("config.json")));
  EXPECT_EQ(root["architectures"][0], "KimiK3ForConditionalGeneration");
  EXPECT_EQ(root["model_type"], "kimi_k3");
  EXPECT_TRUE(root.contains("vision_config"));
  const k3::K3Config c = k3::parse_k3_config(root, "synth config.json");
  const k3::K3Config f =
      k3::parse_k3_config(nlohmann::json::parse(slurp(kTinyDir + "/config.json")), "fixture");
  EXPECT_EQ(c.hidden_size, f.hidden_size);
  EXPECT_EQ(c.num_hidden_layers, f.num_hidden_layers);
  EXPECT_EQ(c.vocab_size, f.vocab_size);
  EXPECT_EQ(c.intermediate_size, f.intermediate_size);
  EXPECT_EQ(c.num_attention_heads, f.num_attention_heads);
  EXPECT_EQ(c.q_lora_rank, f.q_lora_rank);
  EXPECT_EQ(c.kv_lora_rank, f.kv_lora_rank);
  EXPECT_EQ(c.qk_nope_head_dim, f.qk_nope_head_dim);
  EXPECT_EQ(c.qk_rope_head_dim, f.qk_rope_head_dim);
  EXPECT_EQ(c.v_head_dim, f.v_head_dim);
  EXPECT_EQ(c.num_experts, f.num_experts);
  EXPECT_EQ(c.num_experts_per_token, f.num_experts_per_token);
  EXPECT_EQ(c.moe_intermediate_size, f.moe_intermediate_size);
  EXPECT_EQ(c.routed_expert_hidden_size, f.routed_expert_hidden_size);
  EXPECT_EQ(c.num_shared_experts, f.num_shared_experts);
  EXPECT_EQ(c.attn_res_block_size, f.attn_res_block_size);
  EXPECT_EQ(c.kda_num_heads, f.kda_num_heads);
  EXPECT_EQ(c.kda_head_dim, f.kda_head_dim);
  EXPECT_EQ(c.kda_layers, f.kda_layers);
  EXPECT_EQ(c.bos_token_id, f.bos_token_id);
  EXPECT_EQ(c.eos_token_ids, f.eos_token_ids);
  EXPECT_EQ(c.pad_token_id, f.pad_token_id);
  EXPECT_EQ(c.attention, f.attention);
  EXPECT_EQ(c.ffn, f.ffn);
}

TEST_F(SynthTiny, WeightValuesAreSane) {
  k3::ModelFiles s(dir_->path());
  namespace n = k3::names;
  // A_log: head_dim entries, the first num_heads non-zero, the rest exactly 0.
  const auto a_log = read_floats(s.require(n::layer(1, n::kKdaALog), k3::DType::kF32, {16}));
  for (int i = 0; i < 16; ++i) {
    if (i < 4)
      EXPECT_GT(a_log[static_cast<size_t>(i)], 0.0f);
    else
      EXPECT_EQ(a_log[static_cast<size_t>(i)], 0.0f);
  }
  // Norm weights near 1, projections ~ 1/sqrt(fan_in), res_proj small.
  const auto norm = read_floats(s.find(n::layer(2, n::kInputLayernorm)));
  for (float v : norm) EXPECT_TRUE(v > 0.3f && v < 1.7f) << v;
  const auto q = read_floats(s.find(n::layer(1, n::kKdaQProj)));
  double ss = 0;
  for (float v : q) ss += static_cast<double>(v) * v;
  const double rms = std::sqrt(ss / static_cast<double>(q.size()));
  EXPECT_NEAR(rms, 1.0 / 8.0, 0.02);
  const auto embed = read_floats(s.find(n::kEmbedTokens));
  ss = 0;
  for (float v : embed) ss += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(ss / static_cast<double>(embed.size())), 1.0, 0.05);
  for (float v : read_floats(s.find(n::layer(3, n::kMlpResProj)))) EXPECT_LT(std::abs(v), 0.5f);
  // MXFP4 scales: never 0 or 255, and near the expected exponent.
  for (int k : {1, 3, 5}) {
    const auto t = s.find(n::expert(4, 9, n::kExpertTensors[k]));
    std::vector<uint8_t> raw(t.info->nbytes);
    k3::ModelFiles::read(t, raw.data());
    for (uint8_t b : raw) {
      EXPECT_GE(b, 110);
      EXPECT_LE(b, 135);
    }
  }
}

TEST(Synth, DeterministicInSeedAndThreads) {
  // A custom spec with a larger vocabulary so the embedding spans several fill chunks.
  k3::synth::SynthSpec spec = k3::synth::preset_spec("tiny");
  k3::synth::apply_overrides(&spec, 2, 4);
  spec.vocab_size = 8192;
  spec.bos_token_id = 8192 - 256;
  spec.eos_token_id = 8192 - 254;
  spec.pad_token_id = 8191;
  spec.media_placeholder_token_id = 8192 - 235;
  spec.progress = false;
  TempDir a("det-a"), b("det-b"), c("det-c");
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  k3::synth::write_checkpoint(spec, a.path());
  omp_set_num_threads(std::max(2, threads));
  k3::synth::write_checkpoint(spec, b.path());
  spec.seed = 2;
  k3::synth::write_checkpoint(spec, c.path());
  omp_set_num_threads(threads);

  ASSERT_EQ(all_files(a.path()), all_files(b.path()));
  ASSERT_EQ(all_files(a.path()).size(), 7u);  // 4 shards + index + config + generation config
  for (const std::string& f : all_files(a.path())) {
    EXPECT_EQ(slurp(a.file(f)), slurp(b.file(f))) << f;
    if (f.ends_with(".safetensors")) {
      EXPECT_EQ(header_bytes(a.file(f)), header_bytes(c.file(f))) << f;
      EXPECT_NE(slurp(a.file(f)), slurp(c.file(f))) << f;
    } else {
      EXPECT_EQ(slurp(a.file(f)), slurp(c.file(f))) << f;
    }
  }
  k3::ModelFiles snap(a.path());
  const k3::K3Config cfg = k3::parse_k3_config(snap.config_root(), "det");
  EXPECT_EQ(cfg.num_hidden_layers, 2);
  EXPECT_EQ(cfg.num_experts, 4);
  EXPECT_EQ(cfg.vocab_size, 8192);
  // 2 layers with the tiny rule: both are among the last two, so both MLA.
  EXPECT_TRUE(cfg.kda_layers.empty());
}

TEST(Synth, DemoPreset) {
  TempDir dir("synth-demo");
  k3::synth::SynthSpec spec = k3::synth::preset_spec("demo");
  spec.progress = false;
  k3::synth::write_checkpoint(spec, dir.path());
  k3::ModelFiles s(dir.path());
  EXPECT_EQ(s.prefix(), "language_model.");
  EXPECT_EQ(s.text_config()["vocab_size"], 163840);
  EXPECT_EQ(s.config_root()["bos_token_id"], 163584);
  EXPECT_EQ(s.config_root()["eos_token_id"], 163586);
  EXPECT_EQ(s.config_root()["pad_token_id"], 163839);
  EXPECT_EQ(s.config_root()["media_placeholder_token_id"], 163605);
  const auto gen = nlohmann::json::parse(slurp(dir.file("generation_config.json")));
  EXPECT_EQ(gen["eos_token_id"], 163586);
  const std::string assets = std::string(K3_SOURCE_DIR) + "/assets/k3-release";
  EXPECT_EQ(slurp(dir.file("tiktoken.model")), slurp(assets + "/tiktoken.model"));
  EXPECT_EQ(slurp(dir.file("tokenizer_config.json")), slurp(assets + "/tokenizer_config.json"));
  const k3::K3Config c = k3::parse_k3_config(s.config_root(), "demo config.json");
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_EQ(c.num_hidden_layers, 6);
  ASSERT_EQ(c.attention.size(), 6u);
  EXPECT_EQ(c.attention[4], k3::AttentionKind::kMLA);
  EXPECT_EQ(c.attention[5], k3::AttentionKind::kMLA);
  EXPECT_EQ(c.attention[0], k3::AttentionKind::kKDA);
  EXPECT_EQ(c.ffn[0], k3::FfnKind::kDense);
  EXPECT_EQ(c.ffn[1], k3::FfnKind::kMoE);
  s.require(k3::names::kEmbedTokens, k3::DType::kBF16, {163840, 256});
  s.require(k3::names::kLmHead, k3::DType::kBF16, {163840, 256});
  EXPECT_EQ(shard_files(dir.path()).size(), 8u);
  EXPECT_EQ(shard_files(dir.path()).front(), "model-00001-of-000008.safetensors");
}

TEST(Synth, SlicePresetMatchesReleasedByteCounts) {
  // Only the plan (no data): byte counts re-derived in docs/tensor_names.md §10 from the real
  // shards.
  k3::synth::SynthSpec spec = k3::synth::preset_spec("slice");
  EXPECT_EQ(spec.num_hidden_layers, 2);
  EXPECT_EQ(spec.num_experts, 16);
  EXPECT_EQ(spec.num_experts_per_token, 16);
  const uint64_t expert = 17547264, globals = 4697663488ull, vision = 192;
  const uint64_t layer0 = 2341213184ull, kda_moe = 1267744256ull, mla_moe = 844335616ull;
  // The per-layer MoE totals include the 896-expert router (BF16 [896,7168] + F32 bias [896]).
  const auto router = [](uint64_t e) { return e * (7168 * 2 + 4); };
  EXPECT_EQ(router(896), 12848640u);
  EXPECT_EQ(k3::synth::total_tensor_bytes(spec),
            layer0 + kda_moe - router(896) + router(16) + 16 * expert + globals + vision);
  k3::synth::apply_overrides(&spec, 4, 8);
  EXPECT_EQ(spec.num_experts_per_token, 8);
  EXPECT_EQ(k3::synth::total_tensor_bytes(spec), layer0 + 2 * kda_moe + mla_moe +
                                                     3 * (router(8) - router(896) + 8 * expert) +
                                                     globals + vision);
  spec.num_experts = 896;
  spec.num_hidden_layers = 93;
  spec.kda_layers = k3::synth::kda_layers_for("slice", 93);
  // The full model (slice rule plus the last layer as MLA): the released total_size.
  spec.kda_layers.erase(std::remove(spec.kda_layers.begin(), spec.kda_layers.end(), 93),
                        spec.kda_layers.end());
  EXPECT_EQ(spec.kda_layers.size(), 69u);
  EXPECT_EQ(k3::synth::total_tensor_bytes(spec) - vision, 1560860324864ull - 894717952ull);
  const k3::K3Config c = k3::parse_k3_config(k3::synth::make_config(spec), "slice");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.kda_projection_size(), 12288);
  EXPECT_EQ(c.attention[3], k3::AttentionKind::kMLA);
  EXPECT_EQ(c.attention[2], k3::AttentionKind::kKDA);
  EXPECT_EQ(c.attn_res_block_size, 12);
  EXPECT_EQ(k3::synth::shard_file_name(3, 96), "model-00003-of-000096.safetensors");
}

TEST(Synth, RejectsBadArguments) {
  EXPECT_THROW(k3::synth::preset_spec("huge"), k3::Error);
  k3::synth::SynthSpec spec = k3::synth::preset_spec("tiny");
  EXPECT_THROW(k3::synth::apply_overrides(&spec, 0, -1), k3::Error);
  k3::synth::apply_overrides(&spec, -1, 3);
  EXPECT_THROW(k3::synth::validate(spec), k3::Error);  // 3 experts < top-4
  TempDir dir("synth-bad");
  EXPECT_THROW(k3::synth::write_checkpoint(spec, dir.path()), k3::Error);
  EXPECT_TRUE(all_files(dir.path()).empty());
  spec = k3::synth::preset_spec("demo");
  spec.tokenizer_dir = dir.file("nowhere");
  EXPECT_THROW(k3::synth::write_checkpoint(spec, dir.path()), k3::Error);
  EXPECT_TRUE(all_files(dir.path()).empty());
}

}  // namespace

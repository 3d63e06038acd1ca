// The engine on checkpoints of other shapes than the fixture — other depths, two dense layers,
// MLA first, other head counts and block sizes, vocabularies that are not powers of two, longer
// prompts — against the independent float64 numpy reference in ref/ (derived from the spec,
// itself validated against Moonshot's goldens). Anything hard-coded to the fixture shows here.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/trace.h"
#include "synth_lib.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using k3::testing::Tensors;

struct Variant {
  std::string name;
  k3::synth::SynthSpec spec;
  int64_t prompt_length;
};

k3::synth::SynthSpec small_spec(int64_t vocab) {
  k3::synth::SynthSpec s = k3::synth::preset_spec("tiny");
  s.preset = "variant";
  s.vocab_size = vocab;
  s.bos_token_id = vocab - 256 > 0 ? vocab - 256 : 0;
  s.eos_token_id = vocab - 254 > 0 ? vocab - 254 : 1;
  s.pad_token_id = vocab - 1;
  s.media_placeholder_token_id = vocab - 235 > 0 ? vocab - 235 : 2;
  s.progress = false;
  return s;
}

std::vector<Variant> variants() {
  std::vector<Variant> out;
  {  // Two dense layers, block size 2, odd head counts, vocabulary 1000, conv width 3.
    k3::synth::SynthSpec s = small_spec(1000);
    s.num_hidden_layers = 6;
    s.first_k_dense_replace = 2;
    s.intermediate_size = 80;
    s.attn_res_block_size = 2;
    s.hidden_size = 48;
    s.kda_layers = {1, 3, 4, 6};
    s.kda_num_heads = 3;
    s.kda_head_dim = 16;
    s.short_conv_kernel_size = 3;
    s.num_attention_heads = 3;
    s.q_lora_rank = 24;
    s.kv_lora_rank = 16;
    s.qk_nope_head_dim = 8;
    s.qk_rope_head_dim = 4;
    s.v_head_dim = 12;
    s.num_experts = 8;
    s.num_experts_per_token = 3;
    s.num_shared_experts = 1;
    s.seed = 11;
    out.push_back({"two_dense_block2_vocab1000", s, 14});
  }
  {  // MLA first, no dense layer, block size 1, vocabulary 517, longer prompt.
    k3::synth::SynthSpec s = small_spec(517);
    s.num_hidden_layers = 5;
    s.first_k_dense_replace = 0;
    s.attn_res_block_size = 1;
    s.kda_layers = {2, 3, 5};
    s.num_attention_heads = 5;
    s.kda_num_heads = 2;
    s.kda_head_dim = 8;
    s.num_experts = 12;
    s.num_experts_per_token = 2;
    s.moe_intermediate_size = 96;
    s.routed_expert_hidden_size = 64;
    s.seed = 23;
    out.push_back({"mla_first_block1_vocab517", s, 40});
  }
  {  // The tiny dimensions, 11 layers, block size 4 (a partial last block), 25-token prompt.
    k3::synth::SynthSpec s = small_spec(1024);
    s.num_hidden_layers = 11;
    s.attn_res_block_size = 4;
    s.kda_layers = k3::synth::kda_layers_for("tiny", 11);
    s.seed = 37;
    out.push_back({"tiny_11_layers_block4", s, 25});
  }
  return out;
}

void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.name;
}

class VariantTest : public ::testing::TestWithParam<Variant> {};

TEST_P(VariantTest, MatchesTheIndependentReference) {
  const Variant& v = GetParam();
  const fs::path dir =
      fs::temp_directory_path() / ("k3_variant_" + v.name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  k3::synth::write_checkpoint(v.spec, dir.string());

  std::vector<int64_t> prompt;
  uint64_t x = 0x9e3779b97f4a7c15ull ^ v.spec.seed;
  for (int64_t t = 0; t < v.prompt_length; ++t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    prompt.push_back(static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(v.spec.vocab_size)));
  }
  const int64_t decode_steps = 4;

  // Engine: trace of the prefill, then greedy decode through the cache.
  k3::Engine engine(dir.string(), k3::LoadOptions::exact());
  k3::Session session(engine, v.prompt_length + decode_steps);
  k3::TraceRecorder recorder(engine.info().hidden_size, engine.info().num_experts_per_token);
  std::vector<float> all_logits;
  k3::PrefillHooks hooks;
  hooks.observer = &recorder;
  hooks.all_logits = &all_logits;
  std::vector<float> logits = session.prefill(prompt, hooks);
  const std::string engine_trace = (dir / "engine.safetensors").string();
  recorder.write(engine_trace, prompt, all_logits, engine.info().vocab_size);
  std::vector<int64_t> decode_ids;
  std::vector<std::vector<float>> decode_logits;
  for (int64_t j = 0; j < decode_steps; ++j) {
    decode_logits.push_back(logits);
    decode_ids.push_back(k3::argmax(logits));
    if (j + 1 < decode_steps) logits = session.step(decode_ids.back());
  }

  // Reference.
  std::string ids;
  for (int64_t id : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  const std::string ref_trace = (dir / "ref.safetensors").string();
  const std::string src = K3_SOURCE_DIR;
  const auto ref = k3::testing::run_command("/usr/bin/python3 " + src + "/ref/k3_ref.py trace " +
                                            dir.string() + " --ids " + ids + " --decode " +
                                            std::to_string(decode_steps) + " --out " + ref_trace);
  ASSERT_EQ(ref.status, 0) << ref.out;
  const auto cmp = k3::testing::run_command("/usr/bin/python3 " + src + "/ref/compare.py " +
                                            ref_trace + " " + engine_trace);
  EXPECT_EQ(cmp.status, 0) << cmp.out;
  std::printf("%s: %s", v.name.c_str(), cmp.out.c_str());

  const Tensors reference(ref_trace);
  const auto ref_ids = reference.i64("decode_ids");
  const auto ref_logits = reference.f32("decode_logits");
  const size_t V = static_cast<size_t>(v.spec.vocab_size);
  for (size_t j = 0; j < decode_ids.size() && j < ref_ids.size(); ++j) {
    k3::testing::expect_close(v.name + " decode_logits[" + std::to_string(j) + "]",
                              decode_logits[j].data(), ref_logits.data() + j * V, V);
    ASSERT_EQ(decode_ids[j], ref_ids[j]) << v.name << " decode step " << j;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Shapes, VariantTest, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<Variant>& param_info) {
                           return param_info.param.name;
                         });

}  // namespace

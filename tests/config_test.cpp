// config_test — K3Config parsing (model/config.h): every field of the k3-tiny fixture config, the
// released config's layer schedule, flat configs, and a message naming the key for each refusal.
#include "model/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "io/file.h"
#include "test_util.h"
#include "util/error.h"

using nlohmann::json;

namespace {

using k3::testing::error_of;

const std::string kTinyConfig = std::string(K3_SOURCE_DIR) + "/tests/data/k3-tiny/config.json";
const std::string kReleaseConfig = std::string(K3_SOURCE_DIR) + "/assets/k3-release/config.json";

json load(const std::string& path) {
  return json::parse(k3::read_text_file(path));
}
json tiny() {
  return load(kTinyConfig);
}

// Parses the tiny config after `edit`, expecting an error; returns its message.
std::string tiny_error(const std::function<void(json&)>& edit) {
  json c = tiny();
  edit(c);
  return error_of([&] { k3::parse_k3_config(c, "config.json"); });
}

std::vector<int64_t> layers_of(const k3::K3Config& c, k3::AttentionKind kind) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < c.attention.size(); ++i)
    if (c.attention[i] == kind) out.push_back(static_cast<int64_t>(i));
  return out;
}

// ---------------------------------------------------------------------------------------------
// The tiny fixture

TEST(ConfigTiny, EveryField) {
  const k3::K3Config c = k3::parse_k3_config(tiny(), "config.json");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 8);
  EXPECT_EQ(c.vocab_size, 1024);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.q_lora_rank, 32);
  EXPECT_EQ(c.kv_lora_rank, 32);
  EXPECT_EQ(c.qk_nope_head_dim, 16);
  EXPECT_EQ(c.qk_rope_head_dim, 8);
  EXPECT_EQ(c.v_head_dim, 16);
  EXPECT_EQ(c.num_experts, 16);
  EXPECT_EQ(c.num_experts_per_token, 4);
  EXPECT_EQ(c.moe_intermediate_size, 64);
  EXPECT_EQ(c.routed_expert_hidden_size, 32);
  EXPECT_EQ(c.num_shared_experts, 2);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_EQ(c.attn_res_block_size, 3);
  EXPECT_DOUBLE_EQ(c.activation_situ_beta, 4.0);
  EXPECT_DOUBLE_EQ(c.activation_situ_linear_beta, 25.0);
  EXPECT_EQ(c.kda_num_heads, 4);
  EXPECT_EQ(c.kda_head_dim, 16);
  EXPECT_EQ(c.short_conv_kernel_size, 4);
  EXPECT_DOUBLE_EQ(c.gate_lower_bound, -5.0);
  EXPECT_EQ(c.kda_layers, (std::vector<int64_t>{1, 2, 3, 5, 6}));
  EXPECT_EQ(c.bos_token_id, 768);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{770}));
  EXPECT_EQ(c.pad_token_id, 1023);

  // Derived sizes.
  EXPECT_EQ(c.qk_head_dim(), 24);
  EXPECT_EQ(c.kda_projection_size(), 64);
  EXPECT_EQ(c.shared_intermediate_size(), 128);
  EXPECT_EQ(c.num_blocks(), 3);
  EXPECT_DOUBLE_EQ(k3::K3Config::kMlaLowRankNormEps, 1e-6);
  EXPECT_DOUBLE_EQ(k3::K3Config::kKdaL2NormEps, 1e-6);
}

TEST(ConfigTiny, LayerSchedule) {
  const k3::K3Config c = k3::parse_k3_config(tiny(), "config.json");
  using A = k3::AttentionKind;
  const std::vector<A> want = {A::kKDA, A::kKDA, A::kKDA, A::kMLA,
                               A::kKDA, A::kKDA, A::kMLA, A::kMLA};
  EXPECT_EQ(c.attention, want);
  ASSERT_EQ(c.ffn.size(), 8u);
  EXPECT_EQ(c.ffn[0], k3::FfnKind::kDense);
  for (size_t i = 1; i < 8; ++i) EXPECT_EQ(c.ffn[i], k3::FfnKind::kMoE) << i;
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (c.is_block_start(i)) starts.push_back(i);
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 3, 6}));
}

TEST(ConfigTiny, SourceNameIsInMessages) {
  json c = tiny();
  c["text_config"].erase("hidden_size");
  const std::string msg = error_of([&] { k3::parse_k3_config(c, "/some/dir/config.json"); });
  EXPECT_HAS(msg, "/some/dir/config.json");
  EXPECT_HAS(msg, "hidden_size");
}

// ---------------------------------------------------------------------------------------------
// The released config

TEST(ConfigRelease, Schedule) {
  const k3::K3Config c = k3::parse_k3_config(load(kReleaseConfig), "config.json");
  EXPECT_EQ(c.num_hidden_layers, 93);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_EQ(c.num_experts, 896);
  EXPECT_EQ(c.num_experts_per_token, 16);
  EXPECT_EQ(c.moe_intermediate_size, 3072);
  EXPECT_EQ(c.routed_expert_hidden_size, 3584);
  EXPECT_EQ(c.intermediate_size, 33792);
  EXPECT_EQ(c.num_attention_heads, 96);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.kda_num_heads, 96);
  EXPECT_EQ(c.kda_head_dim, 128);
  EXPECT_EQ(c.kda_projection_size(), 12288);
  EXPECT_EQ(c.shared_intermediate_size(), 6144);
  EXPECT_EQ(c.attn_res_block_size, 12);
  EXPECT_EQ(c.bos_token_id, 163584);
  EXPECT_NE(std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), 163586),
            c.eos_token_ids.end());
  EXPECT_EQ(c.pad_token_id, 163839);

  std::vector<int64_t> mla_want;
  for (int64_t i = 0; i < 93; ++i)
    if (i % 4 == 3 || i == 92) mla_want.push_back(i);
  ASSERT_EQ(mla_want.size(), 24u);
  EXPECT_EQ(layers_of(c, k3::AttentionKind::kMLA), mla_want);
  EXPECT_EQ(layers_of(c, k3::AttentionKind::kKDA).size(), 69u);
  EXPECT_EQ(c.kda_layers.size(), 69u);

  ASSERT_EQ(c.ffn.size(), 93u);
  EXPECT_EQ(c.ffn[0], k3::FfnKind::kDense);
  for (size_t i = 1; i < 93; ++i) EXPECT_EQ(c.ffn[i], k3::FfnKind::kMoE) << i;

  std::vector<int64_t> starts;
  for (int64_t i = 0; i < 93; ++i)
    if (c.is_block_start(i)) starts.push_back(i);
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 12, 24, 36, 48, 60, 72, 84}));
  EXPECT_EQ(c.num_blocks(), 8);  // embedding + one per later block start
}

// ---------------------------------------------------------------------------------------------
// Layout variants

TEST(ConfigLayout, FlatConfigParses) {
  const json flat = tiny()["text_config"];  // carries bos/eos/pad itself
  ASSERT_FALSE(flat.contains("text_config"));
  const k3::K3Config c = k3::parse_k3_config(flat, "flat.json");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 8);
  EXPECT_EQ(c.kda_layers, (std::vector<int64_t>{1, 2, 3, 5, 6}));
  EXPECT_EQ(c.bos_token_id, 768);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{770}));
  EXPECT_EQ(c.pad_token_id, 1023);

  json broken = flat;
  broken.erase("num_experts");
  const std::string msg = error_of([&] { k3::parse_k3_config(broken, "flat.json"); });
  EXPECT_HAS(msg, "flat.json");
  EXPECT_HAS(msg, "num_experts");
}

TEST(ConfigLayout, SpecialIdsRootFirstThenTextConfig) {
  json c = tiny();
  c["eos_token_id"] = json::array({770, 771});
  c["text_config"]["eos_token_id"] = 5;
  c["bos_token_id"] = 769;
  auto cfg = k3::parse_k3_config(c, "config.json");
  EXPECT_EQ(cfg.eos_token_ids, (std::vector<int64_t>{770, 771}));
  EXPECT_EQ(cfg.bos_token_id, 769);
  // Fallback to text_config when the root lacks (or nulls) them.
  c.erase("eos_token_id");
  c["bos_token_id"] = nullptr;
  cfg = k3::parse_k3_config(c, "config.json");
  EXPECT_EQ(cfg.eos_token_ids, (std::vector<int64_t>{5}));
  EXPECT_EQ(cfg.bos_token_id, 768);
  // Absent everywhere: no ids, not an error.
  c.erase("bos_token_id");
  c["text_config"].erase("bos_token_id");
  cfg = k3::parse_k3_config(c, "config.json");
  EXPECT_EQ(cfg.bos_token_id, -1);
}

TEST(ConfigLayout, OptionalKeysDefault) {
  json c = tiny();
  c["text_config"].erase("rms_norm_eps");
  c["text_config"]["linear_attn_config"].erase("gate_lower_bound");
  c["text_config"].erase("routed_scaling_factor");
  c["text_config"]["linear_attn_config"].erase("full_attn_layers");
  c["text_config"].erase("topk_method");  // behaviour keys may be absent
  const k3::K3Config cfg = k3::parse_k3_config(c, "config.json");
  EXPECT_DOUBLE_EQ(cfg.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(cfg.gate_lower_bound, -5.0);
  EXPECT_DOUBLE_EQ(cfg.routed_scaling_factor, 1.0);
  EXPECT_EQ(layers_of(cfg, k3::AttentionKind::kMLA), (std::vector<int64_t>{3, 6, 7}));
}

TEST(ConfigLayout, NoDenseLayers) {
  json c = tiny();
  c["text_config"]["first_k_dense_replace"] = 0;
  c["text_config"].erase("intermediate_size");
  const k3::K3Config cfg = k3::parse_k3_config(c, "config.json");
  for (auto f : cfg.ffn) EXPECT_EQ(f, k3::FfnKind::kMoE);
  // With a dense layer the key is required.
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"].erase("intermediate_size"); }),
             "intermediate_size");
}

// ---------------------------------------------------------------------------------------------
// Refusals

TEST(ConfigReject, NotAnObject) {
  EXPECT_HAS(error_of([] { k3::parse_k3_config(json::array({1}), "config.json"); }), "config.json");
}

TEST(ConfigReject, MissingKeys) {
  for (const char* key :
       {"hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "q_lora_rank",
        "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_experts",
        "num_experts_per_token", "moe_intermediate_size", "routed_expert_hidden_size",
        "num_shared_experts", "attn_res_block_size", "activation_situ_beta",
        "activation_situ_linear_beta", "linear_attn_config", "first_k_dense_replace"}) {
    const std::string msg = tiny_error([&](json& j) { j["text_config"].erase(key); });
    EXPECT_HAS(msg, key);
    EXPECT_HAS(msg, "config.json");
  }
  for (const char* key : {"num_heads", "head_dim", "short_conv_kernel_size", "kda_layers"}) {
    const std::string msg =
        tiny_error([&](json& j) { j["text_config"]["linear_attn_config"].erase(key); });
    EXPECT_HAS(msg, key);
  }
  // null counts as missing.
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["hidden_size"] = nullptr; }), "hidden_size");
}

TEST(ConfigReject, MissingHiddenSizeNamesTheNestedKey) {
  const std::string msg = tiny_error([](json& j) { j["text_config"].erase("hidden_size"); });
  EXPECT_HAS(msg, "text_config.hidden_size");
}

TEST(ConfigReject, WrongTypes) {
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["hidden_size"] = "64"; }), "hidden_size");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["hidden_size"] = 64.5; }), "hidden_size");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["num_hidden_layers"] = true; }),
             "num_hidden_layers");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["rms_norm_eps"] = "1e-5"; }),
             "rms_norm_eps");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["linear_attn_config"] = 3; }),
             "linear_attn_config");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["linear_attn_config"]["kda_layers"] = 1; }),
             "kda_layers");
  EXPECT_HAS(tiny_error([](json& j) {
               j["text_config"]["linear_attn_config"]["kda_layers"] = {1, "2"};
             }),
             "kda_layers");
  EXPECT_HAS(tiny_error([](json& j) { j["eos_token_id"] = "770"; }), "eos_token_id");
  EXPECT_HAS(tiny_error([](json& j) { j["eos_token_id"] = {770, 1.5}; }), "eos_token_id");
}

TEST(ConfigReject, OutOfRange) {
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["hidden_size"] = 0; }), "hidden_size");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["hidden_size"] = -64; }), "hidden_size");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["num_hidden_layers"] = 0; }),
             "num_hidden_layers");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["num_experts_per_token"] = 17; }),
             "num_experts_per_token");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["num_experts_per_token"] = 0; }),
             "num_experts_per_token");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["first_k_dense_replace"] = 9; }),
             "first_k_dense_replace");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["rms_norm_eps"] = 0.0; }), "rms_norm_eps");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["attn_res_block_size"] = 0; }),
             "attn_res_block_size");
  EXPECT_HAS(
      tiny_error([](json& j) { j["text_config"]["linear_attn_config"]["gate_lower_bound"] = 1.0; }),
      "gate_lower_bound");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["routed_expert_hidden_size"] = 48; }),
             "routed_expert_hidden_size");
  EXPECT_HAS(tiny_error([](json& j) { j["text_config"]["moe_intermediate_size"] = 40; }),
             "moe_intermediate_size");
}

TEST(ConfigReject, KdaLayersOutOfRange) {
  const std::string zero = tiny_error([](json& j) {
    j["text_config"]["linear_attn_config"]["kda_layers"] = {0, 1, 2};
  });
  EXPECT_HAS(zero, "kda_layers");
  const std::string past = tiny_error([](json& j) {
    j["text_config"]["linear_attn_config"]["kda_layers"] = {1, 2, 9};
  });
  EXPECT_HAS(past, "kda_layers");
  EXPECT_HAS(past, "9");
  const std::string full = tiny_error([](json& j) {
    j["text_config"]["linear_attn_config"]["full_attn_layers"] = {4, 7, 9};
  });
  EXPECT_HAS(full, "full_attn_layers");
}

TEST(ConfigReject, UnsupportedBehaviour) {
  struct Case {
    const char* key;
    json value;
  };
  const std::vector<Case> cases = {
      {"hidden_act", "silu"},
      {"mla_use_nope", false},
      {"mla_use_output_gate", false},
      {"latent_moe_use_norm", false},
      {"moe_router_activation_func", "softmax"},
      {"moe_renormalize", false},
      {"topk_method", "greedy"},
      {"num_nextn_predict_layers", 1},
      {"tie_word_embeddings", true},
      {"num_expert_group", 2},
      {"topk_group", 2},
      {"moe_layer_freq", 2},
      {"num_key_value_heads", 2},
      {"hidden_act", 1},
      {"mla_use_nope", "true"},
  };
  for (const auto& c : cases) {
    const std::string msg = tiny_error([&](json& j) { j["text_config"][c.key] = c.value; });
    EXPECT_HAS(msg, c.key);
    EXPECT_HAS(msg, "config.json");
  }
  EXPECT_HAS(tiny_error([](json& j) {
               j["text_config"]["linear_attn_config"]["use_full_rank_gate"] = false;
             }),
             "use_full_rank_gate");
  EXPECT_HAS(tiny_error([](json& j) { j["tie_word_embeddings"] = true; }), "tie_word_embeddings");
  EXPECT_HAS(
      tiny_error([](json& j) { j["text_config"]["quantization_config"]["quant_method"] = "gptq"; }),
      "quant_method");
  EXPECT_HAS(
      tiny_error([](json& j) { j["text_config"]["quantization_config"]["format"] = "nvfp4"; }),
      "format");
}

TEST(ConfigReject, FullAttnLayersOverlapKdaLayers) {
  const std::string msg = tiny_error([](json& j) {
    j["text_config"]["linear_attn_config"]["full_attn_layers"] = {3, 4, 7, 8};
  });
  EXPECT_HAS(msg, "full_attn_layers");
  EXPECT_HAS(msg, "3");
}

TEST(ConfigReject, SpecialIdsOutsideVocab) {
  EXPECT_HAS(tiny_error([](json& j) { j["eos_token_id"] = 1024; }), "eos_token_id");
  EXPECT_HAS(tiny_error([](json& j) { j["eos_token_id"] = {770, 5000}; }), "5000");
  EXPECT_HAS(tiny_error([](json& j) { j["eos_token_id"] = -1; }), "eos_token_id");
  EXPECT_HAS(tiny_error([](json& j) { j["bos_token_id"] = 1024; }), "bos_token_id");
}

}  // namespace

namespace {

// Issue 16, defect 11: a quantization_config whose weights are not MXFP4 (4-bit floats in groups
// of 32) describes bytes the engine would misread; each disagreeing field is refused by its path.
TEST(ConfigReject, QuantizationConfigThatIsNotMxfp4) {
  const std::string base = "quantization_config.config_groups.group_0.weights.";
  const std::vector<std::pair<const char*, json>> cases = {
      {"group_size", 16}, {"group_size", 128}, {"num_bits", 8},
      {"num_bits", "4"},  {"type", "int"},     {"strategy", "channel"},
  };
  for (const auto& [key, value] : cases) {
    const std::string msg = tiny_error([&](json& j) {
      j["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"][key] = value;
    });
    EXPECT_HAS(msg, base + key);
    EXPECT_HAS(msg, "config.json");
  }
  EXPECT_HAS(tiny_error([](json& j) {
               j["text_config"]["quantization_config"]["config_groups"]["group_0"]["format"] =
                   "int-quantized";
             }),
             "quantization_config.config_groups.group_0.format");
  EXPECT_HAS(tiny_error([](json& j) {
               j["text_config"]["quantization_config"]["config_groups"]["group_0"] = 3;
             }),
             "config_groups.group_0");
  // The release's own quantization_config parses.
  EXPECT_NO_THROW(k3::parse_k3_config(load(kReleaseConfig), "config.json"));
}

}  // namespace

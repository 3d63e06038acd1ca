// model/config.h — K3Config: every hyperparameter the engine reads from config.json
// (docs/architecture.md §1.2), range-checked, plus the behaviour keys of §1.3 asserted, plus the
// derived layer schedule (KDA/MLA, dense/MoE, AttnRes block starts).
// Nothing about dimensions is hard-coded anywhere else: the same binary runs the tiny fixture
// and the 93-layer model.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace k3 {

enum class AttentionKind { kKDA, kMLA };
enum class FfnKind { kDense, kMoE };

struct K3Config {
  // Residual stream.
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-5;
  // Dense MLP (layers < first_k_dense_replace).
  int64_t first_k_dense_replace = 0;
  int64_t intermediate_size = 0;
  // Gated NoPE MLA.
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // LatentMoE.
  int64_t num_experts = 0;
  int64_t num_experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  int64_t routed_expert_hidden_size = 0;
  int64_t num_shared_experts = 0;
  double routed_scaling_factor = 1.0;
  // AttnRes.
  int64_t attn_res_block_size = 0;
  // SiTU bounds.
  double activation_situ_beta = 4.0;
  double activation_situ_linear_beta = 25.0;
  // KDA (linear_attn_config).
  int64_t kda_num_heads = 0;
  int64_t kda_head_dim = 0;
  int64_t short_conv_kernel_size = 0;
  double gate_lower_bound = -5.0;
  std::vector<int64_t> kda_layers;  // 1-based, as in config.json
  // Special ids (root first, text_config as fallback).
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = -1;

  // Derived schedule, one entry per layer.
  std::vector<AttentionKind> attention;  // [num_hidden_layers]
  std::vector<FfnKind> ffn;              // [num_hidden_layers]

  // MLA eps for q_a_layernorm / kv_a_layernorm: Moonshot's class default, not rms_norm_eps.
  static constexpr double kMlaLowRankNormEps = 1e-6;
  // KDA q/k L2 norm: added to the sum of squares.
  static constexpr double kKdaL2NormEps = 1e-6;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t kda_projection_size() const { return kda_num_heads * kda_head_dim; }
  int64_t shared_intermediate_size() const { return num_shared_experts * moe_intermediate_size; }
  bool is_block_start(int64_t layer) const { return layer % attn_res_block_size == 0; }
  // Number of AttnRes blocks appended over the whole stack (embedding included).
  int64_t num_blocks() const {
    return (num_hidden_layers + attn_res_block_size - 1) / attn_res_block_size;
  }
};

// Parses the root config.json object (text keys under text_config, or at the root when flat).
// Throws k3::Error naming `source` and the key on a missing key, a wrong type, a value out of
// range, or an unsupported behaviour value.
K3Config parse_k3_config(const nlohmann::json& root, const std::string& source);

}  // namespace k3

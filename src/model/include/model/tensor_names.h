// model/tensor_names.h — every checkpoint tensor name, in one table (after llama-arch).
// Names are relative to the snapshot prefix ("language_model." in the real checkpoint).
// Nothing else in the code base spells a tensor name.
#pragma once

#include <cstdint>
#include <string>

namespace k3::names {

// Globals.
inline constexpr const char* kEmbedTokens = "model.embed_tokens.weight";
inline constexpr const char* kLmHead = "lm_head.weight";
inline constexpr const char* kFinalNorm = "model.norm.weight";
inline constexpr const char* kOutputAttnResNorm = "model.output_attn_res_norm.weight";
inline constexpr const char* kOutputAttnResProj = "model.output_attn_res_proj.weight";

// "model.layers.{layer}." + suffix.
std::string layer(int64_t layer, const char* suffix);
// "model.layers.{layer}.block_sparse_moe.experts.{expert}." + suffix.
std::string expert(int64_t layer, int64_t expert, const char* suffix);

// The layer a name (relative to the prefix) belongs to, -1 for a global; and whether it is a
// routed expert's tensor (load progress counts what the loader reads).
int64_t layer_of(const std::string& name);
bool is_routed_expert(const std::string& name);

// Per-layer suffixes common to every layer.
inline constexpr const char* kInputLayernorm = "input_layernorm.weight";
inline constexpr const char* kPostAttentionLayernorm = "post_attention_layernorm.weight";
inline constexpr const char* kAttnResNorm = "self_attention_res_norm.weight";
inline constexpr const char* kAttnResProj = "self_attention_res_proj.weight";
inline constexpr const char* kMlpResNorm = "mlp_res_norm.weight";
inline constexpr const char* kMlpResProj = "mlp_res_proj.weight";

// KDA attention.
inline constexpr const char* kKdaQProj = "self_attn.q_proj.weight";
inline constexpr const char* kKdaKProj = "self_attn.k_proj.weight";
inline constexpr const char* kKdaVProj = "self_attn.v_proj.weight";
inline constexpr const char* kKdaQConv = "self_attn.q_conv1d.weight";
inline constexpr const char* kKdaKConv = "self_attn.k_conv1d.weight";
inline constexpr const char* kKdaVConv = "self_attn.v_conv1d.weight";
inline constexpr const char* kKdaFAProj = "self_attn.f_a_proj.weight";
inline constexpr const char* kKdaFBProj = "self_attn.f_b_proj.weight";
inline constexpr const char* kKdaBProj = "self_attn.b_proj.weight";
inline constexpr const char* kKdaALog = "self_attn.A_log";
inline constexpr const char* kKdaDtBias = "self_attn.dt_bias";
inline constexpr const char* kKdaGProj = "self_attn.g_proj.weight";
inline constexpr const char* kKdaONorm = "self_attn.o_norm.weight";
inline constexpr const char* kKdaOProj = "self_attn.o_proj.weight";

// Gated NoPE MLA attention.
inline constexpr const char* kMlaQAProj = "self_attn.q_a_proj.weight";
inline constexpr const char* kMlaQALayernorm = "self_attn.q_a_layernorm.weight";
inline constexpr const char* kMlaQBProj = "self_attn.q_b_proj.weight";
inline constexpr const char* kMlaKvAProj = "self_attn.kv_a_proj_with_mqa.weight";
inline constexpr const char* kMlaKvALayernorm = "self_attn.kv_a_layernorm.weight";
inline constexpr const char* kMlaKvBProj = "self_attn.kv_b_proj.weight";
inline constexpr const char* kMlaGProj = "self_attn.g_proj.weight";
inline constexpr const char* kMlaOProj = "self_attn.o_proj.weight";

// Dense MLP.
inline constexpr const char* kMlpGateProj = "mlp.gate_proj.weight";
inline constexpr const char* kMlpUpProj = "mlp.up_proj.weight";
inline constexpr const char* kMlpDownProj = "mlp.down_proj.weight";

// LatentMoE (non-expert).
inline constexpr const char* kMoeRouter = "block_sparse_moe.gate.weight";
inline constexpr const char* kMoeRouterBias = "block_sparse_moe.gate.e_score_correction_bias";
inline constexpr const char* kMoeLatentDown = "block_sparse_moe.routed_expert_down_proj.weight";
inline constexpr const char* kMoeLatentNorm = "block_sparse_moe.routed_expert_norm.weight";
inline constexpr const char* kMoeLatentUp = "block_sparse_moe.routed_expert_up_proj.weight";
inline constexpr const char* kMoeSharedGate = "block_sparse_moe.shared_experts.gate_proj.weight";
inline constexpr const char* kMoeSharedUp = "block_sparse_moe.shared_experts.up_proj.weight";
inline constexpr const char* kMoeSharedDown = "block_sparse_moe.shared_experts.down_proj.weight";

// Routed expert tensors, in their on-disk order (w1 = gate, w2 = down, w3 = up).
inline constexpr const char* kExpertTensors[6] = {
    "w1.weight_packed", "w1.weight_scale",  "w2.weight_packed",
    "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale",
};

}  // namespace k3::names

#include "synth_lib.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "io/file.h"
#include "io/safetensors_writer.h"
#include "model/tensor_names.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/progress.h"

#ifndef K3_SOURCE_DIR
#define K3_SOURCE_DIR "."
#endif

namespace k3::synth {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPrefix = "language_model.";
constexpr const char* kVisionTensor = "vision_tower.patch_embed.weight";

// The released config.json's structure (the k3-tiny fixture's copy: identical keys and
// behaviour values, tiny dimensions). make_config() overwrites every dimension and id.
constexpr const char* kConfigTemplate = R"json(
{
  "architectures": [
    "KimiK3ForConditionalGeneration"
  ],
  "auto_map": {
    "AutoConfig": "configuration_kimi_k3.KimiK3Config",
    "AutoModel": "modeling_kimi_k3.KimiK3ForConditionalGeneration",
    "AutoModelForCausalLM": "modeling_kimi_k3.KimiK3ForConditionalGeneration"
  },
  "bos_token_id": 768,
  "dtype": "bfloat16",
  "eos_token_id": 770,
  "ignore_index": -100,
  "image_placeholder": "<|kimi_image_placeholder|>",
  "media_placeholder_token_id": 789,
  "model_type": "kimi_k3",
  "pad_token_id": 1023,
  "text_config": {
    "_name_or_path": "",
    "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0,
    "add_cross_attention": false,
    "architectures": [
      "KimiLinearForCausalLM"
    ],
    "attn_res_block_size": 3,
    "auto_map": {
      "AutoConfig": "configuration_kimi_k3.KimiLinearConfig",
      "AutoModel": "modeling_kimi_linear.KimiLinearModel",
      "AutoModelForCausalLM": "modeling_kimi_linear.KimiLinearForCausalLM"
    },
    "bad_words_ids": null,
    "begin_suppress_tokens": null,
    "bos_token_id": 768,
    "chunk_size_feed_forward": 0,
    "cross_attention_hidden_size": null,
    "decoder_start_token_id": null,
    "diversity_penalty": 0.0,
    "do_sample": false,
    "dtype": "bfloat16",
    "early_stopping": false,
    "encoder_no_repeat_ngram_size": 0,
    "eos_token_id": 770,
    "exponential_decay_length_penalty": null,
    "finetuning_task": null,
    "first_k_dense_replace": 1,
    "forced_bos_token_id": null,
    "forced_eos_token_id": null,
    "hidden_act": "situ",
    "hidden_size": 64,
    "id2label": {
      "0": "LABEL_0",
      "1": "LABEL_1"
    },
    "initializer_range": 0.02,
    "intermediate_size": 96,
    "is_decoder": false,
    "is_encoder_decoder": false,
    "kv_lora_rank": 32,
    "label2id": {
      "LABEL_0": 0,
      "LABEL_1": 1
    },
    "latent_moe_use_norm": true,
    "length_penalty": 1.0,
    "linear_attn_config": {
      "full_attn_layers": [
        4,
        7,
        8
      ],
      "gate_lower_bound": -5.0,
      "head_dim": 16,
      "kda_layers": [
        1,
        2,
        3,
        5,
        6
      ],
      "num_heads": 4,
      "short_conv_kernel_size": 4,
      "use_full_rank_gate": true
    },
    "max_length": 20,
    "max_position_embeddings": 1048576,
    "min_length": 0,
    "mla_use_nope": true,
    "mla_use_output_gate": true,
    "model_type": "kimi_linear",
    "moe_intermediate_size": 64,
    "moe_layer_freq": 1,
    "moe_renormalize": true,
    "moe_router_activation_func": "sigmoid",
    "no_repeat_ngram_size": 0,
    "num_attention_heads": 4,
    "num_beam_groups": 1,
    "num_beams": 1,
    "num_expert_group": 1,
    "num_experts": 16,
    "num_experts_per_token": 4,
    "num_hidden_layers": 8,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 0,
    "num_return_sequences": 1,
    "num_shared_experts": 2,
    "output_attentions": false,
    "output_hidden_states": false,
    "output_scores": false,
    "pad_token_id": 1023,
    "prefix": null,
    "problem_type": null,
    "pruned_heads": {},
    "q_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "quantization_config": {
      "config_groups": {
        "group_0": {
          "format": "mxfp4-pack-quantized",
          "input_activations": null,
          "output_activations": null,
          "targets": [
            "Linear"
          ],
          "weights": {
            "actorder": null,
            "block_structure": null,
            "dynamic": false,
            "group_size": 32,
            "num_bits": 4,
            "observer": "minmax",
            "observer_kwargs": {},
            "scale_dtype": "torch.uint8",
            "strategy": "group",
            "symmetric": true,
            "type": "float",
            "zp_dtype": null
          }
        }
      },
      "format": "mxfp4-pack-quantized",
      "global_compression_ratio": null,
      "ignore": [
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
        "re:.*lm_head.*",
        "re:.*vision_tower.*",
        "re:.*mm_projector.*"
      ],
      "kv_cache_scheme": null,
      "quant_method": "compressed-tensors",
      "quantization_status": "compressed"
    },
    "remove_invalid_values": false,
    "repetition_penalty": 1.0,
    "return_dict": true,
    "return_dict_in_generate": false,
    "rms_norm_eps": 1e-05,
    "routed_expert_hidden_size": 32,
    "routed_scaling_factor": 1.0,
    "sep_token_id": null,
    "suppress_tokens": null,
    "task_specific_params": null,
    "temperature": 1.0,
    "tf_legacy_loss": false,
    "tie_encoder_decoder": false,
    "tie_word_embeddings": false,
    "tokenizer_class": null,
    "top_k": 50,
    "top_p": 1.0,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "torchscript": false,
    "transformers_version": "4.56.2",
    "typical_p": 1.0,
    "use_bfloat16": false,
    "use_cache": true,
    "use_grouped_topk": true,
    "v_head_dim": 16,
    "vocab_size": 1024
  },
  "tie_word_embeddings": false,
  "vision_config": {
    "_attn_implementation": "flash_attention_2",
    "activation_func": "gelu_pytorch_tanh",
    "attn_bias": false,
    "init_pos_emb_height": 64,
    "init_pos_emb_time": 4,
    "init_pos_emb_width": 64,
    "linear_bias": false,
    "merge_kernel_size": [
      2,
      2
    ],
    "merge_type": "sd2_tpool",
    "mlp_type": "mlp2",
    "mm_hidden_size": 1024,
    "mm_projector_type": "patchmergerv2",
    "norm_type": "rmsnorm",
    "patch_embed_proj_bias": false,
    "patch_size": 14,
    "pos_emb_interpolation_mode": "bilinear",
    "pos_emb_type": "divided_fixed",
    "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-05,
    "qkv_hidden_size": 1536,
    "text_hidden_size": 64,
    "vt_hidden_size": 1024,
    "vt_intermediate_size": 4096,
    "vt_num_attention_heads": 12,
    "vt_num_hidden_layers": 27
  }
})json";

// ---------------------------------------------------------------------------------------------
// Deterministic random numbers: every tensor has its own seed (from the run seed and its name),
// and every fixed-size chunk of it its own stream, so the bytes never depend on thread count.

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t s = a ^ (b * 0xD6E8FEB86659FD93ull);
  splitmix64(&s);
  return splitmix64(&s);
}

uint64_t tensor_seed(uint64_t seed, const std::string& name) {
  return mix(seed, fnv1a_64(name));
}

// Approximately standard normal from one 64-bit draw (Irwin-Hall of four 16-bit uniforms,
// rescaled to unit variance; bounded by +-3.46).
inline float normal_from(uint64_t r) {
  const uint32_t s = static_cast<uint32_t>(r & 0xFFFF) + static_cast<uint32_t>((r >> 16) & 0xFFFF) +
                     static_cast<uint32_t>((r >> 32) & 0xFFFF) + static_cast<uint32_t>(r >> 48);
  // Each piece is uniform on {0..65535}: mean 32767.5, variance (65536^2 - 1) / 12.
  return (static_cast<float>(s) - 131070.0f) * (1.7320508f / 65536.0f);
}

// Uniform in [0, 1).
inline float uniform_from(uint64_t r) {
  return static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
}

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// E[c^2] over the 16 E2M1 codes with uniform nibbles: (0+.25+1+2.25+4+9+16+36)/8.
constexpr double kE2M1Rms = 2.9261749;

// ---------------------------------------------------------------------------------------------
// Tensor plans.

enum class Init {
  kNormal,  // a + b * N(0,1)
  kALog,    // first `heads` entries uniform in [a, b), the rest exactly 0
  kPacked,  // uniform random bytes (two uniform E2M1 nibbles each)
  kScale,   // ue8m0 exponents: a + {-1, 0, +1}
};

struct TensorPlan {
  std::string name;  // full name as stored (prefix included)
  DType dtype;
  std::vector<int64_t> shape;
  Init init;
  double a = 0, b = 0;
  int64_t heads = 0;

  uint64_t numel() const {
    uint64_t n = 1;
    for (const int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
  uint64_t nbytes() const { return numel() * dtype_size(dtype); }
};

int dtype_group(DType d) {
  switch (d) {
    case DType::kF32:
      return 0;
    case DType::kBF16:
      return 1;
    case DType::kU8:
      return 2;
    default:
      return 3;
  }
}

// All tensors of one shard, in data order.
struct ShardPlan {
  std::vector<TensorPlan> tensors;
  uint64_t nbytes() const {
    uint64_t n = 0;
    for (const auto& t : tensors) n += t.nbytes();
    return n;
  }
};

class PlanBuilder {
 public:
  explicit PlanBuilder(std::string prefix) : prefix_(std::move(prefix)) {}

  // Linear weight [out, in], std = gain / sqrt(in).
  void linear(const std::string& name, int64_t out, int64_t in, double gain) {
    add(name, DType::kBF16, {out, in}, Init::kNormal, 0.0,
        gain / std::sqrt(static_cast<double>(in)));
  }
  // Norm weight near 1.
  void norm(const std::string& name, int64_t n, DType dtype = DType::kBF16, double spread = 0.15) {
    add(name, dtype, {n}, Init::kNormal, 1.0, spread);
  }
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, Init init, double a,
           double b, int64_t heads = 0) {
    shard_.tensors.push_back(
        TensorPlan{prefix_ + name, dtype, std::move(shape), init, a, b, heads});
  }
  // MXFP4 weight [out, in]: packed [out, in/2], scale [out, in/32]. Scale exponents are chosen
  // so the dequantised weight has std ~ gain / sqrt(in).
  void mxfp4(const std::string& packed, const std::string& scale, int64_t out, int64_t in,
             double gain) {
    const double target = gain / std::sqrt(static_cast<double>(in));
    const double e = std::round(127.0 + std::log2(target / kE2M1Rms));
    const double base = std::clamp(e, 2.0, 253.0);
    add(packed, DType::kU8, {out, in / 2}, Init::kPacked, 0, 0);
    add(scale, DType::kU8, {out, in / 32}, Init::kScale, base, 0);
  }
  // Sorts into the released data order: F32, BF16, U8; by name inside each group.
  ShardPlan finish() {
    std::stable_sort(shard_.tensors.begin(), shard_.tensors.end(),
                     [](const TensorPlan& x, const TensorPlan& y) {
                       const int gx = dtype_group(x.dtype), gy = dtype_group(y.dtype);
                       return gx != gy ? gx < gy : x.name < y.name;
                     });
    return std::move(shard_);
  }

 private:
  std::string prefix_;
  ShardPlan shard_;
};

bool is_kda_layer(const SynthSpec& s, int64_t layer) {
  return std::find(s.kda_layers.begin(), s.kda_layers.end(), layer + 1) != s.kda_layers.end();
}

ShardPlan plan_layer(const SynthSpec& s, int64_t i) {
  namespace n = k3::names;
  PlanBuilder b(kPrefix);
  const int64_t D = s.hidden_size;
  const auto L = [i](const char* suffix) { return n::layer(i, suffix); };
  const double res_proj_std = 0.8 / std::sqrt(static_cast<double>(D));

  // Common: pre-norms and AttnRes weights.
  b.norm(L(n::kInputLayernorm), D);
  b.norm(L(n::kPostAttentionLayernorm), D);
  b.norm(L(n::kAttnResNorm), D);
  b.add(L(n::kAttnResProj), DType::kBF16, {1, D}, Init::kNormal, 0.0, res_proj_std);
  b.norm(L(n::kMlpResNorm), D);
  b.add(L(n::kMlpResProj), DType::kBF16, {1, D}, Init::kNormal, 0.0, res_proj_std);

  if (is_kda_layer(s, i)) {
    const int64_t H = s.kda_num_heads, dk = s.kda_head_dim, P = H * dk,
                  K = s.short_conv_kernel_size;
    b.linear(L(n::kKdaQProj), P, D, 1.0);
    b.linear(L(n::kKdaKProj), P, D, 1.0);
    b.linear(L(n::kKdaVProj), P, D, 1.0);
    b.add(L(n::kKdaQConv), DType::kF32, {P, 1, K}, Init::kNormal, 0.0, 0.5);
    b.add(L(n::kKdaKConv), DType::kF32, {P, 1, K}, Init::kNormal, 0.0, 0.5);
    b.add(L(n::kKdaVConv), DType::kF32, {P, 1, K}, Init::kNormal, 0.0, 0.5);
    b.linear(L(n::kKdaFAProj), dk, D, 1.0);
    b.linear(L(n::kKdaFBProj), P, dk, 1.0);
    b.linear(L(n::kKdaBProj), H, D, 1.4);
    b.add(L(n::kKdaALog), DType::kF32, {dk}, Init::kALog, 0.3, 2.0, H);
    b.add(L(n::kKdaDtBias), DType::kF32, {P}, Init::kNormal, -1.0, 1.0);
    b.linear(L(n::kKdaGProj), P, D, 1.5);
    b.norm(L(n::kKdaONorm), dk, DType::kF32, 0.25);
    b.linear(L(n::kKdaOProj), D, P, 0.8);
  } else {
    const int64_t H = s.num_attention_heads, qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
    b.linear(L(n::kMlaQAProj), s.q_lora_rank, D, 1.0);
    b.norm(L(n::kMlaQALayernorm), s.q_lora_rank);
    b.linear(L(n::kMlaQBProj), H * qk, s.q_lora_rank, 1.3);
    b.linear(L(n::kMlaKvAProj), s.kv_lora_rank + s.qk_rope_head_dim, D, 0.5);
    b.norm(L(n::kMlaKvALayernorm), s.kv_lora_rank);
    b.linear(L(n::kMlaKvBProj), H * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank, 1.3);
    b.linear(L(n::kMlaGProj), H * s.v_head_dim, D, 1.5);
    b.linear(L(n::kMlaOProj), D, H * s.v_head_dim, 0.8);
  }

  if (i < s.first_k_dense_replace) {
    const int64_t I = s.intermediate_size;
    b.linear(L(n::kMlpGateProj), I, D, 2.0);
    b.linear(L(n::kMlpUpProj), I, D, 3.0);
    b.linear(L(n::kMlpDownProj), D, I, 0.25);
  } else {
    const int64_t E = s.num_experts, R = s.routed_expert_hidden_size, F = s.moe_intermediate_size;
    const int64_t S = s.num_shared_experts * F;
    b.linear(L(n::kMoeRouter), E, D, 1.5);
    b.add(L(n::kMoeRouterBias), DType::kF32, {E}, Init::kNormal, 0.0, 0.1);
    b.linear(L(n::kMoeLatentDown), R, D, 1.0);
    b.norm(L(n::kMoeLatentNorm), R, DType::kBF16, 0.1);
    b.linear(L(n::kMoeLatentUp), D, R, 1.1);
    b.linear(L(n::kMoeSharedGate), S, D, 2.0);
    b.linear(L(n::kMoeSharedUp), S, D, 3.0);
    b.linear(L(n::kMoeSharedDown), D, S, 0.25);
    for (int64_t e = 0; e < E; ++e) {
      const auto X = [i, e](int k) { return n::expert(i, e, n::kExpertTensors[k]); };
      b.mxfp4(X(0), X(1), F, R, 1.5);  // w1 = gate
      b.mxfp4(X(2), X(3), R, F, 1.0);  // w2 = down
      b.mxfp4(X(4), X(5), F, R, 1.5);  // w3 = up
    }
  }
  return b.finish();
}

ShardPlan plan_globals(const SynthSpec& s) {
  namespace n = k3::names;
  PlanBuilder b(kPrefix);
  const int64_t D = s.hidden_size, V = s.vocab_size;
  b.add(n::kEmbedTokens, DType::kBF16, {V, D}, Init::kNormal, 0.0, 1.0);
  b.linear(n::kLmHead, V, D, 1.5);
  b.norm(n::kFinalNorm, D);
  b.norm(n::kOutputAttnResNorm, D);
  b.add(n::kOutputAttnResProj, DType::kBF16, {1, D}, Init::kNormal, 0.0,
        0.8 / std::sqrt(static_cast<double>(D)));
  return b.finish();
}

ShardPlan plan_vision() {
  PlanBuilder b("");
  b.add(kVisionTensor, DType::kBF16, {8, 3, 2, 2}, Init::kNormal, 0.0, 0.1);
  return b.finish();
}

std::vector<ShardPlan> plan_all(const SynthSpec& s) {
  std::vector<ShardPlan> shards;
  for (int64_t i = 0; i < s.num_hidden_layers; ++i) shards.push_back(plan_layer(s, i));
  shards.push_back(plan_globals(s));
  shards.push_back(plan_vision());
  return shards;
}

// ---------------------------------------------------------------------------------------------
// Filling.

constexpr uint64_t kChunkElems = uint64_t{1} << 16;

void fill_tensor(const TensorPlan& t, uint64_t seed, uint8_t* dst, uint64_t nbytes) {
  const uint64_t numel = t.numel();
  if (nbytes != t.nbytes()) throw Error("synth: size mismatch for " + t.name);
  const uint64_t ts = tensor_seed(seed, t.name);
  const int64_t chunks = static_cast<int64_t>((numel + kChunkElems - 1) / kChunkElems);
  const float a = static_cast<float>(t.a), b = static_cast<float>(t.b);
#pragma omp parallel for schedule(dynamic, 4) if (chunks > 4)
  for (int64_t c = 0; c < chunks; ++c) {
    uint64_t state = mix(ts, static_cast<uint64_t>(c));
    const uint64_t lo = static_cast<uint64_t>(c) * kChunkElems;
    const uint64_t hi = std::min(numel, lo + kChunkElems);
    switch (t.init) {
      case Init::kPacked: {
        uint64_t j = lo;
        for (; j + 8 <= hi; j += 8) {
          const uint64_t r = splitmix64(&state);
          std::memcpy(dst + j, &r, 8);  // little-endian hosts only (like the reader)
        }
        if (j < hi) {
          const uint64_t r = splitmix64(&state);
          std::memcpy(dst + j, &r, hi - j);
        }
        break;
      }
      case Init::kScale: {
        const int base = static_cast<int>(t.a);
        for (uint64_t j = lo; j < hi; ++j) {
          const int v = base + static_cast<int>(splitmix64(&state) % 3) - 1;
          dst[j] = static_cast<uint8_t>(std::clamp(v, 1, 254));
        }
        break;
      }
      default: {
        for (uint64_t j = lo; j < hi; ++j) {
          const uint64_t r = splitmix64(&state);
          float v;
          switch (t.init) {
            case Init::kNormal:
              v = a + b * normal_from(r);
              break;
            case Init::kALog:
              v = static_cast<int64_t>(j) < t.heads ? a + (b - a) * uniform_from(r) : 0.0f;
              break;
            default:
              v = 0.0f;
              break;
          }
          if (t.dtype == DType::kF32) {
            std::memcpy(dst + 4 * j, &v, 4);
          } else {
            const uint16_t h = to_bf16(v);
            std::memcpy(dst + 2 * j, &h, 2);
          }
        }
        break;
      }
    }
  }
}

void copy_file_atomic(const std::string& from, const std::string& to) {
  const std::string bytes = read_text_file(from);
  write_file_atomic(to, bytes.data(), bytes.size());
}

void write_json(const std::string& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

std::vector<int64_t> range_complement(const std::vector<int64_t>& kda, int64_t layers) {
  std::vector<int64_t> out;
  for (int64_t n = 1; n <= layers; ++n)
    if (std::find(kda.begin(), kda.end(), n) == kda.end()) out.push_back(n);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string default_assets_dir() {
  return std::string(K3_SOURCE_DIR) + "/assets/k3-release";
}

std::vector<int64_t> kda_layers_for(const std::string& preset, int64_t layers) {
  std::vector<int64_t> kda;
  for (int64_t i = 0; i < layers; ++i) {
    bool mla = i % 4 == 3;
    if (preset != "slice") mla = mla || i >= layers - 2;
    if (!mla) kda.push_back(i + 1);
  }
  return kda;
}

SynthSpec preset_spec(const std::string& preset) {
  SynthSpec s;
  s.preset = preset;
  s.seed = 1;
  s.first_k_dense_replace = 1;
  s.num_shared_experts = 2;
  s.short_conv_kernel_size = 4;
  if (preset == "tiny") {
    s.hidden_size = 64;
    s.num_hidden_layers = 8;
    s.vocab_size = 1024;
    s.intermediate_size = 96;
    s.num_attention_heads = 4;
    s.q_lora_rank = 32;
    s.kv_lora_rank = 32;
    s.qk_nope_head_dim = 16;
    s.qk_rope_head_dim = 8;
    s.v_head_dim = 16;
    s.num_experts = 16;
    s.num_experts_per_token = 4;
    s.moe_intermediate_size = 64;
    s.routed_expert_hidden_size = 32;
    s.attn_res_block_size = 3;
    s.kda_num_heads = 4;
    s.kda_head_dim = 16;
  } else if (preset == "demo") {
    s.hidden_size = 256;
    s.num_hidden_layers = 6;
    s.vocab_size = 163840;
    s.intermediate_size = 512;
    s.num_attention_heads = 8;
    s.q_lora_rank = 64;
    s.kv_lora_rank = 64;
    s.qk_nope_head_dim = 32;
    s.qk_rope_head_dim = 16;
    s.v_head_dim = 32;
    s.num_experts = 16;
    s.num_experts_per_token = 4;
    s.moe_intermediate_size = 128;
    s.routed_expert_hidden_size = 128;
    s.attn_res_block_size = 3;
    s.kda_num_heads = 8;
    s.kda_head_dim = 32;
    s.tokenizer_dir = default_assets_dir();
  } else if (preset == "slice") {
    s.hidden_size = 7168;
    s.num_hidden_layers = 2;
    s.vocab_size = 163840;
    s.intermediate_size = 33792;
    s.num_attention_heads = 96;
    s.q_lora_rank = 1536;
    s.kv_lora_rank = 512;
    s.qk_nope_head_dim = 128;
    s.qk_rope_head_dim = 64;
    s.v_head_dim = 128;
    s.num_experts = 16;
    s.num_experts_per_token = 16;
    s.moe_intermediate_size = 3072;
    s.routed_expert_hidden_size = 3584;
    s.attn_res_block_size = 12;
    s.kda_num_heads = 96;
    s.kda_head_dim = 128;
  } else {
    throw Error("unknown preset \"" + preset + "\" (expected tiny, demo or slice)");
  }
  if (preset == "tiny") {
    // Special ids at the released model's distances from the end of the vocabulary.
    s.bos_token_id = s.vocab_size - 256;
    s.eos_token_id = s.vocab_size - 254;
    s.pad_token_id = s.vocab_size - 1;
    s.media_placeholder_token_id = s.vocab_size - 235;
  } else {
    s.bos_token_id = 163584;
    s.eos_token_id = 163586;
    s.pad_token_id = 163839;
    s.media_placeholder_token_id = 163605;
  }
  s.kda_layers = kda_layers_for(preset, s.num_hidden_layers);
  return s;
}

void apply_overrides(SynthSpec* spec, int64_t layers, int64_t experts) {
  if (layers >= 0) {
    if (layers < 1) throw Error("--layers must be >= 1 (got " + std::to_string(layers) + ")");
    spec->num_hidden_layers = layers;
    spec->kda_layers = kda_layers_for(spec->preset, layers);
  }
  if (experts >= 0) {
    if (experts < 1) throw Error("--experts must be >= 1 (got " + std::to_string(experts) + ")");
    spec->num_experts = experts;
    if (spec->preset == "slice") spec->num_experts_per_token = std::min<int64_t>(16, experts);
  }
}

void validate(const SynthSpec& s) {
  const auto need = [](bool ok, const std::string& what) {
    if (!ok) throw Error("invalid synthetic checkpoint spec: " + what);
  };
  need(s.hidden_size >= 1, "hidden_size must be >= 1");
  need(s.num_hidden_layers >= 1,
       "--layers must be >= 1 (got " + std::to_string(s.num_hidden_layers) + ")");
  need(s.vocab_size >= 1, "vocab_size must be >= 1");
  for (const int64_t id :
       {s.bos_token_id, s.eos_token_id, s.pad_token_id, s.media_placeholder_token_id})
    need(id >= 0 && id < s.vocab_size, "special id " + std::to_string(id) +
                                           " is outside the vocabulary of " +
                                           std::to_string(s.vocab_size));
  need(s.first_k_dense_replace >= 0 && s.first_k_dense_replace <= s.num_hidden_layers,
       "first_k_dense_replace must be in [0, layers]");
  need(s.first_k_dense_replace == 0 || s.intermediate_size >= 1, "intermediate_size must be >= 1");
  need(s.num_attention_heads >= 1 && s.q_lora_rank >= 1 && s.kv_lora_rank >= 1 &&
           s.qk_nope_head_dim >= 1 && s.qk_rope_head_dim >= 0 && s.v_head_dim >= 1,
       "MLA dimensions must be positive");
  need(s.kda_num_heads >= 1 && s.kda_head_dim >= 1 && s.short_conv_kernel_size >= 1,
       "KDA dimensions must be positive");
  need(s.kda_num_heads <= s.kda_head_dim,
       "KDA heads (" + std::to_string(s.kda_num_heads) + ") must be <= head_dim (" +
           std::to_string(s.kda_head_dim) + "): A_log has head_dim entries");
  need(s.num_experts_per_token >= 1, "top-k must be >= 1");
  need(s.num_experts >= s.num_experts_per_token, "--experts (" + std::to_string(s.num_experts) +
                                                     ") must be >= top-k (" +
                                                     std::to_string(s.num_experts_per_token) + ")");
  need(s.moe_intermediate_size >= 32 && s.moe_intermediate_size % 32 == 0,
       "moe_intermediate_size must be a positive multiple of 32 (MXFP4 groups)");
  need(s.routed_expert_hidden_size >= 32 && s.routed_expert_hidden_size % 32 == 0,
       "routed_expert_hidden_size must be a positive multiple of 32 (MXFP4 groups)");
  need(s.num_shared_experts >= 1, "num_shared_experts must be >= 1");
  need(s.attn_res_block_size >= 1, "attn_res_block_size must be >= 1");
  int64_t prev = 0;
  for (const int64_t k : s.kda_layers) {
    need(k > prev && k <= s.num_hidden_layers,
         "kda_layers must be increasing 1-based layer numbers");
    prev = k;
  }
}

nlohmann::json make_config(const SynthSpec& s) {
  nlohmann::json c = nlohmann::json::parse(kConfigTemplate);
  c["bos_token_id"] = s.bos_token_id;
  c["eos_token_id"] = s.eos_token_id;
  c["pad_token_id"] = s.pad_token_id;
  c["media_placeholder_token_id"] = s.media_placeholder_token_id;
  nlohmann::json& t = c["text_config"];
  t["bos_token_id"] = s.bos_token_id;
  t["eos_token_id"] = s.eos_token_id;
  t["pad_token_id"] = s.pad_token_id;
  t["hidden_size"] = s.hidden_size;
  t["num_hidden_layers"] = s.num_hidden_layers;
  t["vocab_size"] = s.vocab_size;
  t["first_k_dense_replace"] = s.first_k_dense_replace;
  t["intermediate_size"] = s.intermediate_size;
  t["num_attention_heads"] = s.num_attention_heads;
  t["num_key_value_heads"] = s.num_attention_heads;
  t["q_lora_rank"] = s.q_lora_rank;
  t["kv_lora_rank"] = s.kv_lora_rank;
  t["qk_nope_head_dim"] = s.qk_nope_head_dim;
  t["qk_rope_head_dim"] = s.qk_rope_head_dim;
  t["v_head_dim"] = s.v_head_dim;
  t["num_experts"] = s.num_experts;
  t["num_experts_per_token"] = s.num_experts_per_token;
  t["moe_intermediate_size"] = s.moe_intermediate_size;
  t["routed_expert_hidden_size"] = s.routed_expert_hidden_size;
  t["num_shared_experts"] = s.num_shared_experts;
  t["attn_res_block_size"] = s.attn_res_block_size;
  nlohmann::json& la = t["linear_attn_config"];
  la["num_heads"] = s.kda_num_heads;
  la["head_dim"] = s.kda_head_dim;
  la["short_conv_kernel_size"] = s.short_conv_kernel_size;
  la["kda_layers"] = s.kda_layers;
  la["full_attn_layers"] = range_complement(s.kda_layers, s.num_hidden_layers);
  c["vision_config"]["text_hidden_size"] = s.hidden_size;
  return c;
}

std::string shard_file_name(int64_t number, int64_t total) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05lld-of-%06lld.safetensors",
                static_cast<long long>(number), static_cast<long long>(total));
  return buf;
}

uint64_t total_tensor_bytes(const SynthSpec& spec) {
  uint64_t total = 0;
  for (const auto& shard : plan_all(spec)) total += shard.nbytes();
  return total;
}

namespace {

// One file write_checkpoint writes: a shard (its writer), JSON text, or a copied tokenizer file.
struct PlannedFile {
  std::string name;
  uint64_t bytes = 0;
  std::unique_ptr<SafetensorsWriter> shard;
  std::string text;
  std::string copy_from;
};

const char* const kTokenizerFiles[] = {"tiktoken.model", "tokenizer_config.json"};

// What a file takes of its filesystem: whole 4 KiB blocks (ext4's and XFS's usual size).
uint64_t round_up_to_block(uint64_t bytes) {
  return (bytes + 4095) / 4096 * 4096;
}

// Every file of the checkpoint, in the order written: the shards, the index,
// generation_config.json, the tokenizer files, and config.json last (its presence marks a
// complete checkpoint). The shard writers' fills read `shards`, which must outlive them.
std::vector<PlannedFile> plan_files(const SynthSpec& spec, const std::vector<ShardPlan>& shards) {
  std::vector<PlannedFile> files;
  const int64_t total_shards = static_cast<int64_t>(shards.size());
  uint64_t total_bytes = 0;
  std::map<std::string, std::string> weight_map;
  for (int64_t k = 0; k < total_shards; ++k) {
    PlannedFile f;
    f.name = shard_file_name(k + 1, total_shards);
    f.shard = std::make_unique<SafetensorsWriter>();
    for (const TensorPlan& t : shards[static_cast<size_t>(k)].tensors) {
      const TensorPlan* tp = &t;
      const uint64_t seed = spec.seed;
      f.shard->add(t.name, t.dtype, t.shape, [tp, seed](uint8_t* dst, uint64_t, uint64_t nbytes) {
        fill_tensor(*tp, seed, dst, nbytes);
      });
      weight_map[t.name] = f.name;
    }
    f.bytes = f.shard->file_bytes();
    total_bytes += shards[static_cast<size_t>(k)].nbytes();
    files.push_back(std::move(f));
  }
  auto text = [&](const std::string& name, std::string body) {
    PlannedFile f;
    f.name = name;
    f.bytes = body.size();
    f.text = std::move(body);
    files.push_back(std::move(f));
  };
  // A sorted json object, not an ordered_json: weight_map is already sorted and "metadata" sorts
  // before "weight_map", so the text is the same, and an ordered_json's insert is a linear search
  // (the release's ~500k tensors took minutes).
  nlohmann::json index;
  index["metadata"]["total_size"] = total_bytes;
  nlohmann::json& wm = index["weight_map"];
  wm = nlohmann::json::object();
  for (const auto& [name, file] : weight_map) wm.emplace(name, file);
  text("model.safetensors.index.json", index.dump(2) + "\n");
  nlohmann::ordered_json gen;
  gen["max_length"] = 1048576;
  gen["eos_token_id"] = spec.eos_token_id;
  text("generation_config.json", gen.dump(2) + "\n");
  if (!spec.tokenizer_dir.empty())
    for (const char* name : kTokenizerFiles) {
      PlannedFile f;
      f.name = name;
      f.copy_from = (fs::path(spec.tokenizer_dir) / name).string();
      std::error_code ec;
      const uintmax_t size = fs::file_size(f.copy_from, ec);
      f.bytes = ec ? 0 : size;
      files.push_back(std::move(f));
    }
  text("config.json", make_config(spec).dump(2));
  return files;
}

}  // namespace

WritePlan plan_write(const SynthSpec& spec, const std::string& out_dir) {
  const std::vector<ShardPlan> shards = plan_all(spec);
  WritePlan plan;
  // Each file goes to a temp name and is renamed over the file of that name (if any): while the
  // k-th is written, the ones before it have replaced theirs and its old copy still exists.
  int64_t grown = 0;
  for (const PlannedFile& f : plan_files(spec, shards)) {
    const int64_t bytes = static_cast<int64_t>(round_up_to_block(f.bytes));
    std::error_code ec;
    const uintmax_t old_size = fs::file_size(fs::path(out_dir) / f.name, ec);
    const int64_t old_bytes = ec ? 0 : static_cast<int64_t>(round_up_to_block(old_size));
    plan.needed_bytes =
        std::max(plan.needed_bytes, static_cast<uint64_t>(std::max<int64_t>(0, grown + bytes)));
    grown += bytes - old_bytes;
    plan.bytes += f.bytes;
    ++plan.files;
  }
  return plan;
}

void check_free_space(const WritePlan& plan, uint64_t free_bytes, const std::string& out_dir) {
  if (free_bytes >= plan.needed_bytes) return;
  throw Error(out_dir + ": the checkpoint needs " + std::to_string(plan.needed_bytes) + " bytes (" +
              gb_text(plan.needed_bytes) + ") and its filesystem has " +
              std::to_string(free_bytes) + " bytes (" + gb_text(free_bytes) +
              ") free: choose another --out, fewer --layers or --experts, or free space");
}

std::string gb_text(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, bytes >= 100000000 ? "%.1f GB" : "%.3f GB",
                static_cast<double>(bytes) / 1e9);
  return buf;
}

void write_checkpoint(const SynthSpec& spec, const std::string& out_dir) {
  validate(spec);
  // Check the tokenizer source before writing gigabytes.
  if (!spec.tokenizer_dir.empty()) {
    for (const char* f : kTokenizerFiles) {
      const fs::path p = fs::path(spec.tokenizer_dir) / f;
      if (!fs::is_regular_file(p))
        throw Error(p.string() + ": tokenizer file not found (see --assets)");
    }
  }

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir))
    throw Error(out_dir + ": cannot create output directory" + (ec ? ": " + ec.message() : ""));

  const std::vector<ShardPlan> shards = plan_all(spec);
  uint64_t total_bytes = 0;
  for (const auto& s : shards) total_bytes += s.nbytes();
  std::unique_ptr<Progress> progress;
  if (spec.progress) progress = std::make_unique<Progress>("k3_synth " + spec.preset, total_bytes);
  for (const PlannedFile& f : plan_files(spec, shards)) {
    const std::string path = (fs::path(out_dir) / f.name).string();
    if (f.shard) {
      if (progress) progress->set_label("k3_synth " + spec.preset + " " + f.name);
      f.shard->write(path, [&progress](uint64_t n) {
        if (progress) progress->advance(n);
      });
    } else if (!f.copy_from.empty()) {
      copy_file_atomic(f.copy_from, path);
    } else {
      write_json(path, f.text);
    }
  }
  if (progress) {
    progress->set_label("k3_synth " + spec.preset);  // the closing line is the run's
    progress->finish();
  }
}

}  // namespace k3::synth

// tools/synth_lib.h — synthetic Kimi K3 checkpoints in the exact layout of the released snapshot
// (docs/architecture.md §1, docs/tensor_names.md, docs/quant_formats.md §1;
// tests/data/k3-tiny/README.md): wrapper config.json, the `language_model.` prefix, one shard per
// decoder layer, a globals shard and a vision shard, per-shard data order F32 | BF16 | U8 by name,
// MXFP4 routed experts, the index json. Weights are random but deterministic in the seed, scaled so
// activations stay O(1). Owns: presets, the tensor list per layer, the weight distributions. Does
// not own: the safetensors container (io/safetensors_writer.h) or config parsing (model/config.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace k3::synth {

// Every dimension of a synthetic checkpoint (names follow config.json).
struct SynthSpec {
  std::string preset;  // "tiny", "demo", "slice" (informational once built)
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t vocab_size = 0;
  int64_t first_k_dense_replace = 1;
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
  int64_t num_shared_experts = 2;
  // AttnRes.
  int64_t attn_res_block_size = 0;
  // KDA.
  int64_t kda_num_heads = 0;
  int64_t kda_head_dim = 0;
  int64_t short_conv_kernel_size = 4;
  std::vector<int64_t> kda_layers;  // 1-based, as in config.json
  // Special ids.
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 0;
  int64_t pad_token_id = 0;
  int64_t media_placeholder_token_id = 0;
  // Generation.
  uint64_t seed = 0;
  // Tokenizer files (tiktoken.model, tokenizer_config.json) copied from this directory into the
  // output when non-empty.
  std::string tokenizer_dir;
  // Draw a progress bar on stderr (only when it is a terminal).
  bool progress = true;
};

// The preset's spec with default layers/experts/seed. Throws k3::Error for an unknown preset.
//   tiny:  exactly tests/data/k3-tiny's dimensions (D 64, 8 layers, V 1024, 16 experts top-4).
//   demo:  D 256, 6 layers, the real vocabulary (163840) and special ids, real tokenizer files.
//   slice: the released per-layer dimensions (D 7168, ...), 2 layers, 16 experts top-16.
SynthSpec preset_spec(const std::string& preset);

// Changes the layer count (recomputing kda_layers with the preset's schedule rule) and/or the
// expert count (slice: top-k becomes min(16, E)). A value < 0 leaves that field unchanged.
void apply_overrides(SynthSpec* spec, int64_t layers, int64_t experts);

// The preset's KDA schedule for `layers` layers, 1-based. tiny/demo: MLA iff i%4==3 or i is
// one of the last two layers (ends with two MLA layers like the released model); slice: MLA iff
// i%4==3.
std::vector<int64_t> kda_layers_for(const std::string& preset, int64_t layers);

// Throws k3::Error with a one-line reason when the spec cannot be written.
void validate(const SynthSpec& spec);

// The wrapper config.json object (structure of the released config; dims from `spec`).
nlohmann::json make_config(const SynthSpec& spec);

// Shard file name: "model-00003-of-000010.safetensors" (5-digit number, 6-digit total).
std::string shard_file_name(int64_t number, int64_t total);

// Total tensor bytes of the checkpoint `spec` describes (index metadata.total_size).
uint64_t total_tensor_bytes(const SynthSpec& spec);

// What write_checkpoint(spec, out_dir) will write, worked out without writing: `bytes`, every
// file's size (the shards exactly, from their headers; the JSON; the tokenizer files) and
// `needed_bytes`, the most the checkpoint adds to out_dir's filesystem at any moment, in whole
// 4 KiB blocks: each file is written beside the file of its name (if any) and then replaces it.
struct WritePlan {
  uint64_t bytes = 0;
  uint64_t needed_bytes = 0;
  int64_t files = 0;
};
WritePlan plan_write(const SynthSpec& spec, const std::string& out_dir);

// Throws k3::Error naming out_dir, the bytes needed and the bytes free when free_bytes (the
// filesystem's, for an unprivileged writer) is less than plan.needed_bytes.
void check_free_space(const WritePlan& plan, uint64_t free_bytes, const std::string& out_dir);

// "8.6 GB" (one decimal from 0.1 GB up, else three: "0.004 GB").
std::string gb_text(uint64_t bytes);

// Writes the whole checkpoint into `out_dir` (created when missing): config.json,
// generation_config.json, num_hidden_layers + 2 shards, model.safetensors.index.json and, when
// spec.tokenizer_dir is set, the tokenizer files. Every file goes through a temp name + rename.
// Deterministic in spec.seed (independent of thread count). Throws k3::Error.
void write_checkpoint(const SynthSpec& spec, const std::string& out_dir);

// Default directory of the released tokenizer files (assets/k3-release in the source tree).
std::string default_assets_dir();

}  // namespace k3::synth

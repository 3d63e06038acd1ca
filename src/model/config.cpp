#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace k3 {
namespace {

using nlohmann::json;

class Reader {
 public:
  Reader(const json& obj, std::string source, std::string scope)
      : obj_(obj), source_(std::move(source)), scope_(std::move(scope)) {}

  const json* find(const std::string& key) const {
    const auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(source_ + ": " + scope_ + key + ": " + what);
  }
  const json& need(const std::string& key) const {
    const json* v = find(key);
    if (!v) fail(key, "missing");
    return *v;
  }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) const {
    const json& v = need(key);
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      fail(key, std::to_string(x) + " is outside [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
    return x;
  }
  double number(const std::string& key, double lo, double hi) const {
    const json& v = need(key);
    if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi))
      fail(key, v.dump() + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
  }
  double number_or(const std::string& key, double fallback, double lo, double hi) const {
    return find(key) ? number(key, lo, hi) : fallback;
  }
  // Asserts a behaviour key. Absent keys are accepted (older copies of the config lack some).
  void expect_bool(const std::string& key, bool want) const {
    const json* v = find(key);
    if (!v) return;
    if (!v->is_boolean()) fail(key, "expected a boolean, got " + v->dump());
    if (v->get<bool>() != want)
      fail(key, "unsupported value " + v->dump() + " (this engine implements " +
                    (want ? "true" : "false") + ")");
  }
  void expect_string(const std::string& key, const std::string& want) const {
    const json* v = find(key);
    if (!v) return;
    if (!v->is_string()) fail(key, "expected a string, got " + v->dump());
    if (v->get<std::string>() != want)
      fail(key, "unsupported value " + v->dump() + " (this engine implements \"" + want + "\")");
  }
  void expect_int(const std::string& key, int64_t want) const {
    const json* v = find(key);
    if (!v) return;
    if (!v->is_number_integer() || v->get<int64_t>() != want)
      fail(key, "unsupported value " + v->dump() + " (this engine implements " +
                    std::to_string(want) + ")");
  }
  std::vector<int64_t> int_list(const std::string& key, int64_t lo, int64_t hi) const {
    const json& v = need(key);
    if (!v.is_array()) fail(key, "expected an array of integers");
    std::vector<int64_t> out;
    for (const auto& e : v) {
      if (!e.is_number_integer()) fail(key, "expected an array of integers, found " + e.dump());
      const int64_t x = e.get<int64_t>();
      if (x < lo || x > hi)
        fail(key, "entry " + std::to_string(x) + " is outside [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
      out.push_back(x);
    }
    return out;
  }

 private:
  const json& obj_;
  std::string source_;
  std::string scope_;
};

constexpr int64_t kMaxDim = int64_t{1} << 20;

// Root first, then text_config; int or list of ints.
std::vector<int64_t> id_list(const json& root, const json& text, const std::string& key,
                             const std::string& source) {
  const json* v = nullptr;
  for (const json* obj : {&root, &text}) {
    const auto it = obj->find(key);
    if (it != obj->end() && !it->is_null()) {
      v = &*it;
      break;
    }
  }
  if (!v) return {};
  std::vector<int64_t> ids;
  if (v->is_number_integer()) {
    ids.push_back(v->get<int64_t>());
  } else if (v->is_array()) {
    for (const auto& e : *v) {
      if (!e.is_number_integer())
        throw Error(source + ": " + key + ": expected integers, found " + e.dump());
      ids.push_back(e.get<int64_t>());
    }
  } else {
    throw Error(source + ": " + key + ": expected an integer or a list, got " + v->dump());
  }
  return ids;
}

}  // namespace

K3Config parse_k3_config(const nlohmann::json& root, const std::string& source) {
  if (!root.is_object()) throw Error(source + ": not a JSON object");
  const auto tc = root.find("text_config");
  const json& text = (tc != root.end() && tc->is_object()) ? *tc : root;
  const std::string scope = (&text == &root) ? "" : "text_config.";
  const Reader r(text, source, scope);

  K3Config c;
  c.hidden_size = r.integer("hidden_size", 1, kMaxDim);
  c.num_hidden_layers = r.integer("num_hidden_layers", 1, 1024);
  c.vocab_size = r.integer("vocab_size", 2, int64_t{1} << 24);
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-5, 1e-12, 1e-1);
  c.first_k_dense_replace = r.integer("first_k_dense_replace", 0, c.num_hidden_layers);
  // Only the dense layers use intermediate_size; a config without dense layers may omit it.
  if (c.first_k_dense_replace > 0 || r.find("intermediate_size"))
    c.intermediate_size = r.integer("intermediate_size", 1, kMaxDim);
  c.num_attention_heads = r.integer("num_attention_heads", 1, 4096);
  c.q_lora_rank = r.integer("q_lora_rank", 1, kMaxDim);
  c.kv_lora_rank = r.integer("kv_lora_rank", 1, kMaxDim);
  c.qk_nope_head_dim = r.integer("qk_nope_head_dim", 1, 4096);
  c.qk_rope_head_dim = r.integer("qk_rope_head_dim", 0, 4096);
  c.v_head_dim = r.integer("v_head_dim", 1, 4096);
  c.num_experts = r.integer("num_experts", 1, 65536);
  c.num_experts_per_token = r.integer("num_experts_per_token", 1, c.num_experts);
  c.moe_intermediate_size = r.integer("moe_intermediate_size", 1, kMaxDim);
  c.routed_expert_hidden_size = r.integer("routed_expert_hidden_size", 1, kMaxDim);
  c.num_shared_experts = r.integer("num_shared_experts", 0, 64);
  c.routed_scaling_factor = r.number_or("routed_scaling_factor", 1.0, 1e-6, 1e6);
  c.attn_res_block_size = r.integer("attn_res_block_size", 1, 1024);
  c.activation_situ_beta = r.number("activation_situ_beta", 1e-6, 1e6);
  c.activation_situ_linear_beta = r.number("activation_situ_linear_beta", 1e-6, 1e6);

  // MXFP4 groups are 32 inputs wide; packed rows hold two inputs per byte.
  if (c.routed_expert_hidden_size % 32 != 0)
    r.fail("routed_expert_hidden_size", std::to_string(c.routed_expert_hidden_size) +
                                            " is not a multiple of the MXFP4 group size 32");
  if (c.moe_intermediate_size % 32 != 0)
    r.fail("moe_intermediate_size", std::to_string(c.moe_intermediate_size) +
                                        " is not a multiple of the MXFP4 group size 32");

  const json& lac = r.need("linear_attn_config");
  if (!lac.is_object()) r.fail("linear_attn_config", "expected an object");
  const Reader lr(lac, source, scope + "linear_attn_config.");
  c.kda_num_heads = lr.integer("num_heads", 1, 4096);
  c.kda_head_dim = lr.integer("head_dim", 1, 4096);
  c.short_conv_kernel_size = lr.integer("short_conv_kernel_size", 1, 64);
  c.gate_lower_bound = lr.number_or("gate_lower_bound", -5.0, -1e3, -1e-6);
  c.kda_layers = lr.int_list("kda_layers", 1, c.num_hidden_layers);
  lr.expect_bool("use_full_rank_gate", true);

  // Behaviour keys (§1.3): what the engine implements, asserted.
  r.expect_string("hidden_act", "situ");
  r.expect_bool("latent_moe_use_norm", true);
  r.expect_bool("mla_use_nope", true);
  r.expect_bool("mla_use_output_gate", true);
  r.expect_string("moe_router_activation_func", "sigmoid");
  r.expect_bool("moe_renormalize", true);
  r.expect_int("num_expert_group", 1);
  r.expect_int("topk_group", 1);
  r.expect_string("topk_method", "noaux_tc");
  r.expect_int("moe_layer_freq", 1);
  r.expect_int("num_key_value_heads", c.num_attention_heads);
  r.expect_int("num_nextn_predict_layers", 0);
  r.expect_bool("tie_word_embeddings", false);
  {
    const Reader root_reader(root, source, "");
    root_reader.expect_bool("tie_word_embeddings", false);
  }
  if (const json* q = r.find("quantization_config")) {
    if (!q->is_object()) r.fail("quantization_config", "expected an object, got " + q->dump());
    const Reader qr(*q, source, scope + "quantization_config.");
    qr.expect_string("quant_method", "compressed-tensors");
    qr.expect_string("format", "mxfp4-pack-quantized");
    // The routed experts are read as MXFP4 (docs/quant_formats.md §1): 4-bit floats in groups of
    // 32 with one shared scale. A config group that claims other bits, another group size or an
    // integer type describes bytes this engine would misread, so it is refused by name.
    if (const json* groups = qr.find("config_groups")) {
      if (!groups->is_object())
        qr.fail("config_groups", "expected an object, got " + groups->dump());
      for (const auto& [name, group] : groups->items()) {
        const std::string gscope = scope + "quantization_config.config_groups." + name + ".";
        if (!group.is_object())
          throw Error(source + ": " + gscope.substr(0, gscope.size() - 1) +
                      ": expected an object, got " + group.dump());
        const Reader gr(group, source, gscope);
        gr.expect_string("format", "mxfp4-pack-quantized");
        const json* w = gr.find("weights");
        if (!w) continue;
        if (!w->is_object()) gr.fail("weights", "expected an object, got " + w->dump());
        const Reader wr(*w, source, gscope + "weights.");
        wr.expect_int("num_bits", 4);
        wr.expect_int("group_size", 32);
        wr.expect_string("type", "float");
        wr.expect_string("strategy", "group");
      }
    }
  }

  // Layer schedule.
  c.attention.assign(static_cast<size_t>(c.num_hidden_layers), AttentionKind::kMLA);
  for (int64_t one_based : c.kda_layers)
    c.attention[static_cast<size_t>(one_based - 1)] = AttentionKind::kKDA;
  if (lr.find("full_attn_layers")) {
    std::vector<bool> listed(static_cast<size_t>(c.num_hidden_layers), false);
    for (int64_t one_based : c.kda_layers) listed[static_cast<size_t>(one_based - 1)] = true;
    for (int64_t one_based : lr.int_list("full_attn_layers", 1, c.num_hidden_layers)) {
      if (c.attention[static_cast<size_t>(one_based - 1)] != AttentionKind::kMLA)
        lr.fail("full_attn_layers",
                "layer " + std::to_string(one_based) + " is also listed in kda_layers");
      listed[static_cast<size_t>(one_based - 1)] = true;
    }
    for (size_t i = 0; i < listed.size(); ++i)
      if (!listed[i])
        lr.fail("full_attn_layers", "layer " + std::to_string(i + 1) +
                                        " (1-based) is in neither kda_layers nor full_attn_layers");
  }
  c.ffn.assign(static_cast<size_t>(c.num_hidden_layers), FfnKind::kMoE);
  for (int64_t i = 0; i < c.first_k_dense_replace; ++i)
    c.ffn[static_cast<size_t>(i)] = FfnKind::kDense;

  // Special ids.
  const auto bos = id_list(root, text, "bos_token_id", source);
  c.bos_token_id = bos.empty() ? -1 : bos.front();
  c.eos_token_ids = id_list(root, text, "eos_token_id", source);
  const auto pad = id_list(root, text, "pad_token_id", source);
  c.pad_token_id = pad.empty() ? -1 : pad.front();
  const auto check_ids = [&](const char* key, const std::vector<int64_t>& ids) {
    for (int64_t id : ids)
      if (id < 0 || id >= c.vocab_size)
        throw Error(source + ": " + key + " " + std::to_string(id) +
                    " is outside the vocabulary of " + std::to_string(c.vocab_size));
  };
  check_ids("bos_token_id", bos);
  check_ids("eos_token_id", c.eos_token_ids);
  check_ids("pad_token_id", pad);
  return c;
}

}  // namespace k3

#include "model/state.h"

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>

namespace k3 {

ModelState::ModelState(const K3Config& c, int64_t num_layers, int64_t capacity_, size_t rows)
    : capacity(capacity_) {
  const size_t P = static_cast<size_t>(c.kda_projection_size());
  const size_t history = static_cast<size_t>(c.short_conv_kernel_size - 1);
  const size_t dk = static_cast<size_t>(c.kda_head_dim);
  const size_t kvr = static_cast<size_t>(c.kv_lora_rank);
  kda.resize(static_cast<size_t>(num_layers));
  mla.resize(static_cast<size_t>(num_layers));
  for (size_t l = 0; l < static_cast<size_t>(num_layers); ++l) {
    if (c.attention[l] == AttentionKind::kKDA) {
      kda[l].q_window.assign(history * P, 0.0f);
      kda[l].k_window.assign(history * P, 0.0f);
      kda[l].v_window.assign(history * P, 0.0f);
      kda[l].recurrent.assign(static_cast<size_t>(c.kda_num_heads) * dk * dk, 0.0f);
    } else {
      mla[l].latent.resize(static_cast<size_t>(capacity) * kvr);
      mla[l].rope.resize(static_cast<size_t>(capacity) * static_cast<size_t>(c.qk_rope_head_dim));
    }
  }
  work.init(c, capacity);
  work.reserve(c, rows);
}

void Workspace::init(const K3Config& c, int64_t capacity) {
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t dk = static_cast<size_t>(c.kda_head_dim);
  const size_t H = static_cast<size_t>(c.num_attention_heads);
  const size_t kvr = static_cast<size_t>(c.kv_lora_rank);
  const size_t E = static_cast<size_t>(c.num_experts);
  const size_t K = static_cast<size_t>(c.num_experts_per_token);
  const size_t num_blocks = static_cast<size_t>(c.num_blocks());
  Workspace& w = *this;
  if (w.mla_scores.size() >= H * static_cast<size_t>(capacity) && !w.head_normed.empty()) return;
  w.embed_bytes.reserve(D * sizeof(float));
  w.sources.assign(num_blocks + 1, nullptr);
  w.mix_weights.assign(num_blocks + 1, 0.0f);
  w.kda_u.assign(static_cast<size_t>(c.kda_num_heads) * dk, 0.0f);
  w.mla_qabs.assign(H * kvr, 0.0f);
  w.mla_lat.assign(H * kvr, 0.0f);
  w.mla_scores.resize(H * static_cast<size_t>(capacity));
  w.score_heads = H;
  w.moe_scores.assign(E, 0.0f);
  w.moe_choice.assign(E, 0.0f);
  w.moe_order.assign(E, 0);
  w.moe_by_weight.reserve(K);
  w.predict_count.assign(E, 0);
  w.predict_order.reserve(E);
  w.predicted.ids.reserve(K);
  w.predicted.weights.reserve(K);
  w.head_normed.assign(D, 0.0f);
}

uint64_t ModelState::floats_per_position(const K3Config& c, int64_t num_layers) {
  uint64_t floats = static_cast<uint64_t>(c.num_attention_heads);  // work.mla_scores
  for (size_t l = 0; l < static_cast<size_t>(num_layers); ++l)
    if (c.attention[l] != AttentionKind::kKDA)  // mla[l].latent + mla[l].rope
      floats += static_cast<uint64_t>(c.kv_lora_rank + c.qk_rope_head_dim);
  return floats;
}

uint64_t ModelState::fixed_floats(const K3Config& c, int64_t num_layers) {
  const uint64_t P = static_cast<uint64_t>(c.kda_projection_size());
  const uint64_t history = static_cast<uint64_t>(c.short_conv_kernel_size - 1);
  const uint64_t dk = static_cast<uint64_t>(c.kda_head_dim);
  uint64_t floats = 0;
  for (size_t l = 0; l < static_cast<size_t>(num_layers); ++l)
    if (c.attention[l] == AttentionKind::kKDA)
      floats += 3 * history * P + static_cast<uint64_t>(c.kda_num_heads) * dk * dk;
  return floats;
}

// Every vector reserve() sizes per row (the phase views aside), with its elements per row and the
// rows it holds at least: `visit(vector, per_row, min_rows)`. W is Workspace or const Workspace.
template <class W, class Visit>
void Workspace::per_row_buffers(W& w, const K3Config& c, Visit&& visit) {
  const size_t D = static_cast<size_t>(c.hidden_size);
  visit(w.blocks, static_cast<size_t>(c.num_blocks()) * D, 0);
  for (auto* v : {&w.partial, &w.mixed, &w.normed, &w.branch, &w.moe_routed}) visit(*v, D, 0);
  visit(w.moe_logits, static_cast<size_t>(c.num_experts), 0);
  // Room for a decode step's experts all ahead of the first (sixteen rows), or a chunk's rows.
  visit(w.moe_ahead, static_cast<size_t>(c.routed_expert_hidden_size), kMoeAheadRows);
}

// The MoE step's pick lists, with the entries they hold beyond num_experts_per_token per row:
// `visit(vector, extra)`. W is Workspace or const Workspace.
template <class W, class Visit>
void Workspace::pick_buffers(W& w, Visit&& visit) {
  visit(w.picks, 0);
  visit(w.pick_ids, 0);
  visit(w.pick_starts, 1);
  visit(w.pick_state, 0);
  visit(w.pick_ahead, 0);
  visit(w.pick_rows, 0);
  visit(w.pick_owner, 0);
  visit(w.cpu_groups, 0);
  visit(w.cpu_ids, 0);
}

// Every view into the phase arena, with its elements per row and its phase:
// `visit(span, per_row, phase)`. W is Workspace or const Workspace.
template <class W, class Visit>
void Workspace::phase_views(W& w, const K3Config& c, Visit&& visit) {
  const size_t P = static_cast<size_t>(c.kda_projection_size());
  const size_t H = static_cast<size_t>(c.num_attention_heads);
  const size_t R = static_cast<size_t>(c.routed_expert_hidden_size);
  const size_t I = static_cast<size_t>(c.moe_intermediate_size);
  const size_t mlp =
      static_cast<size_t>(std::max(c.intermediate_size, c.shared_intermediate_size()));
  for (auto* v : {&w.kda_q, &w.kda_k, &w.kda_v, &w.kda_gate, &w.kda_decay, &w.kda_out})
    visit(*v, P, kKdaPhase);
  visit(w.kda_decay_low, static_cast<size_t>(c.kda_head_dim), kKdaPhase);
  visit(w.kda_beta, static_cast<size_t>(c.kda_num_heads), kKdaPhase);
  visit(w.mla_cq, static_cast<size_t>(c.q_lora_rank), kMlaPhase);
  visit(w.mla_q, H * static_cast<size_t>(c.qk_head_dim()), kMlaPhase);
  visit(w.mla_ckv, static_cast<size_t>(c.kv_lora_rank + c.qk_rope_head_dim), kMlaPhase);
  visit(w.mla_gate, H * static_cast<size_t>(c.v_head_dim), kMlaPhase);
  visit(w.mla_ctx, H * static_cast<size_t>(c.v_head_dim), kMlaPhase);
  for (auto* v : {&w.moe_z, &w.moe_acc, &w.ex_z, &w.ex_down}) visit(*v, R, kFeedForwardPhase);
  visit(w.moe_z_q8, R, kFeedForwardPhase);
  visit(w.ex_z_q8, R, kFeedForwardPhase);
  visit(w.moe_z_d, R / 32, kFeedForwardPhase);
  visit(w.ex_z_d, R / 32, kFeedForwardPhase);
  visit(w.ex_gate, I, kFeedForwardPhase);
  visit(w.ex_up, I, kFeedForwardPhase);
  visit(w.ex_h_q8, I, kFeedForwardPhase);
  visit(w.ex_h_d, I / 32, kFeedForwardPhase);
  visit(w.mlp_gate, mlp, kFeedForwardPhase);
  visit(w.mlp_up, mlp, kFeedForwardPhase);
}

namespace {

// Bytes of the phase arena a view of `elements` elements of T takes, rounded up to 64 so every
// view starts 64-byte aligned.
template <class T>
size_t arena_bytes(size_t elements) {
  return (elements * sizeof(T) + 63) / 64 * 64;
}

template <class Span>
using ElementOf = typename std::remove_reference_t<Span>::element_type;

}  // namespace

uint64_t Workspace::row_bytes(const K3Config& c) {
  Workspace w;
  uint64_t bytes = 0;
  per_row_buffers(w, c, [&](auto& v, size_t per_row, size_t) {
    bytes += per_row * sizeof(typename std::remove_reference_t<decltype(v)>::value_type);
  });
  uint64_t phase[kPhases] = {};
  phase_views(w, c, [&](auto& view, size_t per_row, int p) {
    phase[p] += per_row * sizeof(ElementOf<decltype(view)>);
  });
  bytes += *std::max_element(phase, phase + kPhases);
  // The routing picks: num_experts_per_token per row, a few words each.
  return bytes + static_cast<uint64_t>(c.num_experts_per_token) * 64;
}

int64_t auto_prefill_chunk(const K3Config& config, uint64_t available_bytes) {
  const uint64_t per_row = Workspace::row_bytes(config);
  int64_t chunk = 32;
  while (chunk < 4096 && per_row * static_cast<uint64_t>(chunk * 2) <= available_bytes / 16)
    chunk *= 2;
  return chunk;
}

void Workspace::reserve(const K3Config& c, size_t n) {
  if (n <= rows) return;
  // `rows` and `ahead_rows` change last: an allocation that throws leaves them describing buffers
  // at least that large (a later pass of up to `rows` rows must not skip this and overrun).
  const size_t K = static_cast<size_t>(c.num_experts_per_token);
  per_row_buffers(*this, c, [&](auto& v, size_t per_row, size_t min_rows) {
    v.assign(std::max(n, min_rows) * per_row, {});
  });
  size_t phase_bytes[kPhases] = {};
  phase_views(*this, c, [&](auto& view, size_t per_row, int p) {
    phase_bytes[p] += arena_bytes<ElementOf<decltype(view)>>(n * per_row);
  });
  // 63 bytes of slack: the views start at the arena's first 64-byte aligned byte.
  phase_arena.assign(*std::max_element(phase_bytes, phase_bytes + kPhases) + 63, std::byte{0});
  std::byte* base = phase_arena.data();
  base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  size_t at[kPhases] = {};
  phase_views(*this, c, [&](auto& view, size_t per_row, int p) {
    using T = ElementOf<decltype(view)>;
    view = std::span<T>(reinterpret_cast<T*>(base + at[p]), n * per_row);
    at[p] += arena_bytes<T>(n * per_row);
  });
  sequence_rows.resize(n);
  routing.resize(n);
  for (RoutingResult& r : routing) {
    r.ids.reserve(K);
    r.weights.reserve(K);
  }
  pick_buffers(*this, [&](auto& v, size_t extra) { v.reserve(n * K + extra); });
  ahead_rows = std::max(n, kMoeAheadRows);
  rows = n;
}

bool Workspace::release_rows(const K3Config& c) {
  if (rows <= 1 && kda_chunk.empty()) return false;
  const auto drop = [](auto& v) { std::remove_reference_t<decltype(v)>().swap(v); };
  per_row_buffers(*this, c, [&](auto& v, size_t, size_t) { drop(v); });
  phase_views(*this, c, [](auto& view, size_t, int) { view = {}; });
  drop(phase_arena);
  drop(sequence_rows);
  drop(routing);
  pick_buffers(*this, [&](auto& v, size_t) { drop(v); });
  drop(kda_chunk);
  rows = 0;
  reserve(c, 1);
  return true;
}

uint64_t ModelState::kda_bytes() const {
  uint64_t floats = 0;
  for (const KdaState& k : kda)
    floats += k.q_window.size() + k.k_window.size() + k.v_window.size() + k.recurrent.size();
  return floats * sizeof(float);
}

uint64_t ModelState::mla_bytes() const {
  if (capacity <= 0) return 0;
  uint64_t floats = 0;
  for (const MlaCache& m : mla) floats += (m.latent.size() + m.rope.size()) / capacity * position;
  return floats * sizeof(float);
}

uint64_t Workspace::bytes(const K3Config& config, int64_t positions) const {
  uint64_t total = 0;
  const auto add = [&](const auto& v) { total += v.capacity() * sizeof(v[0]); };
  per_row_buffers(*this, config, [&](const auto& v, size_t, size_t) { add(v); });
  add(phase_arena);
  add(sequence_rows);
  add(embed_bytes);
  for (const auto* v : {&mix_weights, &kda_u, &kda_chunk, &mla_qabs, &mla_lat, &moe_scores,
                        &moe_choice, &head_normed})
    add(*v);
  add(sources);
  add(moe_order);
  add(moe_by_weight);
  add(predict_count);
  add(predict_order);
  pick_buffers(*this, [&](const auto& v, size_t) { add(v); });
  for (const RoutingResult& r : routing) {
    add(r.ids);
    add(r.weights);
  }
  total +=
      std::min<uint64_t>(mla_scores.size(),
                         score_heads * static_cast<uint64_t>(std::max<int64_t>(positions, 0))) *
      sizeof(float);
  return total;
}

void ModelState::reset() {
  position = 0;
  for (auto& s : kda) {
    std::fill(s.q_window.begin(), s.q_window.end(), 0.0f);
    std::fill(s.k_window.begin(), s.k_window.end(), 0.0f);
    std::fill(s.v_window.begin(), s.v_window.end(), 0.0f);
    std::fill(s.recurrent.begin(), s.recurrent.end(), 0.0f);
  }
  // MLA rows past `position` are never read; no need to clear them.
}

}  // namespace k3

#include "model/latent_moe.h"

#include <algorithm>
#include <numeric>
#include <span>

#include "kernels/vec.h"
#include "model/dense_mlp.h"

namespace k3 {

namespace {

// One routed expert applied to m rows: down[j] = W2 SiTU(W1 z_j, W3 z_j) for j < m. The idot
// path takes z pre-quantised (zq8 [m][R], zd [m][R/32]); the float path z [m][R]. gate, up:
// [m][I] scratch; hq8 [m][I], hd [m][I/32] scratch; down: [m][R]. Every row is bit-identical to
// m = 1 on that row (the kernels' per-row results do not depend on m; matmul_*_chunk).
void apply_expert(const K3Config& c, const Compute& compute, const ExpertView& e, size_t m, const float* z,
                  const int8_t* zq8, const float* zd, float* gate, float* up, int8_t* hq8, float* hd,
                  float* down) {
  const size_t R = static_cast<size_t>(c.routed_expert_hidden_size);
  const size_t I = static_cast<size_t>(c.moe_intermediate_size);
  const float beta = static_cast<float>(c.activation_situ_beta);
  const float beta_linear = static_cast<float>(c.activation_situ_linear_beta);
  const KernelTable& kt = *compute.kernels;
  const Mxfp4Matrix gate_w{e.gate_packed, e.gate_scale, I, R}, up_w{e.up_packed, e.up_scale, I, R};
  const Mxfp4Matrix down_w{e.down_packed, e.down_scale, R, I};
  if (compute.idot) {
    matmul_mxfp4_idot(kt, gate_w, zq8, zd, m, gate);
    matmul_mxfp4_idot(kt, up_w, zq8, zd, m, up);
    // SiTU fused with the down projection's activation quantisation, one 32-group at a time.
    for (size_t g = 0; g < m * I / 32; ++g) {
      for (size_t i = g * 32; i < g * 32 + 32; ++i) gate[i] = situ(gate[i], up[i], beta, beta_linear);
      kt.quantize_q8_32(gate + g * 32, 32, hq8 + g * 32, hd + g);
    }
    matmul_mxfp4_idot(kt, down_w, hq8, hd, m, down);
  } else {
    matmul_mxfp4_exact_chunk(compute, gate_w, z, m, gate);
    matmul_mxfp4_exact_chunk(compute, up_w, z, m, up);
    for (size_t i = 0; i < m * I; ++i) gate[i] = situ(gate[i], up[i], beta, beta_linear);
    matmul_mxfp4_exact_chunk(compute, down_w, gate, m, down);
  }
}

// acc[i] += weight * down[i] for i < n (the routed sum, experts in ascending id order).
void add_scaled(float* acc, float weight, const float* down, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += weight * down[i];
}

}  // namespace

void route(const K3Config& c, const MoeWeights& w, const float* logits, double top_p, Workspace& ws, RoutingResult* r) {
  const size_t E = static_cast<size_t>(c.num_experts);
  const size_t k = static_cast<size_t>(c.num_experts_per_token);
  float* scores = ws.moe_scores.data();  // [E]
  float* choice = ws.moe_choice.data();  // [E]
  for (size_t e = 0; e < E; ++e) {
    scores[e] = sigmoid(logits[e]);
    choice[e] = scores[e] + w.router_bias[e];
  }
  std::vector<int64_t>& order = ws.moe_order;
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](int64_t a, int64_t b) {
                      const float ca = choice[static_cast<size_t>(a)], cb = choice[static_cast<size_t>(b)];
                      return ca != cb ? ca > cb : a < b;
                    });
  r->ids.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  std::sort(r->ids.begin(), r->ids.end());
  float sum = 0.0f;
  for (int64_t id : r->ids) sum += scores[static_cast<size_t>(id)];
  const float scale = static_cast<float>(c.routed_scaling_factor);
  if (top_p > 0.0 && top_p < 1.0) {
    // K3_TOPP (STREAMING_PERF.md §1.4 step 2): the shortest prefix of the picks by weight
    // (ties: lower id) whose cumulative normalised weight reaches p, renormalised over itself.
    std::vector<int64_t> by_weight = r->ids;
    std::sort(by_weight.begin(), by_weight.end(), [&](int64_t a, int64_t b) {
      const float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
      return sa != sb ? sa > sb : a < b;
    });
    float mass = 0.0f;
    size_t keep = 0;
    while (keep < by_weight.size() && mass / (sum + 1e-20f) < static_cast<float>(top_p))
      mass += scores[static_cast<size_t>(by_weight[keep++])];
    by_weight.resize(std::max<size_t>(keep, 1));
    std::sort(by_weight.begin(), by_weight.end());
    r->ids = by_weight;
    sum = 0.0f;
    for (int64_t id : r->ids) sum += scores[static_cast<size_t>(id)];
  }
  r->weights.resize(r->ids.size());
  for (size_t j = 0; j < r->ids.size(); ++j) r->weights[j] = scores[static_cast<size_t>(r->ids[j])] / (sum + 1e-20f) * scale;
}

void latent_moe_forward(const K3Config& c, const Compute& compute, const MoeWeights& w,
                        ExpertCache& experts, int64_t layer, Workspace& ws, StageStats& stats,
                        const float* x, float* out, RoutingResult* r, NextMoe next) {
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t R = static_cast<size_t>(c.routed_expert_hidden_size);
  const KernelTable& kt = *compute.kernels;
  const bool shared = c.num_shared_experts > 0;
  float* z = ws.moe_z.data();       // [R]
  float* acc = ws.moe_acc.data();   // [R]
  float* gate = ws.moe_gate.data(); // [I]
  float* up = ws.moe_up.data();     // [I]
  float* routed = ws.moe_routed.data();  // [D]
  {
    // Everything that reads x, in one parallel region: router logits, latent down, shared gate/up.
    StageTimer timer(stats, Stage::kRouter);
    const MatmulJob jobs[] = {{&w.router, ws.moe_scores.data()}, {&w.latent_down, z},
                              {&w.shared_gate, ws.mlp_gate.data()}, {&w.shared_up, ws.mlp_up.data()}};
    matmul_batch(kt, jobs, shared ? 4 : 2, x);
    route(c, w, ws.moe_scores.data(), compute.expert_top_p, ws, r);
  }
  {
    StageTimer timer(stats, Stage::kExperts);
    std::fill(acc, acc + R, 0.0f);
    if (compute.idot) quantize_q8_32(kt, z, 1, R, ws.moe_z_q8.data(), ws.moe_z_d.data());  // shared by gate and up
    experts.record(layer, r->ids);
    experts.routed(layer, r->ids);
    for (size_t j0 = 0; j0 < r->ids.size(); j0 += ExpertCache::kMaxBatch) {
      const size_t j1 = std::min(r->ids.size(), j0 + ExpertCache::kMaxBatch);
      experts.acquire(layer, std::span<const int64_t>(r->ids).subspan(j0, j1 - j0), ExpertCache::Use::kToken,
                      ws.expert_batch);
      if (j1 == r->ids.size() && next.weights) {
        // This layer's misses are queued; the next layer's likely experts go behind them.
        matmul(kt, next.weights->router, x, 1, ws.moe_predict.data());
        route(c, *next.weights, ws.moe_predict.data(), compute.expert_top_p, ws, &ws.predicted);
        experts.prefetch(next.layer, ws.predicted.ids);
      }
      // Experts computed as their reads land (those already here first, else the next one in
      // line), each into its own row of `downs`; summed below in ascending id order, so the
      // result does not depend on the arrival order.
      float* downs = ws.moe_downs.data();  // [kMaxBatch][R]
      uint8_t* done = ws.moe_done.data();  // [kMaxBatch]
      const size_t m = j1 - j0;
      std::fill(done, done + m, uint8_t{0});
      for (size_t left = m; left > 0; --left) {
        size_t pick = m;
        for (size_t j = 0; j < m && pick == m; ++j)
          if (!done[j] && ws.expert_batch.ready(j)) pick = j;
        for (size_t j = 0; j < m && pick == m; ++j)
          if (!done[j]) pick = j;
        done[pick] = 1;
        ++stats.expert_reads;
        apply_expert(c, compute, ws.expert_batch.view(pick), 1, z, ws.moe_z_q8.data(), ws.moe_z_d.data(), gate, up,
                     ws.moe_h_q8.data(), ws.moe_h_d.data(), downs + pick * R);
      }
      for (size_t j = j0; j < j1; ++j) add_scaled(acc, r->weights[j], downs + (j - j0) * R, R);
      ws.expert_batch.release();
    }
    experts.finish_layer(layer);
    rmsnorm(acc, w.latent_norm.data(), R, c.rms_norm_eps, acc);
    matmul(kt, w.latent_up, acc, 1, routed);  // [D]
  }
  StageTimer timer(stats, Stage::kShared);
  if (shared) {
    situ_down(c, compute, w.shared_down, ws.mlp_gate.data(), ws.mlp_up.data(), out);
    for (size_t i = 0; i < D; ++i) out[i] += routed[i];
  } else {
    std::copy(routed, routed + D, out);
  }
}

namespace {

// Reads ahead the experts the next MoE layer's router picks for the chunk's rows X [n][hidden],
// most picked first (at most ExpertCache::kMaxStaged are staged).
void predict_chunk(const K3Config& c, const Compute& compute, NextMoe next, Workspace& ws, ChunkWorkspace& cw,
                   const float* X, size_t n, ExpertCache& experts) {
  const size_t E = static_cast<size_t>(c.num_experts);
  float* logits = cw.moe_logits.data();  // [n][num_experts] (this layer's routing is done)
  matmul_chunk(compute, next.weights->router, X, n, logits);
  std::vector<uint32_t>& count = ws.predict_count;  // [num_experts]
  count.assign(E, 0);
  for (size_t t = 0; t < n; ++t) {
    route(c, *next.weights, logits + t * E, compute.expert_top_p, ws, &ws.predicted);
    for (int64_t e : ws.predicted.ids) ++count[static_cast<size_t>(e)];
  }
  std::vector<int64_t>& order = ws.predict_order;  // [<= num_experts]: picked experts, most picked first
  order.clear();
  for (size_t e = 0; e < E; ++e)
    if (count[e] > 0) order.push_back(static_cast<int64_t>(e));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return count[static_cast<size_t>(a)] > count[static_cast<size_t>(b)]; });
  experts.prefetch(next.layer, order);
}

}  // namespace

void latent_moe_forward_chunk(const K3Config& c, const Compute& compute, const MoeWeights& w,
                              ExpertCache& experts, int64_t layer, Workspace& ws, ChunkWorkspace& cw,
                              StageStats& stats, const float* X, size_t n, float* out, NextMoe next) {
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t E = static_cast<size_t>(c.num_experts);
  const size_t R = static_cast<size_t>(c.routed_expert_hidden_size);
  const KernelTable& kt = *compute.kernels;
  const bool shared = c.num_shared_experts > 0;
  float* z = cw.moe_z.data();          // [n][R]
  float* acc = cw.moe_acc.data();      // [n][R]
  float* routed = cw.moe_routed.data();  // [n][D]
  {
    StageTimer timer(stats, Stage::kRouter);
    matmul_chunk(compute, w.router, X, n, cw.moe_logits.data());
    matmul_chunk(compute, w.latent_down, X, n, z);
    if (shared) {
      matmul_chunk(compute, w.shared_gate, X, n, cw.mlp_gate.data());
      matmul_chunk(compute, w.shared_up, X, n, cw.mlp_up.data());
    }
    for (size_t t = 0; t < n; ++t) route(c, w, cw.moe_logits.data() + t * E, compute.expert_top_p, ws, &cw.routing[t]);
  }
  {
    StageTimer timer(stats, Stage::kExperts);
    std::fill(acc, acc + n * R, 0.0f);
    if (compute.idot) quantize_q8_32(kt, z, n, R, cw.moe_z_q8.data(), cw.moe_z_d.data());
    // The chunk's union of experts, ascending id; per expert its rows ascending (so every row
    // still adds its experts in ascending id order, as alone).
    struct Pick {
      int64_t expert;
      size_t row;
      float weight;
    };
    std::vector<Pick> picks;
    picks.reserve(n * static_cast<size_t>(c.num_experts_per_token));
    for (size_t t = 0; t < n; ++t)
      for (size_t j = 0; j < cw.routing[t].ids.size(); ++j) picks.push_back({cw.routing[t].ids[j], t, cw.routing[t].weights[j]});
    std::stable_sort(picks.begin(), picks.end(), [](const Pick& a, const Pick& b) { return a.expert < b.expert; });
    for (size_t t = 0; t < n; ++t) experts.record(layer, cw.routing[t].ids);
    // The union's groups [start, end) in picks, ascending expert id.
    std::vector<size_t> starts;
    std::vector<int64_t> ids;
    for (size_t p = 0; p < picks.size(); ++p) {
      if (p == 0 || picks[p].expert != picks[p - 1].expert) {
        starts.push_back(p);
        ids.push_back(picks[p].expert);
      }
    }
    starts.push_back(picks.size());
    experts.routed(layer, ids);
    for (size_t g0 = 0; g0 < ids.size(); g0 += ExpertCache::kMaxBatch) {
      const size_t g1 = std::min(ids.size(), g0 + ExpertCache::kMaxBatch);
      experts.acquire(layer, std::span<const int64_t>(ids).subspan(g0, g1 - g0), ExpertCache::Use::kChunk,
                      ws.expert_batch);
      if (g1 == ids.size() && next.weights) predict_chunk(c, compute, next, ws, cw, X, n, experts);
      for (size_t g = g0; g < g1; ++g) {
        const size_t p0 = starts[g], m = starts[g + 1] - p0;
        // Gather the expert's rows.
        for (size_t j = 0; j < m; ++j) {
          const size_t t = picks[p0 + j].row;
          if (compute.idot) {
            std::copy(cw.moe_z_q8.data() + t * R, cw.moe_z_q8.data() + (t + 1) * R, cw.ex_z_q8.data() + j * R);
            std::copy(cw.moe_z_d.data() + t * (R / 32), cw.moe_z_d.data() + (t + 1) * (R / 32), cw.ex_z_d.data() + j * (R / 32));
          } else {
            std::copy(z + t * R, z + (t + 1) * R, cw.ex_z.data() + j * R);
          }
        }
        ++stats.expert_reads;
        apply_expert(c, compute, ws.expert_batch.view(g - g0), m, cw.ex_z.data(), cw.ex_z_q8.data(), cw.ex_z_d.data(),
                     cw.ex_gate.data(), cw.ex_up.data(), cw.ex_h_q8.data(), cw.ex_h_d.data(), cw.ex_down.data());
        for (size_t j = 0; j < m; ++j) add_scaled(acc + picks[p0 + j].row * R, picks[p0 + j].weight, cw.ex_down.data() + j * R, R);
      }
      ws.expert_batch.release();
    }
    experts.finish_layer(layer);
    for (size_t t = 0; t < n; ++t) rmsnorm(acc + t * R, w.latent_norm.data(), R, c.rms_norm_eps, acc + t * R);
    matmul_chunk(compute, w.latent_up, acc, n, routed);  // [n][D]
  }
  StageTimer timer(stats, Stage::kShared);
  if (shared) {
    situ_down_chunk(c, compute, w.shared_down, cw.mlp_gate.data(), cw.mlp_up.data(), n, out);
    for (size_t i = 0; i < n * D; ++i) out[i] += routed[i];
  } else {
    std::copy(routed, routed + n * D, out);
  }
}

}  // namespace k3

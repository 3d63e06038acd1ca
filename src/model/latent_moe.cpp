#include "model/latent_moe.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <span>

#include "kernels/vec.h"
#include "model/dense_mlp.h"
#include "model/expert_executor.h"
#include "util/error.h"

namespace k3 {

void apply_expert(const K3Config& c, const Compute& compute, const ExpertView& e, size_t m,
                  const float* z, const int8_t* zq8, const float* zd, float* gate, float* up,
                  int8_t* hq8, float* hd, float* down) {
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
    // SiTU, then the down projection's activation quantisation (situ_glu: the 32-groups split
    // across the threads).
    situ_glu(kt, gate, up, m * I, beta, beta_linear, hq8, hd);
    matmul_mxfp4_idot(kt, down_w, hq8, hd, m, down);
  } else {
    // Row-stable on every ISA (tests/mxfp4_kernels_test.cpp), so m rows take one call.
    matmul_mxfp4_exact(kt, gate_w, z, m, gate);
    matmul_mxfp4_exact(kt, up_w, z, m, up);
    situ_glu(kt, gate, up, m * I, beta, beta_linear);
    matmul_mxfp4_exact(kt, down_w, gate, m, down);
  }
}

namespace {

// acc[i] += weight * down[i] for i < n (the routed sum, experts in ascending id order).
void add_scaled(float* acc, float weight, const float* down, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += weight * down[i];
}

}  // namespace

void route(const K3Config& c, const MoeWeights& w, const float* logits, double top_p, Workspace& ws,
           RoutingResult* r) {
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
                      const float ca = choice[static_cast<size_t>(a)],
                                  cb = choice[static_cast<size_t>(b)];
                      return ca != cb ? ca > cb : a < b;
                    });
  r->ids.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  std::sort(r->ids.begin(), r->ids.end());
  float sum = 0.0f;
  for (int64_t id : r->ids) sum += scores[static_cast<size_t>(id)];
  const float scale = static_cast<float>(c.routed_scaling_factor);
  if (top_p > 0.0 && top_p < 1.0) {
    // K3_TOPP (docs/streaming.md §1.4 step 2): the shortest prefix of the picks by weight
    // (ties: lower id) whose cumulative normalised weight reaches p, renormalised over itself.
    std::vector<int64_t>& by_weight = ws.moe_by_weight;
    by_weight.assign(r->ids.begin(), r->ids.end());
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
    r->ids.assign(by_weight.begin(), by_weight.end());
    sum = 0.0f;
    for (int64_t id : r->ids) sum += scores[static_cast<size_t>(id)];
  }
  r->weights.resize(r->ids.size());
  for (size_t j = 0; j < r->ids.size(); ++j)
    r->weights[j] = scores[static_cast<size_t>(r->ids[j])] / (sum + 1e-20f) * scale;
}

namespace {

// The next MoE layer's likely experts for the step's rows X [n][hidden]: its router applied to
// this layer's input, the experts most picked over the rows first (ties: lower id).
class ReadAheadGuess {
 public:
  ReadAheadGuess(const K3Config& c, const Compute& compute, NextMoe next, Workspace& ws,
                 const float* X, size_t n)
      : c_(c), compute_(compute), next_(next), ws_(ws), X_(X), n_(n) {}

  std::span<const int64_t> guess(int64_t* layer) {
    if (!next_.weights) return {};
    const size_t E = static_cast<size_t>(c_.num_experts);
    float* logits = ws_.moe_logits.data();  // [n][num_experts] (this layer's routing is done)
    matmul_chunk(compute_, next_.weights->router, X_, n_, logits);
    std::vector<uint32_t>& count = ws_.predict_count;  // [num_experts]
    std::fill(count.begin(), count.end(), 0u);
    for (size_t t = 0; t < n_; ++t) {
      route(c_, *next_.weights, logits + t * E, compute_.expert_top_p, ws_, &ws_.predicted);
      for (int64_t e : ws_.predicted.ids) ++count[static_cast<size_t>(e)];
    }
    std::vector<int64_t>& order = ws_.predict_order;
    order.clear();
    for (size_t e = 0; e < E; ++e)
      if (count[e] > 0) order.push_back(static_cast<int64_t>(e));
    // Most picked first, ties by id (std::sort: stable_sort would allocate).
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const uint32_t ca = count[static_cast<size_t>(a)], cb = count[static_cast<size_t>(b)];
      return ca != cb ? ca > cb : a < b;
    });
    *layer = next_.layer;
    return order;
  }

 private:
  const K3Config& c_;
  const Compute& compute_;
  NextMoe next_;
  Workspace& ws_;
  const float* X_;
  size_t n_;
};

// The routed sum of one step (the PairSink of model/expert_executor.h): acc[row] += weight · out
// for every pair, group after group in ascending expert id, whatever order the groups arrive in.
// A group delivered ahead of an earlier one waits: by reference when its executor keeps the rows
// (stable), else copied into ws.moe_ahead (a slot reserved by reserve(), or taken on delivery).
class OrderedSum final : public PairSink {
 public:
  // `grow`: moe_ahead may grow past ahead_rows (other executors hold groups the CPU's rows may
  // have to wait for); without it, reserve() refuses once ahead_rows are in use.
  OrderedSum(Workspace& ws, size_t R, bool grow) : ws_(ws), R_(R), grow_(grow) {
    const size_t G = ws_.pick_ids.size();
    ws_.pick_state.assign(G, kPending);
    ws_.pick_ahead.assign(G, 0);
    ws_.pick_rows.assign(G, nullptr);
  }

  // Reserves moe_ahead rows for group g delivered ahead of the next one. False when full.
  bool reserve(size_t g) {
    const size_t m = rows(g);
    if (ahead_used_ + m > ws_.ahead_rows) {
      if (!grow_) return false;
      ws_.ahead_rows = ahead_used_ + m;
      ws_.moe_ahead.resize(ws_.ahead_rows * R_);
    }
    ws_.pick_state[g] = kReserved;
    ws_.pick_ahead[g] = ahead_used_;
    ahead_used_ += m;
    return true;
  }

  // Where an executor computing group g in place should write its rows: ex_down for the next
  // group, else its moe_ahead slot (reserved here when it has none).
  float* place(size_t g) {
    if (g == next_) return ws_.ex_down.data();
    if (ws_.pick_state[g] != kReserved) reserve_forced(g);
    return ahead(g);
  }

  void deliver(size_t g, const float* rows_in, bool stable) override {
    if (g == next_) {
      add(g, rows_in);
      advance();
      return;
    }
    if (stable) {
      ws_.pick_state[g] = kStable;
      ws_.pick_rows[g] = rows_in;
      return;
    }
    if (ws_.pick_state[g] != kReserved) reserve_forced(g);
    float* slot = ahead(g);
    if (slot != rows_in) std::copy(rows_in, rows_in + rows(g) * R_, slot);
    ws_.pick_state[g] = kBuffered;
    ++buffered_;
  }

  bool delivered(size_t g) const {
    return g < next_ || ws_.pick_state[g] == kBuffered || ws_.pick_state[g] == kStable;
  }
  bool complete() const { return next_ == ws_.pick_ids.size(); }

 private:
  enum : uint8_t { kPending, kReserved, kBuffered, kStable };
  size_t rows(size_t g) const { return ws_.pick_starts[g + 1] - ws_.pick_starts[g]; }
  float* ahead(size_t g) { return ws_.moe_ahead.data() + ws_.pick_ahead[g] * R_; }
  void reserve_forced(size_t g) {
    const bool grow = grow_;
    grow_ = true;
    reserve(g);
    grow_ = grow;
  }
  // acc[row] += weight · rows_in[j] for the group's j-th pair.
  void add(size_t g, const float* rows_in) {
    const size_t p0 = ws_.pick_starts[g];
    for (size_t j = 0; j < rows(g); ++j) {
      const MoePick& p = ws_.picks[p0 + j];
      add_scaled(ws_.moe_acc.data() + p.row * R_, p.weight, rows_in + j * R_, R_);
    }
  }
  // The groups that arrived ahead and are now next in id order.
  void advance() {
    for (++next_; next_ < ws_.pick_ids.size(); ++next_) {
      const uint8_t state = ws_.pick_state[next_];
      if (state == kStable) {
        add(next_, ws_.pick_rows[next_]);
      } else if (state == kBuffered) {
        add(next_, ahead(next_));
        --buffered_;
      } else {
        break;
      }
    }
    if (buffered_ == 0) ahead_used_ = 0;  // nothing waits in moe_ahead
  }

  Workspace& ws_;
  const size_t R_;
  bool grow_;
  size_t next_ = 0;        // the first group not yet summed
  size_t ahead_used_ = 0;  // rows of moe_ahead in use
  size_t buffered_ = 0;    // groups waiting in moe_ahead
};

// The first executor: the RAM cache (ExpertSource) and the CPU kernels. Takes every group no
// other executor took; finish() runs the source over its groups, computing each as its bytes
// arrive (ahead of an earlier one when the sum can hold it), and offers the bytes it computed
// with to the other executors.
class CpuExecutor final : public ExpertExecutor, private ExpertWork {
 public:
  CpuExecutor(const K3Config& c, const Compute& compute, Workspace& ws, StageStats& stats,
              ExpertSource& source, ReadAheadGuess& guess, OrderedSum& sum)
      : c_(c),
        compute_(compute),
        ws_(ws),
        stats_(stats),
        source_(source),
        guess_(guess),
        sum_(sum),
        R_(static_cast<size_t>(c.routed_expert_hidden_size)) {}

  const char* name() const override { return "cpu"; }

  void issue(const MoeStep& step, std::span<GroupOwner> owner, GroupOwner self) override {
    for (GroupOwner& o : owner)
      if (o == kUnowned) o = self;
  }

  // Computes the groups it owns that are not delivered yet (called again for groups another
  // executor failed to deliver).
  bool finish(const MoeStep& step, std::span<const GroupOwner> owner, GroupOwner self,
              PairSink& sink) override {
    ws_.cpu_groups.clear();
    ws_.cpu_ids.clear();
    for (size_t g = 0; g < owner.size(); ++g)
      if (owner[g] == self && !sum_.delivered(g)) {
        ws_.cpu_groups.push_back(g);
        ws_.cpu_ids.push_back(step.ids[g]);
      }
    step_ = &step;
    if (!ws_.cpu_ids.empty()) source_.run(step.layer, ws_.cpu_ids, step.use, *this);
    return true;
  }

 private:
  bool ahead(size_t j) override { return sum_.reserve(ws_.cpu_groups[j]); }

  void apply(size_t j, const ExpertView& view) override {
    const size_t g = ws_.cpu_groups[j];
    float* down = sum_.place(g);
    const size_t p0 = ws_.pick_starts[g], m = ws_.pick_starts[g + 1] - p0;
    // Gather the expert's rows.
    for (size_t i = 0; i < m; ++i) {
      const size_t t = ws_.picks[p0 + i].row;
      if (compute_.idot) {
        std::copy(ws_.moe_z_q8.data() + t * R_, ws_.moe_z_q8.data() + (t + 1) * R_,
                  ws_.ex_z_q8.data() + i * R_);
        std::copy(ws_.moe_z_d.data() + t * (R_ / 32), ws_.moe_z_d.data() + (t + 1) * (R_ / 32),
                  ws_.ex_z_d.data() + i * (R_ / 32));
      } else {
        std::copy(ws_.moe_z.data() + t * R_, ws_.moe_z.data() + (t + 1) * R_,
                  ws_.ex_z.data() + i * R_);
      }
    }
    ++stats_.expert_reads;
    apply_expert(c_, compute_, view, m, ws_.ex_z.data(), ws_.ex_z_q8.data(), ws_.ex_z_d.data(),
                 ws_.ex_gate.data(), ws_.ex_up.data(), ws_.ex_h_q8.data(), ws_.ex_h_d.data(), down);
    sum_.deliver(g, down, false);
    for (ExpertExecutor* e : compute_.executors) e->offered(step_->layer, step_->ids[g], view);
  }

  std::span<const int64_t> read_ahead(int64_t* layer) override { return guess_.guess(layer); }

  const K3Config& c_;
  const Compute& compute_;
  Workspace& ws_;
  StageStats& stats_;
  ExpertSource& source_;
  ReadAheadGuess& guess_;
  OrderedSum& sum_;
  const size_t R_;
  const MoeStep* step_ = nullptr;
};

// The step's pairs through the executors (model/expert_executor.h): start() issues every
// executor (the extra ones first) and runs the CPU executor; end() finishes the extra ones and
// hands what one failed to deliver to the CPU executor. Between the two the caller computes the
// shared experts, so the device's batch overlaps them too.
class StepExecutors {
 public:
  StepExecutors(const K3Config& c, const Compute& compute, Workspace& ws, StageStats& stats,
                ExpertSource& experts, ReadAheadGuess& guess, int64_t layer, size_t n)
      : extra_(compute.executors),
        step_(make_step(c, ws, layer, n)),
        owner_(ws.pick_owner),
        sum_(ws, step_.R, !extra_.empty()),
        cpu_(c, compute, ws, stats, experts, guess, sum_),
        cpu_self_(static_cast<GroupOwner>(extra_.size())) {}

  void start() {
    owner_.assign(step_.groups(), kUnowned);
    for (size_t i = 0; i < extra_.size(); ++i)
      extra_[i]->issue(step_, owner_, static_cast<GroupOwner>(i));
    cpu_.issue(step_, owner_, cpu_self_);
    cpu_.finish(step_, owner_, cpu_self_, sum_);
  }

  void end() {
    bool failed = false;
    for (size_t i = 0; i < extra_.size(); ++i)
      if (!extra_[i]->finish(step_, owner_, static_cast<GroupOwner>(i), sum_)) failed = true;
    if (failed) {
      for (size_t g = 0; g < owner_.size(); ++g)
        if (!sum_.delivered(g)) owner_[g] = cpu_self_;
      cpu_.finish(step_, owner_, cpu_self_, sum_);
    }
    if (!sum_.complete())
      throw Error("MoE layer " + std::to_string(step_.layer) +
                  ": an expert executor claimed experts it never delivered");
  }

 private:
  static MoeStep make_step(const K3Config& c, Workspace& ws, int64_t layer, size_t n) {
    MoeStep step;
    step.layer = layer;
    step.use = n == 1 ? ExpertUse::kToken : ExpertUse::kChunk;
    step.ids = ws.pick_ids;
    step.starts = ws.pick_starts;
    step.picks = ws.picks;
    step.z = ws.moe_z.data();
    step.rows = n;
    step.R = static_cast<size_t>(c.routed_expert_hidden_size);
    step.I = static_cast<size_t>(c.moe_intermediate_size);
    return step;
  }

  const std::span<ExpertExecutor* const> extra_;
  const MoeStep step_;
  std::vector<GroupOwner>& owner_;
  OrderedSum sum_;
  CpuExecutor cpu_;
  const GroupOwner cpu_self_;
};

}  // namespace

void latent_moe_forward(const K3Config& c, const Compute& compute, const MoeWeights& w,
                        ExpertSource& experts, int64_t layer, Workspace& ws, StageStats& stats,
                        const float* X, size_t n, float* out, NextMoe next) {
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t E = static_cast<size_t>(c.num_experts);
  const size_t R = static_cast<size_t>(c.routed_expert_hidden_size);
  const KernelTable& kt = *compute.kernels;
  const bool shared = c.num_shared_experts > 0;
  float* z = ws.moe_z.data();            // [n][R]
  float* acc = ws.moe_acc.data();        // [n][R]
  float* routed = ws.moe_routed.data();  // [n][D]
  ReadAheadGuess guess(c, compute, next, ws, X, n);
  std::optional<StepExecutors> executors;
  {
    // Everything that reads X: router logits, latent down, shared gate/up.
    StageTimer timer(stats, Stage::kRouter);
    const MatmulJob jobs[] = {{&w.router, ws.moe_logits.data()},
                              {&w.latent_down, z},
                              {&w.shared_gate, ws.mlp_gate.data()},
                              {&w.shared_up, ws.mlp_up.data()}};
    matmul_jobs(compute, jobs, shared ? 4 : 2, X, n);
    for (size_t t = 0; t < n; ++t)
      route(c, w, ws.moe_logits.data() + t * E, compute.expert_top_p, ws, &ws.routing[t]);
  }
  {
    StageTimer timer(stats, Stage::kExperts);
    std::fill(acc, acc + n * R, 0.0f);
    if (compute.idot)
      quantize_q8_32(kt, z, n, R, ws.moe_z_q8.data(), ws.moe_z_d.data());  // shared by gate and up
    // The step's union of experts, ascending id; per expert its rows ascending (so every row
    // still adds its experts in ascending id order, as alone).
    std::vector<MoePick>& picks = ws.picks;
    picks.clear();
    for (size_t t = 0; t < n; ++t)
      for (size_t j = 0; j < ws.routing[t].ids.size(); ++j)
        picks.push_back({ws.routing[t].ids[j], t, ws.routing[t].weights[j]});
    std::sort(picks.begin(), picks.end(), [](const MoePick& a, const MoePick& b) {
      return a.expert != b.expert ? a.expert < b.expert
                                  : a.row < b.row;  // (std::sort: stable_sort would allocate)
    });
    for (size_t t = 0; t < n; ++t) experts.record(layer, ws.routing[t].ids);
    ws.pick_ids.clear();
    ws.pick_starts.clear();
    for (size_t p = 0; p < picks.size(); ++p) {
      if (p == 0 || picks[p].expert != picks[p - 1].expert) {
        ws.pick_starts.push_back(p);
        ws.pick_ids.push_back(picks[p].expert);
      }
    }
    ws.pick_starts.push_back(picks.size());
    executors.emplace(c, compute, ws, stats, experts, guess, layer, n);
    executors->start();
  }
  if (shared) {  // while the other executors (a device) still compute
    StageTimer timer(stats, Stage::kShared);
    situ_down(c, compute, w.shared_down, ws.mlp_gate.data(), ws.mlp_up.data(), n, out);
  }
  {
    StageTimer timer(stats, Stage::kExperts);
    executors->end();
    for (size_t t = 0; t < n; ++t)
      rmsnorm(acc + t * R, w.latent_norm.data(), R, c.rms_norm_eps, acc + t * R);
    matmul_chunk(compute, w.latent_up, acc, n, routed);  // [n][D]
  }
  StageTimer timer(stats, Stage::kShared);
  if (shared) {
    for (size_t i = 0; i < n * D; ++i) out[i] += routed[i];
  } else {
    std::copy(routed, routed + n * D, out);
  }
}

}  // namespace k3

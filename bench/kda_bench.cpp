// bench/kda_bench.cpp — `k3_bench kda` (benchmarks, not tests).
//
//   k3_bench kda [--config FILE] [--rows 32,128,512,2048] [--layer-rows N] [--seconds S]
//                [--isa I] [--threads N]
//       The KDA recurrence of one layer of the model's geometry (config.json: kda heads and
//       head_dim), in one run: token by token (kda_head_step, one parallel region over the heads
//       per token, as model/kda.cpp runs it with K3_KDA_CHUNKED off) against the chunk form
//       (kda_head_chunk, one region per chunk) with sub-chunks of 16, 32 and 64 rows, at chunks of
//       --rows rows: ms per token per layer of each and the ratio token / chunk. Then one whole
//       KDA layer of that geometry (random int4 matrices as K3_BITS=4 holds them, int8 activations
//       as K3_IDOT=1) over --layer-rows rows with the option off and on, and the projections
//       alone: the recurrence's share of the layer's prefill time.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_common.h"
#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "model/compute.h"
#include "model/config.h"
#include "model/kda.h"
#include "model/state.h"
#include "model/weights.h"
#include "util/error.h"

namespace k3bench {
namespace {

struct KdaArgs : CommonOptions {
  std::string config = K3_BENCH_SOURCE_DIR "/../assets/k3-release/config.json";
  std::vector<size_t> rows = {32, 128, 512, 2048};
  size_t layer_rows = 512;  // 0: skip the whole-layer part
  double seconds = 1.0;
};

float sigmoidf(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// Inputs of the recurrence shaped as kda_forward makes them: [n][heads * dk] rows, q and k
// normalised per head (q scaled by dk^-1/2), a = exp(-5 sigmoid(z)), beta [n][heads] sigmoids.
struct Inputs {
  size_t n = 0, heads = 0, dk = 0;
  std::vector<float> q, k, v, a, beta, o;
};

Inputs make_inputs(size_t n, size_t heads, size_t dk, float lower_bound) {
  Inputs in;
  in.n = n;
  in.heads = heads;
  in.dk = dk;
  const size_t P = heads * dk;
  in.q.resize(n * P);
  in.k.resize(n * P);
  in.v.resize(n * P);
  in.a.resize(n * P);
  in.o.resize(n * P);
  in.beta.resize(n * heads);
  fill_floats(in.q.data(), in.q.size(), 1);
  fill_floats(in.k.data(), in.k.size(), 2);
  fill_floats(in.v.data(), in.v.size(), 3);
  fill_floats(in.a.data(), in.a.size(), 4);
  fill_floats(in.beta.data(), in.beta.size(), 5);
  for (size_t r = 0; r < n * heads; ++r) {
    float* q = in.q.data() + r * dk;
    float* k = in.k.data() + r * dk;
    double qq = 0, kk = 0;
    for (size_t i = 0; i < dk; ++i) {
      qq += double(q[i]) * q[i];
      kk += double(k[i]) * k[i];
    }
    const float qs = static_cast<float>(1.0 / std::sqrt(qq + 1e-6) / std::sqrt(double(dk)));
    const float ks = static_cast<float>(1.0 / std::sqrt(kk + 1e-6));
    for (size_t i = 0; i < dk; ++i) {
      q[i] *= qs;
      k[i] *= ks;
    }
  }
  for (float& x : in.a) x = std::exp(lower_bound * sigmoidf(3.0f * x));
  for (float& x : in.beta) x = sigmoidf(2.0f * x);
  return in;
}

// Token by token: per token one parallel region over the heads (model/kda.cpp's kda_token).
void recurrence_tokens(const k3::KernelTable& kt, Inputs& in, std::vector<float>& S,
                       std::vector<float>& u) {
  const size_t P = in.heads * in.dk, dk = in.dk;
  const int64_t heads = static_cast<int64_t>(in.heads);
  for (size_t t = 0; t < in.n; ++t) {
#pragma omp parallel for schedule(static)
    for (int64_t hh = 0; hh < heads; ++hh) {
      const size_t h = static_cast<size_t>(hh);
      const size_t off = t * P + h * dk;
      kt.kda_head_step(S.data() + h * dk * dk, in.q.data() + off, in.k.data() + off,
                       in.v.data() + off, in.a.data() + off, in.beta[t * in.heads + h], dk,
                       u.data() + h * dk, in.o.data() + off);
    }
  }
}

// The chunk form: one parallel region over the heads for the whole chunk.
void recurrence_chunk(const k3::KernelTable& kt, Inputs& in, std::vector<float>& S, size_t bt,
                      std::vector<float>& scratch) {
  const size_t P = in.heads * in.dk, dk = in.dk;
  const size_t per_thread = k3::kda_chunk_scratch_floats(bt, dk);
  const int64_t heads = static_cast<int64_t>(in.heads);
#pragma omp parallel for schedule(static)
  for (int64_t hh = 0; hh < heads; ++hh) {
    const size_t h = static_cast<size_t>(hh);
    float* scr = scratch.data() + static_cast<size_t>(omp_get_thread_num()) * per_thread;
    kt.kda_head_chunk(S.data() + h * dk * dk, in.q.data() + h * dk, in.k.data() + h * dk,
                      in.v.data() + h * dk, in.a.data() + h * dk, P, in.beta.data() + h, in.heads,
                      in.n, dk, bt, scr, in.o.data() + h * dk);
  }
}

// A random matrix as the loader holds it at K3_BITS (4: int4 g64 with int8 activations).
k3::WeightMatrix random_matrix(size_t rows, size_t cols, int bits, uint64_t seed,
                               const k3::KernelTable& kt) {
  k3::WeightMatrix W;
  W.rows = static_cast<int64_t>(rows);
  W.cols = static_cast<int64_t>(cols);
  W.f32.resize(rows * cols);
  fill_floats(W.f32.data(), rows * cols, seed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
  for (size_t i = 0; i < rows * cols; ++i) W.f32[i] *= scale;
  if (bits != 32) {
    k3::quantize_matrix(W, bits, kt);
    W.int8_activations = W.format == k3::WeightFormat::kInt4G64;
  }
  return W;
}

int run_kda(const KdaArgs& a) {
  const k3::Isa isa = apply_common_options(a);
  print_machine(isa);
  const k3::KernelTable& kt = k3::kernel_table(isa);
  std::ifstream f(a.config);
  if (!f) throw k3::Error(a.config + ": cannot open");
  const k3::K3Config config = k3::parse_k3_config(nlohmann::json::parse(f), a.config);
  const size_t H = static_cast<size_t>(config.kda_num_heads);
  const size_t dk = static_cast<size_t>(config.kda_head_dim);
  const float lower_bound = static_cast<float>(config.gate_lower_bound);
  const size_t threads = static_cast<size_t>(omp_get_max_threads());
  std::printf("\n== KDA recurrence, %zu heads x head_dim %zu (%s), gate_lower_bound %g\n", H, dk,
              a.config.c_str(), config.gate_lower_bound);
  std::printf("%-7s %-12s %12s %9s\n", "rows", "form", "ms/token", "ratio");

  std::vector<float> S(H * dk * dk, 0.0f), u(H * dk);
  const size_t bts[] = {16, 32, 64};
  std::vector<float> scratch(threads * k3::kda_chunk_scratch_floats(64, dk));
  for (size_t n : a.rows) {
    Inputs in = make_inputs(n, H, dk, lower_bound);
    const Timing tok = measure(
        a.seconds, 3, [&] { recurrence_tokens(kt, in, S, u); },
        [&] { recurrence_tokens(kt, in, S, u); });
    const double tok_ms = tok.best * 1e3 / static_cast<double>(n);
    std::printf("%-7zu %-12s %12.4f %9s  (cpu %.0f%%)\n", n, "token", tok_ms, "1.00",
                100.0 * tok.cpu_share);
    add_result("kda_token_rows" + std::to_string(n), tok_ms, "ms/token", 1.0, tok.cpu_share);
    for (size_t bt : bts) {
      const Timing chk = measure(
          a.seconds, 3, [&] { recurrence_chunk(kt, in, S, bt, scratch); },
          [&] { recurrence_chunk(kt, in, S, bt, scratch); });
      const double ms = chk.best * 1e3 / static_cast<double>(n);
      const std::string form = "chunk bt=" + std::to_string(bt);
      std::printf("%-7zu %-12s %12.4f %8.2fx  (cpu %.0f%%)\n", n, form.c_str(), ms, tok_ms / ms,
                  100.0 * chk.cpu_share);
      add_result("kda_chunk" + std::to_string(bt) + "_rows" + std::to_string(n), ms, "ms/token",
                 tok_ms / ms, chk.cpu_share);
    }
  }

  if (a.layer_rows > 0) {
    // One KDA layer of this geometry, as model/kda.cpp runs it.
    const size_t n = a.layer_rows, D = static_cast<size_t>(config.hidden_size), P = H * dk;
    const size_t K = static_cast<size_t>(config.short_conv_kernel_size);
    std::printf(
        "\n== one KDA layer (hidden %zu, projections int4 g64 on int8 activations), %zu "
        "rows\n",
        D, n);
    k3::KdaWeights w;
    w.q_proj = random_matrix(P, D, 4, 11, kt);
    w.k_proj = random_matrix(P, D, 4, 12, kt);
    w.v_proj = random_matrix(P, D, 4, 13, kt);
    w.g_proj = random_matrix(P, D, 4, 14, kt);
    w.o_proj = random_matrix(D, P, 4, 15, kt);
    w.f_a_proj = random_matrix(dk, D, 32, 16, kt);
    w.f_b_proj = random_matrix(P, dk, 32, 17, kt);
    w.b_proj = random_matrix(H, D, 32, 18, kt);
    for (auto* conv : {&w.q_conv, &w.k_conv, &w.v_conv}) {
      conv->resize(P * K);
      fill_floats(conv->data(), conv->size(), 19);
    }
    w.a_exp.assign(H, 1.0f);
    w.dt_bias.resize(P);
    fill_floats(w.dt_bias.data(), P, 20);
    w.o_norm.assign(dk, 1.0f);

    // A model state of the first layer only (a KDA layer in K3), its workspace sized for n rows.
    k3::ModelState state(config, 1, 1, 1);
    k3::Workspace& ws = state.work;
    ws.reserve(config, n);
    std::vector<k3::SequenceRow> rows(n, k3::SequenceRow{&state, 0});
    std::vector<float> X(n * D), out(n * D);
    fill_floats(X.data(), X.size(), 21);

    k3::Compute compute;
    compute.kernels = &kt;
    compute.idot = true;
    const size_t layer = 0;
    if (config.attention[layer] != k3::AttentionKind::kKDA)
      throw k3::Error(a.config + ": the first layer is not a KDA layer");
    auto forward = [&](bool chunked) {
      compute.kda_chunked = chunked;
      k3::kda_forward(config, compute, w, layer, rows.data(), ws, X.data(), n, out.data());
    };
    // The projections alone: what kda_forward multiplies before and after the recurrence.
    auto projections = [&] {
      const k3::MatmulJob jobs[] = {
          {&w.q_proj, ws.kda_q.data()},           {&w.k_proj, ws.kda_k.data()},
          {&w.v_proj, ws.kda_v.data()},           {&w.g_proj, ws.kda_gate.data()},
          {&w.f_a_proj, ws.kda_decay_low.data()}, {&w.b_proj, ws.kda_beta.data()}};
      k3::matmul_jobs(compute, jobs, std::size(jobs), X.data(), n);
      k3::matmul_chunk(compute, w.f_b_proj, ws.kda_decay_low.data(), n, ws.kda_decay.data());
      k3::matmul_chunk(compute, w.o_proj, ws.kda_out.data(), n, out.data());
    };
    // The three interleaved, pass by pass, so a change in the machine's load falls on all of
    // them alike; the best pass of each is reported.
    projections();
    forward(false);
    forward(true);
    Timing proj, off2, on;
    {
      std::vector<double> tp, toff, ton;
      const double start = k3::now_seconds(), cpu0 = process_cpu_seconds();
      auto timed = [](std::vector<double>& into, auto&& fn) {
        const double t0 = k3::now_seconds();
        fn();
        into.push_back(k3::now_seconds() - t0);
      };
      while (tp.size() < 3 || k3::now_seconds() - start < 3 * a.seconds) {
        timed(tp, projections);
        timed(toff, [&] { forward(false); });
        timed(ton, [&] { forward(true); });
      }
      const double share =
          (process_cpu_seconds() - cpu0) / ((k3::now_seconds() - start) * omp_get_max_threads());
      auto best = [&](std::vector<double>& v) {
        std::sort(v.begin(), v.end());
        return Timing{v.front(), v[v.size() / 2], static_cast<int>(v.size()), share};
      };
      proj = best(tp);
      off2 = best(toff);
      on = best(ton);
    }
    const double per = 1e3 / static_cast<double>(n);
    const double rest_off = std::max(0.0, off2.best - proj.best);
    const double rest_on = std::max(0.0, on.best - proj.best);
    std::printf("projections alone          %10.4f ms/token\n", proj.best * per);
    std::printf(
        "layer, token recurrence    %10.4f ms/token  (recurrence, conv, norms: %.4f = "
        "%.0f%% of the layer)\n",
        off2.best * per, rest_off * per, 100.0 * rest_off / off2.best);
    std::printf(
        "layer, K3_KDA_CHUNKED=1    %10.4f ms/token  (recurrence, conv, norms: %.4f = "
        "%.0f%% of the layer)\n",
        on.best * per, rest_on * per, 100.0 * rest_on / on.best);
    std::printf(
        "layer speed-up off / on    %10.2fx  (best of %d interleaved passes each, cpu %.0f%%)\n",
        off2.best / on.best, on.passes, 100.0 * on.cpu_share);
    add_result("kda_layer_off_rows" + std::to_string(n), off2.best * per, "ms/token", 1.0,
               off2.cpu_share);
    add_result("kda_layer_on_rows" + std::to_string(n), on.best * per, "ms/token",
               off2.best / on.best, on.cpu_share);
    add_result("kda_layer_recurrence_share_off", 100.0 * rest_off / off2.best, "%",
               rest_off / off2.best, off2.cpu_share);
    add_result("kda_layer_recurrence_share_on", 100.0 * rest_on / on.best, "%", rest_on / on.best,
               on.cpu_share);
  }
  print_results();
  return 0;
}

}  // namespace

Subcommand register_kda(CLI::App& app) {
  auto a = std::make_shared<KdaArgs>();
  Command sub(app, "kda",
              "KDA recurrence: token by token vs the chunk (WY/UT) form, and its share of a layer");
  sub.option("--config", a->config, "config.json whose KDA geometry is measured").show_default();
  sub.option("--rows", a->rows, "chunk rows to measure").list(',').default_text("32,128,512,2048");
  sub.option("--layer-rows", a->layer_rows, "rows of the whole-layer part (0 = skip it)")
      .show_default();
  sub.option("--seconds", a->seconds, "timing seconds per figure").show_default();
  add_common_options(sub, *a);
  return {sub.app(), [a] { return run_kda(*a); }};
}

}  // namespace k3bench

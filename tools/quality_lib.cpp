// tools/quality_lib.cpp — see quality_lib.h.
#include "quality_lib.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "engine/sampler.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "repack_lib.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3::quality {

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// exp(x) in double for x <= 0 (the softmax's exponents), ~2 ulp: x = k ln2 + r with |r| <=
// ln2 / 2 (Cody-Waite, ln2 split so that k * kLn2Hi is exact), exp(r) by its degree-13 Taylor
// polynomial (truncation < 1e-17), 2^k built in the exponent bits. Below -700 the result is
// exp(-700) ~ 1e-304, nothing next to a sum >= 1. glibc's exp is ~6x slower and does not
// vectorise: the measurement takes 2 x 163,840 of them per position. Exp2 below is the same
// arithmetic two lanes at a time (SSE2, in every x86-64): both round identically.
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kRound = 6755399441055744.0;  // 1.5 * 2^52: x + kRound rounds x to an integer
constexpr double kExpFloor = -700.0;
// 1/13!, 1/12!, ..., 1/1!, 1/0!
constexpr double kTaylor[14] = {1.0 / 6227020800.0,
                                1.0 / 479001600.0,
                                1.0 / 39916800.0,
                                1.0 / 3628800.0,
                                1.0 / 362880.0,
                                1.0 / 40320.0,
                                1.0 / 5040.0,
                                1.0 / 720.0,
                                1.0 / 120.0,
                                1.0 / 24.0,
                                1.0 / 6.0,
                                0.5,
                                1.0,
                                1.0};

double exp_neg(double x) {
  x = std::isnan(x) ? x : std::max(kExpFloor, x);
  const double t = x * kLog2e + kRound;
  const double k = t - kRound;
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  double p = kTaylor[0];
  for (int i = 1; i < 14; ++i) p = p * r + kTaylor[i];
  uint64_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits = (bits + 1023) << 52;
  double scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

#if defined(__SSE2__)
__m128d exp_neg2(__m128d x) {
  x = _mm_max_pd(_mm_set1_pd(kExpFloor), x);  // a NaN lane stays NaN (max returns operand 2)
  const __m128d round = _mm_set1_pd(kRound);
  const __m128d t = _mm_add_pd(_mm_mul_pd(x, _mm_set1_pd(kLog2e)), round);
  const __m128d k = _mm_sub_pd(t, round);
  const __m128d r = _mm_sub_pd(_mm_sub_pd(x, _mm_mul_pd(k, _mm_set1_pd(kLn2Hi))),
                               _mm_mul_pd(k, _mm_set1_pd(kLn2Lo)));
  __m128d p = _mm_set1_pd(kTaylor[0]);
  for (int i = 1; i < 14; ++i) p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(kTaylor[i]));
  const __m128i bits =
      _mm_slli_epi64(_mm_add_epi64(_mm_castpd_si128(t), _mm_set1_epi64x(1023)), 52);
  return _mm_mul_pd(p, _mm_castsi128_pd(bits));
}

__m128d load2(const float* p) {
  return _mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

double sum2(__m128d v) {
  return _mm_cvtsd_f64(v) + _mm_cvtsd_f64(_mm_unpackhi_pd(v, v));
}

// Four lanes of exp_neg2 on AVX2 (no FMA: the same roundings lane for lane), for the loops
// below: they add the two halves in the SSE2 loops' order, so that the sums, and every figure of
// the gate, are bit-identical on every x86-64 (the exponentials are most of the measurement).
__attribute__((target("avx2"))) __m256d exp_neg4(__m256d x) {
  x = _mm256_max_pd(_mm256_set1_pd(kExpFloor), x);
  const __m256d round = _mm256_set1_pd(kRound);
  const __m256d t = _mm256_add_pd(_mm256_mul_pd(x, _mm256_set1_pd(kLog2e)), round);
  const __m256d k = _mm256_sub_pd(t, round);
  const __m256d r = _mm256_sub_pd(_mm256_sub_pd(x, _mm256_mul_pd(k, _mm256_set1_pd(kLn2Hi))),
                                  _mm256_mul_pd(k, _mm256_set1_pd(kLn2Lo)));
  __m256d p = _mm256_set1_pd(kTaylor[0]);
  for (int i = 1; i < 14; ++i) p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(kTaylor[i]));
  const __m256i bits =
      _mm256_slli_epi64(_mm256_add_epi64(_mm256_castpd_si256(t), _mm256_set1_epi64x(1023)), 52);
  return _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
}

__attribute__((target("avx2"))) __m256d load4(const float* p) {
  return _mm256_cvtps_pd(_mm_loadu_ps(p));
}

// acc += v[0..1], then acc += v[2..3]: the SSE2 loop's two steps.
__attribute__((target("avx2"))) __m128d add_halves(__m128d acc, __m256d v) {
  acc = _mm_add_pd(acc, _mm256_castpd256_pd128(v));
  return _mm_add_pd(acc, _mm256_extractf128_pd(v, 1));
}

// The SSE2 loops' sums over [0, 4 * (n / 4)), four at a time.
__attribute__((target("avx2"))) size_t lse_sum_avx2(const float* z, size_t n, float m,
                                                    __m128d& acc) {
  const __m256d mv = _mm256_set1_pd(m);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) acc = add_halves(acc, exp_neg4(_mm256_sub_pd(load4(z + i), mv)));
  return i;
}

__attribute__((target("avx2"))) size_t kl_sums_avx2(const float* zp, double lse_p, const float* zq,
                                                    size_t n, __m128d& w2, __m128d& m2) {
  const __m256d lv = _mm256_set1_pd(lse_p);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d a = load4(zp + i);
    const __m256d p = exp_neg4(_mm256_sub_pd(a, lv));
    w2 = add_halves(w2, _mm256_mul_pd(p, _mm256_sub_pd(a, load4(zq + i))));
    m2 = add_halves(m2, p);
  }
  return i;
}

const bool kHasAvx2 = __builtin_cpu_supports("avx2");
#endif

// log(sum_i exp(z_i)) in double.
double log_sum_exp(const float* z, size_t n) {
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (size_t i = 0; i < n; ++i) {
    m = std::max(m, z[i]);
    nan |= std::isnan(z[i]);
  }
  if (nan) return std::nan("");
  double sum = 0;
  size_t i = 0;
#if defined(__SSE2__)
  __m128d acc = _mm_setzero_pd();
  const __m128d mv = _mm_set1_pd(m);
  if (kHasAvx2) i = lse_sum_avx2(z, n, m, acc);
  for (; i + 2 <= n; i += 2) acc = _mm_add_pd(acc, exp_neg2(_mm_sub_pd(load2(z + i), mv)));
  sum = sum2(acc);
#endif
  for (; i < n; ++i) sum += exp_neg(static_cast<double>(z[i]) - m);
  return m + std::log(sum);
}

// KL(p || q) of two logit vectors, their log-sum-exps known: sum_i p_i ((zp_i - zq_i) -
// (lse_p - lse_q)), written so that identical logits give exactly 0.
double kl_divergence(const float* zp, double lse_p, const float* zq, double lse_q, size_t n) {
  double weighted = 0, mass = 0;
  size_t i = 0;
#if defined(__SSE2__)
  __m128d w2 = _mm_setzero_pd(), m2 = _mm_setzero_pd();
  const __m128d lv = _mm_set1_pd(lse_p);
  if (kHasAvx2) i = kl_sums_avx2(zp, lse_p, zq, n, w2, m2);
  for (; i + 2 <= n; i += 2) {
    const __m128d a = load2(zp + i);
    const __m128d p = exp_neg2(_mm_sub_pd(a, lv));
    w2 = _mm_add_pd(w2, _mm_mul_pd(p, _mm_sub_pd(a, load2(zq + i))));
    m2 = _mm_add_pd(m2, p);
  }
  weighted = sum2(w2);
  mass = sum2(m2);
#endif
  for (; i < n; ++i) {
    const double p = exp_neg(static_cast<double>(zp[i]) - lse_p);
    weighted += p * (static_cast<double>(zp[i]) - static_cast<double>(zq[i]));
    mass += p;
  }
  const double kl = weighted - (lse_p - lse_q) * mass;
  return std::isnan(kl) ? kl : std::max(0.0, kl);
}

// Counts the routed experts picked at each MoE layer.
class RoutingCounter : public LayerObserver {
 public:
  explicit RoutingCounter(std::vector<std::vector<int64_t>>& use, int64_t experts)
      : use_(use), experts_(experts) {}
  void on_tensor(int64_t, Site, const float*) override {}
  void on_routing(int64_t layer, const Routing& routing) override {
    if (use_.size() <= static_cast<size_t>(layer)) use_.resize(static_cast<size_t>(layer) + 1);
    auto& row = use_[static_cast<size_t>(layer)];
    row.resize(static_cast<size_t>(experts_));
    for (int64_t id : routing.ids) ++row[static_cast<size_t>(id)];
  }

 private:
  std::vector<std::vector<int64_t>>& use_;
  int64_t experts_;
};

// Counts the routed picks made and the routed tokens (one on_routing call each).
class PickCounter : public LayerObserver {
 public:
  void on_tensor(int64_t, Site, const float*) override {}
  void on_routing(int64_t, const Routing& routing) override {
    picks += static_cast<int64_t>(routing.ids.size());
    ++tokens;
  }
  int64_t picks = 0, tokens = 0;
};

// The oracle's figures for a setting's logits `z` [>= T][V] (the prefill of window 0) whose
// log-sum-exps are `lse` [>= T]: KL(oracle || setting) per position over the full vocabulary (the
// oracle's K ids, the two group representatives weighing their group's size), summed in position
// order, and the positions where the oracle's top id is also a top id of the setting (a group
// representative stands for every member: equal logits, whichever of them argmax returns).
void compare_with_oracle(const Oracle& oracle, const float* z, const std::vector<double>& lse,
                         size_t V, Row& row) {
  const size_t K = oracle.logit_ids.size(), T = oracle.positions;
  std::vector<double> kl(T);
  std::vector<int64_t> top(T);
#pragma omp parallel for schedule(static)
  for (size_t t = 0; t < T; ++t) {
    const double* o = oracle.logits.data() + t * K;
    const float* zt = z + t * V;
    size_t best = 0;
    for (size_t k = 1; k < K; ++k)
      if (o[k] > o[best]) best = k;
    double mass = 0;
    for (size_t k = 0; k < K; ++k) mass += oracle.weight[k] * std::exp(o[k] - o[best]);
    const double lse_o = o[best] + std::log(mass);
    double sum = 0;
    for (size_t k = 0; k < K; ++k) {
      const double lp = o[k] - lse_o;
      const double lq = static_cast<double>(zt[static_cast<size_t>(oracle.logit_ids[k])]) - lse[t];
      sum += oracle.weight[k] * std::exp(lp) * (lp - lq);
    }
    kl[t] = std::isnan(sum) ? sum : std::max(0.0, sum);
    const float zmax = zt[static_cast<size_t>(argmax({zt, V}))];
    top[t] = zt[static_cast<size_t>(oracle.logit_ids[best])] >= zmax;
  }
  double kl_sum = 0;
  int64_t agree = 0;
  row.oracle_kl_max = 0;
  for (size_t t = 0; t < T; ++t) {
    kl_sum += kl[t];
    if (!(kl[t] <= row.oracle_kl_max)) row.oracle_kl_max = kl[t];
    agree += top[t];
  }
  row.oracle_kl_mean = kl_sum / static_cast<double>(T);
  row.oracle_top1 = static_cast<double>(agree) / static_cast<double>(T);
}

// The oracle fixture (oracle.safetensors; Oracle in quality_lib.h), checked against window 0.
Oracle load_oracle(const std::string& path, const std::vector<int64_t>& window0) {
  if (!std::filesystem::exists(path))
    throw Error(path + ": cannot open (the second oracle, tools/train/make_fixtures.py)");
  const SafetensorsShard shard(open_posix_file(path));
  const auto tensor = [&](const std::string& name, DType dtype) {
    const TensorInfo* t = shard.find(name);
    if (!t) throw Error(path + ": no tensor \"" + name + "\"");
    if (t->dtype != dtype) throw Error(path + ": \"" + name + "\" has an unexpected dtype");
    return t;
  };
  const auto i64 = [&](const std::string& name) {
    const TensorInfo* t = tensor(name, DType::kI64);
    std::vector<int64_t> v(t->numel());
    shard.read(*t, v.data());
    return v;
  };
  const std::vector<int64_t> ids = i64("ids");
  const std::vector<int64_t> shared = i64("shared_count");
  Oracle o;
  o.logit_ids = i64("logit_ids");
  const TensorInfo* lt = shard.find("logits");
  if (!lt) throw Error(path + ": no tensor \"logits\"");
  if (lt->dtype == DType::kF32) {
    std::vector<float> v(lt->numel());
    shard.read(*lt, v.data());
    o.logits.assign(v.begin(), v.end());
  } else {
    tensor("logits", DType::kF64);
    o.logits.resize(lt->numel());
    shard.read(*lt, o.logits.data());
  }
  const size_t K = o.logit_ids.size();
  o.positions = ids.size();
  if (K < 3 || shared.size() != 2 || o.logits.size() != o.positions * K ||
      o.positions > static_cast<size_t>(kWindowTokens - 1) ||
      !std::equal(ids.begin(), ids.end(), window0.begin()))
    throw Error(path + ": expected ids [T] equal to the first T ids of window 0 (T < " +
                std::to_string(kWindowTokens) +
                "), logit_ids [K], logits [T, K] and shared_count [2]");
  o.weight.assign(K, 1.0);
  o.weight[K - 2] = static_cast<double>(shared[0]);
  o.weight[K - 1] = static_cast<double>(shared[1]);
  return o;
}

// Greedy-decodes kGreedyTokens ids from each prompt, the prompts side by side in one Batch: the
// head and the dense matrices stream once per step for all of them, and each prompt's ids are
// those of its own session decoded alone (engine/engine.h, Batch).
std::vector<std::vector<int64_t>> greedy(const Engine& engine,
                                         const std::vector<std::vector<int64_t>>& prompts) {
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Session*> rows;
  std::vector<std::vector<int64_t>> out(prompts.size());
  std::vector<int64_t> next(prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) {
    sessions.push_back(
        std::make_unique<Session>(engine, static_cast<int64_t>(prompts[p].size()) + kGreedyTokens));
    rows.push_back(sessions.back().get());
    next[p] = argmax(sessions.back()->prefill(prompts[p]));
    out[p].push_back(next[p]);
  }
  Batch batch(engine);
  for (int64_t j = 1; j < kGreedyTokens; ++j) {
    batch.step(rows, next);
    for (size_t p = 0; p < prompts.size(); ++p) {
      next[p] = argmax(rows[p]->logits());
      out[p].push_back(next[p]);
    }
  }
  return out;
}

void check_fixtures(const Fixtures& f) {
  if (f.windows.empty() || f.prompts.empty())
    throw Error("quality: the fixtures hold no held-out windows or prompts");
}

}  // namespace

std::string Setting::env() const {
  std::string s = container > 0 ? "container --bits " + std::to_string(container) + ":" : "";
  const auto width = [&](const char* key, int value) {
    if (value <= 0) return;
    if (!s.empty()) s += ' ';
    s += key;
    s += '=';
    s += std::to_string(value);
  };
  width("K3_BITS", bits);
  width("K3_MLA_BITS", mla_bits);
  width("K3_HEAD_BITS", head_bits);
  s += " K3_IDOT=" + std::string(idot ? "1" : "0");
  if (top_p > 0) s += " K3_TOPP=" + number(top_p);
  return s;
}

LoadOptions Setting::apply(LoadOptions base) const {
  const LoadOptions defaults;
  base.bits = bits > 0 ? bits : defaults.bits;
  base.mla_bits = mla_bits > 0 ? mla_bits : defaults.mla_bits;
  base.head_bits = head_bits > 0 ? head_bits : defaults.head_bits;
  base.bits_chosen = bits > 0;
  base.mla_bits_chosen = mla_bits > 0;
  base.head_bits_chosen = head_bits > 0;
  base.idot = idot;
  base.expert_top_p = top_p;
  return base;
}

std::vector<Setting> settings() {
  const LoadOptions d;  // the release defaults
  // The ceilings (Ceiling in quality_lib.h), fixed by hand per class of setting: {ppl / exact,
  // KL mean, top-1 min, greedy min, KL mean vs the oracle, top-1 min vs the oracle}. About twice
  // the class's largest measured cost (ppl excess, KL) and agreement a margin below its lowest
  // (docs/testing.md §5 has the figures). Exact: its figures against the exact reference are a
  // re-run of itself (0 / 1 unless the engine is not deterministic); its KL against the oracle
  // measured 8.7e-13 (f32 against float64), its top-1 64 of 64.
  const Ceiling exact{1.001, 1e-6, 0.98, 0.9, 1e-8, 0.95};
  // Integer dots, int8 dense, int8 / int4 MLA, int8 head: measured at most ppl x1.0019, KL 5.7e-4,
  // top-1 >= 0.988, greedy >= 0.75, KL vs oracle 1.1e-3, top-1 vs oracle >= 63/64.
  const Ceiling near{1.005, 2e-3, 0.95, 0.5, 3e-3, 0.95};
  // int4 dense or int4 head: at most ppl x1.015, KL 0.0148, top-1 >= 0.893, greedy >= 0.55, KL
  // vs oracle 0.020, top-1 vs oracle >= 58/64.
  const Ceiling int4{1.03, 0.03, 0.85, 0.35, 0.04, 0.85};
  // The defaults with K3_TOPP (experts dropped on top of int4): at most ppl x1.024, KL 0.036,
  // top-1 >= 0.865, greedy >= 0.55, KL vs oracle 0.046, top-1 vs oracle >= 56/64.
  const Ceiling topp{1.05, 0.075, 0.8, 0.35, 0.1, 0.8};
  return {
      {"exact", 32, 32, 32, false, 0, 0, exact},
      {"idot", 32, 32, 32, true, 0, 0, near},
      {"bits8", 8, 32, 32, false, 0, 0, near},
      {"bits4", 4, 32, 32, false, 0, 0, int4},
      {"bits4_idot", 4, 32, 32, true, 0, 0, int4},
      {"mla_bits8", 32, 8, 32, false, 0, 0, near},
      {"mla_bits4", 32, 4, 32, false, 0, 0, near},
      {"head_bits8", 32, 32, 8, false, 0, 0, near},
      {"head_bits4", 32, 32, 4, false, 0, 0, int4},
      {"defaults", d.bits, d.mla_bits, d.head_bits, d.idot, 0, 0, int4},
      // K3_TOPP rows that drop picks on this model, whose top-4 weights are near uniform: 0.9
      // never does (all four are needed to reach it); 0.8 keeps 95.5% of the picks, 0.7 75%.
      {"defaults_topp0.8", d.bits, d.mla_bits, d.head_bits, d.idot, 0.8, 0, topp},
      {"defaults_topp0.7", d.bits, d.mla_bits, d.head_bits, d.idot, 0.7, 0, topp},
      // The repacked container with its own widths (int4: the same bytes as "defaults", so the
      // same figures; int8: 8/8/8), and K3_BITS=4 downcasting the int8 container at load.
      {"container_int4", 0, 0, 0, true, 0, 4, int4},
      {"container_int8", 0, 0, 0, false, 0, 8, near},
      {"container_int8_downcast4", 4, 0, 0, true, 0, 8, int4},
  };
}

Setting setting(const std::string& name) {
  std::string names;
  for (const Setting& s : settings()) {
    if (s.name == name) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  throw Error("quality: no setting \"" + name + "\" (settings: " + names + ")");
}

Fixtures Fixtures::load(const std::string& dir) {
  Fixtures f;
  const std::string text_path = dir + "/heldout_text.u32";
  std::ifstream text(text_path, std::ios::binary);
  if (!text) throw Error(text_path + ": cannot open (the held-out text windows)");
  const std::string bytes{std::istreambuf_iterator<char>(text), {}};
  const size_t window_bytes = 4 * static_cast<size_t>(kWindowTokens);
  if (bytes.empty() || bytes.size() % window_bytes != 0)
    throw Error(text_path + ": " + std::to_string(bytes.size()) +
                " bytes, expected a positive multiple of " + std::to_string(window_bytes) +
                " (windows of " + std::to_string(kWindowTokens) + " u32 ids)");
  for (size_t w = 0; w < bytes.size() / window_bytes; ++w) {
    std::vector<int64_t> ids;
    for (int64_t t = 0; t < kWindowTokens; ++t) {
      const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + w * window_bytes +
                      4 * static_cast<size_t>(t);
      ids.push_back(static_cast<int64_t>(p[0] | (p[1] << 8) | (p[2] << 16) |
                                         (static_cast<uint32_t>(p[3]) << 24)));
    }
    f.windows.push_back(std::move(ids));
  }

  const std::string prompts_path = dir + "/heldout_prompts.jsonl";
  std::ifstream prompts(prompts_path);
  if (!prompts) throw Error(prompts_path + ": cannot open (the held-out chat prompts)");
  std::string line;
  for (int n = 1; std::getline(prompts, line); ++n) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("ids") || !j["ids"].is_array() ||
        j["ids"].empty())
      throw Error(prompts_path + ":" + std::to_string(n) +
                  ": expected {\"ids\": [...]} with at least one id");
    std::vector<int64_t> ids;
    for (const auto& id : j["ids"]) {
      if (!id.is_number_integer())
        throw Error(prompts_path + ":" + std::to_string(n) + ": \"ids\" holds a non-integer");
      ids.push_back(id.get<int64_t>());
    }
    f.prompts.push_back(std::move(ids));
  }
  if (f.prompts.empty()) throw Error(prompts_path + ": no prompts");
  f.oracle = load_oracle(dir + "/oracle.safetensors", f.windows.front());
  return f;
}

Reference::Reference(const std::string& model_dir, const Fixtures& fixtures,
                     const LoadOptions& base)
    : model_dir_(model_dir), fixtures_(fixtures), base_(base) {
  check_fixtures(fixtures);
  const double t0 = now_seconds();
  const Setting exact = settings().front();
  const Engine engine(model_dir, exact.apply(base));
  vocab_ = engine.info().vocab_size;
  const size_t V = static_cast<size_t>(vocab_);
  const size_t rows = static_cast<size_t>(kWindowTokens - 1);
  RoutingCounter counter(expert_use_, engine.info().num_experts);
  double nll = 0;
  for (const std::vector<int64_t>& window : fixtures.windows) {
    Session session(engine, kWindowTokens);
    std::vector<float> all;
    all.reserve(static_cast<size_t>(kWindowTokens) * V);
    PrefillHooks hooks;
    hooks.observer = &counter;
    hooks.all_logits = &all;
    session.prefill(window, hooks);
    all.resize(rows * V);
    std::vector<double> lse(rows);
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < rows; ++t) lse[t] = log_sum_exp(all.data() + t * V, V);
    for (size_t t = 0; t < rows; ++t) {
      const float* z = all.data() + t * V;
      nll += lse[t] - z[static_cast<size_t>(window[t + 1])];
      lse_.push_back(lse[t]);
      top1_.push_back(argmax({z, V}));
    }
    logits_.push_back(std::move(all));
  }
  greedy_ = greedy(engine, fixtures.prompts);
  row_.setting = exact.name;
  row_.env = exact.env();
  row_.describe = engine.describe();
  row_.positions = static_cast<int64_t>(lse_.size());
  row_.ppl = std::exp(nll / static_cast<double>(row_.positions));
  row_.top1 = row_.greedy = 1;
  row_.first_diverge = static_cast<double>(kGreedyTokens);
  row_.ppl_ratio = 1;
  row_.experts_kept = 1;  // no K3_TOPP: every top-k pick is made
  compare_with_oracle(fixtures.oracle, logits_.front().data(), lse_, V, row_);
  row_.seconds = now_seconds() - t0;
}

Reference::~Reference() {
  for (const auto& [bits, dir] : containers_) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

Row Reference::measure(const Setting& s, const std::string& model_dir) const {
  const double t0 = now_seconds();
  std::string dir = model_dir.empty() ? model_dir_ : model_dir;
  if (s.container > 0) {
    // The container is made once per width (a few seconds for the trained tiny model) and its
    // repack time counts in this row's seconds.
    auto it = containers_.find(s.container);
    if (it == containers_.end()) {
      repack::Options o;
      o.source = dir;
      o.dest = (std::filesystem::temp_directory_path() /
                ("k3_quality_container_" + std::to_string(::getpid()) + "_" +
                 std::to_string(s.container)))
                   .string();
      o.bits = s.container;
      std::filesystem::remove_all(o.dest);
      repack::run(o);
      it = containers_.emplace(s.container, o.dest).first;
    }
    dir = it->second;
  }
  const Engine engine(dir, s.apply(base_));
  if (engine.info().vocab_size != vocab_)
    throw Error("quality: " + model_dir + " has vocab_size " +
                std::to_string(engine.info().vocab_size) + ", the reference " +
                std::to_string(vocab_));
  const size_t V = static_cast<size_t>(vocab_);
  const size_t rows = static_cast<size_t>(kWindowTokens - 1);
  Row row;
  row.setting = s.name;
  row.env = s.env();
  row.describe = engine.describe();
  double nll = 0, kl = 0;
  int64_t top1 = 0;
  std::vector<double> pos_nll(rows), pos_kl(rows), pos_lse(rows);
  std::vector<int64_t> pos_top1(rows);
  PickCounter picks;
  std::vector<float> all;  // [kWindowTokens][vocab], reused (prefill clears it, keeping capacity)
  all.reserve(static_cast<size_t>(kWindowTokens) * V);
  for (size_t w = 0; w < fixtures_.windows.size(); ++w) {
    const std::vector<int64_t>& window = fixtures_.windows[w];
    Session session(engine, kWindowTokens);
    PrefillHooks hooks;
    hooks.all_logits = &all;
    hooks.observer = &picks;
    session.prefill(window, hooks);
    const float* ref = logits_[w].data();
    // Per position in parallel, summed in order below: the figures do not depend on threads.
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < rows; ++t) {
      const float* z = all.data() + t * V;
      const double lse = log_sum_exp(z, V);
      pos_lse[t] = lse;
      const double lse_ref = lse_[w * rows + t];
      pos_nll[t] = lse - z[static_cast<size_t>(window[t + 1])];
      pos_kl[t] = kl_divergence(ref + t * V, lse_ref, z, lse, V);
      pos_top1[t] = argmax({z, V}) == top1_[w * rows + t];
    }
    for (size_t t = 0; t < rows; ++t) {
      nll += pos_nll[t];
      kl += pos_kl[t];
      // NaN propagates into the max (and fails the gate) instead of being skipped.
      if (!(pos_kl[t] <= row.kl_max)) row.kl_max = pos_kl[t];
      top1 += pos_top1[t];
    }
    if (w == 0) compare_with_oracle(fixtures_.oracle, all.data(), pos_lse, V, row);
  }
  row.positions = static_cast<int64_t>(fixtures_.windows.size() * rows);
  const double n = static_cast<double>(row.positions);
  row.ppl = std::exp(nll / n);
  row.ppl_ratio = row.ppl / row_.ppl;
  row.experts_kept =
      picks.tokens ? static_cast<double>(picks.picks) /
                         static_cast<double>(picks.tokens * engine.info().num_experts_per_token)
                   : 1.0;
  row.kl_mean = kl / n;
  row.top1 = static_cast<double>(top1) / n;
  double same = 0, first = 0;
  const std::vector<std::vector<int64_t>> decoded = greedy(engine, fixtures_.prompts);
  for (size_t p = 0; p < fixtures_.prompts.size(); ++p) {
    const std::vector<int64_t>& got = decoded[p];
    const std::vector<int64_t>& want = greedy_[p];
    int64_t equal = 0, diverge = kGreedyTokens;
    for (int64_t j = 0; j < kGreedyTokens; ++j) {
      const bool eq = got[static_cast<size_t>(j)] == want[static_cast<size_t>(j)];
      equal += eq;
      if (!eq && diverge == kGreedyTokens) diverge = j;
    }
    same += static_cast<double>(equal) / static_cast<double>(kGreedyTokens);
    first += static_cast<double>(diverge);
  }
  const double prompts = static_cast<double>(fixtures_.prompts.size());
  row.greedy = same / prompts;
  row.first_diverge = first / prompts;
  row.seconds = now_seconds() - t0;
  return row;
}

std::string summary(const Row& r) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%-18s ppl %.4f (x%.4f) | KL mean %.3g max %.3g | top-1 %.4f | greedy %.4f (first "
                "diff %.1f) | oracle KL mean %.3g max %.3g, top-1 %.4f | experts kept %.4f | %.1f "
                "s | ",
                r.setting.c_str(), r.ppl, r.ppl_ratio, r.kl_mean, r.kl_max, r.top1, r.greedy,
                r.first_diverge, r.oracle_kl_mean, r.oracle_kl_max, r.oracle_top1, r.experts_kept,
                r.seconds);
  return buf + r.describe;
}

Bound bound_from(const Row& row, size_t oracle_positions) {
  Bound b;
  b.ppl_max = row.ppl * 1.01;
  b.kl_mean_max = row.kl_mean * 1.25 + 1e-6;
  b.top1_min = std::max(0.0, row.top1 - 0.02);
  b.greedy_min = std::max(0.0, row.greedy - 0.10);
  b.oracle_kl_mean_max = row.oracle_kl_mean * 1.25 + 1e-9;
  b.oracle_top1_min = std::max(0.0, row.oracle_top1 - 2.0 / static_cast<double>(oracle_positions));
  return b;
}

Bounds read_bounds(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw Error(path + ": cannot open (write it with `k3_bench quality --write-bounds " + path +
                "`)");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(path + ": not a JSON object");
  Bounds bounds;
  for (const auto& [name, v] : j.items()) {
    Bound b;
    const char* keys[6] = {"ppl_max",    "kl_mean_max",        "top1_min",
                           "greedy_min", "oracle_kl_mean_max", "oracle_top1_min"};
    double* fields[6] = {&b.ppl_max,    &b.kl_mean_max,        &b.top1_min,
                         &b.greedy_min, &b.oracle_kl_mean_max, &b.oracle_top1_min};
    for (int k = 0; k < 6; ++k) {
      if (!v.is_object() || !v.contains(keys[k]) || !v[keys[k]].is_number())
        throw Error(path + ": \"" + name + "\" has no number \"" + keys[k] + "\"");
      *fields[k] = v[keys[k]].get<double>();
    }
    bounds[name] = b;
  }
  return bounds;
}

void write_bounds(const std::string& path, const std::vector<Row>& rows, size_t oracle_positions) {
  std::string outside;
  for (const Row& row : rows)
    for (const std::string& v : ceiling_violations(row)) outside += "\n  " + row.setting + ": " + v;
  if (!outside.empty())
    throw Error(path + ": not written, rows are outside their ceiling (settings() in " +
                "tools/quality_lib.cpp):" + outside);
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const Row& row : rows) {
    const Bound b = bound_from(row, oracle_positions);
    j[row.setting] = {{"ppl_max", b.ppl_max},
                      {"kl_mean_max", b.kl_mean_max},
                      {"top1_min", b.top1_min},
                      {"greedy_min", b.greedy_min},
                      {"oracle_kl_mean_max", b.oracle_kl_mean_max},
                      {"oracle_top1_min", b.oracle_top1_min}};
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) throw Error(tmp + ": cannot write");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error(path + ": cannot rename " + tmp);
}

namespace {

void add_line(std::vector<std::string>& out, const char* what, double v, const char* op,
              const char* key, double b) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %.6g %s %s %.6g", what, v, op, key, b);
  out.push_back(buf);
}

}  // namespace

std::vector<std::string> ceiling_violations(const Row& row) {
  const Setting s = setting(row.setting);
  const Ceiling& c = s.ceiling;
  std::vector<std::string> out;
  if (!(row.ppl_ratio <= c.ppl_ratio))
    add_line(out, "ppl / exact", row.ppl_ratio, ">", "ceiling", c.ppl_ratio);
  if (!(row.kl_mean <= c.kl_mean)) add_line(out, "kl_mean", row.kl_mean, ">", "ceiling", c.kl_mean);
  if (!(row.top1 >= c.top1)) add_line(out, "top1", row.top1, "<", "ceiling", c.top1);
  if (!(row.greedy >= c.greedy)) add_line(out, "greedy", row.greedy, "<", "ceiling", c.greedy);
  if (!(row.oracle_kl_mean <= c.oracle_kl_mean))
    add_line(out, "oracle_kl_mean", row.oracle_kl_mean, ">", "ceiling", c.oracle_kl_mean);
  if (!(row.oracle_top1 >= c.oracle_top1))
    add_line(out, "oracle_top1", row.oracle_top1, "<", "ceiling", c.oracle_top1);
  // K3_TOPP must drop routed picks (else the row measures the defaults again); without it every
  // pick is kept.
  char buf[160];
  if (s.top_p > 0 && !(row.experts_kept < 1)) {
    std::snprintf(buf, sizeof buf, "experts_kept %.6g: K3_TOPP=%g dropped no routed pick",
                  row.experts_kept, s.top_p);
    out.push_back(buf);
  }
  if (s.top_p <= 0 && row.experts_kept != 1) {
    std::snprintf(buf, sizeof buf, "experts_kept %.6g != 1 without K3_TOPP", row.experts_kept);
    out.push_back(buf);
  }
  return out;
}

std::vector<std::string> violations(const Row& row, const Bound& bound) {
  std::vector<std::string> out = ceiling_violations(row);
  if (!(row.ppl <= bound.ppl_max)) add_line(out, "ppl", row.ppl, ">", "ppl_max", bound.ppl_max);
  if (!(row.kl_mean <= bound.kl_mean_max))
    add_line(out, "kl_mean", row.kl_mean, ">", "kl_mean_max", bound.kl_mean_max);
  if (!(row.top1 >= bound.top1_min))
    add_line(out, "top1", row.top1, "<", "top1_min", bound.top1_min);
  if (!(row.greedy >= bound.greedy_min))
    add_line(out, "greedy", row.greedy, "<", "greedy_min", bound.greedy_min);
  if (!(row.oracle_kl_mean <= bound.oracle_kl_mean_max))
    add_line(out, "oracle_kl_mean", row.oracle_kl_mean, ">", "oracle_kl_mean_max",
             bound.oracle_kl_mean_max);
  if (!(row.oracle_top1 >= bound.oracle_top1_min))
    add_line(out, "oracle_top1", row.oracle_top1, "<", "oracle_top1_min", bound.oracle_top1_min);
  return out;
}

std::string markdown(const std::vector<Row>& rows, const Bounds& bounds) {
  std::ostringstream md;
  md << "| setting | environment | ppl | KL mean | KL max | top-1 | greedy 64 | first diff | KL vs "
        "oracle | top-1 vs oracle | experts kept |\n"
     << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  char buf[512];
  const auto fmt = [&](const char* f, double v) {
    std::snprintf(buf, sizeof buf, f, v);
    return std::string(buf);
  };
  for (const Row& r : rows) {
    const Ceiling c = setting(r.setting).ceiling;
    const auto it = bounds.find(r.setting);
    const bool b = it != bounds.end();
    // value (bound · ceiling), or value (ceiling) without a bounds row.
    const auto cell = [&](const std::string& value, const std::string& bound,
                          const std::string& ceiling) {
      return value + " (" + (b ? bound + " · " : "") + ceiling + ")";
    };
    const std::string ppl = cell(fmt("%.3f", r.ppl), b ? fmt("≤ %.3f", it->second.ppl_max) : "",
                                 fmt("≤ ×%.4g", c.ppl_ratio));
    const std::string kl =
        cell(fmt("%.3g", r.kl_mean), b ? fmt("≤ %.3g", it->second.kl_mean_max) : "",
             fmt("≤ %.3g", c.kl_mean));
    const std::string top1 =
        cell(fmt("%.1f%%", 100 * r.top1), b ? fmt("≥ %.1f%%", 100 * it->second.top1_min) : "",
             fmt("≥ %.0f%%", 100 * c.top1));
    const std::string greedy_text =
        cell(fmt("%.1f%%", 100 * r.greedy), b ? fmt("≥ %.1f%%", 100 * it->second.greedy_min) : "",
             fmt("≥ %.0f%%", 100 * c.greedy));
    const std::string okl =
        cell(fmt("%.3g", r.oracle_kl_mean), b ? fmt("≤ %.3g", it->second.oracle_kl_mean_max) : "",
             fmt("≤ %.3g", c.oracle_kl_mean));
    const std::string otop = cell(fmt("%.1f%%", 100 * r.oracle_top1),
                                  b ? fmt("≥ %.1f%%", 100 * it->second.oracle_top1_min) : "",
                                  fmt("≥ %.0f%%", 100 * c.oracle_top1));
    std::snprintf(
        buf, sizeof buf, "| %s | `%s` | %s | %s | %.3g | %s | %s | %.1f | %s | %s | %.1f%% |\n",
        r.setting.c_str(), r.env.c_str(), ppl.c_str(), kl.c_str(), r.kl_max, top1.c_str(),
        greedy_text.c_str(), r.first_diverge, okl.c_str(), otop.c_str(), 100 * r.experts_kept);
    md << buf;
  }
  return md.str();
}

}  // namespace k3::quality

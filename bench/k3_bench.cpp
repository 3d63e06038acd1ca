// bench/k3_bench.cpp — benchmarks (not tests; timings are never assertions).
//
//   k3_bench kernels [--isa auto|scalar|avx2|avx512] [--threads N] [--seconds S]
//       Machine facts, a DRAM read-bandwidth probe, then GB/s of weight bytes (and the ratio to
//       the probe) for the MXFP4 expert (idot and exact; 1/4/16/64 rows), int8 and int4-g64 on
//       12288x7168 / 7168x12288 (1 and 64 rows; both also on int8 activations, int8_idot and
//       int4_idot), and ggml's MXFP4 dot product as a peer when the npm package
//       @node-llama-cpp/linux-x64 is installed under bench/node_modules.
//   k3_bench decode [MODEL_DIR] [--layers N] [--experts E] [--tokens T] [--dir DIR]
//       Decode tokens/s with every expert in memory, with the per-stage breakdown, and prefill
//       tokens/s token at a time (K3_CHUNK=1) vs chunked (32) with the expert dedup factor. Without
//       MODEL_DIR a `k3_synth --preset slice` checkpoint is written once into DIR and reused.
//   k3_bench stream [MODEL_DIR] [--layers N] [--experts E] [--tokens T] [--dir DIR]
//       Decode with routed experts streamed from disk, against the drive's O_DIRECT rate, with and
//       without the pipe and the read-ahead (K3_PREFETCH) and its recall.
//   k3_bench serve [MODEL_DIR] [--tokens T] [--prompt P] [--concurrency 1,2,4,8]
//       The engine service with N sessions (coli serve --parallel): aggregate generated tok/s at
//       each number of concurrent streams (ratio to the first), routed-expert MB read per token
//       and the mean decode batch, then the time to first token of a new request while three
//       others decode against alone. Without MODEL_DIR the demo checkpoint (k3_synth --preset
//       demo, with the tokenizer) is written once beside the build.
//   k3_bench routing --model DIR --ids FILE [--window W] [--contrast DIR]
//       What the routers do on real text: held-out token ids (u32 little-endian, windows of W)
//       through the model, per MoE layer: expert reuse between neighbouring tokens, the prefill
//       dedup factor at C = 32, and the recall of the read-ahead (token at a time and C = 32);
//       then the same on the random-weights demo checkpoint (written once into --contrast), each
//       figure beside what random routing gives.
//   k3_bench quality [--model DIR] [--fixtures DIR] [--write-bounds FILE] [--isa I] [--threads N]
//       The real-text quality table of a trained checkpoint (default assets/k3-mini with
//       tests/data/k3-mini): held-out perplexity, KL and top-1 agreement against the exact
//       setting, greedy agreement over 64 tokens, KL and top-1 agreement against the training
//       model's float64 forward (oracle.safetensors), the routed picks kept, for every precision
//       setting (tools/quality_lib.h, docs/testing.md §5), as Markdown; --write-bounds writes the
//       gate's bounds file from it (refused when a row is outside its setting's ceiling).
//   k3_bench vulkan [MODEL_DIR] [--preset tiny|demo|slice] [--layers N] [--experts E]
//                   [--tokens T] [--prefill P] [--dir DIR]
//       The Vulkan expert tier (docs/vulkan.md) on the device COLI_VULKAN would open: upload GB/s
//       and expert-batch ms on the model's expert shape, then prefill tok/s (C = 32) and decode
//       s/token with K3_IDOT=0, without the tier, with it (every expert resident after a warm-up
//       run: the device share) and with prompt streaming (COLI_VK_PREFILL=on). Without MODEL_DIR a
//       `k3_synth --preset` checkpoint (default demo: seconds on lavapipe) is written once into
//       DIR. On a CPU device (Mesa's lavapipe) the figures say nothing about a GPU's speed.
//
// Every figure is also printed as one machine-readable line:
//   RESULT <name> <value> <unit> ratio=<r>
// ratio is GB/s / DRAM probe for bandwidth figures, the figure itself for "x" figures and nan
// where there is no reference (decode).
#include <fcntl.h>
#include <omp.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "engine/engine.h"
#include "engine/internal.h"
#include "engine/sampler.h"
#include "engine/service.h"
#include "experts/expert_cache.h"
#include "ggml_peer.h"
#include "grammar_bench.h"
#include "io/read_queue.h"
#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "kernels/mxfp4.h"
#include "kernels/quant.h"
#include "model/compute.h"
#include "model/vk_tier.h"
#include "options/options.h"
#include "options/tool_cli.h"
#include "quality_lib.h"
#include "repack_lib.h"
#include "synth_lib.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/sys.h"
#include "vk/mxfp4_device.h"

#ifndef K3_BENCH_SOURCE_DIR
#define K3_BENCH_SOURCE_DIR "bench"
#endif

namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// RESULT lines

struct Result {
  std::string name;
  double value;
  std::string unit;
  double ratio;
  double cpu;  // the lowest cpu share of the timings behind the figure (not printed in RESULT)
  bool vs_probe = false;  // ratio = value / the run's DRAM reference, filled in at the end
};

std::vector<Result> g_results;

void add_result(const std::string& name, double value, const std::string& unit, double ratio,
                double cpu = 1.0) {
  g_results.push_back({name, value, unit, ratio, cpu, false});
}

// A GB/s figure whose ratio to the DRAM reference is computed once every probe has run.
void add_bandwidth(const std::string& name, double gbs, double cpu) {
  g_results.push_back({name, gbs, "GB/s", std::nan(""), cpu, true});
}

void print_results() {
  std::printf("\n== machine-readable (RESULT <name> <value> <unit> ratio=<r>)\n");
  for (const Result& r : g_results) {
    if (std::isnan(r.ratio))
      std::printf("RESULT %s %.3f %s ratio=nan\n", r.name.c_str(), r.value, r.unit.c_str());
    else
      std::printf("RESULT %s %.3f %s ratio=%.3f\n", r.name.c_str(), r.value, r.unit.c_str(),
                  r.ratio);
  }
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// Machine facts

std::string trim(std::string s) {
  const size_t a = s.find_first_not_of(" \t\n");
  const size_t b = s.find_last_not_of(" \t\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return trim(line);
}

// "32768K" -> bytes.
uint64_t parse_cache_size(const std::string& s) {
  if (s.empty()) return 0;
  uint64_t v = std::strtoull(s.c_str(), nullptr, 10);
  const char unit = s.back();
  if (unit == 'K') v <<= 10;
  if (unit == 'M') v <<= 20;
  if (unit == 'G') v <<= 30;
  return v;
}

struct CacheFact {
  int level = 0;
  uint64_t bytes = 0;
  std::string shared_with;
};

// The highest-level data/unified cache of cpu0 from sysfs (bytes 0 when unreadable).
CacheFact last_level_cache() {
  CacheFact best;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
    if (!fs::exists(dir)) break;
    const std::string type = read_line(dir + "/type");
    if (type == "Instruction") continue;
    const int level = std::atoi(read_line(dir + "/level").c_str());
    if (level > best.level) {
      best.level = level;
      best.bytes = parse_cache_size(read_line(dir + "/size"));
      best.shared_with = read_line(dir + "/shared_cpu_list");
    }
  }
  return best;
}

uint64_t mem_total_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  while (f >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024;
    f.ignore(1 << 10, '\n');
  }
  return 0;
}

void print_machine(const k3::Isa isa) {
  const CacheFact llc = last_level_cache();
  std::string isas;
  for (k3::Isa i : k3::supported_isas())
    isas += std::string(isas.empty() ? "" : ",") + k3::isa_name(i);
  std::printf("== machine\n");
  std::printf("cpu:            %s\n", k3::cpu_model_name().c_str());
  std::printf("cores online:   %ld (hardware_concurrency %u)\n", sysconf(_SC_NPROCESSORS_ONLN),
              std::thread::hardware_concurrency());
  std::printf("memory:         %.1f GiB\n", static_cast<double>(mem_total_bytes()) / (1u << 30));
  std::printf("OpenMP threads: %d\n", omp_get_max_threads());
  std::printf("load average:   %s (contention shows per figure in the cpu column)\n",
              read_line("/proc/loadavg").c_str());
  std::printf("ISA used:       %s (supported: %s)\n", k3::isa_name(isa), isas.c_str());
  if (llc.bytes)
    std::printf("LLC:            L%d %.1f MiB (shared with cpus %s)\n", llc.level,
                static_cast<double>(llc.bytes) / (1 << 20), llc.shared_with.c_str());
  else
    std::printf("LLC:            unknown (sysfs unreadable)\n");
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// Deterministic random data (parallel, independent of the thread count)

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr size_t kChunk = size_t{1} << 16;

// Bytes uniform in [lo, hi].
void fill_bytes(uint8_t* p, size_t n, uint64_t seed, int lo, int hi) {
  const size_t chunks = (n + kChunk - 1) / kChunk;
  const uint64_t span = static_cast<uint64_t>(hi - lo + 1);
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    uint64_t s = seed * 0x100000001B3ull + c;
    const size_t end = std::min(n, (c + 1) * kChunk);
    for (size_t i = c * kChunk; i < end; ++i)
      p[i] = static_cast<uint8_t>(lo + static_cast<int>(splitmix(s) % span));
  }
}

// Floats uniform in [-1, 1).
void fill_floats(float* p, size_t n, uint64_t seed) {
  const size_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    uint64_t s = seed * 0x100000001B3ull + c;
    const size_t end = std::min(n, (c + 1) * kChunk);
    for (size_t i = c * kChunk; i < end; ++i)
      p[i] = static_cast<float>(static_cast<double>(splitmix(s) >> 11) * 0x1.0p-52 - 1.0);
  }
}

// ---------------------------------------------------------------------------------------------
// Timing: one untimed warm-up unit, then whole passes until `seconds` have gone by (and at
// least `min_passes`). Best = fastest pass (the figure reported), median for the spread.

struct Timing {
  double best = 0;
  double median = 0;
  int passes = 0;
  // Process CPU time / (wall time x OpenMP threads) over the timed passes: well below 1 means
  // the threads were not running (other processes on the cores), and the figure is low.
  double cpu_share = 0;
};

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

template <typename Warm, typename Pass>
Timing measure(double seconds, int min_passes, Warm&& warm, Pass&& pass) {
  warm();
  std::vector<double> t;
  const double start = k3::now_seconds();
  const double cpu0 = process_cpu_seconds();
  while (static_cast<int>(t.size()) < min_passes || k3::now_seconds() - start < seconds) {
    const double t0 = k3::now_seconds();
    pass();
    t.push_back(k3::now_seconds() - t0);
  }
  const double wall = k3::now_seconds() - start;
  const double cpu = process_cpu_seconds() - cpu0;
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2], static_cast<int>(t.size()),
          cpu / (wall * omp_get_max_threads())};
}

// ---------------------------------------------------------------------------------------------
// DRAM probe: threaded sum of a >= 1 GiB float array, best of `passes`.

// n: a multiple of 32; p: 16-byte aligned.
double sum_range(const float* p, size_t n) {
#if defined(__SSE2__)
  __m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (size_t i = 0; i < n; i += 32) {
    a0 = _mm_add_ps(a0, _mm_load_ps(p + i));
    a1 = _mm_add_ps(a1, _mm_load_ps(p + i + 4));
    a2 = _mm_add_ps(a2, _mm_load_ps(p + i + 8));
    a3 = _mm_add_ps(a3, _mm_load_ps(p + i + 12));
    a4 = _mm_add_ps(a4, _mm_load_ps(p + i + 16));
    a5 = _mm_add_ps(a5, _mm_load_ps(p + i + 20));
    a6 = _mm_add_ps(a6, _mm_load_ps(p + i + 24));
    a7 = _mm_add_ps(a7, _mm_load_ps(p + i + 28));
  }
  a0 = _mm_add_ps(_mm_add_ps(_mm_add_ps(a0, a1), _mm_add_ps(a2, a3)),
                  _mm_add_ps(_mm_add_ps(a4, a5), _mm_add_ps(a6, a7)));
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, a0);
  return static_cast<double>(lanes[0]) + lanes[1] + lanes[2] + lanes[3];
#else
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
#endif
}

// GB/s of the best pass; *cpu_share as in Timing.
double dram_probe(size_t bytes, int passes, double* cpu_share) {
  const size_t n = bytes / sizeof(float);
  const size_t block = 1 << 14;  // floats per scheduling block (64 KiB, 16-byte aligned)
  const size_t blocks = n / block;
  std::unique_ptr<float[]> a(new float[blocks * block]);
  float* p = a.get();
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < blocks; ++b)  // first touch by the thread that will read it
    for (size_t i = 0; i < block; ++i) p[b * block + i] = static_cast<float>((b + i) & 7);
  double best = 1e30, checksum = 0;
  const double wall0 = k3::now_seconds(), cpu0 = process_cpu_seconds();
  for (int pass = 0; pass < passes; ++pass) {
    double total = 0;
    const double t0 = k3::now_seconds();
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (size_t b = 0; b < blocks; ++b) total += sum_range(p + b * block, block);
    best = std::min(best, k3::now_seconds() - t0);
    checksum += total;
  }
  *cpu_share =
      (process_cpu_seconds() - cpu0) / ((k3::now_seconds() - wall0) * omp_get_max_threads());
  if (checksum == -1) std::printf("(checksum)\n");  // keeps the sums alive
  return static_cast<double>(blocks * block * sizeof(float)) / best / 1e9;
}

// ---------------------------------------------------------------------------------------------
// MXFP4 experts

constexpr size_t kInter = 3072;   // moe_intermediate_size
constexpr size_t kLatent = 3584;  // routed_expert_hidden_size

struct Mx {
  std::vector<uint8_t> packed, scales;
  size_t rows = 0, cols = 0;
  k3::Mxfp4Matrix view() const { return {packed.data(), scales.data(), rows, cols}; }
  size_t bytes() const { return packed.size() + scales.size(); }
};

Mx random_mx(size_t rows, size_t cols, uint64_t seed) {
  Mx m;
  m.rows = rows;
  m.cols = cols;
  m.packed.resize(rows * cols / 2);
  m.scales.resize(rows * cols / 32);
  fill_bytes(m.packed.data(), m.packed.size(), seed, 0, 255);
  fill_bytes(m.scales.data(), m.scales.size(), seed + 1, 120, 130);
  return m;
}

struct Expert {
  Mx gate, up, down;  // gate/up [3072][3584], down [3584][3072]
  size_t bytes() const { return gate.bytes() + up.bytes() + down.bytes(); }
};

// Activations and scratch for up to 64 rows.
struct ExpertScratch {
  static constexpr size_t kMaxRows = 64;
  std::vector<float> X, G, U, H, Y;
  std::vector<int8_t> qx, qh;
  std::vector<float> dx, dh;
  ExpertScratch()
      : X(kMaxRows * kLatent),
        G(kMaxRows * kInter),
        U(kMaxRows * kInter),
        H(kMaxRows * kInter),
        Y(kMaxRows * kLatent),
        qx(kMaxRows * kLatent),
        qh(kMaxRows * kInter),
        dx(kMaxRows * kLatent / 32),
        dh(kMaxRows * kInter / 32) {
    fill_floats(X.data(), X.size(), 777);
  }
};

// h = g * u (the SiLU is left out: it is not a weight kernel and would only add a constant).
void glue(ExpertScratch& s, size_t n) {
  for (size_t i = 0; i < n * kInter; ++i) s.H[i] = s.G[i] * s.U[i] * (1.0f / 1024.0f);
}

// The integer path as the engine runs it: quantise x, gate + up, quantise h, down.
void expert_idot(const k3::KernelTable& k, const Expert& e, ExpertScratch& s, size_t n) {
  k3::quantize_q8_32(k, s.X.data(), n, kLatent, s.qx.data(), s.dx.data());
  k3::matmul_mxfp4_idot(k, e.gate.view(), s.qx.data(), s.dx.data(), n, s.G.data());
  k3::matmul_mxfp4_idot(k, e.up.view(), s.qx.data(), s.dx.data(), n, s.U.data());
  glue(s, n);
  k3::quantize_q8_32(k, s.H.data(), n, kInter, s.qh.data(), s.dh.data());
  k3::matmul_mxfp4_idot(k, e.down.view(), s.qh.data(), s.dh.data(), n, s.Y.data());
}

void expert_exact(const k3::KernelTable& k, const Expert& e, ExpertScratch& s, size_t n) {
  k3::matmul_mxfp4_exact(k, e.gate.view(), s.X.data(), n, s.G.data());
  k3::matmul_mxfp4_exact(k, e.up.view(), s.X.data(), n, s.U.data());
  glue(s, n);
  k3::matmul_mxfp4_exact(k, e.down.view(), s.H.data(), n, s.Y.data());
}

// ggml's blocks of the same expert.
struct GgmlExpert {
  std::vector<uint8_t> gate, up, down;
};

// Row-parallel GEMV with ggml's vec_dot (one OpenMP region per matrix, like our wrappers).
void ggml_gemv(const k3bench::GgmlPeer& g, const std::vector<uint8_t>& W, size_t rows, size_t cols,
               const void* q8, float* y) {
  const size_t row_bytes = cols / 32 * k3bench::kGgmlMxfp4Block;
  const uint8_t* base = W.data();
#pragma omp parallel for schedule(static)
  for (size_t o = 0; o < rows; ++o)
    g.vec_dot_mxfp4_q8_0(static_cast<int>(cols), y + o, 0, base + o * row_bytes, 0, q8, 0, 1);
}

void expert_ggml(const k3bench::GgmlPeer& g, const GgmlExpert& e, ExpertScratch& s,
                 std::vector<uint8_t>& q8x, std::vector<uint8_t>& q8h) {
  g.quantize_row_q8_0(s.X.data(), q8x.data(), static_cast<int64_t>(kLatent));
  ggml_gemv(g, e.gate, kInter, kLatent, q8x.data(), s.G.data());
  ggml_gemv(g, e.up, kInter, kLatent, q8x.data(), s.U.data());
  glue(s, 1);
  g.quantize_row_q8_0(s.H.data(), q8h.data(), static_cast<int64_t>(kInter));
  ggml_gemv(g, e.down, kLatent, kInter, q8h.data(), s.Y.data());
}

// Relative L2 error of a against the reference b.
double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// ---------------------------------------------------------------------------------------------
// kernels

struct KernelsArgs {
  std::string isa = "auto";
  int threads = 0;
  double seconds = 1.5;
  int experts = 16;
  std::string ggml_dir = K3_BENCH_SOURCE_DIR "/node_modules/@node-llama-cpp/linux-x64/bins";
  bool no_ggml = false;
  std::vector<std::string> only;  // figure-name substrings; empty = everything
};

// True when a section whose figures are named `prefix`... is selected by --only.
bool selected(const KernelsArgs& a, const std::string& prefix) {
  if (a.only.empty()) return true;
  for (const std::string& o : a.only)
    if (prefix.find(o) != std::string::npos || o.find(prefix) != std::string::npos) return true;
  return false;
}

// The issue's targets, checked against the figures of this run (informative, never a failure).
void print_targets() {
  auto find = [](const std::string& name) -> const Result* {
    for (const Result& r : g_results)
      if (r.name == name) return &r;
    return nullptr;
  };
  std::printf("\n== targets (informative; timings are not test assertions)\n");
  auto check = [&](const std::string& name, bool use_ratio, double want, const char* what) {
    const Result* r = find(name);
    if (!r) return;
    const double v = use_ratio ? r->ratio : r->value;
    char note[64] = "";
    if (r->cpu < 0.9)
      std::snprintf(note, sizeof note, "  (contended: cpu %.0f%%, not meaningful)", 100.0 * r->cpu);
    std::printf("%-44s %-26s %7.2f  %s%s\n", name.c_str(), what, v, v >= want ? "met" : "MISSED",
                note);
  };
  if (const Result* p = find("dram_probe"); p && p->cpu < 0.9)
    std::printf("the DRAM reference probe ran contended (cpu %.0f%%): every ratio is suspect\n",
                100.0 * p->cpu);
  check("mxfp4_idot_rows1", true, 0.8, ">= 0.80 x DRAM probe");
  check("mxfp4_exact_rows1", true, 0.8, ">= 0.80 x DRAM probe");
  check("int4_12288x7168_rows1", true, 0.8, ">= 0.80 x DRAM probe");
  check("int4_7168x12288_rows1", true, 0.8, ">= 0.80 x DRAM probe");
  check("int4_idot_12288x7168_rows1", true, 0.8, ">= 0.80 x DRAM probe");
  check("int4_idot_7168x12288_rows1", true, 0.8, ">= 0.80 x DRAM probe");
  check("int8_idot_12288x7168_rows1", true, 0.8, ">= 0.80 x DRAM probe");
  check("int8_idot_7168x12288_rows1", true, 0.8, ">= 0.80 x DRAM probe");
  check("mxfp4_idot_rows1_vs_ggml", false, 2.0, ">= 2.00 x ggml");
  for (const Result& r : g_results)
    if (r.name.find("rows64_per_row_vs_rows1") != std::string::npos)
      check(r.name, false, 3.0, ">= 3.00 x rows1 per row");
}

k3::Isa resolve_isa(const std::string& name) {
  if (name == "auto") return k3::best_isa();
  k3::Isa isa;
  if (!k3::parse_isa(name, &isa)) throw k3::Error("--isa: unknown variant '" + name + "'");
  if (!k3::isa_supported(isa))
    throw k3::Error(std::string("--isa ") + name + ": this CPU cannot run it");
  return isa;
}

void print_row(const std::string& name, size_t rows, double bytes, const Timing& t,
               double per_row_vs_1) {
  const double gbs = bytes / t.best / 1e9;
  const double gbs_med = bytes / t.median / 1e9;
  char extra[32] = "";
  if (per_row_vs_1 > 0) std::snprintf(extra, sizeof extra, "%.2fx", per_row_vs_1);
  std::printf("%-26s %4zu %8.1f %9.3f %9.3f %7.2f %7.2f %6d %4.0f%% %8s\n", name.c_str(), rows,
              bytes / 1e6, t.best * 1e3, t.median * 1e3, gbs, gbs_med, t.passes,
              100.0 * t.cpu_share, extra);
  std::fflush(stdout);
}

void print_header(const char* title) {
  std::printf("\n== %s\n", title);
  std::printf("%-26s %4s %8s %9s %9s %7s %7s %6s %5s %8s\n", "figure", "rows", "MB/pass", "best ms",
              "med ms", "GB/s", "med", "passes", "cpu", "per-row");
}

int run_kernels(const KernelsArgs& a) {
  const double t_start = k3::now_seconds();
  if (a.threads > 0) omp_set_num_threads(a.threads);
  const k3::Isa isa = resolve_isa(a.isa);
  const k3::KernelTable& k = k3::kernel_table(isa);
  print_machine(isa);
  const int threads = omp_get_max_threads();
  const CacheFact llc = last_level_cache();
  const uint64_t llc_bytes = llc.bytes ? llc.bytes : (uint64_t{32} << 20);

  // DRAM probes: at the start, after the MXFP4 figures and at the end. The host's memory
  // bandwidth moves with its other tenants (32 to 53 GB/s seen here with our cores idle), so the
  // ratios use the highest probe of the run as the reference, conservatively.
  const size_t probe_bytes = size_t{1} << 30;
  struct Probe {
    const char* name;
    double gbs, cpu;
  };
  std::vector<Probe> probes;
  auto run_probe = [&](const char* name) {
    double cpu = 0;
    const double gbs = dram_probe(probe_bytes, 5, &cpu);
    probes.push_back({name, gbs, cpu});
    std::printf(
        "\n== DRAM read probe (%s): sum of a %.2f GiB float array, %d threads, best of 5 passes: "
        "%.2f GB/s (cpu %.0f%%)\n",
        name, static_cast<double>(probe_bytes) / (1u << 30), threads, gbs, 100.0 * cpu);
    std::fflush(stdout);
  };
  run_probe("start");
  std::printf(
      "(figures below: one pass = every distinct matrix/expert once; passes repeated for >= %.1f "
      "s, GB/s from the best pass, med = median pass; GB/s = weight bytes (incl. scales) read "
      "per second; per-row = rows x GB/s / rows-1 GB/s, the throughput per activation row vs one "
      "row; cpu = process CPU time / (wall x threads): well under 100%% means other processes "
      "took the cores. Ratios to the DRAM reference come at the end.)\n",
      a.seconds);

  // MXFP4 experts (and the ggml peer on the same weights).
  if (selected(a, "mxfp4_idot") || selected(a, "mxfp4_exact") || selected(a, "ggml_mxfp4")) {
    // MXFP4 experts.
    const int E = std::max(1, a.experts);
    std::vector<Expert> experts(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      const uint64_t seed = 1000 + 10 * static_cast<uint64_t>(e);
      experts[e].gate = random_mx(kInter, kLatent, seed);
      experts[e].up = random_mx(kInter, kLatent, seed + 3);
      experts[e].down = random_mx(kLatent, kInter, seed + 6);
    }
    const double expert_bytes = static_cast<double>(experts[0].bytes());
    const double pass_bytes = expert_bytes * E;
    ExpertScratch scratch;
    std::printf(
        "\n== MXFP4 expert: gate+up %zux%zu, down %zux%zu, %.2f MB per expert, %d experts "
        "rotated (%.0f MB working set, LLC %.0f MiB)\n",
        kInter, kLatent, kLatent, kInter, expert_bytes / 1e6, E, pass_bytes / 1e6,
        static_cast<double>(llc_bytes) / (1 << 20));
    if (pass_bytes < 2.0 * static_cast<double>(llc_bytes))
      std::printf("warning: the working set is not much larger than the LLC\n");

    const size_t row_counts[] = {1, 4, 16, 64};
    double mx_idot_rows1 = 0, mx_idot_cpu = 1;
    for (const bool idot : {true, false}) {
      const std::string path = idot ? "mxfp4_idot" : "mxfp4_exact";
      if (!selected(a, path)) continue;
      print_header(
          ("MXFP4 expert, " + std::string(idot ? "idot (default path)" : "exact float path"))
              .c_str());
      double gbs1 = 0, cpu1 = 1;
      for (const size_t n : row_counts) {
        auto call = [&](const Expert& e) {
          if (idot)
            expert_idot(k, e, scratch, n);
          else
            expert_exact(k, e, scratch, n);
        };
        const Timing t = measure(
            a.seconds, 3, [&] { call(experts[0]); },
            [&] {
              for (const Expert& e : experts) call(e);
            });
        const double gbs = pass_bytes / t.best / 1e9;
        const std::string name = path + "_rows" + std::to_string(n);
        double per_row = 0;
        if (n == 1) {
          gbs1 = gbs;
          if (idot) {
            mx_idot_rows1 = gbs;
            mx_idot_cpu = t.cpu_share;
          }
        } else {
          per_row = gbs * static_cast<double>(n) / gbs1;
        }
        print_row(name, n, pass_bytes, t, per_row);
        if (n == 1) cpu1 = t.cpu_share;
        add_bandwidth(name, gbs, t.cpu_share);
        if (n > 1)
          add_result(name + "_per_row_vs_rows1", per_row, "x", per_row,
                     std::min(cpu1, t.cpu_share));
      }
    }

    // ggml peer on the same experts.
    if (selected(a, "ggml_mxfp4") && mx_idot_rows1 == 0 && !a.only.empty())
      std::printf("\n(add mxfp4_idot to --only for the ours/ggml ratio)\n");
    std::printf("\n== ggml peer (MXFP4 x Q8_0 vec_dot, row-parallel over %d OpenMP threads)\n",
                threads);
    if (a.no_ggml || !selected(a, "ggml_mxfp4")) {
      std::printf("ggml peer: skipped\n");
    } else {
      k3bench::GgmlPeer g(a.ggml_dir);
      if (!g.ok()) {
        std::printf("ggml peer unavailable: %s\n", g.why().c_str());
      } else {
        std::printf("library: %s/%s\n", g.dir().c_str(), g.variant().c_str());
        // The exponent convention: ggml doubles the E2M1 table and halves the scale; find the byte
        // offset that makes ggml's dequantisation equal ours, then check it on a few rows.
        const Mx& g0 = experts[0].gate;
        int offset = 0;
        bool values_ok = true;
        const size_t check_rows = 4;
        if (g.dequantize_row_mxfp4) {
          for (int attempt = 0; attempt < 2; ++attempt) {
            std::vector<uint8_t> blocks = k3bench::repack_mxfp4_for_ggml(
                g0.packed.data(), g0.scales.data(), check_rows, g0.cols, offset);
            std::vector<float> deq(check_rows * g0.cols);
            g.dequantize_row_mxfp4(blocks.data(), deq.data(), static_cast<int64_t>(deq.size()));
            size_t mismatches = 0;
            double ratio = 0;
            for (size_t o = 0; o < check_rows; ++o)
              for (size_t i = 0; i < g0.cols; ++i) {
                const float ours =
                    k3::mxfp4_weight(g0.packed.data(), g0.scales.data(), g0.cols, o, i);
                const float theirs = deq[o * g0.cols + i];
                if (ours != theirs) {
                  if (mismatches == 0 && ours != 0) ratio = theirs / ours;
                  ++mismatches;
                }
              }
            std::printf(
                "dequantize_row_mxfp4 vs k3::mxfp4_weight (%zu rows, exponent offset %+d): %zu "
                "mismatches%s\n",
                check_rows, offset, mismatches,
                mismatches ? (", ggml/ours = " + std::to_string(ratio)).c_str() : "");
            values_ok = mismatches == 0;
            if (values_ok) break;
            if (ratio == 0.5)
              offset += 1;
            else if (ratio == 2.0)
              offset -= 1;
            else
              break;
          }
        } else {
          std::printf("dequantize_row_mxfp4 not exported: exponent convention not checked\n");
        }
        if (!values_ok) {
          std::printf("ggml peer unusable: its dequantised weights do not match ours\n");
        } else {
          std::vector<GgmlExpert> gx(experts.size());
          for (size_t e = 0; e < experts.size(); ++e) {
            const Expert& x = experts[e];
            gx[e].gate = k3bench::repack_mxfp4_for_ggml(x.gate.packed.data(), x.gate.scales.data(),
                                                        kInter, kLatent, offset);
            gx[e].up = k3bench::repack_mxfp4_for_ggml(x.up.packed.data(), x.up.scales.data(),
                                                      kInter, kLatent, offset);
            gx[e].down = k3bench::repack_mxfp4_for_ggml(x.down.packed.data(), x.down.scales.data(),
                                                        kLatent, kInter, offset);
          }
          std::vector<uint8_t> q8x(kLatent / 32 * k3bench::kGgmlQ8Block),
              q8h(kInter / 32 * k3bench::kGgmlQ8Block);
          // Numerics: gate of expert 0 on row 0, ggml vs our exact float path (the reference) and
          // our idot path.
          std::vector<float> ref(kInter), ours_idot(kInter), theirs(kInter);
          k3::matmul_mxfp4_exact(k, experts[0].gate.view(), scratch.X.data(), 1, ref.data());
          k3::quantize_q8_32(k, scratch.X.data(), 1, kLatent, scratch.qx.data(), scratch.dx.data());
          k3::matmul_mxfp4_idot(k, experts[0].gate.view(), scratch.qx.data(), scratch.dx.data(), 1,
                                ours_idot.data());
          g.quantize_row_q8_0(scratch.X.data(), q8x.data(), static_cast<int64_t>(kLatent));
          ggml_gemv(g, gx[0].gate, kInter, kLatent, q8x.data(), theirs.data());
          const double err_ggml = rel_l2(theirs.data(), ref.data(), kInter);
          const double err_idot = rel_l2(ours_idot.data(), ref.data(), kInter);
          const double err_pair = rel_l2(theirs.data(), ours_idot.data(), kInter);
          std::printf(
              "gate[0] x row 0, relative L2 error vs our exact path: ggml %.2e, our idot %.2e; "
              "ggml vs our idot %.2e\n",
              err_ggml, err_idot, err_pair);
          if (!(err_ggml < 2e-2)) {
            std::printf("ggml peer unusable: its output does not match ours (rel err %.3g)\n",
                        err_ggml);
          } else {
            print_header("ggml MXFP4 expert (same weights, repacked), 1 row");
            const Timing t = measure(
                a.seconds, 3, [&] { expert_ggml(g, gx[0], scratch, q8x, q8h); },
                [&] {
                  for (const GgmlExpert& e : gx) expert_ggml(g, e, scratch, q8x, q8h);
                });
            const double gbs = pass_bytes / t.best / 1e9;
            print_row("ggml_mxfp4_rows1", 1, pass_bytes, t, 0);
            add_bandwidth("ggml_mxfp4_rows1", gbs, t.cpu_share);
            if (mx_idot_rows1 > 0) {
              const double vs = mx_idot_rows1 / gbs;
              std::printf("ours (idot, rows 1) / ggml: %.2fx\n", vs);
              add_result("mxfp4_idot_rows1_vs_ggml", vs, "x", vs,
                         std::min(mx_idot_cpu, t.cpu_share));
            }
          }
        }
      }
    }
    experts.clear();
    experts.shrink_to_fit();
    run_probe("middle");
  }

  // Dense int8 / int4 matrices.
  struct Shape {
    int64_t rows, cols;
  };
  const Shape shapes[] = {{12288, 7168}, {7168, 12288}};
  for (const int bits : {8, 4}) {
    for (const Shape& sh : shapes) {
      const std::string dims = std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
      const bool sel_plain = selected(a, (bits == 8 ? "int8_" : "int4_") + dims);
      const std::string idot_fmt = bits == 8 ? "int8_idot" : "int4_idot";
      const bool sel_idot = selected(a, idot_fmt + "_" + dims);
      if (!sel_plain && !sel_idot) continue;
      const double one =
          bits == 8 ? static_cast<double>(sh.rows * sh.cols + sh.rows * 4)
                    : static_cast<double>(sh.rows * sh.cols / 2 + sh.rows * sh.cols / 64 * 4);
      const int count =
          std::clamp(static_cast<int>(std::ceil(4.0 * static_cast<double>(llc_bytes) / one)), 2, 8);
      std::vector<k3::WeightMatrix> mats(static_cast<size_t>(count));
      double bytes = 0;
      for (int m = 0; m < count; ++m) {
        k3::WeightMatrix& W = mats[m];
        W.rows = sh.rows;
        W.cols = sh.cols;
        W.f32.resize(static_cast<size_t>(sh.rows * sh.cols));
        fill_floats(W.f32.data(), W.f32.size(), 5000 + static_cast<uint64_t>(bits * 100 + m));
        k3::quantize_matrix(W, bits, k3::kernel_table(k3::best_isa()));
        bytes += static_cast<double>(W.bytes());
      }
      const std::string fmt = bits == 8 ? "int8" : "int4";
      const std::string base = fmt + "_" + dims;
      char title[200];
      std::vector<float> X(static_cast<size_t>(64 * sh.cols)), Y(static_cast<size_t>(64 * sh.rows));
      fill_floats(X.data(), X.size(), 4242);
      // One figure of a 1-row / 64-row series (1 row first): GB/s, and for 64 rows the per-row
      // ratio to the series' 1-row figure.
      double gbs1 = 0, cpu1 = 1;
      auto report = [&](const std::string& name_base, size_t n, const Timing& t) {
        const double gbs = bytes / t.best / 1e9;
        const std::string name = name_base + "_rows" + std::to_string(n);
        double per_row = 0;
        if (n == 1)
          gbs1 = gbs;
        else
          per_row = gbs * static_cast<double>(n) / gbs1;
        print_row(name, n, bytes, t, per_row);
        if (n == 1) cpu1 = t.cpu_share;
        add_bandwidth(name, gbs, t.cpu_share);
        if (n > 1)
          add_result(name + "_per_row_vs_rows1", per_row, "x", per_row,
                     std::min(cpu1, t.cpu_share));
      };
      if (sel_plain) {
        std::snprintf(title, sizeof title,
                      "%s %lldx%lld (%s), %d distinct matrices rotated (%.0f MB working set)",
                      bits == 8 ? "int8 per row" : "int4 g64", static_cast<long long>(sh.rows),
                      static_cast<long long>(sh.cols), k3::weight_format_name(mats[0].format),
                      count, bytes / 1e6);
        print_header(title);
        for (const size_t n : {size_t{1}, size_t{64}}) {
          const Timing t = measure(
              a.seconds, 3, [&] { k3::matmul(k, mats[0], X.data(), n, Y.data()); },
              [&] {
                for (const k3::WeightMatrix& W : mats) k3::matmul(k, W, X.data(), n, Y.data());
              });
          report(base, n, t);
        }
      }
      if (sel_idot) {
        // The integer path on the same matrices. One pass = quantize_q8_32 of the n activation
        // rows once (as a caller shares it between the matrices applied to one input), then
        // every matrix; the quantisation alone is timed and shown beside it.
        const size_t cols = static_cast<size_t>(sh.cols);
        std::vector<int8_t> Q8(64 * cols);
        std::vector<float> D(64 * cols / 32);
        std::snprintf(
            title, sizeof title,
            "%s %lldx%lld on int8 activations (idot; quantize_q8_32 of the rows "
            "once per pass, included), %d distinct matrices rotated (%.0f MB working set)",
            bits == 8 ? "int8 per row" : "int4 g64", static_cast<long long>(sh.rows),
            static_cast<long long>(sh.cols), count, bytes / 1e6);
        print_header(title);
        const std::string idot_base = idot_fmt + "_" + dims;
        auto idot = [&](const k3::WeightMatrix& W, size_t n) {
          if (bits == 8)
            k3::matmul_int8_idot(k, W, Q8.data(), D.data(), n, Y.data());
          else
            k3::matmul_int4_idot(k, W, Q8.data(), D.data(), n, Y.data());
        };
        for (const size_t n : {size_t{1}, size_t{64}}) {
          const Timing t = measure(
              a.seconds, 3,
              [&] {
                k3::quantize_q8_32(k, X.data(), n, cols, Q8.data(), D.data());
                idot(mats[0], n);
              },
              [&] {
                k3::quantize_q8_32(k, X.data(), n, cols, Q8.data(), D.data());
                for (const k3::WeightMatrix& W : mats) idot(W, n);
              });
          report(idot_base, n, t);
          const Timing q = measure(
              0.2, 3, [&] { k3::quantize_q8_32(k, X.data(), n, cols, Q8.data(), D.data()); },
              [&] { k3::quantize_q8_32(k, X.data(), n, cols, Q8.data(), D.data()); });
          std::printf("  (quantize_q8_32 of %zu rows: %.3f ms, %.2f%% of the best pass)\n", n,
                      q.best * 1e3, 100.0 * q.best / t.best);
        }
      }
    }
  }

  run_probe("end");

  // The reference: the highest probe of the run.
  double ref = 0, lowest = 1e30, ref_cpu = 1;
  for (const Probe& p : probes) {
    if (p.gbs > ref) ref = p.gbs, ref_cpu = p.cpu;
    lowest = std::min(lowest, p.gbs);
  }
  std::printf("\n== DRAM reference = the highest probe: %.2f GB/s (probes:", ref);
  for (const Probe& p : probes) std::printf(" %s %.2f", p.name, p.gbs);
  std::printf(")\n");
  if (lowest < 0.85 * ref)
    std::printf(
        "the probes differ by %.0f%%: the memory bandwidth changed during the run (other "
        "processes or tenants); compare runs with care\n",
        100.0 * (1.0 - lowest / ref));
  g_results.insert(g_results.begin(), {"dram_probe", ref, "GB/s", 1.0, ref_cpu, false});
  for (const Probe& p : probes)
    add_result(std::string("dram_probe_") + p.name, p.gbs, "GB/s", p.gbs / ref, p.cpu);
  std::printf("%-32s %8s %6s %5s\n", "figure", "GB/s", "xDRAM", "cpu");
  for (Result& r : g_results) {
    if (!r.vs_probe) continue;
    r.ratio = r.value / ref;
    std::printf("%-32s %8.2f %6.2f %4.0f%%\n", r.name.c_str(), r.value, r.ratio, 100.0 * r.cpu);
  }

  print_targets();
  print_results();
  std::printf("kernels: done in %.1f s (peak RSS %.2f GB)\n", k3::now_seconds() - t_start,
              static_cast<double>(k3::peak_rss_bytes()) / 1e9);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// decode

struct DecodeArgs {
  std::string model_dir;  // an existing checkpoint; empty = the cached slice
  int64_t layers = 2;
  int64_t experts = 16;
  int64_t tokens = 8;
  int64_t prefill = 4;
  std::string dir;  // cache of the slice checkpoint
  std::string isa = "auto";
  int threads = 0;
};

// <build>/bench-slice for a binary at <build>/bench/k3_bench.
std::string default_slice_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "build/bench-slice";
  return (exe.parent_path().parent_path() / "bench-slice").string();
}

// Writes a `k3_synth --preset` checkpoint into `dir` unless an identical one is already there
// (its stamp file names the preset, the dimensions and the seed).
void ensure_preset(const std::string& dir, const std::string& preset, int64_t layers,
                   int64_t experts) {
  k3::synth::SynthSpec spec = k3::synth::preset_spec(preset);
  k3::synth::apply_overrides(&spec, layers, experts);
  spec.seed = 1;
  k3::synth::validate(spec);
  std::ostringstream want;
  want << "preset=" << preset << " layers=" << spec.num_hidden_layers
       << " experts=" << spec.num_experts << " seed=" << spec.seed;
  const fs::path stamp = fs::path(dir) / "k3_bench-spec.txt";
  if (fs::exists(fs::path(dir) / "config.json") && read_line(stamp.string()) == want.str()) {
    std::printf("checkpoint: reusing %s (%s)\n", dir.c_str(), want.str().c_str());
    return;
  }
  std::error_code ec;
  if (fs::exists(dir) && !fs::is_empty(dir, ec)) {
    if (!fs::exists(stamp))
      throw k3::Error("--dir " + dir +
                      " is not empty and was not written by k3_bench; pass an existing "
                      "checkpoint as MODEL_DIR instead");
    fs::remove_all(dir);  // our own cache with other dimensions
  }
  fs::create_directories(dir);
  const uint64_t need = k3::synth::total_tensor_bytes(spec);
  const fs::space_info space = fs::space(dir);
  std::printf("checkpoint: writing %s (%s, %.2f GB; %.1f GB free) ...\n", dir.c_str(),
              want.str().c_str(), static_cast<double>(need) / 1e9,
              static_cast<double>(space.available) / 1e9);
  std::fflush(stdout);
  if (space.available < need + (uint64_t{1} << 30))
    throw k3::Error("not enough disk space in " + dir + " for the " + preset + " checkpoint");
  spec.progress = false;
  const double t0 = k3::now_seconds();
  k3::synth::write_checkpoint(spec, dir);
  std::ofstream(stamp) << want.str() << "\n";
  std::printf("checkpoint: written in %.1f s\n", k3::now_seconds() - t0);
}

void ensure_slice(const std::string& dir, int64_t layers, int64_t experts) {
  ensure_preset(dir, "slice", layers, experts);
}

int run_decode(const DecodeArgs& a) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  const k3::Isa isa = resolve_isa(a.isa);
  print_machine(isa);
  std::string dir = a.model_dir;
  std::string name;
  if (dir.empty()) {
    dir = a.dir.empty() ? default_slice_dir() : a.dir;
    std::printf("\n== decode on a slice checkpoint (%lld layers, %lld experts)\n",
                static_cast<long long>(a.layers), static_cast<long long>(a.experts));
    ensure_slice(dir, a.layers, a.experts);
    name = "decode_slice_L" + std::to_string(a.layers) + "_E" + std::to_string(a.experts);
  } else {
    std::printf("\n== decode on %s\n", dir.c_str());
    name = "decode_model";
  }
  k3::LoadOptions load;
  load.isa = a.isa;
  load.experts_in_memory = true;
  k3::Engine engine(dir, load);
  std::printf("engine: %s, loaded in %.2f s (experts in memory)\n", engine.describe().c_str(),
              engine.load_seconds());
  const k3::K3Config& c = k3::internal::config(engine);
  std::printf("model: D %lld, %lld layers, vocab %lld\n", static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.vocab_size));

  const int64_t P = std::max<int64_t>(1, a.prefill);
  k3::Session session(engine, P + a.tokens + 2);
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < P; ++i) prompt.push_back(1 + (i * 7919) % (c.vocab_size - 1));
  // Prefill token at a time (C = 1) against chunked (C = 32): speed and routed-expert reads per
  // token (the chunk's dedup factor). Same logits by construction (chunked_prefill_test).
  double reads_per_token[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const int64_t chunk = k == 0 ? 1 : 32;
    k3::Session s(engine, P + 2);
    s.set_prefill_chunk(chunk);
    const double p0 = k3::now_seconds();
    s.prefill(prompt);
    const double ps = k3::now_seconds() - p0;
    reads_per_token[k] = static_cast<double>(s.stats().expert_reads) / static_cast<double>(P);
    std::printf("prefill C=%-2lld: %lld tokens in %.3f s = %.2f tok/s, %.1f expert reads/token\n",
                static_cast<long long>(chunk), static_cast<long long>(P), ps,
                static_cast<double>(P) / ps, reads_per_token[k]);
    add_result(name + "_prefill_C" + std::to_string(chunk), static_cast<double>(P) / ps, "tok/s",
               std::nan(""));
  }
  if (reads_per_token[1] > 0)
    add_result(name + "_prefill_dedup_C32", reads_per_token[0] / reads_per_token[1], "x",
               reads_per_token[0] / reads_per_token[1]);
  double t0 = k3::now_seconds();
  std::vector<float> logits = session.prefill(prompt);
  const double prefill_s = k3::now_seconds() - t0;
  const k3::StageStats before = k3::internal::stage_stats(session);

  std::vector<double> steps;
  const double cpu0 = process_cpu_seconds();
  t0 = k3::now_seconds();
  for (int64_t i = 0; i < a.tokens; ++i) {
    const double s0 = k3::now_seconds();
    logits = session.step(k3::argmax(logits));
    steps.push_back(k3::now_seconds() - s0);
  }
  const double dt = k3::now_seconds() - t0;
  const double cpu_share = (process_cpu_seconds() - cpu0) / (dt * omp_get_max_threads());
  k3::StageStats decode_stats = k3::internal::stage_stats(session);
  for (int i = 0; i < static_cast<int>(k3::Stage::kCount); ++i)
    decode_stats.seconds[i] -= before.seconds[i];
  std::sort(steps.begin(), steps.end());
  const double tps = static_cast<double>(a.tokens) / dt;
  std::printf("prefill: %lld tokens in %.3f s\n", static_cast<long long>(P), prefill_s);
  std::printf(
      "decode:  %lld tokens in %.3f s = %.2f tok/s (step best %.1f ms, median %.1f ms, cpu "
      "%.0f%%)\n",
      static_cast<long long>(a.tokens), dt, tps, steps.empty() ? 0.0 : steps.front() * 1e3,
      steps.empty() ? 0.0 : steps[steps.size() / 2] * 1e3, 100.0 * cpu_share);
  std::printf("decode stages: %s\n", decode_stats.summary().c_str());
  std::printf("peak RSS: %.2f GB\n", static_cast<double>(k3::peak_rss_bytes()) / 1e9);
  add_result(name, tps, "tok/s", std::nan(""));
  // The check that nothing is sized for small models only (the slice has the released per-layer
  // dimensions; it moved here from tests/ because it writes ~9 GB): the last step's logits are
  // finite and equal the one-shot prefill of every id fed.
  int status = 0;
  if (a.tokens > 0) {
    const std::vector<int64_t> fed = session.tokens();
    k3::Session oneshot(engine, static_cast<int64_t>(fed.size()) + 1);
    const std::vector<float> want = oneshot.prefill(fed);
    double diff2 = 0, ref2 = 0;
    bool finite = logits.size() == want.size();
    for (size_t i = 0; finite && i < want.size(); ++i) {
      finite = std::isfinite(logits[i]);
      diff2 +=
          (static_cast<double>(logits[i]) - want[i]) * (static_cast<double>(logits[i]) - want[i]);
      ref2 += static_cast<double>(want[i]) * want[i];
    }
    const double rel = std::sqrt(diff2) / std::max(std::sqrt(ref2), 1e-30);
    status = finite && rel <= 1e-5 ? 0 : 1;
    std::printf(
        "check: the last decode step vs a one-shot prefill of the %zu ids: rel-L2 %.3g%s -> %s\n",
        fed.size(), rel, finite ? "" : " (non-finite logits)", status == 0 ? "ok" : "FAILED");
  }
  print_results();
  return status;
}

// ---------------------------------------------------------------------------------------------
// vulkan: the expert tier on the device COLI_VULKAN would open

struct VulkanArgs {
  std::string model_dir;  // an existing checkpoint; empty = a k3_synth preset
  std::string preset = "demo";
  int64_t layers = -1, experts = -1;  // preset overrides (-1: the preset's)
  int64_t tokens = 8;
  int64_t prefill = 64;
  std::string dir;  // cache of the preset checkpoint
  int threads = 0;
};

int run_vulkan(const VulkanArgs& a) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  print_machine(resolve_isa("auto"));
  std::string dir = a.model_dir;
  if (dir.empty()) {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    dir = !a.dir.empty() ? a.dir
          : ec           ? "build/bench-vulkan-" + a.preset
               : (exe.parent_path().parent_path() / ("bench-vulkan-" + a.preset)).string();
    ensure_preset(dir, a.preset, a.layers, a.experts);
  }
  // The device alone, on the model's expert shape.
  k3::LoadOptions exact = k3::LoadOptions::exact();  // K3_IDOT=0: the tier's numerics
  const std::string state = dir + "/.k3_bench-state";
  fs::create_directories(state);
  exact.cache.state_dir = state;
  k3::K3Config c;
  {
    const k3::Engine probe(dir, exact);
    c = k3::internal::config(probe);
  }
  const uint32_t R = static_cast<uint32_t>(c.routed_expert_hidden_size),
                 I = static_cast<uint32_t>(c.moe_intermediate_size);
  auto dev = k3::vk::Mxfp4Device::open({}, {R, I, static_cast<float>(c.activation_situ_beta),
                                            static_cast<float>(c.activation_situ_linear_beta)});
  std::printf("\n== vulkan: %s (%s, %s uploads), expert %u x %u\n", dev->name().c_str(),
              dev->is_cpu() ? "a CPU device" : "a GPU", dev->staged() ? "staged" : "mapped", R, I);
  if (dev->is_cpu())
    std::printf(
        "NOTE: %s is a CPU implementation of Vulkan (lavapipe): these figures are NOT GPU "
        "speed; they only show that the tier runs.\n",
        dev->name().c_str());
  const size_t mat = size_t{I} * R / 2, groups = size_t{I} * R / 32;
  std::vector<uint8_t> bytes(3 * mat + 3 * groups);
  fill_bytes(bytes.data(), 3 * mat, 1, 0, 255);
  fill_bytes(bytes.data() + 3 * mat, 3 * groups, 2, 120, 131);
  const uint8_t* p = bytes.data();
  const k3::vk::ExpertBytes e{
      p, p + 3 * mat, p + mat, p + 3 * mat + groups, p + 2 * mat, p + 3 * mat + 2 * groups};
  const int n_up = 16;
  std::vector<int32_t> slots;
  double t0 = k3::now_seconds();
  for (int i = 0; i < n_up; ++i) slots.push_back(dev->upload(e));
  const double up_s = k3::now_seconds() - t0;
  const double up_gbs = static_cast<double>(n_up) * static_cast<double>(bytes.size()) / up_s / 1e9;
  std::printf("upload: %d experts in %.3f s = %.2f GB/s (of the RAM form)\n", n_up, up_s, up_gbs);
  add_result("vulkan_upload", up_gbs, "GB/s", std::nan(""));
  for (const uint32_t rows : {1u, 32u}) {
    std::vector<k3::vk::Mxfp4Device::Group> batch;
    for (int32_t s : slots) batch.push_back({s, rows});
    const size_t P = slots.size() * rows;
    std::vector<float> z(P * R), out(P * R);
    fill_floats(z.data(), z.size(), 3);
    double best = 1e30;
    for (int pass = 0; pass < 3; ++pass) {
      t0 = k3::now_seconds();
      dev->issue(batch, z.data());
      if (!dev->join(out.data())) throw k3::Error("the Vulkan device was lost");
      best = std::min(best, k3::now_seconds() - t0);
    }
    std::printf("expert batch: %zu experts x %u rows in %.3f ms (best of 3)\n", slots.size(), rows,
                best * 1e3);
    add_result("vulkan_batch_" + std::to_string(slots.size()) + "x" + std::to_string(rows),
               best * 1e3, "ms", std::nan(""));
  }
  dev.reset();

  // The engine without the tier, with it, and with prompt streaming.
  const int64_t P = std::max<int64_t>(1, a.prefill);
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < P; ++i) prompt.push_back(1 + (i * 7919) % (c.vocab_size - 1));
  struct Config {
    const char* name;
    bool tier;
    const char* prefill;
  };
  std::vector<int64_t> cpu_tokens;
  int status = 0;
  for (const Config& cfg : {Config{"cpu", false, "off"}, Config{"tier", true, "off"},
                            Config{"tier_stream", true, "on"}}) {
    fs::remove_all(state);
    fs::create_directories(state);
    k3::LoadOptions load = exact;
    load.vulkan.enabled = cfg.tier;
    load.vulkan.tier_gb = 1e3;  // every expert fits (the device's memory permitting)
    load.vulkan.prefill = cfg.prefill;
    const k3::Engine engine(dir, load);
    const k3::VkTier* tier = k3::internal::model(engine).vk_tier();
    // Warm-up: fills the tier (and the RAM cache) as a served model's first requests would.
    {
      k3::Session s(engine, P + a.tokens + 1);
      std::vector<float> logits = s.prefill(prompt);
      for (int64_t i = 0; i < a.tokens; ++i) logits = s.step(k3::argmax(logits));
    }
    const k3::VkTierStats before = tier ? tier->stats() : k3::VkTierStats{};
    k3::Session s(engine, P + a.tokens + 1);
    s.set_prefill_chunk(32);
    t0 = k3::now_seconds();
    std::vector<float> logits = s.prefill(prompt);
    const double prefill_s = k3::now_seconds() - t0;
    std::vector<int64_t> tokens;
    t0 = k3::now_seconds();
    for (int64_t i = 0; i < a.tokens; ++i) {
      tokens.push_back(k3::argmax(logits));
      logits = s.step(tokens.back());
    }
    const double per_token = (k3::now_seconds() - t0) / static_cast<double>(a.tokens);
    std::string share;
    if (tier) {
      const k3::VkTierStats st = tier->stats();
      const double served = static_cast<double>(st.pairs_served - before.pairs_served),
                   total = static_cast<double>(st.pairs_total - before.pairs_total);
      char buf[200];
      std::snprintf(buf, sizeof buf, ", device share %.1f%% (%llu residents, %llu streamed pairs)",
                    total > 0 ? 100.0 * served / total : 0.0,
                    static_cast<unsigned long long>(st.residents),
                    static_cast<unsigned long long>(st.streamed_pairs - before.streamed_pairs));
      share = buf;
      add_result(std::string("vulkan_") + cfg.name + "_device_share",
                 total > 0 ? served / total : 0.0, "x", std::nan(""));
    }
    std::printf("%-11s prefill %lld tokens (C=32) %.2f tok/s, decode %.4f s/token%s\n", cfg.name,
                static_cast<long long>(P), static_cast<double>(P) / prefill_s, per_token,
                share.c_str());
    add_result(std::string("vulkan_") + cfg.name + "_prefill", static_cast<double>(P) / prefill_s,
               "tok/s", std::nan(""));
    add_result(std::string("vulkan_") + cfg.name + "_decode", per_token, "s/token", std::nan(""));
    if (!tier) {
      cpu_tokens = tokens;
    } else if (tokens != cpu_tokens) {
      std::printf("check: %s greedy tokens differ from the CPU run's -> FAILED\n", cfg.name);
      status = 1;
    }
  }
  fs::remove_all(state);
  if (status == 0) std::printf("check: the greedy tokens of every run equal the CPU run's -> ok\n");
  print_results();
  return status;
}

// ---------------------------------------------------------------------------------------------
// stream: routed experts read from disk (O_DIRECT) during decode, against the drive's own rate

struct StreamArgs {
  std::string model_dir;  // an existing checkpoint; empty = the cached slice
  int64_t layers = 4;     // slice layers (the first is dense)
  int64_t experts = 128;  // slice routed experts per MoE layer
  int64_t tokens = 8;     // decode tokens per configuration
  int64_t prefill = 64;   // prompt tokens (chunked, C = 32)
  double expert_gb = 1;   // expert cache budget: small, so decode streams
  double probe_gb = 3;    // bytes dd reads for the drive rate
  std::string dir;
  std::string isa = "auto";
  std::string io_engine = "auto";
  int threads = 0;
};

// The checkpoint's shards, largest first: {bytes, path}.
std::vector<std::pair<uintmax_t, fs::path>> largest_shards(const std::string& dir) {
  std::vector<std::pair<uintmax_t, fs::path>> shards;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") shards.emplace_back(e.file_size(), e.path());
  std::sort(shards.rbegin(), shards.rend());
  return shards;
}

// Runs a dd command line; its wall seconds, or 0 (with dd's message printed) when it fails.
double timed_dd(const std::string& cmd) {
  const double t0 = k3::now_seconds();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return 0;
  char line[512];
  std::string out;
  while (std::fgets(line, sizeof line, p)) out += line;
  const int rc = ::pclose(p);
  const double dt = k3::now_seconds() - t0;
  if (rc != 0) {
    std::printf("dd failed: %s\n", trim(out).c_str());
    return 0;
  }
  return dt;
}

// The drive's sequential O_DIRECT rate over the checkpoint's largest shards (dd iflag=direct,
// bs=4M), in GB/s; 0 when dd is unavailable.
double drive_rate_dd(const std::string& dir, double probe_gb, std::string* what) {
  const std::vector<std::pair<uintmax_t, fs::path>> shards = largest_shards(dir);
  const uint64_t block = uint64_t{4} << 20;
  uint64_t left = static_cast<uint64_t>(probe_gb * 1e9);
  uint64_t bytes = 0;
  double seconds = 0;
  for (const auto& [size, path] : shards) {
    if (left < block) break;
    const uint64_t count = std::min<uint64_t>(left, size) / block;
    if (count == 0) continue;
    const std::string cmd = "dd if='" + path.string() +
                            "' of=/dev/null iflag=direct bs=4M count=" + std::to_string(count) +
                            " 2>&1";
    const double dt = timed_dd(cmd);
    if (dt <= 0) return 0;
    bytes += count * block;
    seconds += dt;
    left -= count * block;
    *what += (what->empty() ? "" : ", ") + path.filename().string();
  }
  return seconds > 0 ? static_cast<double>(bytes) / 1e9 / seconds : 0;
}

// The drive's O_DIRECT write rate: dd writes `probe_gb` of zeros to a scratch file in `dir`
// (fdatasync'd, then removed). 0 when dd fails.
double drive_write_rate_dd(const std::string& dir, double probe_gb, uint64_t block_mib = 4) {
  const std::string probe =
      (fs::path(dir) / ("k3_bench-write-probe-" + std::to_string(::getpid()))).string();
  const uint64_t block = block_mib << 20;
  const uint64_t count = std::max<uint64_t>(1, static_cast<uint64_t>(probe_gb * 1e9) / block);
  const std::string cmd = "dd if=/dev/zero of='" + probe +
                          "' oflag=direct conv=fdatasync bs=" + std::to_string(block_mib) +
                          "M count=" + std::to_string(count) + " 2>&1";
  const double dt = timed_dd(cmd);
  fs::remove(probe);
  return dt > 0 ? static_cast<double>(count * block) / 1e9 / dt : 0;
}

// The same drive read the way the engine reads it: O_DIRECT through k3::ReadQueue (io_uring when
// available), `depth` requests of `request_mb` in flight, sequential over the largest shards.
double drive_rate_queue(const std::string& dir, double probe_gb, int depth, uint64_t request_bytes,
                        std::string* engine) {
  const std::vector<std::pair<uintmax_t, fs::path>> shards = largest_shards(dir);
  std::unique_ptr<k3::ReadQueue> queue = k3::make_read_queue({});
  *engine = queue->engine();
  std::vector<std::unique_ptr<k3::ReadTicket>> tickets;
  std::vector<uint8_t*> buffers;
  for (int i = 0; i < depth; ++i) {
    tickets.push_back(std::make_unique<k3::ReadTicket>());
    buffers.push_back(static_cast<uint8_t*>(std::aligned_alloc(k3::kDirectAlign, request_bytes)));
  }
  uint64_t left = static_cast<uint64_t>(probe_gb * 1e9), bytes = 0;
  const double t0 = k3::now_seconds();
  for (const auto& [size, path] : shards) {
    if (left < request_bytes) break;
    const std::unique_ptr<k3::File> file = k3::open_posix_file(path.string());
    const uint64_t n = std::min<uint64_t>(left, size) / request_bytes;
    for (uint64_t r = 0; r < n; ++r) {
      const size_t slot = static_cast<size_t>(r % static_cast<uint64_t>(depth));
      tickets[slot]->wait();
      if (!tickets[slot]->error().empty()) throw k3::Error(tickets[slot]->error());
      const k3::ReadRequest req{file.get(), buffers[slot], request_bytes, r * request_bytes, true};
      queue->submit(*tickets[slot], {&req, 1});
    }
    for (auto& t : tickets) t->wait();
    bytes += n * request_bytes;
    left -= n * request_bytes;
  }
  const double dt = k3::now_seconds() - t0;
  for (uint8_t* b : buffers) std::free(b);
  return dt > 0 ? static_cast<double>(bytes) / 1e9 / dt : 0;
}

// A prompt of real text (README.md through the release tokenizer), or a fixed id pattern when
// the tokenizer is not beside the binary's source tree.
std::vector<int64_t> realistic_prompt(int64_t n, int64_t vocab, std::string* what) {
  std::error_code ec;
  const fs::path root =
      fs::read_symlink("/proc/self/exe", ec).parent_path().parent_path().parent_path();
  std::vector<int64_t> ids;
  try {
    const k3::text::Tokenizer tok = k3::text::Tokenizer::load(root / "tests/data/k3-release");
    std::ifstream in(root / "README.md");
    const std::string text{std::istreambuf_iterator<char>(in), {}};
    for (int32_t id : tok.encode(text, false))
      if (static_cast<int64_t>(ids.size()) < n && id < vocab) ids.push_back(id);
    *what = "README.md, release tokenizer";
  } catch (const std::exception&) {
  }
  if (static_cast<int64_t>(ids.size()) < n) {
    ids.clear();
    for (int64_t i = 0; i < n; ++i) ids.push_back(1 + (i * 7919) % (vocab - 1));
    *what = "fixed id pattern (no tokenizer found)";
  }
  return ids;
}

int run_stream(const StreamArgs& a) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  const k3::Isa isa = resolve_isa(a.isa);
  print_machine(isa);
  std::string dir = a.model_dir;
  if (dir.empty()) {
    dir = a.dir.empty() ? default_slice_dir() + "-stream" : a.dir;
    std::printf("\n== stream on a slice checkpoint (%lld layers, %lld experts of real size)\n",
                static_cast<long long>(a.layers), static_cast<long long>(a.experts));
    ensure_slice(dir, a.layers, a.experts);
  } else {
    std::printf("\n== stream on %s\n", dir.c_str());
  }
  std::string shards;
  const double drive = drive_rate_dd(dir, a.probe_gb, &shards);
  std::printf("drive: dd iflag=direct bs=4M over %.1f GB of %s: %.3f GB/s\n", a.probe_gb,
              shards.c_str(), drive);
  std::string engine_name;
  const double deep = drive_rate_queue(dir, a.probe_gb, 32, uint64_t{4} << 20, &engine_name);
  std::printf("drive: O_DIRECT via %s, 32 x 4 MiB in flight, same shards: %.3f GB/s (%.2fx dd)\n",
              engine_name.c_str(), deep, drive > 0 ? deep / drive : 0);
  add_result("stream_drive_dd", drive, "GB/s", 1.0);
  add_result("stream_drive_queue", deep, "GB/s", drive > 0 ? deep / drive : std::nan(""));

  const std::string state =
      (fs::temp_directory_path() / ("k3_bench-state-" + std::to_string(::getpid()))).string();
  k3::LoadOptions load;
  load.isa = a.isa;
  load.cache.expert_gb = a.expert_gb;
  load.cache.pin = false;
  load.cache.state_dir = state;  // the benchmark's routing never seeds a user's pins
  load.cache.io_engine = a.io_engine;
  k3::Engine engine(dir, load);
  fs::remove_all(state);
  k3::ExpertCache& cache = k3::internal::model(engine).experts();
  const k3::K3Config& c = k3::internal::config(engine);
  const int64_t moe_layers =
      engine.info().num_layers - std::min(engine.info().num_layers, c.first_k_dense_replace);
  std::printf("engine: %s, loaded in %.2f s\n", engine.describe().c_str(), engine.load_seconds());
  std::printf(
      "experts: %lld MoE layers x %lld, %.1f MB each, %lld slots/layer (K3_EXPERT_GB=%g), reads "
      "via %s\n",
      static_cast<long long>(moe_layers), static_cast<long long>(c.num_experts),
      static_cast<double>(
          k3::ExpertGeometry{c.routed_expert_hidden_size, c.moe_intermediate_size}.expert_bytes()) /
          1e6,
      static_cast<long long>(cache.slots_per_layer()), a.expert_gb, cache.stats().io_engine);

  // Prefill dedup at C = 32: token at a time reads k experts per token per MoE layer; a chunk
  // reads each distinct expert of its rows once.
  std::string what;
  const std::vector<int64_t> prompt = realistic_prompt(a.prefill, c.vocab_size, &what);
  k3::Session session(engine, a.prefill + 3 * a.tokens + 2);
  session.set_prefill_chunk(32);
  double t0 = k3::now_seconds();
  std::vector<float> logits = session.prefill(prompt);
  const double prefill_s = k3::now_seconds() - t0;
  const double selections = static_cast<double>(a.prefill * c.num_experts_per_token * moe_layers);
  const double dedup = selections / static_cast<double>(session.stats().expert_reads);
  std::printf(
      "prefill: %lld tokens (%s), C=32: %.1f s, %llu expert reads for %.0f selections: dedup "
      "%.2fx\n",
      static_cast<long long>(a.prefill), what.c_str(), prefill_s,
      static_cast<unsigned long long>(session.stats().expert_reads), selections, dedup);
  add_result("stream_prefill_dedup_C32", dedup, "x", dedup);

  struct Config {
    const char* name;
    bool pipe, prefetch;
  };
  const Config configs[] = {
      {"wait_all", false, false}, {"pipe", true, false}, {"pipe_prefetch", true, true}};
  std::vector<std::string> stage_lines;
  std::printf("\n%-14s %9s %8s %9s %7s %7s %8s %8s %8s\n", "config", "s/token", "GB read",
              "exp GB/s", "x dd", "x queue", "busy", "wait", "recall");
  for (const Config& cfg : configs) {
    cache.set_pipe(cfg.pipe);
    cache.set_prefetch(cfg.prefetch);
    cache.clear();
    const k3::ExpertCacheStats s0 = cache.stats();
    const k3::StageStats stages0 = k3::internal::stage_stats(session);
    t0 = k3::now_seconds();
    for (int64_t i = 0; i < a.tokens; ++i) logits = session.step(k3::argmax(logits));
    const double dt = k3::now_seconds() - t0;
    const k3::ExpertCacheStats s1 = cache.stats();
    k3::StageStats stages = k3::internal::stage_stats(session);
    for (int i = 0; i < static_cast<int>(k3::Stage::kCount); ++i)
      stages.seconds[i] -= stages0.seconds[i];
    stage_lines.push_back(std::string(cfg.name) + ": " + stages.summary());
    const double gb = static_cast<double>(s1.drive_bytes - s0.drive_bytes) / 1e9;
    const double busy = s1.busy_seconds - s0.busy_seconds;
    const double wait = s1.wait_seconds - s0.wait_seconds;
    const double rate = busy > 0 ? gb / busy : 0;
    const double total = static_cast<double>(s1.predicted_total - s0.predicted_total);
    const double recall = total > 0
                              ? static_cast<double>(s1.predicted_hits - s0.predicted_hits) / total
                              : std::nan("");
    std::printf("%-14s %9.3f %8.2f %9.3f %7.2f %7.2f %7.0f%% %7.0f%% %7.1f%%\n", cfg.name,
                dt / static_cast<double>(a.tokens), gb, rate, drive > 0 ? rate / drive : 0,
                deep > 0 ? rate / deep : 0, 100 * busy / dt, 100 * wait / dt, 100 * recall);
    const std::string n = std::string("stream_") + cfg.name;
    add_result(n + "_decode", dt / static_cast<double>(a.tokens), "s/token", std::nan(""));
    add_result(n + "_expert_gbps", rate, "GB/s", drive > 0 ? rate / drive : std::nan(""));
    add_result(n + "_expert_vs_queue_probe", deep > 0 ? rate / deep : 0, "x",
               deep > 0 ? rate / deep : std::nan(""));
    add_result(n + "_unhidden_wait", wait / dt, "fraction", wait / dt);
    add_result(n + "_drive_busy", busy / dt, "fraction", busy / dt);
    if (cfg.prefetch) {
      add_result(n + "_recall", recall, "fraction", recall);
      for (const k3::ExpertCache::LayerRecall& r : cache.recall_by_layer()) {
        const double v =
            static_cast<double>(r.predicted_hits) / static_cast<double>(r.predicted_total);
        std::printf(
            "  read-ahead recall, layer %lld (predicted from layer %lld's input): %.1f%% of %llu "
            "selections\n",
            static_cast<long long>(r.layer), static_cast<long long>(r.layer - 1), 100 * v,
            static_cast<unsigned long long>(r.predicted_total));
        add_result(n + "_recall_layer" + std::to_string(r.layer), v, "fraction", v);
      }
      const double issued = static_cast<double>(s1.prefetch_issued - s0.prefetch_issued);
      add_result(n + "_prefetch_used",
                 issued > 0 ? static_cast<double>(s1.prefetch_used - s0.prefetch_used) / issued : 0,
                 "fraction", std::nan(""));
    }
  }
  std::printf(
      "(busy = time with a read in flight / decode time; wait = compute thread blocked on reads / "
      "decode time;\n"
      " exp GB/s = expert bytes / busy time; recall = selections the read-ahead predicted / "
      "selections)\n");
  std::printf(
      "decode stages (experts includes the wait on reads; no expert reads can be pending during "
      "embed,\n"
      "the dense layers and the head):\n");
  for (const std::string& line : stage_lines) std::printf("  %s\n", line.c_str());
  std::printf("peak RSS: %.2f GB\n", static_cast<double>(k3::peak_rss_bytes()) / 1e9);
  print_results();
  return 0;
}

// ---------------------------------------------------------------------------------------------
// container: the repacked container (docs/container.md) against the snapshot it came from, on
// the same slice: load time cold (pages dropped), repack throughput vs the drive's O_DIRECT read
// rate, bytes read from the drive per streamed expert and decode s/token.

struct ContainerArgs {
  int64_t layers = 2;      // slice layers (the first is dense)
  int64_t experts = 64;    // slice routed experts per MoE layer
  int bits = 4;            // K3_BITS of the load-time path and k3_repack --bits
  int64_t tokens = 6;      // decode tokens per layout
  double expert_gb = 0.3;  // expert cache budget: small, so decode streams
  double probe_gb = 2;     // bytes dd reads for the drive rate
  std::string dir;
  std::string isa = "auto";
  int threads = 0;
};

// Drops the page cache of every regular file in `dir` (posix_fadvise DONTNEED), so the next read
// comes from the drive (or whatever cache sits below the page cache).
void drop_pages(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Bytes this process has read from storage so far (/proc/self/io read_bytes: O_DIRECT and
// io_uring reads included, page-cache hits not).
uint64_t storage_read_bytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value)
    if (key == "read_bytes:") return value;
  return 0;
}

uint64_t tensor_bytes_in(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") n += e.file_size();
  return n;
}

int run_container(const ContainerArgs& a) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  const k3::Isa isa = resolve_isa(a.isa);
  print_machine(isa);
  const std::string dir = a.dir.empty() ? default_slice_dir() + "-container" : a.dir;
  std::printf(
      "\n== container vs snapshot on a slice checkpoint (%lld layers, %lld experts of "
      "real size, --bits %d)\n",
      static_cast<long long>(a.layers), static_cast<long long>(a.experts), a.bits);
  ensure_slice(dir, a.layers, a.experts);
  const std::string box = dir + ".container";
  // The drive's sequential read rate: dd (one 4 MiB request at a time) before and after the
  // repack (a virtual drive's rate drifts over minutes; the mean of the two is used) and O_DIRECT
  // through k3::ReadQueue with 32 x 4 MiB in flight; the faster of the two is the reference.
  std::string shards;
  drop_pages(dir);
  const double dd_before = drive_rate_dd(dir, a.probe_gb, &shards);
  std::printf("drive: dd iflag=direct bs=4M over %.1f GB of %s: %.3f GB/s\n", a.probe_gb,
              shards.c_str(), dd_before);
  std::string engine_name;
  drop_pages(dir);
  const double deep = drive_rate_queue(dir, a.probe_gb, 32, uint64_t{4} << 20, &engine_name);
  std::printf("drive: O_DIRECT via %s, 32 x 4 MiB in flight, same shards: %.3f GB/s\n",
              engine_name.c_str(), deep);
  const std::string box_parent = fs::absolute(dir).parent_path().string();
  const double drive_write = drive_write_rate_dd(box_parent, a.probe_gb);
  std::printf("drive: dd oflag=direct bs=4M, %.1f GB written in %s: %.3f GB/s\n", a.probe_gb,
              box_parent.c_str(), drive_write);

  // Repack, source pages dropped first: one streaming pass, read + quantise + write.
  fs::remove_all(box);
  drop_pages(dir);
  k3::repack::Options ro;
  ro.source = dir;
  ro.dest = box;
  ro.bits = a.bits;
  const double repack_cpu0 = process_cpu_seconds();
  const k3::repack::Summary rs = k3::repack::run(ro);
  const double repack_cpu = process_cpu_seconds() - repack_cpu0;
  std::string again;
  drop_pages(dir);
  const double dd_after = drive_rate_dd(dir, a.probe_gb, &again);
  std::printf("drive: dd iflag=direct bs=4M again after the repack: %.3f GB/s\n", dd_after);
  const double dd = (dd_before + dd_after) / 2;
  const double drive = std::max(dd, deep);
  add_result("container_drive_dd", dd, "GB/s", 1.0);
  add_result("container_drive_queue", deep, "GB/s", dd > 0 ? deep / dd : std::nan(""));
  add_result("container_drive_write_dd", drive_write, "GB/s",
             drive > 0 ? drive_write / drive : std::nan(""));
  const double src_rate = static_cast<double>(rs.bytes_read) / 1e9 / rs.seconds;
  std::printf(
      "repack --bits %d: %.2f GB read, %.2f GB written in %.2f s: %.3f GB/s read = %.2fx the "
      "drive's read rate (%.3f GB/s, the faster of dd's mean and the queue; target >= 0.8x), "
      "%.3f GB/s written\n",
      a.bits, static_cast<double>(rs.bytes_read) / 1e9, static_cast<double>(rs.bytes_written) / 1e9,
      rs.seconds, src_rate, drive > 0 ? src_rate / drive : 0, drive,
      static_cast<double>(rs.bytes_written) / 1e9 / rs.seconds);
  add_result("container_repack_read", src_rate, "GB/s",
             drive > 0 ? src_rate / drive : std::nan(""));
  {
    // The drive doing what the repack does: reading (the queue probe) while it writes (dd with
    // 64 MiB O_DIRECT blocks, the writer's staging size) in the repack's proportions, both at
    // once. On a drive whose reads and writes share its bandwidth, this is the read rate a
    // repack can reach.
    const double write_share = static_cast<double>(rs.bytes_written) /
                               static_cast<double>(std::max<uint64_t>(1, rs.bytes_read));
    drop_pages(dir);
    const double m0 = k3::now_seconds();
    std::thread writes([&] { drive_write_rate_dd(box_parent, a.probe_gb * write_share, 64); });
    drive_rate_queue(dir, a.probe_gb, 32, uint64_t{4} << 20, &engine_name);
    writes.join();
    const double mixed = a.probe_gb / (k3::now_seconds() - m0);
    std::printf(
        "drive reading %.1f GB while writing %.1f GB (the repack's proportions) at once: %.3f "
        "GB/s of reading; the repack read at %.2fx that\n",
        a.probe_gb, a.probe_gb * write_share, mixed, src_rate / mixed);
    add_result("container_repack_vs_mixed", src_rate, "GB/s", src_rate / mixed);
  }
  {
    // A repack bound by its CPU keeps every core busy; one bound by the drive leaves them idle.
    const double cores = static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
    const double busy = repack_cpu / (rs.seconds * cores);
    std::printf(
        "repack CPU: %.2f s of user + system time in %.2f s on %.0f cores = %.0f%% busy (%s)\n",
        repack_cpu, rs.seconds, cores, 100 * busy,
        busy < 0.75 ? "not CPU-bound: the rest of the time it waits on the drive"
                    : "CPU-bound: more cores or faster kernels would raise it");
    add_result("container_repack_cpu_busy", busy, "fraction", busy);
  }
  if (drive > 0 && drive_write > 0) {
    // What the drive alone allows for these bytes: reading and writing one after the other (a
    // drive whose reads and writes share its bandwidth) or at the same time (one that does both
    // at full rate).
    const double read_s = static_cast<double>(rs.bytes_read) / 1e9 / drive;
    const double write_s = static_cast<double>(rs.bytes_written) / 1e9 / drive_write;
    std::printf(
        "drive-bound time for these bytes: %.2f s reading then writing, %.2f s doing both at "
        "once; the repack took %.2fx / %.2fx that\n",
        read_s + write_s, std::max(read_s, write_s), rs.seconds / (read_s + write_s),
        rs.seconds / std::max(read_s, write_s));
    add_result("container_repack_vs_drive_bound", rs.seconds, "s",
               std::max(read_s, write_s) / rs.seconds);
  }
  std::printf("sizes: snapshot %.2f GB, container %.2f GB\n",
              static_cast<double>(tensor_bytes_in(dir)) / 1e9,
              static_cast<double>(tensor_bytes_in(box)) / 1e9);

  // Load time, cold (both directories' pages dropped before each load) and warm.
  const std::string state =
      (fs::temp_directory_path() / ("k3_bench-state-" + std::to_string(::getpid()))).string();
  k3::LoadOptions hf_load;
  hf_load.isa = a.isa;
  hf_load.bits = a.bits;
  hf_load.bits_chosen = true;
  hf_load.cache.expert_gb = a.expert_gb;
  hf_load.cache.pin = false;
  hf_load.cache.state_dir = state;
  k3::LoadOptions box_load = hf_load;
  box_load.bits_chosen = false;  // the container's own widths
  struct Layout {
    const char* name;
    const std::string* dir;
    const k3::LoadOptions* load;
  };
  const Layout layouts[] = {{"snapshot", &dir, &hf_load}, {"container", &box, &box_load}};
  double cold[2] = {0, 0};
  uint64_t cold_read[2] = {0, 0};  // bytes each cold load read from storage
  std::printf("\n%-10s %12s %12s %14s %12s\n", "load", "cold s", "warm s", "cold GB read",
              "cold GB/s");
  for (int i = 0; i < 2; ++i) {
    drop_pages(dir);
    drop_pages(box);
    const uint64_t read0 = storage_read_bytes();
    double t0 = k3::now_seconds();
    { const k3::Engine e(*layouts[i].dir, *layouts[i].load); }
    cold[i] = k3::now_seconds() - t0;
    cold_read[i] = storage_read_bytes() - read0;
    t0 = k3::now_seconds();
    { const k3::Engine e(*layouts[i].dir, *layouts[i].load); }
    const double warm = k3::now_seconds() - t0;
    const double gb = static_cast<double>(cold_read[i]) / 1e9;
    std::printf("%-10s %12.3f %12.3f %14.3f %12.3f\n", layouts[i].name, cold[i], warm, gb,
                gb / cold[i]);
    add_result(std::string("container_load_cold_") + layouts[i].name, cold[i], "s", std::nan(""));
    add_result(std::string("container_load_warm_") + layouts[i].name, warm, "s", std::nan(""));
  }
  {  // K3_MMAP=1: the prepared matrices used in place (no copy, no first touch of new memory).
    k3::LoadOptions mapped = box_load;
    mapped.mmap = true;
    drop_pages(dir);
    drop_pages(box);
    double t0 = k3::now_seconds();
    { const k3::Engine e(box, mapped); }
    const double cold_mmap = k3::now_seconds() - t0;
    t0 = k3::now_seconds();
    { const k3::Engine e(box, mapped); }
    const double warm_mmap = k3::now_seconds() - t0;
    std::printf("%-10s %12.3f %12.3f   (K3_MMAP=1)\n", "mapped", cold_mmap, warm_mmap);
    std::printf("load speed-up, cold: %.1fx copying, %.1fx mapped (target >= 20x at K3_BITS=%d)\n",
                cold[0] / cold[1], cold[0] / cold_mmap, a.bits);
    if (drive > 0 && cold_read[1] > 0) {
      // A copying load must read its bytes from the drive: at the drive's best rate that takes
      // at least this long, which caps its speed-up over this snapshot load.
      const double floor_s = static_cast<double>(cold_read[1]) / 1e9 / drive;
      std::printf(
          "copying load's floor: %.3f GB at the drive's %.3f GB/s = %.3f s (measured %.3f s = "
          "%.2fx the floor); so at most %.1fx faster than this snapshot load\n",
          static_cast<double>(cold_read[1]) / 1e9, drive, floor_s, cold[1], cold[1] / floor_s,
          cold[0] / floor_s);
      add_result("container_load_copy_vs_floor", cold[1], "s", floor_s / cold[1]);
      add_result("container_load_speedup_ceiling", cold[0] / floor_s, "x", cold[0] / floor_s);
    }
    add_result("container_load_speedup", cold[0] / cold[1], "x", cold[0] / cold[1]);
    add_result("container_load_speedup_mmap", cold[0] / cold_mmap, "x", cold[0] / cold_mmap);
  }
  {  // What a copying load cannot beat here: the first touch of fresh anonymous memory.
    const size_t n = size_t{1} << 30;
    const double t0 = k3::now_seconds();
    std::vector<uint8_t> fresh;
    k3::resize_huge(fresh, n);
    const double touch = static_cast<double>(n) / 1e9 / (k3::now_seconds() - t0);
    std::printf("first touch of fresh memory (1 GiB, huge pages advised): %.2f GB/s\n", touch);
    add_result("container_first_touch", touch, "GB/s", std::nan(""));
  }

  // Streamed decode: bytes the drive delivered per expert read, and s/token.
  const k3::ExpertGeometry geometry = [&] {
    const k3::Engine e(dir, hf_load);
    const k3::K3Config& c = k3::internal::config(e);
    return k3::ExpertGeometry{c.routed_expert_hidden_size, c.moe_intermediate_size};
  }();
  std::printf("\nexpert: %llu bytes (%.3f pages of 4 KiB)\n",
              static_cast<unsigned long long>(geometry.expert_bytes()),
              static_cast<double>(geometry.expert_bytes()) / 4096);
  std::printf("%-10s %10s %14s %14s %10s\n", "stream", "reads", "drive B/read", "x record",
              "s/token");
  for (const Layout& l : layouts) {
    k3::Engine engine(*l.dir, *l.load);
    k3::ExpertCache& cache = k3::internal::model(engine).experts();
    k3::Session session(engine, a.tokens + 8);
    const std::vector<int64_t> prompt = {1, 2, 3, 4};
    std::vector<float> logits = session.prefill(prompt);
    cache.clear();
    drop_pages(dir);
    drop_pages(box);
    const k3::ExpertCacheStats s0 = cache.stats();
    const double t0 = k3::now_seconds();
    for (int64_t i = 0; i < a.tokens; ++i) logits = session.step(k3::argmax(logits));
    const double dt = (k3::now_seconds() - t0) / static_cast<double>(a.tokens);
    const k3::ExpertCacheStats s1 = cache.stats();
    const double reads = static_cast<double>(s1.misses - s0.misses);
    const double per = reads > 0 ? static_cast<double>(s1.drive_bytes - s0.drive_bytes) / reads : 0;
    const double record = static_cast<double>((geometry.expert_bytes() + 4095) / 4096 * 4096);
    std::printf("%-10s %10.0f %14.0f %14.5f %10.3f\n", l.name, reads, per, per / record, dt);
    add_result(std::string("container_stream_bytes_per_read_") + l.name, per, "B", per / record);
    add_result(std::string("container_stream_decode_") + l.name, dt, "s/token", std::nan(""));
  }
  fs::remove_all(state);
  std::printf(
      "(x record = drive bytes per read / the aligned record size; 1.00000 = exactly the "
      "record)\n");
  std::printf("peak RSS: %.2f GB\n", static_cast<double>(k3::peak_rss_bytes()) / 1e9);
  print_results();
  return 0;
}

// ---------------------------------------------------------------------------------------------
// routing: per-layer routing statistics of held-out text, trained routers against random ones

struct RoutingArgs {
  std::string model_dir;     // the trained model
  std::string ids_path;      // u32 LE token ids, windows of `window`
  std::string contrast_dir;  // the random-weights demo checkpoint (written when missing)
  int64_t window = 128;
  std::string isa = "auto";
  int threads = 0;
};

// Records every position's routed experts, per layer (calls come in position order per layer).
class RoutingRecorder final : public k3::LayerObserver {
 public:
  void on_tensor(int64_t, Site, const float*) override {}
  void on_routing(int64_t layer, const Routing& routing) override {
    if (layer >= static_cast<int64_t>(by_layer.size()))
      by_layer.resize(static_cast<size_t>(layer + 1));
    by_layer[static_cast<size_t>(layer)].emplace_back(routing.ids.begin(), routing.ids.end());
  }
  std::vector<std::vector<std::vector<int64_t>>> by_layer;  // [layer][position]: ids, ascending
};

struct LayerRouting {
  int64_t layer = 0;
  double reuse = 0, dedup = 0;  // means over token pairs / 32-token chunks
  double recall_c1 = std::nan(""),
         recall_c32 = std::nan("");  // nan: no prediction (first MoE layer)
  uint64_t selections_c1 = 0;
};

struct ModelRouting {
  std::string dir;
  int64_t experts = 0, top_k = 0, tokens = 0;
  std::string settings;
  std::vector<LayerRouting> layers;
  uint64_t prefetch_issued = 0, prefetch_used = 0;  // token at a time, one cache slot per layer
  // Random routing: k of E uniformly, independently per token.
  double chance_reuse() const { return static_cast<double>(top_k) / static_cast<double>(experts); }
  double chance_distinct(int64_t rows) const {  // expected distinct experts of `rows` tokens
    const double E = static_cast<double>(experts);
    return E * (1 - std::pow(1 - static_cast<double>(top_k) / E, static_cast<double>(rows)));
  }
  double chance_dedup(int64_t rows) const {
    return static_cast<double>(rows * top_k) / chance_distinct(rows);
  }
};

std::vector<int64_t> read_u32_ids(const std::string& path, int64_t window, int64_t vocab) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw k3::Error(path + ": cannot read the token id file");
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  if (bytes.size() % 4 != 0 || bytes.empty())
    throw k3::Error(path + ": " + std::to_string(bytes.size()) +
                    " bytes is not a whole number of u32 token ids");
  std::vector<int64_t> ids(bytes.size() / 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);  // little-endian host (x86-64)
    if (v >= vocab)
      throw k3::Error(path + ": token id " + std::to_string(v) + " at index " + std::to_string(i) +
                      " is outside the vocabulary (" + std::to_string(vocab) + ")");
    ids[i] = v;
  }
  if (static_cast<int64_t>(ids.size()) % window != 0)
    throw k3::Error(path + ": " + std::to_string(ids.size()) + " ids are not whole windows of " +
                    std::to_string(window) + " (--window)");
  return ids;
}

// Writes the random-weights demo checkpoint (k3_synth --preset demo) into `dir` when it has none.
void ensure_demo(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "config.json")) return;
  std::error_code ec;
  if (fs::exists(dir) && !fs::is_empty(dir, ec))
    throw k3::Error("--contrast " + dir + " has no config.json and is not empty");
  k3::synth::SynthSpec spec = k3::synth::preset_spec("demo");
  spec.progress = false;
  k3::synth::validate(spec);
  std::printf("contrast: writing the demo checkpoint (k3_synth --preset demo) into %s ...\n",
              dir.c_str());
  std::fflush(stdout);
  fs::create_directories(dir);
  k3::synth::write_checkpoint(spec, dir);
}

// ---------------------------------------------------------------------------------------------
// serve: the engine service with N sessions (coli serve --parallel, docs/serving.md §3.1)

struct ServeArgs {
  std::string model_dir;  // a checkpoint with its tokenizer; empty = the demo checkpoint
  int64_t tokens = 32;    // generated per stream
  int64_t prompt = 48;    // prompt tokens per stream
  std::string concurrency = "1,2,4,8";
  double expert_gb = 8;
  std::string isa = "auto";
  int threads = 0;
};

int run_serve(const ServeArgs& a) {
  const k3::Isa isa = resolve_isa(a.isa);
  if (a.threads > 0) omp_set_num_threads(a.threads);
  print_machine(isa);
  std::string dir = a.model_dir;
  if (dir.empty()) {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    dir = ec ? "build/demo-model" : (exe.parent_path().parent_path() / "demo-model").string();
    ensure_demo(dir);
  }
  std::vector<int> levels;
  {
    std::stringstream ss(a.concurrency);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) levels.push_back(std::max(1, std::stoi(item)));
  }
  if (levels.empty()) throw k3::Error("--concurrency: give a list like 1,2,4,8");
  const int most = std::max(4, *std::max_element(levels.begin(), levels.end()));
  k3::ServiceOptions so;
  so.model_dir = dir;
  so.load.isa = a.isa;
  so.load.cache.expert_gb = a.expert_gb;
  so.context = a.prompt + a.tokens + 8;
  so.parallel = most;
  so.ckpt_slots = 0;
  so.threads = a.threads;
  k3::EngineService service(so);
  while (!service.engine()) {
    const k3::ServiceStats s = service.stats();
    if (s.state == k3::ServiceStats::State::failed)
      throw k3::Error(s.failed_step + ": " + s.load_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const k3::Engine& engine = *service.engine();
  std::printf("\n== serve on %s: %d sessions, %lld prompt + %lld generated tokens per stream\n",
              dir.c_str(), most, static_cast<long long>(a.prompt),
              static_cast<long long>(a.tokens));
  std::printf("engine: %s\n", engine.describe().c_str());
  const int64_t vocab = engine.info().vocab_size;
  auto request = [&](int64_t salt, int64_t prompt_tokens, int64_t tokens) {
    k3::ServiceRequest r;
    for (int64_t i = 0; i < prompt_tokens; ++i)
      r.prompt.push_back(1 + (salt * 104729 + i * 7919) % (std::min<int64_t>(vocab, 150000) - 1));
    r.starts_in_think = false;
    r.raw = true;
    r.max_tokens = tokens;
    r.cache_prompt = false;  // every stream prefills its whole prompt
    r.stop.clear();
    return r;
  };
  auto finish = [](const std::shared_ptr<k3::RequestHandle>& h, double* first_token) {
    k3::ServiceEvent e;
    const double t0 = k3::now_seconds();
    for (;;) {
      if (!h->next(e, std::chrono::seconds(600))) throw k3::Error("serve bench: no event in 600 s");
      if (first_token && *first_token < 0 &&
          (e.kind == k3::ServiceEvent::Kind::content ||
           e.kind == k3::ServiceEvent::Kind::reasoning ||
           (e.kind == k3::ServiceEvent::Kind::done && e.stats.completion_tokens > 0)))
        *first_token = k3::now_seconds() - t0;
      if (e.kind == k3::ServiceEvent::Kind::error) throw k3::Error("serve bench: " + e.text);
      if (e.kind == k3::ServiceEvent::Kind::done) return e.stats;
    }
  };
  std::printf("\n%-8s %10s %12s %14s %14s %10s\n", "streams", "tokens", "seconds",
              "aggregate tok/s", "expert MB/tok", "mean batch");
  double single = 0;
  int64_t salt = 0;
  for (int n : levels) {
    const k3::ExpertStats e0 = engine.expert_stats();
    const k3::ServiceStats s0 = service.stats();
    std::vector<std::shared_ptr<k3::RequestHandle>> handles;
    const double t0 = k3::now_seconds();
    for (int i = 0; i < n; ++i) {
      auto h = service.submit(request(++salt, a.prompt, a.tokens));
      if (!h.ok()) throw k3::Error("serve bench: " + h.status().message());
      handles.push_back(*h);
    }
    int64_t generated = 0;
    for (auto& h : handles) generated += finish(h, nullptr).completion_tokens;
    const double dt = k3::now_seconds() - t0;
    const k3::ExpertStats e1 = engine.expert_stats();
    const k3::ServiceStats s1 = service.stats();
    const double rate = static_cast<double>(generated) / dt;
    if (n == levels.front()) single = rate;
    const double mb_per_token = static_cast<double>(e1.bytes_read - e0.bytes_read) / 1e6 /
                                static_cast<double>(std::max<int64_t>(1, generated));
    const int64_t steps = s1.decode_steps - s0.decode_steps;
    const double batch = steps > 0 ? static_cast<double>(s1.decode_rows - s0.decode_rows) /
                                         static_cast<double>(steps)
                                   : 0;
    std::printf("%-8d %10lld %12.2f %14.1f %14.2f %10.2f\n", n, static_cast<long long>(generated),
                dt, rate, mb_per_token, batch);
    add_result("serve_tok_s_" + std::to_string(n), rate, "tok/s",
               single > 0 ? rate / single : std::nan(""));
    add_result("serve_expert_mb_per_token_" + std::to_string(n), mb_per_token, "MB/tok",
               std::nan(""));
  }
  // Time to first token of a new request while three others decode, against the same request
  // alone.
  double alone = -1, beside = -1;
  finish(*service.submit(request(++salt, a.prompt, 4)), &alone);
  std::vector<std::shared_ptr<k3::RequestHandle>> running;
  for (int i = 0; i < 3; ++i)
    running.push_back(*service.submit(request(++salt, a.prompt, a.tokens * 4)));
  for (auto& h : running) {  // each has started decoding
    k3::ServiceEvent e;
    while (h->next(e, std::chrono::seconds(600)) && e.kind != k3::ServiceEvent::Kind::content &&
           e.kind != k3::ServiceEvent::Kind::done) {
    }
  }
  finish(*service.submit(request(++salt, a.prompt, 4)), &beside);
  for (auto& h : running) service.cancel(h);
  service.wait_idle(600);
  std::printf(
      "\nTTFT of a %lld-token prompt: alone %.1f ms, while 3 streams decode %.1f ms "
      "(%.2fx)\n",
      static_cast<long long>(a.prompt), alone * 1e3, beside * 1e3, beside / alone);
  add_result("serve_ttft_alone", alone * 1e3, "ms", std::nan(""));
  add_result("serve_ttft_beside_3", beside * 1e3, "ms", beside / alone);
  print_results();
  return 0;
}

ModelRouting measure_routing(const std::string& dir, const std::string& ids_path, int64_t window,
                             const std::string& isa) {
  const std::string state =
      (fs::temp_directory_path() / ("k3_bench-state-" + std::to_string(::getpid()))).string();
  k3::LoadOptions load;  // the release defaults (what users run), experts streamed
  load.isa = isa;
  load.cache.expert_gb = 1e-9;  // one slot per layer: nearly every selection is a read
  load.cache.pin = false;
  load.cache.state_dir = state;  // the benchmark's routing never seeds a user's pins
  load.cache.prefetch = true;
  k3::Engine engine(dir, load);
  fs::remove_all(state);
  const k3::K3Config& c = k3::internal::config(engine);
  k3::ExpertCache& cache = k3::internal::model(engine).experts();
  const std::vector<int64_t> ids = read_u32_ids(ids_path, window, c.vocab_size);
  ModelRouting m;
  m.dir = dir;
  m.experts = c.num_experts;
  m.top_k = c.num_experts_per_token;
  m.tokens = static_cast<int64_t>(ids.size());
  m.settings = engine.describe();
  const int64_t C = 32;
  // Token at a time (decode-like: each token's read-ahead is its own), recording the routing;
  // the routing is the same for every chunk size (bit-identical rows).
  RoutingRecorder rec;
  std::vector<RoutingRecorder> per_window;
  const k3::ExpertCacheStats s0 = cache.stats();
  for (size_t w0 = 0; w0 < ids.size(); w0 += static_cast<size_t>(window)) {
    k3::Session session(engine, window + 1);
    session.set_prefill_chunk(1);
    per_window.emplace_back();
    k3::PrefillHooks hooks;
    hooks.observer = &per_window.back();
    session.prefill(std::span<const int64_t>(ids).subspan(w0, static_cast<size_t>(window)), hooks);
  }
  const k3::ExpertCacheStats s1 = cache.stats();
  m.prefetch_issued = s1.prefetch_issued - s0.prefetch_issued;
  m.prefetch_used = s1.prefetch_used - s0.prefetch_used;
  const std::vector<k3::ExpertCache::LayerRecall> r1 = cache.recall_by_layer();
  for (size_t w0 = 0; w0 < ids.size(); w0 += static_cast<size_t>(window)) {
    k3::Session session(engine, window + 1);
    session.set_prefill_chunk(C);
    session.prefill(std::span<const int64_t>(ids).subspan(w0, static_cast<size_t>(window)));
  }
  const std::vector<k3::ExpertCache::LayerRecall> r2 = cache.recall_by_layer();
  for (int64_t l = 0; l < static_cast<int64_t>(per_window.front().by_layer.size()); ++l) {
    if (per_window.front().by_layer[static_cast<size_t>(l)].empty()) continue;  // dense layer
    LayerRouting L;
    L.layer = l;
    double reuse = 0, dedup = 0;
    uint64_t pairs = 0, chunks = 0;
    for (const RoutingRecorder& wr : per_window) {
      const std::vector<std::vector<int64_t>>& pos = wr.by_layer[static_cast<size_t>(l)];
      for (size_t t = 1; t < pos.size(); ++t) {
        std::vector<int64_t> both;
        std::set_intersection(pos[t].begin(), pos[t].end(), pos[t - 1].begin(), pos[t - 1].end(),
                              std::back_inserter(both));
        reuse += static_cast<double>(both.size()) / static_cast<double>(m.top_k);
        ++pairs;
      }
      for (size_t t0 = 0; t0 < pos.size(); t0 += static_cast<size_t>(C)) {
        std::vector<int64_t> all;
        size_t picks = 0;
        for (size_t t = t0; t < std::min(pos.size(), t0 + static_cast<size_t>(C)); ++t) {
          all.insert(all.end(), pos[t].begin(), pos[t].end());
          picks += pos[t].size();
        }
        std::sort(all.begin(), all.end());
        all.erase(std::unique(all.begin(), all.end()), all.end());
        dedup += static_cast<double>(picks) / static_cast<double>(all.size());
        ++chunks;
      }
    }
    L.reuse = pairs ? reuse / static_cast<double>(pairs) : std::nan("");
    L.dedup = chunks ? dedup / static_cast<double>(chunks) : std::nan("");
    for (const k3::ExpertCache::LayerRecall& r : r1)
      if (r.layer == l) {
        L.recall_c1 =
            static_cast<double>(r.predicted_hits) / static_cast<double>(r.predicted_total);
        L.selections_c1 = r.predicted_total;
        for (const k3::ExpertCache::LayerRecall& q : r2)
          if (q.layer == l && q.predicted_total > r.predicted_total)
            L.recall_c32 = static_cast<double>(q.predicted_hits - r.predicted_hits) /
                           static_cast<double>(q.predicted_total - r.predicted_total);
      }
    m.layers.push_back(L);
  }
  return m;
}

// Prints one model's table and its RESULT lines; returns the means {reuse, dedup, recall C=1}.
std::array<double, 3> print_routing(const std::string& name, const ModelRouting& m,
                                    int64_t window) {
  const int64_t C = 32;
  std::printf("\n== %s: %s (%lld experts, top-%lld; %s)\n", name.c_str(), m.dir.c_str(),
              static_cast<long long>(m.experts), static_cast<long long>(m.top_k),
              m.settings.c_str());
  std::printf("   %lld held-out tokens in %lld windows of %lld; chance = random routing (k of E)\n",
              static_cast<long long>(m.tokens), static_cast<long long>(m.tokens / window),
              static_cast<long long>(window));
  std::printf("%-7s %8s %8s %10s %8s %12s %12s %8s\n", "layer", "reuse", "chance", "dedup C=32",
              "chance", "recall C=1", "recall C=32", "chance");
  double sums[4] = {0, 0, 0, 0};
  int counts[4] = {0, 0, 0, 0};
  auto pct = [](double v) {
    char b[32];
    if (std::isnan(v))
      std::snprintf(b, sizeof b, "-");
    else
      std::snprintf(b, sizeof b, "%.1f%%", 100 * v);
    return std::string(b);
  };
  const double chance_recall32 = m.chance_distinct(C) / static_cast<double>(m.experts);
  for (const LayerRouting& L : m.layers) {
    std::printf("%-7lld %8s %8s %9.2fx %7.2fx %12s %12s %8s\n", static_cast<long long>(L.layer),
                pct(L.reuse).c_str(), pct(m.chance_reuse()).c_str(), L.dedup, m.chance_dedup(C),
                pct(L.recall_c1).c_str(), pct(L.recall_c32).c_str(), pct(m.chance_reuse()).c_str());
    const double v[4] = {L.reuse, L.dedup, L.recall_c1, L.recall_c32};
    for (int i = 0; i < 4; ++i)
      if (!std::isnan(v[i])) sums[i] += v[i], ++counts[i];
  }
  double mean[4];
  for (int i = 0; i < 4; ++i) mean[i] = counts[i] ? sums[i] / counts[i] : std::nan("");
  std::printf("%-7s %8s %8s %9.2fx %7.2fx %12s %12s %8s\n", "mean", pct(mean[0]).c_str(),
              pct(m.chance_reuse()).c_str(), mean[1], m.chance_dedup(C), pct(mean[2]).c_str(),
              pct(mean[3]).c_str(), pct(m.chance_reuse()).c_str());
  std::printf(
      "   (recall chance: k/E for C=1, %.1f%% for C=32 = expected distinct experts of 32 random "
      "tokens / E; the first MoE layer has no read-ahead: nothing runs before it to predict "
      "from)\n",
      100 * chance_recall32);
  std::printf(
      "   read-ahead, token at a time, 1 cache slot per layer: %llu reads issued, %.1f%% of them "
      "used by their layer (%llu wasted)\n",
      static_cast<unsigned long long>(m.prefetch_issued),
      m.prefetch_issued
          ? 100.0 * static_cast<double>(m.prefetch_used) / static_cast<double>(m.prefetch_issued)
          : 0.0,
      static_cast<unsigned long long>(m.prefetch_issued - m.prefetch_used));
  const std::string n = "routing_" + name;
  add_result(n + "_reuse", mean[0], "fraction", mean[0]);
  add_result(n + "_reuse_chance", m.chance_reuse(), "fraction", m.chance_reuse());
  add_result(n + "_dedup_C32", mean[1], "x", mean[1]);
  add_result(n + "_dedup_C32_chance", m.chance_dedup(C), "x", m.chance_dedup(C));
  add_result(n + "_recall_C1", mean[2], "fraction", mean[2]);
  add_result(n + "_recall_C32", mean[3], "fraction", mean[3]);
  add_result(n + "_prefetch_used",
             m.prefetch_issued
                 ? static_cast<double>(m.prefetch_used) / static_cast<double>(m.prefetch_issued)
                 : std::nan(""),
             "fraction", std::nan(""));
  return {mean[0], mean[1], mean[2]};
}

int run_routing(const RoutingArgs& a) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  const k3::Isa isa = resolve_isa(a.isa);
  print_machine(isa);
  const ModelRouting trained = measure_routing(a.model_dir, a.ids_path, a.window, a.isa);
  const std::array<double, 3> t = print_routing("trained", trained, a.window);
  std::string contrast = a.contrast_dir;
  if (contrast.empty()) {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    contrast = ec ? "build/demo-model" : (exe.parent_path().parent_path() / "demo-model").string();
  }
  ensure_demo(contrast);
  const ModelRouting random = measure_routing(contrast, a.ids_path, a.window, a.isa);
  const std::array<double, 3> r = print_routing("random", random, a.window);
  std::printf(
      "\nover chance (trained / random-weights): reuse %.2fx / %.2fx, dedup C=32 %.2fx / %.2fx, "
      "recall C=1 %.2fx / %.2fx\n",
      t[0] / trained.chance_reuse(), r[0] / random.chance_reuse(), t[1] / trained.chance_dedup(32),
      r[1] / random.chance_dedup(32), t[2] / trained.chance_reuse(), r[2] / random.chance_reuse());
  print_results();
  return 0;
}

// ---------------------------------------------------------------------------------------------
// quality: the real-text quality table (tools/quality_lib.h)

struct QualityArgs {
  std::string model_dir = std::string(K3_BENCH_SOURCE_DIR) + "/../assets/k3-mini";
  std::string fixtures = std::string(K3_BENCH_SOURCE_DIR) + "/../tests/data/k3-mini";
  std::string write_bounds;  // bounds file to write from the measurement ("" = none)
  std::string isa = "auto";
  int threads = 0;
};

int run_quality(const QualityArgs& a) {
  namespace q = k3::quality;
  if (a.threads > 0) omp_set_num_threads(a.threads);
  print_machine(resolve_isa(a.isa));
  const q::Fixtures fixtures = q::Fixtures::load(a.fixtures);
  std::printf(
      "\n== quality of %s on %s (%zu held-out windows of %lld tokens, %zu prompts x %lld "
      "greedy tokens)\n",
      a.model_dir.c_str(), a.fixtures.c_str(), fixtures.windows.size(),
      static_cast<long long>(q::kWindowTokens), fixtures.prompts.size(),
      static_cast<long long>(q::kGreedyTokens));
  k3::LoadOptions base;
  base.isa = a.isa;
  base.experts_in_memory = true;
  base.cache.pin = false;
  const q::Reference ref(a.model_dir, fixtures, base);
  std::vector<q::Row> rows;
  for (const q::Setting& s : q::settings()) {
    rows.push_back(ref.measure(s));
    const q::Row& r = rows.back();
    std::printf("%s\n", q::summary(r).c_str());
    std::fflush(stdout);
    const std::string n = "quality_" + r.setting;
    add_result(n + "_ppl", r.ppl, "ppl", r.ppl / ref.row().ppl);
    add_result(n + "_kl_mean", r.kl_mean, "nats", std::nan(""));
    add_result(n + "_kl_max", r.kl_max, "nats", std::nan(""));
    add_result(n + "_top1", r.top1, "fraction", r.top1);
    add_result(n + "_greedy64", r.greedy, "fraction", r.greedy);
    add_result(n + "_oracle_kl_mean", r.oracle_kl_mean, "nats", std::nan(""));
    add_result(n + "_oracle_top1", r.oracle_top1, "fraction", r.oracle_top1);
    add_result(n + "_experts_kept", r.experts_kept, "fraction", r.experts_kept);
  }
  q::Bounds bounds;
  if (!a.write_bounds.empty()) {
    q::write_bounds(a.write_bounds, rows, fixtures.oracle.positions);
    bounds = q::read_bounds(a.write_bounds);
    std::printf(
        "\nwrote %s (ppl x 1.01, KL x 1.25 + 1e-6, top-1 - 0.02, greedy - 0.10, KL vs oracle x "
        "1.25 + 1e-9, top-1 vs oracle - 2 of %zu positions)\n",
        a.write_bounds.c_str(), fixtures.oracle.positions);
  }
  std::printf(
      "\n== Markdown (ppl: exp of the mean NLL of %lld held-out tokens; KL(exact || "
      "setting) per position in nats; top-1: argmax equal to exact's; greedy 64: "
      "fraction of 64 greedy tokens equal to exact's, first diff: mean first differing "
      "index; KL vs oracle, top-1 vs oracle: against the training model's float64 forward on "
      "%zu held-out positions; experts kept: routed picks made / top-k; in parentheses: %s)\n\n%s",
      static_cast<long long>(ref.row().positions), fixtures.oracle.positions,
      bounds.empty() ? "the ceiling" : "the bound · the ceiling",
      q::markdown(rows, bounds).c_str());
  print_results();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Benchmarks (not tests): kernel bandwidth, decode speed in memory and streamed from disk, "
      "the repacked container, expert routing, and the real-text quality of every precision "
      "setting. Figures go to stdout with a Markdown summary.",
      "k3_bench"};
  app.set_version_flag("--version", k3::version_text("k3_bench"));
  app.require_subcommand(1);

  KernelsArgs ka;
  CLI::App* kernels =
      app.add_subcommand("kernels", "DRAM probe + GB/s of MXFP4/int8/int4 kernels (+ ggml peer)");
  kernels->add_option("--isa", ka.isa, "kernel variant: auto, scalar, avx2, avx512")
      ->capture_default_str();
  kernels->add_option("--threads", ka.threads, "OpenMP threads (0 = OpenMP default)")
      ->capture_default_str();
  kernels->add_option("--seconds", ka.seconds, "time spent per figure (best pass reported)")
      ->capture_default_str();
  kernels->add_option("--experts", ka.experts, "distinct MXFP4 experts rotated")
      ->capture_default_str();
  kernels
      ->add_option("--ggml-dir", ka.ggml_dir, "where to look for the ggml libraries (recursively)")
      ->capture_default_str();
  kernels->add_flag("--no-ggml", ka.no_ggml, "skip the ggml peer");
  kernels
      ->add_option(
          "--only", ka.only,
          "run only the figures whose names contain one of these (e.g. mxfp4_idot, int4, ggml)")
      ->delimiter(',');

  DecodeArgs da;
  CLI::App* decode = app.add_subcommand("decode", "decode tokens/s with every expert in memory");
  decode->add_option("model_dir", da.model_dir, "an existing checkpoint")
      ->default_str("the cached slice");
  decode->add_option("--layers", da.layers, "slice layers")->capture_default_str();
  decode->add_option("--experts", da.experts, "slice routed experts")->capture_default_str();
  decode->add_option("--tokens", da.tokens, "tokens to decode")->capture_default_str();
  decode->add_option("--prefill", da.prefill, "prompt tokens before decoding")
      ->capture_default_str();
  decode->add_option("--dir", da.dir, "cache directory of the slice checkpoint")
      ->default_str("<build>/bench-slice");
  decode->add_option("--isa", da.isa, "kernel variant: auto, scalar, avx2, avx512")
      ->capture_default_str();
  decode->add_option("--threads", da.threads, "OpenMP threads (0 = OpenMP default)")
      ->capture_default_str();

  StreamArgs sa;
  CLI::App* stream = app.add_subcommand(
      "stream", "decode with experts streamed from disk vs the drive's O_DIRECT rate");
  stream->add_option("model_dir", sa.model_dir, "an existing checkpoint")
      ->default_str("a cached slice with many experts");
  stream->add_option("--layers", sa.layers, "slice layers")->capture_default_str();
  stream->add_option("--experts", sa.experts, "slice routed experts")->capture_default_str();
  stream->add_option("--tokens", sa.tokens, "decode tokens per configuration")
      ->capture_default_str();
  stream->add_option("--prefill", sa.prefill, "prompt tokens (C = 32)")->capture_default_str();
  stream->add_option("--expert-gb", sa.expert_gb, "expert cache budget (small: decode streams)")
      ->capture_default_str();
  stream->add_option("--probe-gb", sa.probe_gb, "bytes dd reads for the drive rate")
      ->capture_default_str();
  stream->add_option("--dir", sa.dir, "cache directory of the slice")
      ->default_str("<build>/bench-slice-stream");
  stream->add_option("--isa", sa.isa, "kernel variant: auto, scalar, avx2, avx512")
      ->capture_default_str();
  stream->add_option("--io-engine", sa.io_engine, "expert reads: auto, uring, threads")
      ->capture_default_str();
  stream->add_option("--threads", sa.threads, "OpenMP threads (0 = OpenMP default)")
      ->capture_default_str();

  QualityArgs qa;
  CLI::App* quality = app.add_subcommand(
      "quality", "held-out perplexity, KL and agreement vs exact for every precision setting");
  quality->add_option("--model", qa.model_dir, "trained checkpoint")->capture_default_str();
  quality->add_option("--fixtures", qa.fixtures, "held-out fixtures (heldout_text.u32, ...)")
      ->capture_default_str();
  quality->add_option("--write-bounds", qa.write_bounds,
                      "write the gate's bounds file (tests/data/k3-mini/quality_bounds.json)");
  quality->add_option("--isa", qa.isa, "kernel variant: auto, scalar, avx2, avx512")
      ->capture_default_str();
  quality->add_option("--threads", qa.threads, "OpenMP threads (0 = OpenMP default)")
      ->capture_default_str();

  RoutingArgs ra;
  CLI::App* routing = app.add_subcommand(
      "routing", "per-layer expert reuse, prefill dedup and read-ahead recall on held-out text");
  routing->add_option("--model", ra.model_dir, "the trained checkpoint (e.g. assets/k3-mini)")
      ->required();
  routing
      ->add_option(
          "--ids", ra.ids_path,
          "held-out token ids, u32 little-endian (e.g. tests/data/k3-mini/heldout_text.u32)")
      ->required();
  routing->add_option("--window", ra.window, "tokens per independent sequence")
      ->capture_default_str();
  routing
      ->add_option("--contrast", ra.contrast_dir,
                   "the random-weights demo checkpoint, written when missing")
      ->default_str("<build>/demo-model");
  routing->add_option("--isa", ra.isa, "kernel variant: auto, scalar, avx2, avx512")
      ->capture_default_str();
  routing->add_option("--threads", ra.threads, "OpenMP threads (0 = OpenMP default)")
      ->capture_default_str();

  ContainerArgs ca;
  CLI::App* container = app.add_subcommand(
      "container",
      "repacked container vs snapshot: cold load time, repack GB/s vs the drive, expert reads");
  container->add_option("--layers", ca.layers, "slice layers")->capture_default_str();
  container->add_option("--experts", ca.experts, "slice routed experts")->capture_default_str();
  container->add_option("--bits", ca.bits, "K3_BITS / k3_repack --bits")
      ->check(CLI::IsMember({4, 8}))
      ->capture_default_str();
  container->add_option("--tokens", ca.tokens, "decode tokens per layout")->capture_default_str();
  container->add_option("--expert-gb", ca.expert_gb, "expert cache budget (GB)")
      ->capture_default_str();
  container->add_option("--probe-gb", ca.probe_gb, "bytes dd reads for the drive rate (GB)")
      ->capture_default_str();
  container->add_option("--dir", ca.dir, "slice directory")
      ->default_str("<build>/bench-slice-container");
  container->add_option("--isa", ca.isa, "kernel variant: auto, scalar, avx2, avx512")
      ->capture_default_str();
  container->add_option("--threads", ca.threads, "OpenMP threads (0 = OpenMP default)")
      ->capture_default_str();

  GrammarBenchArgs ga;
  CLI::App* grammar = add_grammar_bench(app, ga);
  ServeArgs sv;
  CLI::App* serve = app.add_subcommand(
      "serve", "the service with N sessions: aggregate tok/s at 1,2,4,8 streams, TTFT beside 3");
  serve->add_option("model_dir", sv.model_dir, "a checkpoint with its tokenizer")
      ->default_str("the demo checkpoint");
  serve->add_option("--tokens", sv.tokens, "generated tokens per stream")->capture_default_str();
  serve->add_option("--prompt", sv.prompt, "prompt tokens per stream")->capture_default_str();
  serve->add_option("--concurrency", sv.concurrency, "stream counts")->capture_default_str();
  serve->add_option("--expert-gb", sv.expert_gb, "expert cache budget (GB)")->capture_default_str();
  serve->add_option("--isa", sv.isa, "kernel variant: auto, scalar, avx2, avx512")
      ->capture_default_str();
  serve->add_option("--threads", sv.threads, "OpenMP threads (0 = OpenMP default)")
      ->capture_default_str();

  VulkanArgs va;
  CLI::App* vulkan = app.add_subcommand(
      "vulkan",
      "the Vulkan expert tier: upload GB/s, expert-batch ms, prefill and decode with "
      "and without it (lavapipe: not GPU speed)");
  vulkan->add_option("model_dir", va.model_dir, "an existing checkpoint")
      ->default_str("a k3_synth preset");
  vulkan->add_option("--preset", va.preset, "k3_synth preset written when no MODEL_DIR")
      ->check(CLI::IsMember({"tiny", "demo", "slice"}))
      ->capture_default_str();
  vulkan->add_option("--layers", va.layers, "preset layers (-1: the preset's)")
      ->capture_default_str();
  vulkan->add_option("--experts", va.experts, "preset routed experts (-1: the preset's)")
      ->capture_default_str();
  vulkan->add_option("--tokens", va.tokens, "decode tokens per run")->capture_default_str();
  vulkan->add_option("--prefill", va.prefill, "prompt tokens per run")->capture_default_str();
  vulkan->add_option("--dir", va.dir, "cache directory of the preset checkpoint")
      ->default_str("<build>/bench-vulkan-<preset>");
  vulkan->add_option("--threads", va.threads, "OpenMP threads (0 = OpenMP default)")
      ->capture_default_str();

  std::string ep_delay = "0.1ms", ep_rate = "10gbit";
  CLI::App* ep = app.add_subcommand(
      "ep",
      "--expert-parallel over 1, 2 and 3 ranks in network namespaces with shaped links (root; "
      "bench/ep_netns.sh, docs/scale-out.md §2.7)");
  ep->add_option("--delay", ep_delay, "one-way link delay (tc netem, where the kernel has it)")
      ->capture_default_str();
  ep->add_option("--rate", ep_rate, "link rate (tc)")->capture_default_str();

  const k3::ToolArgs parsed = k3::parse_tool_args(app, {argv + 1, argv + argc});
  if (parsed.status >= 0) return parsed.finish();
  try {
    if (grammar->parsed()) return run_grammar_bench(ga);
    if (ep->parsed()) {
      // The namespaces, links and mpirun are shell work: the script, with this build's programs.
      std::error_code ec;
      const fs::path build = fs::read_symlink("/proc/self/exe", ec).parent_path().parent_path();
      if (ec) throw k3::Error("k3_bench ep: cannot find the build folder from /proc/self/exe");
      const auto quoted = [](const std::string& s) {
        for (char c : s)
          if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '/' && c != '_' &&
              c != '-')
            throw k3::Error("k3_bench ep: \"" + s + "\": letters, digits and ./_- only");
        return s;
      };
      const std::string command = "bash " + quoted(K3_BENCH_SOURCE_DIR "/ep_netns.sh") + " " +
                                  quoted((build / "apps" / "kimi_k3").string()) + " " +
                                  quoted((build / "tools" / "k3_synth").string()) + " " +
                                  quoted(ep_delay) + " " + quoted(ep_rate);
      const int status = std::system(command.c_str());
      return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    if (container->parsed()) {
      if (ca.layers < 2 || ca.experts < 1 || ca.tokens < 1)
        throw k3::Error("--layers must be >= 2; --experts, --tokens >= 1");
      return run_container(ca);
    }
    if (routing->parsed()) {
      if (ra.window < 2) throw k3::Error("--window must be >= 2");
      return run_routing(ra);
    }
    if (kernels->parsed()) return run_kernels(ka);
    if (serve->parsed()) {
      if (sv.tokens < 1 || sv.prompt < 1) throw k3::Error("--tokens and --prompt must be >= 1");
      return run_serve(sv);
    }
    if (vulkan->parsed()) {
      if (va.tokens < 1 || va.prefill < 1) throw k3::Error("--tokens, --prefill must be >= 1");
      return run_vulkan(va);
    }
    if (quality->parsed()) return run_quality(qa);
    if (stream->parsed()) {
      if (sa.layers < 2 || sa.experts < 1 || sa.tokens < 1 || sa.prefill < 1)
        throw k3::Error("--layers must be >= 2; --experts, --tokens, --prefill >= 1");
      return run_stream(sa);
    }
    if (da.layers < 1 || da.experts < 1 || da.tokens < 1)
      throw k3::Error("--layers, --experts, --tokens must be >= 1");
    return run_decode(da);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3_bench: %s\n", e.what());
    return 1;
  }
}

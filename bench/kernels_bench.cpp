// bench/kernels_bench.cpp — `k3_bench kernels` (benchmarks, not tests).
//
//   k3_bench kernels [--isa auto|scalar|avx2|avx512] [--threads N] [--seconds S]
//       Machine facts, a DRAM read-bandwidth probe, then GB/s of weight bytes (and the ratio to
//       the probe) for the MXFP4 expert (idot and exact; 1/4/16/64 rows), int8 and int4-g64 on
//       12288x7168 / 7168x12288 (1 and 64 rows; both also on int8 activations, int8_idot and
//       int4_idot), and ggml's MXFP4 dot product as a peer when the npm package
//       @node-llama-cpp/linux-x64 is installed under bench/node_modules. The one-row MXFP4
//       kernels also run on one core with one expert in the LLC, and the targets say whether
//       their instructions or the memory stalls bind them (with the instruction mix). Each
//       one-row figure with a target also gets a ratio paired pass by pass with the probe
//       (pair_with_probe below), and the MXFP4 integer kernel runs on dense-shaped matrices too.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.h"
#include "ggml_peer.h"
#include "io/read_queue.h"
#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "kernels/mxfp4.h"
#include "kernels/quant.h"
#include "util/sys.h"

namespace k3bench {
namespace {

// ---------------------------------------------------------------------------------------------
// MXFP4 experts

constexpr size_t kInter = 3072;   // moe_intermediate_size
constexpr size_t kLatent = 3584;  // routed_expert_hidden_size

// A view of one MXFP4 matrix inside a buffer.
struct Mx {
  const uint8_t* packed = nullptr;  // [rows][cols / 2]
  const uint8_t* scales = nullptr;  // [rows][cols / 32]
  size_t rows = 0, cols = 0;
  k3::Mxfp4Matrix view() const { return {packed, scales, rows, cols}; }
  size_t bytes() const { return rows * cols / 2 + rows * cols / 32; }
};

// Matrices laid back to back, each packed block followed by its scales, in one buffer from the
// allocator of the engine's expert slots (k3::allocate_direct_buffer, io/read_queue.h: 4 KiB
// aligned) starting `offset` bytes past its 4 KiB boundary: 0 is an expert of the container's
// aligned layout; a snapshot's expert read with O_DIRECT starts wherever its file offset falls, a
// multiple of 8 (the safetensors header is padded to 8 bytes).
struct MxBuffer {
  struct Free {
    void operator()(uint8_t* p) const { k3::free_direct_buffer(p); }
  };
  std::unique_ptr<uint8_t[], Free> storage;
  std::vector<Mx> mats;
  size_t bytes() const {
    size_t n = 0;
    for (const Mx& m : mats) n += m.bytes();
    return n;
  }
};

// shapes: (rows, cols) per matrix; random bytes from `seed`, scale bytes in [120, 130].
MxBuffer random_mx(const std::vector<std::pair<size_t, size_t>>& shapes, uint64_t seed,
                   size_t offset) {
  size_t total = offset;
  for (const auto& [rows, cols] : shapes) total += rows * cols / 2 + rows * cols / 32;
  MxBuffer b;
  b.storage.reset(k3::allocate_direct_buffer(total));
  uint8_t* at = b.storage.get() + offset;
  for (const auto& [rows, cols] : shapes) {
    Mx m;
    m.rows = rows;
    m.cols = cols;
    uint8_t* packed = at;
    uint8_t* scales = packed + rows * cols / 2;
    fill_bytes(packed, rows * cols / 2, seed, 0, 255);
    fill_bytes(scales, rows * cols / 32, seed + 1, 120, 130);
    m.packed = packed;
    m.scales = scales;
    at = scales + rows * cols / 32;
    seed += 3;
    b.mats.push_back(m);
  }
  return b;
}

// In the order of the engine's slot (src/experts/expert_store.cpp ExpertStore::view): gate,
// down, up.
struct Expert {
  MxBuffer buffer;
  Mx gate, up, down;  // gate/up [3072][3584], down [3584][3072]
  explicit Expert(MxBuffer b)
      : buffer(std::move(b)), gate(buffer.mats[0]), up(buffer.mats[2]), down(buffer.mats[1]) {}
  size_t bytes() const { return buffer.bytes(); }
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

struct KernelsArgs : CommonOptions {
  double seconds = 1.5;
  int experts = 0;  // 0: enough for 3x the LLC's bytes, at least 16
  int offset = 0;   // where the MXFP4 matrices start past a 4 KiB boundary (MxBuffer)
  std::string ggml_dir = K3_BENCH_SOURCE_DIR "/node_modules/@node-llama-cpp/linux-x64/bins";
  bool no_ggml = false;
  double dram_gib = 1;            // the DRAM probe's array
  int pair_passes = 61;           // kernel/probe pass pairs of each paired ratio (0: none)
  std::vector<std::string> only;  // figure-name substrings; empty = everything
};

// True when a section whose figures are named `prefix`... is selected by --only.
bool selected(const KernelsArgs& a, const std::string& prefix) {
  if (a.only.empty()) return true;
  for (const std::string& o : a.only)
    if (prefix.find(o) != std::string::npos || o.find(prefix) != std::string::npos) return true;
  return false;
}

// Paired ratios. The host's memory bandwidth moves with its other tenants within one run (on the
// 2-core KVM EPYC, probe passes a few milliseconds apart read 9 to 55 GB/s), so the run's highest
// probe charges a kernel for the contention it met. Each one-row figure with a target is therefore
// measured again pass by pass, the kernel's passes alternating with probe passes over as many bytes
// of the probe's array (a window not read for the rest of the array, so from DRAM): a kernel pass's
// ratio is its GB/s over the mean of the probe passes just before and after it, and the median pass
// gives the paired ratio. Both ratios are printed.
struct Paired {
  std::string name;
  double median = 0;
  double cpu = 1;  // the paired passes' cpu share
};
std::vector<Paired> g_paired;

template <typename Pass>
void pair_with_probe(const KernelsArgs& a, DramProbe& probe, const std::string& name, double bytes,
                     Pass&& pass) {
  if (a.pair_passes <= 0) return;
  pass();  // warm-up
  std::vector<double> ratios, probes;
  const double wall0 = k3::now_seconds(), cpu0 = process_cpu_seconds();
  probes.push_back(probe.window(static_cast<size_t>(bytes)));
  for (int r = 0; r < a.pair_passes; ++r) {
    const double t0 = k3::now_seconds();
    pass();
    const double kernel = bytes / (k3::now_seconds() - t0) / 1e9;
    probes.push_back(probe.window(static_cast<size_t>(bytes)));
    ratios.push_back(kernel / (0.5 * (probes[probes.size() - 2] + probes.back())));
  }
  const double cpu =
      (process_cpu_seconds() - cpu0) / ((k3::now_seconds() - wall0) * omp_get_max_threads());
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double m = median(ratios);
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  const auto [plo, phi] = std::minmax_element(probes.begin(), probes.end());
  std::printf(
      "%s paired with the probe, %d passes: GB/s / the mean of the probe passes beside it: median "
      "%.2f (%.2f to %.2f; probe passes %.1f to %.1f GB/s, median %.1f; cpu %.0f%%)\n",
      name.c_str(), a.pair_passes, m, *lo, *hi, *plo, *phi, median(probes), 100.0 * cpu);
  std::fflush(stdout);
  g_paired.push_back({name, m, cpu});
  add_result(name + "_paired", m, "x", m, cpu);
}

// The one-row kernels whose binding resource print_targets names.
enum class Mix { kMxfp4Idot, kMxfp4Exact, kInt8Idot, kInt4Idot };

// The vector instructions a one-row kernel spends per weight byte (counted from
// src/kernels/impl/mxfp4_avx512.cpp, mxfp4_avx2.cpp, dense_avx512.cpp and dense_avx2.cpp),
// printed where they bind. "The 16-row sums": sum_rows16 (src/kernels/impl/avx512_common.h), 44
// unpacks, adds and 128-bit shuffles per 16 rows, 2.75 per 64 bytes of a row.
const char* instruction_mix(k3::Isa isa, Mix kernel) {
  switch (isa) {
    case k3::Isa::kAvx512:
      switch (kernel) {
        case Mix::kMxfp4Idot:
          return "per 64 weight bytes of a row: 1 load, 1 prefetch, 2 vpandd + 1 vpsrlw, 2 vpshufb "
                 "(e2m1 -> u8), 2 vpdpbusd; ~2.8 shuffles/adds and ~1.3 float ops (the 16-row "
                 "sums and scales), ~0.5 for the scale bytes";
        case Mix::kMxfp4Exact:
          return "per 64 weight bytes (16 rows x 8 columns): 8 vpermps (e2m1 -> f32), 8 vpsrld "
                 "and 8 vfmadd231ps with a broadcast operand, plus 3 shuffles of the 16x16 dword "
                 "transpose; the three share vector pipes (~1 permute+shift+FMA per cycle "
                 "measured on Zen 5: 0.125 cycles/byte before the rest)";
        case Mix::kInt8Idot:
          return "per 64 weight bytes of a row (two groups): 1 load, 1 prefetch, 1 vpxord (to "
                 "u8), 1 vpdpbusd; 2.75 for the 16-row sums, ~0.6 float ops per group step";
        case Mix::kInt4Idot:
          return "per 64 weight bytes of a row: 1 load, 1 prefetch, 2 vpandd + 1 vpsrlw "
                 "(nibbles), 2 vpdpbusd; 2.75 for the 16-row sums, ~1.3 float ops and scales";
      }
      break;
    case k3::Isa::kAvx2:
      switch (kernel) {
        case Mix::kMxfp4Idot:
          return "per 128 weight bytes (8 rows x one group): 12 shuffles of the 8x8 dword "
                 "transpose and 8 vpshufb (20 shuffles), 8 vpand + 4 vpsrld, 8 vpmaddubsw, 6 "
                 "vpaddw, 2 vpmaddwd, ~8 int/float ops for the sum and scale";
        case Mix::kMxfp4Exact:
          return "per 32 weight bytes of a row (two groups): 16 shuffles build the floats (4 "
                 "vpshufb, 4 vpunpck*bw, 8 vpunpck*wd; at two per cycle 0.25 cycles/byte), 3 "
                 "and/shift, 3 for the scales, 9 vmulps/vfmadd231ps per activation row";
        case Mix::kInt8Idot:
          return "per 256 weight bytes (8 rows x one group; no VNNI, no one-row special case): "
                 "24 shuffles of the 8x8 dword transpose, 8 vpabsb, 8 x (vpsignb, vpmaddubsw, "
                 "vpmaddwd, vpaddd) against broadcast activation dwords, ~6 float ops";
        case Mix::kInt4Idot:
          return "per 32 weight bytes of a row (one group): 1 load, 2 vpand + 1 vpsrlw "
                 "(nibbles), 2 vpmaddubsw, 1 vpaddw, 1 vpmaddwd; ~2.5 for the 8-row sums and "
                 "~1.3 float ops per row-group";
      }
      break;
    default:
      break;
  }
  return "scalar code";
}

// The core clock of this run (core_clock_ghz, bench/bench_common.h), for cycles per byte.
double g_clock_ghz = 0;

// DRAM bandwidth per core of a real workstation (300 GB/s over 32 cores): the memory's cycles per
// byte there, against which a kernel's own cycles per byte (from the LLC) tell whether it would be
// memory-bound on such a machine.
constexpr double kWorkstationCoreGbs = 300.0 / 32.0;

// The targets, checked against the figures of this run (informative, never a failure);
// isa: the kernel variant of the run, for the instruction mix.
void print_targets(k3::Isa isa) {
  auto find = [](const std::string& name) -> const Result* {
    for (const Result& r : g_results)
      if (r.name == name) return &r;
    return nullptr;
  };
  std::printf(
      "\n== targets (informative; timings are not test assertions; a ratio to the DRAM probe is "
      "judged on the paired ratio where there is one, the ratio to the run's highest probe "
      "beside it)\n");
  auto check = [&](const std::string& name, bool use_ratio, double want, const char* what) {
    const Result* r = find(name);
    if (!r) return;
    double v = use_ratio ? r->ratio : r->value, cpu = r->cpu;
    char note[128] = "";
    const Paired* paired = nullptr;
    for (const Paired& p : g_paired)
      if (use_ratio && p.name == name) paired = &p;
    if (paired) {
      std::snprintf(note, sizeof note, "  (paired; x the highest probe %.2f)", v);
      v = paired->median;
      cpu = paired->cpu;
    }
    if (cpu < 0.9)
      std::snprintf(note + std::strlen(note), sizeof note - std::strlen(note),
                    "  (contended: cpu %.0f%%, not meaningful)", 100.0 * cpu);
    std::printf("%-44s %-26s %7.2f  %s%s\n", name.c_str(), what, v, v >= want ? "met" : "MISSED",
                note);
  };
  if (const Result* p = find("dram_probe"); p && p->cpu < 0.9)
    std::printf("the DRAM reference probe ran contended (cpu %.0f%%): every ratio is suspect\n",
                100.0 * p->cpu);
  check("mxfp4_idot_rows1", true, 0.8, ">= 0.80 x DRAM probe");
  check("mxfp4_exact_rows1", true, 0.5, ">= 0.50 x DRAM probe");
  check("int4_12288x7168_rows1", true, 0.8, ">= 0.80 x DRAM probe");
  check("int4_7168x12288_rows1", true, 0.8, ">= 0.80 x DRAM probe");
  check("int4_idot_12288x7168_rows1", true, 0.7, ">= 0.70 x DRAM probe");
  check("int4_idot_7168x12288_rows1", true, 0.7, ">= 0.70 x DRAM probe");
  check("int8_idot_12288x7168_rows1", true, 0.7, ">= 0.70 x DRAM probe");
  check("int8_idot_7168x12288_rows1", true, 0.7, ">= 0.70 x DRAM probe");
  check("mxfp4_idot_rows1_vs_ggml", false, 2.0, ">= 2.00 x ggml");
  // What binds the one-row kernels: the same kernel on one core with its weights in the LLC
  // costs the instructions' cycles per byte; near the DRAM run's, the instructions bind.
  std::vector<std::pair<std::string, Mix>> paths = {{"mxfp4_idot", Mix::kMxfp4Idot},
                                                    {"mxfp4_exact", Mix::kMxfp4Exact}};
  for (const char* dims : {"12288x7168", "7168x12288"}) {
    paths.emplace_back(std::string("int8_idot_") + dims, Mix::kInt8Idot);
    paths.emplace_back(std::string("int4_idot_") + dims, Mix::kInt4Idot);
  }
  for (const auto& [path, mix] : paths) {
    const Result* dram = find(path + "_rows1_cycles_per_byte");
    const Result* cache = find(path + "_rows1_in_cache_cycles_per_byte");
    if (!dram || !cache) continue;
    const double share = cache->value / dram->value;
    const char* verdict = share >= 0.8   ? "its instructions"
                          : share >= 0.5 ? "its instructions and memory stalls"
                                         : "memory stalls";
    std::printf(
        "%s: %.3f cycles/byte on one core from the LLC = %.0f%% of the DRAM run's %.3f; bound by "
        "%s\n",
        path.c_str(), cache->value, 100.0 * share, dram->value, verdict);
    if (share >= 0.5) std::printf("  the mix, %s\n", instruction_mix(isa, mix));
    // What transfers: a workstation core's share of DRAM (~300 GB/s over 32 cores) at this clock.
    const double floor = g_clock_ghz / kWorkstationCoreGbs;
    std::printf(
        "  on a workstation core with %.1f GB/s of DRAM (300 GB/s / 32 cores) at %.2f GHz the "
        "memory takes %.3f cycles/byte: the instructions' %.3f are %.0f%% of it (%s there)\n",
        kWorkstationCoreGbs, g_clock_ghz, floor, cache->value, 100.0 * cache->value / floor,
        cache->value < floor ? "memory-bound" : "instruction-bound");
    add_result(path + "_rows1_vs_workstation_core", cache->value / floor, "x",
               cache->value / floor);
  }
  for (const Result& r : g_results)
    if (r.name.find("rows64_per_row_vs_rows1") != std::string::npos)
      check(r.name, false, 3.0, ">= 3.00 x rows1 per row");
}

// Core cycles per weight byte of the best pass: its CPU seconds (wall x threads x the cpu share
// of the series, so cycles other processes took do not count) x the clock / bytes. Stalls on
// memory count as cycles: a kernel with more cycles per byte than the DRAM reference's (clock x
// threads / probe) is bound by its instructions, not by the memory.
double cycles_per_byte(double bytes, const Timing& t) {
  return t.best * omp_get_max_threads() * std::min(1.0, t.cpu_share) * g_clock_ghz * 1e9 / bytes;
}

void print_row(const std::string& name, size_t rows, double bytes, const Timing& t,
               double per_row_vs_1) {
  const double gbs = bytes / t.best / 1e9;
  const double gbs_med = bytes / t.median / 1e9;
  char extra[32] = "";
  if (per_row_vs_1 > 0) std::snprintf(extra, sizeof extra, "%.2fx", per_row_vs_1);
  std::printf("%-26s %4zu %8.1f %9.3f %9.3f %7.2f %7.2f %6d %4.0f%% %6.2f %8s\n", name.c_str(),
              rows, bytes / 1e6, t.best * 1e3, t.median * 1e3, gbs, gbs_med, t.passes,
              100.0 * t.cpu_share, cycles_per_byte(bytes, t), extra);
  std::fflush(stdout);
  add_result(name + "_cycles_per_byte", cycles_per_byte(bytes, t), "cyc/B", std::nan(""),
             t.cpu_share);
}

void print_header(const char* title) {
  std::printf("\n== %s\n", title);
  std::printf("%-26s %4s %8s %9s %9s %7s %7s %6s %5s %6s %8s\n", "figure", "rows", "MB/pass",
              "best ms", "med ms", "GB/s", "med", "passes", "cpu", "cyc/B", "per-row");
}

int run_kernels(const KernelsArgs& a) {
  const double t_start = k3::now_seconds();
  const k3::Isa isa = apply_common_options(a);
  const k3::KernelTable& k = k3::kernel_table(isa);
  print_machine(isa);
  if (isa == k3::Isa::kAvx512)
    std::printf("row prefetch:   %s (MXFP4 integer path, one row; kernels/isa.h)\n",
                k3::row_prefetch_name(k3::row_prefetch_for_this_cpu()));
  const int threads = omp_get_max_threads();
  const CacheFact llc = last_level_cache();
  const uint64_t llc_bytes = llc.bytes ? llc.bytes : (uint64_t{32} << 20);
  // `<path>_rows1_in_cache`: `call` (one activation row over `bytes` of weights held in the LLC)
  // on one core: the cycles per byte of the instructions alone, against which print_targets tells
  // instructions from memory stalls.
  const auto one_core_in_cache = [&](const std::string& path, double bytes,
                                     const std::function<void()>& call) {
    omp_set_num_threads(1);
    const Timing t = measure(a.seconds, 3, call, call);
    print_row(path + "_rows1_in_cache", 1, bytes, t, 0);
    omp_set_num_threads(threads);
  };

  // DRAM probes: at the start, after the MXFP4 figures and at the end. The host's memory
  // bandwidth moves with its other tenants (32 to 53 GB/s seen here with our cores idle), so the
  // ratios use the highest probe of the run as the reference, conservatively.
  const size_t probe_bytes = static_cast<size_t>(a.dram_gib * static_cast<double>(size_t{1} << 30));
  struct Probe {
    const char* name;
    double gbs, cpu;
  };
  std::vector<Probe> probes;
  DramProbe probe(probe_bytes);  // also the paired ratios' probe
  auto run_probe = [&](const char* name) {
    double cpu = 0;
    const double gbs = probe.run(5, &cpu);
    probes.push_back({name, gbs, cpu});
    std::printf(
        "\n== DRAM read probe (%s): sum of a %.2f GiB float array, %d threads, best of 5 passes: "
        "%.2f GB/s (cpu %.0f%%)\n",
        name, static_cast<double>(probe_bytes) / (1u << 30), threads, gbs, 100.0 * cpu);
    std::fflush(stdout);
  };
  run_probe("start");
  double tsc_ghz = 0;
  g_clock_ghz = core_clock_ghz(&tsc_ghz);
  std::printf(
      "core clock: %.2f GHz with %d threads busy (a chain of dependent adds, 1 cycle each, per "
      "second of each thread's CPU time; TSC %.2f GHz)\n",
      g_clock_ghz, threads, tsc_ghz);
  std::printf(
      "(figures below: one pass = every distinct matrix/expert once; passes repeated for >= %.1f "
      "s, GB/s from the best pass, med = median pass; GB/s = weight bytes (incl. scales) read "
      "per second; per-row = rows x GB/s / rows-1 GB/s, the throughput per activation row vs one "
      "row; cpu = process CPU time / (wall x threads): well under 100%% means other processes "
      "took the cores; cyc/B = core cycles per weight byte (best pass x threads x cpu share x "
      "clock / bytes): at cpu 100%% a kernel with cyc/B above the DRAM's (clock x threads / "
      "probe) is bound by its instructions. Ratios to the DRAM reference come at the end.)\n",
      a.seconds);

  // MXFP4 experts (and the ggml peer on the same weights).
  if (selected(a, "mxfp4_idot") || selected(a, "mxfp4_exact") || selected(a, "ggml_mxfp4")) {
    // MXFP4 experts. The rotation covers 3x the LLC (a 480 MiB L3 held all 16 experts, 17.5 MB
    // each, of an earlier fixed count), so a pass reads DRAM, not cache.
    const auto make_expert = [&a](int e) {
      const uint64_t seed = 1000 + 10 * static_cast<uint64_t>(e);
      return Expert(
          random_mx({{kInter, kLatent}, {kLatent, kInter}, {kInter, kLatent}}, seed, a.offset));
    };
    std::vector<Expert> experts;
    experts.push_back(make_expert(0));
    const double expert_bytes = static_cast<double>(experts[0].bytes());
    const int E = a.experts > 0
                      ? a.experts
                      : std::max(16, static_cast<int>(std::ceil(
                                         3.0 * static_cast<double>(llc_bytes) / expert_bytes)));
    experts.reserve(static_cast<size_t>(E));
    for (int e = 1; e < E; ++e) experts.push_back(make_expert(e));
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
          ("MXFP4 expert, " + std::string(idot ? "idot (default path)" : "exact float path") +
           ", each expert starting " + std::to_string(a.offset) + " bytes past a 4 KiB boundary")
              .c_str());
      auto call = [&](const Expert& e, size_t n) {
        if (idot)
          expert_idot(k, e, scratch, n);
        else
          expert_exact(k, e, scratch, n);
      };
      double gbs1 = 0, cpu1 = 1;
      for (const size_t n : row_counts) {
        const Timing t = measure(
            a.seconds, 3, [&] { call(experts[0], n); },
            [&] {
              for (const Expert& e : experts) call(e, n);
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
        if (n == 1)
          pair_with_probe(a, probe, name, pass_bytes, [&] {
            for (const Expert& e : experts) call(e, 1);
          });
        if (n > 1)
          add_result(name + "_per_row_vs_rows1", per_row, "x", per_row,
                     std::min(cpu1, t.cpu_share));
      }
      // One row on one core with one expert held in the LLC.
      if (1.5 * expert_bytes <= static_cast<double>(llc_bytes)) {
        one_core_in_cache(path, expert_bytes, [&] { call(experts[0], 1); });
      } else {
        std::printf("%s_rows1_in_cache: skipped (one expert, %.2f MB, is over 2/3 of the LLC)\n",
                    path.c_str(), expert_bytes / 1e6);
      }
    }

    // The same kernel on dense-shaped matrices (12288 x 7168, 46.8 MB each with the scales: rows
    // twice as long as an expert's, one call per matrix instead of per 5.85 MB), as many as cover
    // 3x the LLC (at least 4): what the expert's shape costs.
    if (selected(a, "mxfp4_idot_12288x7168")) {
      std::vector<MxBuffer> big;
      double big_bytes = 0;
      const double one = 12288.0 * 7168.0 * (0.5 + 1.0 / 32.0);
      const int count =
          std::max(4, static_cast<int>(std::ceil(3.0 * static_cast<double>(llc_bytes) / one)));
      for (int m = 0; m < count; ++m) {
        big.push_back(random_mx({{12288, 7168}}, 9000 + static_cast<uint64_t>(m), a.offset));
        big_bytes += static_cast<double>(big.back().bytes());
      }
      std::vector<float> x(7168), d(7168 / 32), y(12288);
      std::vector<int8_t> q(7168);
      fill_floats(x.data(), x.size(), 778);
      k3::quantize_q8_32(k, x.data(), 1, x.size(), q.data(), d.data());
      auto pass = [&] {
        for (const MxBuffer& m : big)
          k3::matmul_mxfp4_idot(k, m.mats[0].view(), q.data(), d.data(), 1, y.data());
      };
      print_header(("MXFP4 12288x7168 (dense shape), idot, " + std::to_string(count) +
                    " distinct matrices rotated, each starting " + std::to_string(a.offset) +
                    " bytes past a 4 KiB boundary")
                       .c_str());
      const Timing t = measure(a.seconds, 3, pass, pass);
      print_row("mxfp4_idot_12288x7168_rows1", 1, big_bytes, t, 0);
      add_bandwidth("mxfp4_idot_12288x7168_rows1", big_bytes / t.best / 1e9, t.cpu_share);
      pair_with_probe(a, probe, "mxfp4_idot_12288x7168_rows1", big_bytes, pass);
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
            std::vector<uint8_t> blocks =
                k3bench::repack_mxfp4_for_ggml(g0.packed, g0.scales, check_rows, g0.cols, offset);
            std::vector<float> deq(check_rows * g0.cols);
            g.dequantize_row_mxfp4(blocks.data(), deq.data(), static_cast<int64_t>(deq.size()));
            size_t mismatches = 0;
            double ratio = 0;
            for (size_t o = 0; o < check_rows; ++o)
              for (size_t i = 0; i < g0.cols; ++i) {
                const float ours = k3::mxfp4_weight(g0.packed, g0.scales, g0.cols, o, i);
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
            gx[e].gate = k3bench::repack_mxfp4_for_ggml(x.gate.packed, x.gate.scales, kInter,
                                                        kLatent, offset);
            gx[e].up =
                k3bench::repack_mxfp4_for_ggml(x.up.packed, x.up.scales, kInter, kLatent, offset);
            gx[e].down = k3bench::repack_mxfp4_for_ggml(x.down.packed, x.down.scales, kLatent,
                                                        kInter, offset);
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
      // At least 4x the LLC's bytes (a 480 MiB L3 held all 8 int4 matrices of an earlier cap).
      const int count = std::clamp(
          static_cast<int>(std::ceil(4.0 * static_cast<double>(llc_bytes) / one)), 2, 64);
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
      // pass1: one pass of the series at one row, for the paired ratio.
      auto report = [&](const std::string& name_base, size_t n, const Timing& t,
                        const std::function<void()>& pass1) {
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
        if (n == 1) pair_with_probe(a, probe, name, bytes, pass1);
      };
      if (sel_plain) {
        std::snprintf(title, sizeof title,
                      "%s %lldx%lld (%s), %d distinct matrices rotated (%.0f MB working set)",
                      bits == 8 ? "int8 per row" : "int4 g64", static_cast<long long>(sh.rows),
                      static_cast<long long>(sh.cols), k3::weight_format_name(mats[0].format),
                      count, bytes / 1e6);
        print_header(title);
        for (const size_t n : {size_t{1}, size_t{64}}) {
          auto pass = [&] {
            for (const k3::WeightMatrix& W : mats) k3::matmul(k, W, X.data(), n, Y.data());
          };
          const Timing t = measure(
              a.seconds, 3, [&] { k3::matmul(k, mats[0], X.data(), n, Y.data()); }, pass);
          report(base, n, t, pass);
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
          auto pass = [&] {
            k3::quantize_q8_32(k, X.data(), n, cols, Q8.data(), D.data());
            for (const k3::WeightMatrix& W : mats) idot(W, n);
          };
          const Timing t = measure(
              a.seconds, 3,
              [&] {
                k3::quantize_q8_32(k, X.data(), n, cols, Q8.data(), D.data());
                idot(mats[0], n);
              },
              pass);
          report(idot_base, n, t, pass);
          const Timing q = measure(
              0.2, 3, [&] { k3::quantize_q8_32(k, X.data(), n, cols, Q8.data(), D.data()); },
              [&] { k3::quantize_q8_32(k, X.data(), n, cols, Q8.data(), D.data()); });
          std::printf("  (quantize_q8_32 of %zu rows: %.3f ms, %.2f%% of the best pass)\n", n,
                      q.best * 1e3, 100.0 * q.best / t.best);
        }
        // One row on one core with a matrix of the same width and format held in the LLC (as
        // many rows as fit half of it, a multiple of 16).
        const double row_bytes = one / static_cast<double>(sh.rows);
        const int64_t small_rows = std::min<int64_t>(
            sh.rows,
            static_cast<int64_t>(0.5 * static_cast<double>(llc_bytes) / row_bytes / 16.0) * 16);
        if (small_rows >= 16) {
          k3::WeightMatrix S;
          S.rows = small_rows;
          S.cols = sh.cols;
          S.f32.resize(static_cast<size_t>(small_rows * sh.cols));
          fill_floats(S.f32.data(), S.f32.size(), 6000 + static_cast<uint64_t>(bits));
          k3::quantize_matrix(S, bits, k3::kernel_table(k3::best_isa()));
          k3::quantize_q8_32(k, X.data(), 1, cols, Q8.data(), D.data());
          one_core_in_cache(idot_base, static_cast<double>(S.bytes()), [&] { idot(S, 1); });
        }
      }
    }
  }

  // SiTU-GLU (KernelTable::situ_glu): one thread, 3,072 x 32 elements (an expert's gate and up
  // for a chunk of 32 rows, in the L2), on every ISA this CPU runs, against the scalar twin and
  // glibc's tanhf / expf (the SiTU of src/kernels/include/kernels/vec.h before its own exp and
  // tanh). The kernel works in place, so each of its passes first copies the gate row back
  // (~10 us of the AVX-512 pass's ~110).
  if (selected(a, "situ")) {
    std::printf("\n== SiTU-GLU, one thread, 98,304 elements\n");
    const size_t count = 3072 * 32;
    std::vector<float> gate(count), up(count), work(count);
    fill_floats(gate.data(), count, 31);
    fill_floats(up.data(), count, 32);
    for (float& g : gate) g *= 8.0f;
    for (float& u : up) u *= 40.0f;
    omp_set_num_threads(1);
    auto time_rows = [&](const auto& fn) {
      const Timing t = measure(std::min(0.5, a.seconds), 5, fn, fn);
      return t.best / static_cast<double>(count) * 1e9;
    };
    const double libm = time_rows([&] {
      for (size_t i = 0; i < count; ++i)
        work[i] = 4.0f * std::tanh(gate[i] / 4.0f) / (1.0f + std::exp(-gate[i])) *
                  (25.0f * std::tanh(up[i] / 25.0f));
    });
    double scalar_ns = 0;
    for (const k3::Isa each : {k3::Isa::kScalar, k3::Isa::kAvx2, k3::Isa::kAvx512}) {
      if (!k3::isa_supported(each)) continue;
      const k3::KernelTable& t = k3::kernel_table(each);
      const double ns = time_rows([&] {
        std::copy(gate.begin(), gate.end(), work.begin());
        t.situ_glu(work.data(), up.data(), count, 4.0f, 25.0f);
      });
      if (each == k3::Isa::kScalar) scalar_ns = ns;
      const std::string name = std::string("situ_") + k3::isa_name(each);
      std::printf(
          "%-14s %6.2f ns/element: x%.1f the scalar twin, x%.1f glibc's tanhf/expf (%.2f)\n",
          name.c_str(), ns, scalar_ns / ns, libm / ns, libm);
      add_result(name, ns, "ns/element", libm / ns, 1.0);
    }
    omp_set_num_threads(threads);
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
  // The DRAM reference in the same unit as the kernels: a kernel at cpu 100 % with more cycles
  // per byte than this is bound by its instructions, not by the memory.
  const double dram_cycles = g_clock_ghz * threads / ref;
  std::printf("DRAM reference in core cycles per byte: %.2f (%.2f GHz x %d threads / %.2f GB/s)\n",
              dram_cycles, g_clock_ghz, threads, ref);
  add_result("dram_probe_cycles_per_byte", dram_cycles, "cyc/B", std::nan(""), ref_cpu);
  add_result("core_clock", g_clock_ghz, "GHz", std::nan(""));
  g_results.insert(g_results.begin(), {"dram_probe", ref, "GB/s", 1.0, ref_cpu, false});
  for (const Probe& p : probes)
    add_result(std::string("dram_probe_") + p.name, p.gbs, "GB/s", p.gbs / ref, p.cpu);
  std::printf("%-32s %8s %6s %5s\n", "figure", "GB/s", "xDRAM", "cpu");
  for (Result& r : g_results) {
    if (!r.vs_probe) continue;
    r.ratio = r.value / ref;
    std::printf("%-32s %8.2f %6.2f %4.0f%%\n", r.name.c_str(), r.value, r.ratio, 100.0 * r.cpu);
  }

  print_targets(isa);
  print_results();
  std::printf("kernels: done in %.1f s (peak RSS %.2f GB)\n", k3::now_seconds() - t_start,
              static_cast<double>(k3::peak_rss_bytes()) / 1e9);
  return 0;
}

}  // namespace

Subcommand register_kernels(CLI::App& app) {
  auto a = std::make_shared<KernelsArgs>();
  Command c(app, "kernels", "DRAM probe + GB/s of MXFP4/int8/int4 kernels (+ ggml peer)");
  add_common_options(c, *a);
  c.option("--seconds", a->seconds, "time spent per figure (best pass reported)").show_default();
  c.option("--experts", a->experts,
           "distinct MXFP4 experts rotated (0: 3x the LLC's bytes, at least 16)")
      .show_default();
  c.option("--offset", a->offset,
           "bytes past a 4 KiB boundary where each MXFP4 expert (and each 12288x7168 matrix) "
           "starts: 0 as in the container's aligned layout, a multiple of 8 as a snapshot's")
      .range(0, 4095)
      .show_default();
  c.option("--ggml-dir", a->ggml_dir, "where to look for the ggml libraries (recursively)")
      .show_default();
  c.flag("--no-ggml", a->no_ggml, "skip the ggml peer");
  c.option("--dram-gib", a->dram_gib, "the DRAM probe's array (GiB; well above the LLC)")
      .range(0.01, 64.0)
      .show_default();
  c.option("--pair-passes", a->pair_passes,
           "kernel passes of each one-row target figure, each followed by a DRAM probe pass of "
           "its bytes (the paired ratio; 0: none)")
      .range(0, 1000)
      .show_default();
  c.option("--only", a->only,
           "run only the figures whose names contain one of these (e.g. mxfp4_idot, int4, ggml)")
      .list(',');
  return {c.app(), [a] { return run_kernels(*a); }};
}

}  // namespace k3bench

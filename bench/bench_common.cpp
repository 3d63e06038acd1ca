// bench/bench_common.cpp — what every k3_bench subcommand shares (bench/bench_common.h).
#include "bench_common.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <new>
#include <sstream>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "io/read_queue.h"
#include "kernels/isa.h"
#include "synth_lib.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3bench {

// ---------------------------------------------------------------------------------------------
// RESULT lines

std::vector<Result> g_results;

void add_result(const std::string& name, double value, const std::string& unit, double ratio,
                double cpu) {
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
// Timing

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// ---------------------------------------------------------------------------------------------
// DRAM probe: threaded sum of a >= 1 GiB float array, best of `passes`.

// n: a multiple of 64; p: 64-byte aligned. The widest loads the CPU has, whatever ISA the
// kernels are told to use: the probe measures the memory, and on a Xeon (Sapphire Rapids class,
// 2 cores) 16-byte loads read 24 GB/s where 64-byte ones read 31.5 (32-byte: 26.5).
#if defined(__x86_64__)
__attribute__((target("avx512f"))) double sum_range_avx512(const float* p, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  double s = 0;
  for (const float v : lanes) s += v;
  return s;
}

__attribute__((target("avx"))) double sum_range_avx(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  double s = 0;
  for (const float v : lanes) s += v;
  return s;
}
#endif

double sum_range(const float* p, size_t n) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  static const bool avx = __builtin_cpu_supports("avx");
  if (avx512) return sum_range_avx512(p, n);
  if (avx) return sum_range_avx(p, n);
#endif
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

DramProbe::DramProbe(size_t bytes) : blocks_(bytes / sizeof(float) / kBlock) {
  float* p = static_cast<float*>(std::aligned_alloc(64, blocks_ * kBlock * sizeof(float)));
  if (p == nullptr) throw std::bad_alloc();
  array_.reset(p);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < blocks_; ++b)  // first touch by the thread that will read it
    for (size_t i = 0; i < kBlock; ++i) p[b * kBlock + i] = static_cast<float>((b + i) & 7);
}

double DramProbe::run(int passes, double* cpu_share) {
  double best = 0;
  const double wall0 = k3::now_seconds(), cpu0 = process_cpu_seconds();
  for (int pass = 0; pass < passes; ++pass)
    best = std::max(best, window(blocks_ * kBlock * sizeof(float)));
  *cpu_share =
      (process_cpu_seconds() - cpu0) / ((k3::now_seconds() - wall0) * omp_get_max_threads());
  return best;
}

double DramProbe::window(size_t bytes) {
  const size_t want = std::max<size_t>(1, bytes / sizeof(float) / kBlock);
  const size_t n = std::min(want, blocks_);
  if (next_ + n > blocks_) next_ = 0;
  const float* p = array_.get() + next_ * kBlock;
  next_ += n;
  double total = 0;
  const double t0 = k3::now_seconds();
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (size_t b = 0; b < n; ++b) total += sum_range(p + b * kBlock, kBlock);
  const double seconds = k3::now_seconds() - t0;
  if (total == -1) std::printf("(checksum)\n");  // keeps the sum alive
  return static_cast<double>(n * kBlock * sizeof(float)) / seconds / 1e9;
}

double dram_probe(size_t bytes, int passes, double* cpu_share) {
  return DramProbe(bytes).run(passes, cpu_share);
}

// ---------------------------------------------------------------------------------------------
// Compute probes

double core_clock_ghz(double* tsc_ghz) {
  constexpr uint64_t kIters = 10'000'000;  // x 32 adds: ~0.1 s at 3 GHz
  double sum = 0, tsc_sum = 0;
  int threads = 1;
#pragma omp parallel reduction(+ : sum, tsc_sum)
  {
#pragma omp single
    threads = omp_get_num_threads();
    uint64_t x = 0;
    for (int pass = 0; pass < 2; ++pass) {  // the first pass lets the clock settle
      timespec ts0{}, ts1{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts0);
      const double wall0 = k3::now_seconds();
#if defined(__x86_64__)
      const uint64_t c0 = __builtin_ia32_rdtsc();
      // Register + register: newer Intel cores fold a chain of immediate adds at rename (several
      // per cycle: a 2.6 GHz Xeon read 22 GHz with `add $1`); a register operand they cannot.
      const uint64_t one = 1;
      for (uint64_t i = 0; i < kIters; ++i)
        asm volatile(
            ".rept 32\n\t"
            "add %1, %0\n\t"
            ".endr"
            : "+r"(x)
            : "r"(one));
      const uint64_t c1 = __builtin_ia32_rdtsc();
#else
      const uint64_t c0 = 0, c1 = 0;
      for (uint64_t i = 0; i < 32 * kIters; ++i) asm volatile("" : "+r"(x));
#endif
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts1);
      const double wall = k3::now_seconds() - wall0;
      // This thread's CPU time: time the scheduler gave other processes does not count.
      const double dt = static_cast<double>(ts1.tv_sec - ts0.tv_sec) +
                        1e-9 * static_cast<double>(ts1.tv_nsec - ts0.tv_nsec);
      if (pass == 1) {
        sum += 32.0 * static_cast<double>(kIters) / dt / 1e9;
        tsc_sum += static_cast<double>(c1 - c0) / wall / 1e9;
      }
    }
  }
  if (tsc_ghz) *tsc_ghz = tsc_sum / threads;
  return sum / threads;
}

namespace {

constexpr int64_t kFmaIters = 20'000'000;

// The sum of every lane of a register loop's accumulators (a checksum that keeps the loop alive),
// read through memory so that no vector instruction of the loop's ISA is needed here.
template <class Lane, class Vector, size_t N>
double sum_lanes(const Vector (&accumulators)[N]) {
  Lane lanes[N * sizeof(Vector) / sizeof(Lane)];
  std::memcpy(lanes, accumulators, sizeof(accumulators));
  double sum = 0;
  for (const Lane v : lanes) sum += static_cast<double>(v);
  return sum;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) double fma_loop_avx512() {
  __m512 a[12];
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i));
  for (int64_t it = 0; it < kFmaIters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  return sum_lanes<float>(a);
}

__attribute__((target("avx2,fma"))) double fma_loop_avx2() {
  __m256 a[12];
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i));
  for (int64_t it = 0; it < kFmaIters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  return sum_lanes<float>(a);
}

// The integer kernels' multiply-add (K3_IDOT=1): vpdpbusd on AVX-512 VNNI, 64 u8 x s8 products a
// zmm; 12 independent accumulators.
__attribute__((target("avx512f,avx512vnni"))) double dot_loop_avx512() {
  __m512i a[12];
  const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(-5);
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
  for (int64_t it = 0; it < kFmaIters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
  return sum_lanes<int32_t>(a);
}

// AVX2 without VNNI: vpmaddubsw (32 u8 x s8 products, pair sums in int16) and vpmaddwd widening
// them, as the AVX2 integer kernels do (src/kernels/impl/mxfp4_avx2.cpp), added in int32. The
// accumulator is also the signed operand, so that nothing can be hoisted out of the loop (the
// values wrap; only the time counts).
__attribute__((target("avx2"))) double dot_loop_avx2() {
  __m256i a[12];
  const __m256i w = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_epi32(i);
  for (int64_t it = 0; it < kFmaIters; ++it)
    for (int i = 0; i < 12; ++i)
      a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(w, a[i]), ones));
  return sum_lanes<int32_t>(a);
}
#endif

double fma_loop_scalar() {
  float a[12];
  for (int i = 0; i < 12; ++i) a[i] = static_cast<float>(i);
  for (int64_t it = 0; it < kFmaIters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = std::fma(a[i], 0.999999f, 1e-7f);
  float sum = 0;
  for (float v : a) sum += v;
  return sum;
}

// G-operations per second of a register loop above on every OpenMP thread: 2 per product, `lanes`
// products per accumulator step, 12 accumulators x kFmaIters steps per call.
double register_loop_rate(double (*loop)(), int lanes) {
  double keep = 0;
  loop();  // warm-up: the wide units power up and the clock settles
  const double t0 = k3::now_seconds();
#pragma omp parallel reduction(+ : keep)
  keep += loop();
  const double dt = k3::now_seconds() - t0;
  if (keep == -1) std::printf("(checksum)\n");  // keeps the loops alive
  const double ops = 2.0 * lanes * 12.0 * static_cast<double>(kFmaIters) * omp_get_max_threads();
  return ops / dt / 1e9;
}

}  // namespace

double fma_peak_gflops(k3::Isa isa) {
#if defined(__x86_64__)
  if (isa == k3::Isa::kAvx512) return register_loop_rate(fma_loop_avx512, 16);
  if (isa == k3::Isa::kAvx2) return register_loop_rate(fma_loop_avx2, 8);
#endif
  return register_loop_rate(fma_loop_scalar, 1);
}

double int8_dot_peak_gops(k3::Isa isa) {
#if defined(__x86_64__)
  // u8 x s8 products per accumulator step.
  if (isa == k3::Isa::kAvx512) return register_loop_rate(dot_loop_avx512, 64);
  if (isa == k3::Isa::kAvx2) return register_loop_rate(dot_loop_avx2, 32);
#endif
  (void)isa;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Shared options

Option& Option::show_default() {
  option_->capture_default_str();
  return *this;
}

Option& Option::default_text(const std::string& text) {
  option_->default_str(text);
  return *this;
}

template <class T>
Option& Option::range(T lo, T hi) {
  option_->check(CLI::Range(lo, hi));
  return *this;
}

template Option& Option::range(int, int);
template Option& Option::range(int64_t, int64_t);
template Option& Option::range(double, double);

Option& Option::one_of(const std::vector<std::string>& values) {
  option_->check(CLI::IsMember(values));
  return *this;
}

Option& Option::one_of(const std::vector<int64_t>& values) {
  option_->check(CLI::IsMember(values));
  return *this;
}

Option& Option::required() {
  option_->required();
  return *this;
}

Option& Option::list(char delimiter) {
  option_->delimiter(delimiter);
  return *this;
}

Command::Command(CLI::App& parent, const std::string& name, const std::string& description)
    : app_(parent.add_subcommand(name, description)) {}

template <class T>
Option Command::option(const std::string& name, T& value, const std::string& help) {
  return Option(app_->add_option(name, value, help));
}

template Option Command::option(const std::string&, std::string&, const std::string&);
template Option Command::option(const std::string&, int&, const std::string&);
template Option Command::option(const std::string&, int64_t&, const std::string&);
template Option Command::option(const std::string&, size_t&, const std::string&);
template Option Command::option(const std::string&, double&, const std::string&);
template Option Command::option(const std::string&, std::vector<std::string>&, const std::string&);
template Option Command::option(const std::string&, std::vector<int>&, const std::string&);
template Option Command::option(const std::string&, std::vector<int64_t>&, const std::string&);
template Option Command::option(const std::string&, std::vector<size_t>&, const std::string&);

void Command::flag(const std::string& name, bool& value, const std::string& help) {
  app_->add_flag(name, value, help);
}

void add_common_options(Command& cmd, CommonOptions& o, bool with_isa) {
  if (with_isa)
    cmd.option("--isa", o.isa, "kernel variant: auto, scalar, avx2, avx512").show_default();
  cmd.option("--threads", o.threads, "OpenMP threads (0 = OpenMP default)").show_default();
}

k3::Isa apply_common_options(const CommonOptions& o) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  return resolve_isa(o.isa);
}

k3::Isa resolve_isa(const std::string& name) {
  if (name == "auto") return k3::best_isa();
  k3::Isa isa;
  if (!k3::parse_isa(name, &isa)) throw k3::Error("--isa: unknown variant '" + name + "'");
  if (!k3::isa_supported(isa))
    throw k3::Error(std::string("--isa ") + name + ": this CPU cannot run it");
  return isa;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints written once and reused

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
// The drive and the page cache

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
double drive_write_rate_dd(const std::string& dir, double probe_gb, uint64_t block_mib) {
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

// A prompt of real text (README.md, then docs/*.md in name order as far as needed, through the
// release tokenizer), or a fixed id pattern when the tokenizer is not beside the binary's source
// tree.
std::vector<int64_t> realistic_prompt(int64_t n, int64_t vocab, std::string* what) {
  std::error_code ec;
  const fs::path root =
      fs::read_symlink("/proc/self/exe", ec).parent_path().parent_path().parent_path();
  std::vector<int64_t> ids;
  try {
    const k3::text::Tokenizer tok = k3::text::Tokenizer::load(root / "tests/data/k3-release");
    std::vector<fs::path> texts = {root / "README.md"};
    std::vector<fs::path> docs;
    for (const auto& e : fs::directory_iterator(root / "docs", ec))
      if (e.path().extension() == ".md") docs.push_back(e.path());
    std::sort(docs.begin(), docs.end());
    texts.insert(texts.end(), docs.begin(), docs.end());
    size_t used = 0;
    for (; used < texts.size() && static_cast<int64_t>(ids.size()) < n; ++used) {
      std::ifstream in(texts[used]);
      const std::string text{std::istreambuf_iterator<char>(in), {}};
      for (int32_t id : tok.encode(text, false))
        if (static_cast<int64_t>(ids.size()) < n && id < vocab) ids.push_back(id);
    }
    *what = used <= 1
                ? "README.md, release tokenizer"
                : "README.md and " + std::to_string(used - 1) + " of docs/*.md, release tokenizer";
  } catch (const std::exception&) {
  }
  if (static_cast<int64_t>(ids.size()) < n) {
    *what = ids.empty() ? "fixed id pattern (no tokenizer found)"
                        : "fixed id pattern (README.md and docs/*.md give only " +
                              std::to_string(ids.size()) + " tokens)";
    ids.clear();
    for (int64_t i = 0; i < n; ++i) ids.push_back(1 + (i * 7919) % (vocab - 1));
  }
  return ids;
}

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

double direct_read_rate(const std::vector<fs::path>& files, uint64_t max_bytes, int depth,
                        std::string* why) {
  constexpr uint64_t kRequest = uint64_t{4} << 20;
  struct Request {
    int fd;
    uint64_t offset, bytes;
  };
  std::vector<int> fds;
  std::vector<Request> requests;  // every file front to back, up to max_bytes
  uint64_t planned = 0;
  for (const fs::path& path : files) {
    if (planned >= max_bytes) break;
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
      *why = path.string() + ": O_DIRECT open refused (" + std::strerror(errno) + ")";
      for (int f : fds) ::close(f);
      return 0;
    }
    fds.push_back(fd);
    const uint64_t size = std::min<uint64_t>(fs::file_size(path), max_bytes - planned);
    for (uint64_t off = 0; off < size; off += kRequest)
      requests.push_back({fd, off, std::min(kRequest, size - off)});
    planned += size;
  }
  // `depth` threads take the next request in order: `depth` requests in flight, sequential.
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> got{0};
  std::atomic<bool> failed{false};
  const double t0 = k3::now_seconds();
  std::vector<std::thread> threads;
  for (int t = 0; t < depth; ++t)
    threads.emplace_back([&] {
      void* buf = std::aligned_alloc(4096, kRequest);
      for (size_t i; !failed && (i = next++) < requests.size();) {
        const Request& r = requests[i];
        // The whole aligned block: a read past the end of the file comes back short.
        const ssize_t n = ::pread(r.fd, buf, kRequest, static_cast<off_t>(r.offset));
        if (n < 0)
          failed = true;
        else
          got += std::min<uint64_t>(static_cast<uint64_t>(n), r.bytes);
      }
      std::free(buf);
    });
  for (std::thread& t : threads) t.join();
  const double dt = k3::now_seconds() - t0;
  for (int f : fds) ::close(f);
  if (failed) {
    *why = "an O_DIRECT read was refused (" + std::string(std::strerror(errno)) + ")";
    return 0;
  }
  return dt > 0 ? static_cast<double>(got) / 1e9 / dt : 0;
}

// ---------------------------------------------------------------------------------------------
// Child processes

ChildRun run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  ChildRun r;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw k3::Error("pipe: " + std::string(std::strerror(errno)));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The environment: this one with `env` replacing the variables it names.
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& x) {
      return x.substr(0, x.find('=') + 1) == kv.substr(0, kv.find('=') + 1);
    });
    if (!replaced) envs.push_back(kv);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (const std::string& e : envs) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const double t0 = k3::now_seconds();
  const pid_t pid = ::fork();
  if (pid < 0) throw k3::Error("fork: " + std::string(std::strerror(errno)));
  if (pid == 0) {  // the child: only async-signal-safe calls until exec
    const int null = ::open("/dev/null", O_RDONLY);
    ::dup2(null, 0);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::execvpe(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    r.output.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  rusage ru{};
  while (::wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  r.wall_s = k3::now_seconds() - t0;
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.user_s =
      static_cast<double>(ru.ru_utime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec);
  r.sys_s =
      static_cast<double>(ru.ru_stime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_stime.tv_usec);
  r.minor_faults = ru.ru_minflt;
  r.major_faults = ru.ru_majflt;
  r.peak_rss_bytes = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  r.storage_read_bytes = static_cast<uint64_t>(ru.ru_inblock) * 512;
  return r;
}

void print_child(const char* label, const ChildRun& r) {
  std::printf(
      "%s: wall %.3f s | user %.3f s, sys %.3f s | page faults minor %ld, major %ld | peak RSS "
      "%.1f MB | read from storage %.1f MB | exit %d\n",
      label, r.wall_s, r.user_s, r.sys_s, r.minor_faults, r.major_faults,
      static_cast<double>(r.peak_rss_bytes) / 1e6, static_cast<double>(r.storage_read_bytes) / 1e6,
      r.status);
  std::fflush(stdout);
}

}  // namespace k3bench

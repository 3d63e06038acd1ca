// bench/bench_common.h — what every k3_bench subcommand shares: the RESULT lines, the machine
// facts, the options every subcommand takes (--isa, --threads), timing, the DRAM probe, the
// drive probes and the page cache, child processes, and the checkpoints written once and reused.
// Each subcommand lives in its own bench/<name>_bench.cpp and registers itself with one
// `Subcommand register_<name>(CLI::App&)`; bench/k3_bench.cpp holds main() and the table.
// Only bench_common.cpp and k3_bench.cpp include CLI11: its header alone is ~5 s of -O3 compile
// in every file that includes it (namespace-scope validator objects, code in each file), so the
// subcommands declare their options through Command / Option below (docs/testing.md §6).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/isa.h"
#include "util/sys.h"

#ifndef K3_BENCH_SOURCE_DIR
#define K3_BENCH_SOURCE_DIR "bench"
#endif

namespace k3bench {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Subcommands

}  // namespace k3bench
namespace CLI {
class App;
class Option;
}  // namespace CLI
namespace k3bench {

// One option of a subcommand, for setting what --help shows and what the value may be.
class Option {
 public:
  explicit Option(CLI::Option* option) : option_(option) {}
  Option& show_default();                         // --help prints the bound value's default
  Option& default_text(const std::string& text);  // --help prints this as the default
  template <class T>
  Option& range(T lo, T hi);  // lo <= value <= hi; T: int, int64_t or double
  Option& one_of(const std::vector<std::string>& values);
  Option& one_of(const std::vector<int64_t>& values);
  Option& required();
  Option& list(char delimiter);  // a vector option: "a,b,c" holds three values

 private:
  CLI::Option* option_;
};

// A subcommand's command line: options bound to its arguments.
class Command {
 public:
  Command(CLI::App& parent, const std::string& name, const std::string& description);
  // "--name" or a positional "name". T: std::string, int, int64_t, size_t, double, or a
  // std::vector of one of them (bench_common.cpp instantiates these).
  template <class T>
  Option option(const std::string& name, T& value, const std::string& help);
  void flag(const std::string& name, bool& value, const std::string& help);
  CLI::App* app() const { return app_; }

 private:
  CLI::App* app_;
};

// One subcommand: its command line and what runs it once parsed.
struct Subcommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};
using RegisterFn = Subcommand (*)(CLI::App&);

// The options every engine-driving subcommand takes.
struct CommonOptions {
  std::string isa = "auto";
  int threads = 0;
};

// Registers --isa (when `with_isa`) and --threads on `cmd`, bound to `o`.
void add_common_options(Command& cmd, CommonOptions& o, bool with_isa = true);

// Sets the OpenMP thread count from --threads and resolves --isa (throws k3::Error when the CPU
// cannot run it).
k3::Isa apply_common_options(const CommonOptions& o);

// "auto" -> the best ISA of this CPU; else the named one, checked.
k3::Isa resolve_isa(const std::string& name);

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

extern std::vector<Result> g_results;

void add_result(const std::string& name, double value, const std::string& unit, double ratio,
                double cpu = 1.0);
// A GB/s figure whose ratio to the DRAM reference is computed once every probe has run.
void add_bandwidth(const std::string& name, double gbs, double cpu);
// Prints every figure as `RESULT <name> <value> <unit> ratio=<r>`.
void print_results();

// ---------------------------------------------------------------------------------------------
// Machine facts

std::string trim(std::string s);
std::string read_line(const std::string& path);

struct CacheFact {
  int level = 0;
  uint64_t bytes = 0;
  std::string shared_with;
};

// The highest-level data/unified cache of cpu0 from sysfs (bytes 0 when unreadable).
CacheFact last_level_cache();
uint64_t mem_total_bytes();
// The "== machine" block: cpu, cores, memory, OpenMP threads, load average, ISA, LLC.
void print_machine(k3::Isa isa);

// ---------------------------------------------------------------------------------------------
// Deterministic random data (parallel, independent of the thread count)

uint64_t splitmix(uint64_t& s);
// Bytes uniform in [lo, hi].
void fill_bytes(uint8_t* p, size_t n, uint64_t seed, int lo, int hi);
// Floats uniform in [-1, 1).
void fill_floats(float* p, size_t n, uint64_t seed);

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

double process_cpu_seconds();

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
// DRAM probe: threaded sum of a >= 1 GiB float array, best of `passes`; GB/s of the best pass,
// *cpu_share as in Timing.
double dram_probe(size_t bytes, int passes, double* cpu_share);

// The same probe with its array allocated and first-touched once, for probes repeated between a
// kernel's passes (the paired ratios of bench/kernels_bench.cpp).
class DramProbe {
 public:
  explicit DramProbe(size_t bytes);
  double run(int passes, double* cpu_share);  // GB/s of the best pass over the whole array
  // GB/s of one pass over the next `bytes` of the array (at most all of it), the windows taken
  // in turn, wrapping: a window is re-read only after the rest of the array.
  double window(size_t bytes);

 private:
  static constexpr size_t kBlock = size_t{1} << 14;  // floats per scheduling block (64 KiB)
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> array_;
  size_t blocks_;
  size_t next_ = 0;  // first block of the next window
};

// ---------------------------------------------------------------------------------------------
// Compute probes

// The core clock in GHz while every OpenMP thread runs: each thread times a chain of dependent
// register adds (one cycle of latency each on every x86-64 core) against its own CPU time
// (CLOCK_THREAD_CPUTIME_ID, so time given to other processes does not count), and the mean over
// threads is returned; *tsc_ghz gets the time-stamp counter's ticks per wall second over the
// same loop (the TSC runs at a constant rate, not the core clock, on current CPUs; under a
// hypervisor neither is exact). Cycles spent = CPU seconds x this.
double core_clock_ghz(double* tsc_ghz);

// The FMA peak of `isa` in GFLOP/s over every OpenMP thread: a register-only loop of independent
// fused multiply-adds (12 accumulators, enough to cover 2 ports x 4-5 cycles of latency), 2
// flops per lane per FMA: 32 per instruction on AVX-512, 16 on AVX2, 2 for scalar.
double fma_peak_gflops(k3::Isa isa);
// The integer dot-product peak of `isa` in GOP/s (2 per u8 x s8 product) over every OpenMP
// thread, for the kernels K3_IDOT=1 runs: vpdpbusd (64 products) on AVX-512 VNNI; vpmaddubsw +
// vpmaddwd + vpaddd (32) on AVX2; 0 for scalar code.
double int8_dot_peak_gops(k3::Isa isa);

// ---------------------------------------------------------------------------------------------
// Checkpoints written once and reused

// <build>/bench-slice for a binary at <build>/bench/k3_bench.
std::string default_slice_dir();
// Writes a `k3_synth --preset` checkpoint into `dir` unless an identical one is already there
// (its stamp file names the preset, the dimensions and the seed).
void ensure_preset(const std::string& dir, const std::string& preset, int64_t layers,
                   int64_t experts);
void ensure_slice(const std::string& dir, int64_t layers, int64_t experts);
// Writes the random-weights demo checkpoint (k3_synth --preset demo) into `dir` when it has none.
void ensure_demo(const std::string& dir);

// ---------------------------------------------------------------------------------------------
// The drive and the page cache

// The checkpoint's shards, largest first: {bytes, path}.
std::vector<std::pair<uintmax_t, fs::path>> largest_shards(const std::string& dir);
// Runs a dd command line; its wall seconds, or 0 (with dd's message printed) when it fails.
double timed_dd(const std::string& cmd);
// The drive's sequential O_DIRECT rate over the checkpoint's largest shards (dd iflag=direct,
// bs=4M), in GB/s; 0 when dd is unavailable.
double drive_rate_dd(const std::string& dir, double probe_gb, std::string* what);
// The drive's O_DIRECT write rate: dd writes `probe_gb` of zeros to a scratch file in `dir`
// (fdatasync'd, then removed). 0 when dd fails.
double drive_write_rate_dd(const std::string& dir, double probe_gb, uint64_t block_mib = 4);
// The same drive read the way the engine reads it: O_DIRECT through k3::ReadQueue (io_uring when
// available), `depth` requests of `request_bytes` in flight, sequential over the largest shards.
double drive_rate_queue(const std::string& dir, double probe_gb, int depth, uint64_t request_bytes,
                        std::string* engine);
// A prompt of real text (README.md, then docs/*.md as far as needed, through the release
// tokenizer), or a fixed id pattern when the tokenizer is not beside the binary's source tree or
// the texts hold fewer than n tokens (`what` says which).
std::vector<int64_t> realistic_prompt(int64_t n, int64_t vocab, std::string* what);
// Drops the page cache of every regular file in `dir` (posix_fadvise DONTNEED), so the next read
// comes from the drive (or whatever cache sits below the page cache).
void drop_pages(const std::string& dir);
// Bytes this process has read from storage so far (/proc/self/io read_bytes: O_DIRECT and
// io_uring reads included, page-cache hits not).
uint64_t storage_read_bytes();
uint64_t tensor_bytes_in(const std::string& dir);

// The sequential O_DIRECT read rate of `files` (GB/s): the files read whole, one after the
// other, front to back, in 4 MiB requests taken in order by `depth` threads (`depth` requests in
// flight), up to `max_bytes` in all. O_DIRECT bypasses the page cache, so a warm
// cache does not inflate it. 0 with *why set when a file refuses O_DIRECT (tmpfs, some overlays).
double direct_read_rate(const std::vector<fs::path>& files, uint64_t max_bytes, int depth,
                        std::string* why);

// ---------------------------------------------------------------------------------------------
// Child processes

// One finished child: its exit status, wall seconds, and its own resource use (wait4: this
// child alone, not every child of the bench).
struct ChildRun {
  int status = -1;  // exit status, 128 + signal when killed, 127 when it could not start
  double wall_s = 0, user_s = 0, sys_s = 0;
  long minor_faults = 0, major_faults = 0;
  uint64_t peak_rss_bytes = 0;
  uint64_t storage_read_bytes = 0;  // ru_inblock x 512: bytes read from storage (not cache hits)
  std::string output;               // stdout and stderr together
};

// Runs argv[0] (searched in PATH) with `argv`, `env` ("NAME=value") added to this environment,
// stdin from /dev/null, stdout and stderr captured together.
ChildRun run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});
// Prints one child's figures as an indented block (wall, user, sys, faults, peak RSS, read).
void print_child(const char* label, const ChildRun& r);

}  // namespace k3bench

// bench/load_bench.cpp — `k3_bench load` (benchmarks, not tests).
//
//   k3_bench load [MODEL_DIR] [--peer 'COMMAND'] [--peer-dir DIR] [--cold] [--runs N]
//                 [--probe-gb G] [--kimi PATH] [--isa I] [--threads N]
//       The load of MODEL_DIR (default assets/k3-mini) the way kimi_k3 does it: `kimi_k3 MODEL_DIR
//       --ids 1 -n 1 --stats` in a child process, so wait4 gives that child's own user and sys
//       seconds, page faults and peak RSS. In one run: the engine's load seconds (the summary
//       line's "load X s") and GB/s = source bytes of the resident weights (every text tensor of
//       the files but the routed experts, read on demand, and the embedding, read a row at a
//       time) / load s; the drive probe
//       (O_DIRECT sequential read of the model's files, 8 x 4 MiB in flight); the quantization
//       work; with --peer the same child figures for the peer command (run by /bin/sh -c), and
//       its load where it prints one (kimi_k3's "load X s", colibri's "init done in Xs"), else
//       its wall time.
//       --cold drops the page cache of every file of MODEL_DIR (and --peer-dir) before each run
//       with posix_fadvise(DONTNEED) after fdatasync (what the drive delivers below the page
//       cache is not controlled). Then
//         RESULT load <s> s ratio=R,  R = floor / measured,
//         floor = max(resident bytes / drive probe, quantization work / cores)
//       Quantization work is estimated in process: the largest resident float matrix but the head
//       (at most 16 Mi elements of it), widened from BF16 into memory already touched and
//       quantized to the run's dense width (the B of kimi_k3's "bits B/M/H"; MLA's width M is
//       not told apart) on one thread, best of 3, per element, times those matrices' elements;
//       plus the head the same way at its width H. It leaves out what a load does besides
//       widening and quantizing (parsing, norms, the tokenizer, first touch of memory).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "bench_common.h"
#include "io/model_files.h"
#include "kernels/convert.h"
#include "kernels/quant.h"
#include "util/error.h"

namespace k3bench {
namespace {

struct LoadArgs : CommonOptions {
  std::string model_dir = std::string(K3_BENCH_SOURCE_DIR) + "/../assets/k3-mini";
  std::string peer;      // a shell command run like ours, for its child figures
  std::string peer_dir;  // the peer's files whose pages --cold drops ("" = none besides ours)
  std::string kimi;      // "" = <build>/apps/kimi_k3
  bool cold = false;
  int runs = 1;
  double probe_gb = 4;
};

// What the files hold: the resident weights (read at load) and the routed experts (on demand).
struct Weights {
  uint64_t resident_bytes = 0, expert_bytes = 0;
  int64_t resident_tensors = 0;
  uint64_t float_elements = 0;  // elements of resident float matrices (the quantizer's input)
  std::string largest;          // the largest resident float matrix but the head
  int64_t rows = 0, cols = 0;
  uint64_t head_elements = 0;  // lm_head's, when it is a float matrix (quantized at the head width)
  int64_t head_rows = 0, head_cols = 0;
  std::vector<fs::path> files;
};

Weights read_weights(const std::string& dir) {
  const k3::ModelFiles files(dir);
  Weights w;
  for (const auto& shard : files.shards()) {
    w.files.emplace_back(shard->path());
    for (const k3::TensorInfo& t : shard->tensors()) {
      if (k3::is_padding_tensor(t.name) || k3::is_vision_tensor(t.name)) continue;
      // The embedding is read a row at a time when used, not at load (src/model/weights.cpp).
      if (t.name.ends_with("embed_tokens.weight")) continue;
      if (t.name.find("block_sparse_moe.experts.") != std::string::npos) {
        w.expert_bytes += t.nbytes;
        continue;
      }
      w.resident_bytes += t.nbytes;
      ++w.resident_tensors;
      const bool is_float =
          t.dtype == k3::DType::kBF16 || t.dtype == k3::DType::kF16 || t.dtype == k3::DType::kF32;
      if (is_float && t.shape.size() == 2 && t.shape[0] >= 64 && t.shape[1] >= 64) {
        w.float_elements += t.numel();
        if (t.name.ends_with("lm_head.weight")) {
          w.head_elements = t.numel();
          w.head_rows = t.shape[0];
          w.head_cols = t.shape[1];
        } else if (t.shape[0] * t.shape[1] > w.rows * w.cols) {
          w.rows = t.shape[0];
          w.cols = t.shape[1];
          w.largest = t.name;
        }
      }
    }
  }
  return w;
}

// Seconds per element of widening BF16 and quantizing to `bits` on one thread (best of 3).
double quantize_seconds_per_element(int64_t rows, int64_t cols, int bits, k3::Isa isa,
                                    int64_t* used_rows) {
  const int64_t cap = int64_t{16} << 20;
  rows = std::max<int64_t>(1, std::min(rows, cap / std::max<int64_t>(1, cols)));
  *used_rows = rows;
  const size_t n = static_cast<size_t>(rows * cols);
  std::vector<float> f(n);
  fill_floats(f.data(), n, 99);
  std::vector<uint8_t> bf16(2 * n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &f[i], 4);
    const uint16_t h = static_cast<uint16_t>(u >> 16);
    std::memcpy(&bf16[2 * i], &h, 2);
  }
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  double best = 1e30;
  for (int pass = 0; pass < 3; ++pass) {
    k3::WeightMatrix W;
    W.rows = rows;
    W.cols = cols;
    W.f32.resize(n);  // allocated and touched before the clock: only the conversion is timed
    const double t0 = k3::now_seconds();
    if (k3::widen_bf16(bf16.data(), n, W.f32.data()) != n)
      throw k3::Error("load bench: a non-finite test weight");
    k3::quantize_matrix(W, bits, k3::kernel_table(isa));
    best = std::min(best, k3::now_seconds() - t0);
  }
  omp_set_num_threads(threads);
  return best / static_cast<double>(n);
}

// The first number after `pattern` (a regex with one group) in `text`, or NaN.
double find_number(const std::string& text, const char* pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(pattern))) return std::nan("");
  return std::stod(m[1].str());
}

std::string last_lines(const std::string& s, int n) {
  size_t pos = s.size();
  for (int i = 0; i < n && pos > 0; ++i) pos = s.rfind('\n', pos - 1);
  return pos == std::string::npos ? s : s.substr(pos);
}

int run_load(const LoadArgs& a) {
  const k3::Isa isa = apply_common_options(a);
  print_machine(isa);
  const int cores = omp_get_max_threads();
  std::string kimi = a.kimi;
  if (kimi.empty()) {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (ec) throw k3::Error("cannot find kimi_k3 beside /proc/self/exe; pass --kimi PATH");
    kimi = (exe.parent_path().parent_path() / "apps" / "kimi_k3").string();
  }
  if (!fs::exists(kimi)) throw k3::Error(kimi + ": no kimi_k3 there (build it, or pass --kimi)");

  const std::string dir = fs::path(a.model_dir).lexically_normal().string();
  const Weights w = read_weights(dir);
  std::printf(
      "\n== load of %s\nweights: %lld resident tensors, %.1f MB in the files (read at load); "
      "routed experts %.1f MB and the embedding (read on demand, not at load)\n",
      dir.c_str(), static_cast<long long>(w.resident_tensors),
      static_cast<double>(w.resident_bytes) / 1e6, static_cast<double>(w.expert_bytes) / 1e6);

  std::string why;
  const double drive = direct_read_rate(w.files, static_cast<uint64_t>(a.probe_gb * 1e9), 8, &why);
  if (drive > 0)
    std::printf(
        "drive probe: O_DIRECT sequential read of the model's files, 8 x 4 MiB in flight: "
        "%.3f GB/s\n",
        drive);
  else
    std::printf("drive probe: unavailable (%s); the floor is the quantization work alone\n",
                why.c_str());
  if (a.cold)
    std::printf(
        "cold: the page cache of every file of %s%s%s is dropped (fdatasync, posix_fadvise "
        "DONTNEED) before each run\n",
        dir.c_str(), a.peer_dir.empty() ? "" : " and ", a.peer_dir.c_str());

  // Ours: kimi_k3, one prompt token, no new token (the summary line's "load X s").
  std::vector<std::string> argv = {kimi, dir, "--ids", "1", "-n", "1", "--stats"};
  if (a.isa != "auto") argv.insert(argv.end(), {"--isa", a.isa});
  if (a.threads > 0) argv.insert(argv.end(), {"--threads", std::to_string(a.threads)});
  std::string command;
  for (const std::string& s : argv) command += (command.empty() ? "" : " ") + s;
  std::printf("ours: %s\n", command.c_str());
  ChildRun best;
  double best_load = 1e30;
  int bits = 8, head_bits = 8;
  for (int i = 0; i < a.runs; ++i) {
    if (a.cold) drop_pages(dir);
    const ChildRun r = run_child(argv);
    const double load = find_number(r.output, R"(\bload ([0-9.]+) s)");
    if (r.status != 0 || std::isnan(load))
      throw k3::Error("kimi_k3 exited " + std::to_string(r.status) +
                      (std::isnan(load) ? " without a \"load X s\" figure" : "") + ":" +
                      last_lines(r.output, 6));
    if (const double b = find_number(r.output, R"(\bbits ([0-9]+)/)"); !std::isnan(b))
      bits = static_cast<int>(b);
    if (const double b = find_number(r.output, R"(\bbits [0-9]+/[0-9]+/([0-9]+))"); !std::isnan(b))
      head_bits = static_cast<int>(b);
    std::printf("run %d: load %.3f s = %.3f GB/s of the resident weights' file bytes\n", i + 1,
                load, static_cast<double>(w.resident_bytes) / 1e9 / load);
    print_child("  kimi_k3", r);
    if (load < best_load) best_load = load, best = r;
  }

  // The floor.
  int64_t used_rows = 0, head_used_rows = 0;
  const uint64_t dense_elements = w.float_elements - w.head_elements;
  const double per_element =
      dense_elements ? quantize_seconds_per_element(w.rows, w.cols, bits, isa, &used_rows) : 0;
  const double per_head_element =
      w.head_elements
          ? quantize_seconds_per_element(w.head_rows, w.head_cols, head_bits, isa, &head_used_rows)
          : 0;
  const double work = per_element * static_cast<double>(dense_elements) +
                      per_head_element * static_cast<double>(w.head_elements);
  const double read_floor = drive > 0 ? static_cast<double>(w.resident_bytes) / 1e9 / drive : 0.0;
  const double work_floor = work / cores;
  const double floor_s = std::max(read_floor, work_floor);
  if (dense_elements)
    std::printf(
        "quantization work: %s (%lld x %lld, %lld rows timed) widened from BF16 and quantized to "
        "%d bits on 1 thread: %.2f ns/element x %.1f M elements of resident float matrices but "
        "the head = %.3f core-s\n",
        w.largest.c_str(), static_cast<long long>(w.rows), static_cast<long long>(w.cols),
        static_cast<long long>(used_rows), bits, per_element * 1e9,
        static_cast<double>(dense_elements) / 1e6,
        per_element * static_cast<double>(dense_elements));
  if (w.head_elements)
    std::printf(
        "%s (%lld x %lld, %lld rows timed) at its width, %d bits: %.2f ns/element x %.1f "
        "M elements = %.3f core-s; %.3f core-s in all\n",
        // Alone (a container whose other matrices are prepared) it opens the figure.
        dense_elements ? "  the head" : "quantization work: the head, widened from BF16",
        static_cast<long long>(w.head_rows), static_cast<long long>(w.head_cols),
        static_cast<long long>(head_used_rows), head_bits, per_head_element * 1e9,
        static_cast<double>(w.head_elements) / 1e6,
        per_head_element * static_cast<double>(w.head_elements), work);
  if (!w.float_elements)
    std::printf("quantization work: none (no resident float matrices: a prepared container)\n");
  std::printf(
      "floor: max(bytes / drive = %.3f s, work / %d cores = %.3f s) = %.3f s; best load %.3f s "
      "= %.2fx the floor\n",
      read_floor, cores, work_floor, floor_s, best_load, best_load / floor_s);
  const double gbps = static_cast<double>(w.resident_bytes) / 1e9 / best_load;
  add_result("load", best_load, "s", floor_s / best_load);
  add_result("load_gbps", gbps, "GB/s", drive > 0 ? gbps / drive : std::nan(""));
  add_result("load_drive_probe", drive, "GB/s", std::nan(""));
  add_result("load_floor", floor_s, "s", std::nan(""));
  add_result("load_user", best.user_s, "s", std::nan(""));
  add_result("load_sys", best.sys_s, "s",
             best.user_s > 0 ? best.sys_s / best.user_s : std::nan(""));
  add_result("load_minor_faults", static_cast<double>(best.minor_faults), "faults", std::nan(""));
  add_result("load_major_faults", static_cast<double>(best.major_faults), "faults", std::nan(""));
  add_result("load_peak_rss", static_cast<double>(best.peak_rss_bytes) / 1e6, "MB", std::nan(""));

  if (!a.peer.empty()) {
    std::printf("\npeer: %s\n", a.peer.c_str());
    ChildRun pbest;
    double pbest_s = 1e30;
    bool own_load = false;
    for (int i = 0; i < a.runs; ++i) {
      if (a.cold) {
        drop_pages(dir);
        if (!a.peer_dir.empty()) drop_pages(a.peer_dir);
      }
      const ChildRun r = run_child({"/bin/sh", "-c", a.peer});
      if (r.status != 0)
        throw k3::Error("the peer exited " + std::to_string(r.status) + ":" +
                        last_lines(r.output, 6));
      // A peer that prints its load is compared on that: "load X s" (kimi_k3's summary) or "init
      // done in Xs" (colibri's kimi_k3.c, docs/streaming.md §1.12); else on its wall.
      double load = find_number(r.output, R"(\bload ([0-9.]+) s)");
      if (std::isnan(load)) load = find_number(r.output, R"(\binit done in ([0-9.]+) ?s)");
      own_load = !std::isnan(load);
      const double s = own_load ? load : r.wall_s;
      std::printf("run %d: %s %.3f s\n", i + 1, own_load ? "load" : "wall (no load printed)", s);
      print_child("  peer", r);
      if (s < pbest_s) pbest_s = s, pbest = r;
    }
    std::printf("ours / peer: load %.2fx (%s), wall %.2fx, user %.2fx, sys %.2fx, peak RSS %.2fx\n",
                best_load / pbest_s, own_load ? "both the printed load" : "ours' load vs its wall",
                best.wall_s / pbest.wall_s, best.user_s / std::max(pbest.user_s, 1e-9),
                best.sys_s / std::max(pbest.sys_s, 1e-9),
                static_cast<double>(best.peak_rss_bytes) /
                    static_cast<double>(std::max<uint64_t>(pbest.peak_rss_bytes, 1)));
    add_result("load_peer", pbest_s, "s", pbest_s / best_load);
    add_result("load_peer_user", pbest.user_s, "s", std::nan(""));
    add_result("load_peer_sys", pbest.sys_s, "s", std::nan(""));
    add_result("load_peer_minor_faults", static_cast<double>(pbest.minor_faults), "faults",
               std::nan(""));
    add_result("load_peer_major_faults", static_cast<double>(pbest.major_faults), "faults",
               std::nan(""));
    add_result("load_peer_peak_rss", static_cast<double>(pbest.peak_rss_bytes) / 1e6, "MB",
               static_cast<double>(pbest.peak_rss_bytes) /
                   static_cast<double>(std::max<uint64_t>(best.peak_rss_bytes, 1)));
  }
  print_results();
  return 0;
}

}  // namespace

Subcommand register_load(CLI::App& app) {
  auto a = std::make_shared<LoadArgs>();
  Command c(
      app, "load",
      "kimi_k3's load in a child: s, GB/s, drive probe, user/sys, page faults, peak RSS, against "
      "max(bytes / drive, quantization / cores) and a --peer");
  c.option("model_dir", a->model_dir, "the checkpoint").default_text("assets/k3-mini");
  c.option("--peer", a->peer, "a command (sh -c) whose load to compare, e.g. another engine")
      .default_text("none");
  c.option("--peer-dir", a->peer_dir, "the peer's model files, dropped too by --cold")
      .default_text("none");
  c.flag("--cold", a->cold, "drop the files' page cache (posix_fadvise DONTNEED) before each run");
  c.option("--runs", a->runs, "runs of each; the fastest is reported").range(1, 100).show_default();
  c.option("--probe-gb", a->probe_gb, "at most this much read by the drive probe (GB)")
      .show_default();
  c.option("--kimi", a->kimi, "the kimi_k3 binary").default_text("<build>/apps/kimi_k3");
  add_common_options(c, *a);
  return {c.app(), [a] { return run_load(*a); }};
}

}  // namespace k3bench

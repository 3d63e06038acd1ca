// bench/container_bench.cpp — `k3_bench container` (benchmarks, not tests).
//
//   k3_bench container [--layers N] [--experts E] [--bits 4|8] [--tokens T] [--dir DIR]
//       The repacked container (docs/container.md) against the snapshot it came from, on a slice
//       checkpoint: the drive's read and write rates, the repack's GB/s against them, cold and
//       warm load of each layout (and K3_MMAP=1), bytes per streamed expert read and s/token.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "engine/engine.h"
#include "engine/internal.h"
#include "engine/sampler.h"
#include "experts/expert_cache.h"
#include "repack_lib.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3bench {
namespace {

// ---------------------------------------------------------------------------------------------
// container: the repacked container (docs/container.md) against the snapshot it came from, on
// the same slice: load time cold (pages dropped), repack throughput vs the drive's O_DIRECT read
// rate, bytes read from the drive per streamed expert and decode s/token.

struct ContainerArgs : CommonOptions {
  int64_t layers = 2;      // slice layers (the first is dense)
  int64_t experts = 64;    // slice routed experts per MoE layer
  int bits = 4;            // K3_BITS of the load-time path and k3_repack --bits
  int64_t tokens = 6;      // decode tokens per layout
  double expert_gb = 0.3;  // expert cache budget: small, so decode streams
  double probe_gb = 2;     // bytes dd reads for the drive rate
  std::string dir;
};

int run_container(const ContainerArgs& a) {
  const k3::Isa isa = apply_common_options(a);
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

}  // namespace

Subcommand register_container(CLI::App& app) {
  auto a = std::make_shared<ContainerArgs>();
  Command c(
      app, "container",
      "repacked container vs snapshot: cold load time, repack GB/s vs the drive, expert reads");
  c.option("--layers", a->layers, "slice layers").show_default();
  c.option("--experts", a->experts, "slice routed experts").show_default();
  c.option("--bits", a->bits, "K3_BITS / k3_repack --bits").one_of({4, 8}).show_default();
  c.option("--tokens", a->tokens, "decode tokens per layout").show_default();
  c.option("--expert-gb", a->expert_gb, "expert cache budget (GB)").show_default();
  c.option("--probe-gb", a->probe_gb, "bytes dd reads for the drive rate (GB)").show_default();
  c.option("--dir", a->dir, "slice directory").default_text("<build>/bench-slice-container");
  add_common_options(c, *a);
  return {c.app(), [a] {
            if (a->layers < 2 || a->experts < 1 || a->tokens < 1)
              throw k3::Error("--layers must be >= 2; --experts, --tokens >= 1");
            return run_container(*a);
          }};
}

}  // namespace k3bench

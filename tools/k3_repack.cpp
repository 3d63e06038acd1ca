// k3_repack — converts a Hugging Face Kimi K3 snapshot into the repacked container
// (docs/container.md): dense matrices pre-quantised exactly as the engine does at load, routed
// experts byte-identical in aligned (layer, expert id) records, vision dropped. Resumable:
// completed shards are kept, the index is rebuilt from all of them on every run.
//   k3_repack <hf_src> <dst> [--bits 8|4|32] [--mla-bits N] [--head-bits N] [--shards LIST]
//             [--layout aligned|packed] [--stripe DIR1,DIR2,...] [--verify-full] [--jobs N]
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "apps/stop_signals.h"
#include "options/options.h"
#include "options/tool_cli.h"
#include "repack_lib.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Converts a Hugging Face Kimi K3 snapshot into the engine's repacked container "
      "(docs/container.md): dense matrices pre-quantised exactly as the engine does at load, "
      "routed experts byte-identical in aligned (layer, expert) records, vision dropped. "
      "Resumable: completed shards are kept and the index is rebuilt from all of them.",
      "k3_repack"};
  app.set_version_flag("--version", k3::version_text("k3_repack"));
  k3::repack::Options o;
  std::string shards, stripe;
  app.add_option("source", o.source, "Hugging Face snapshot directory")->required();
  app.add_option("dest", o.dest, "container directory (created when missing)")->required();
  app.add_option("--bits", o.bits,
                 "KDA q/k/v/g/o, latent down/up, shared experts, dense MLP: 4 = int4 g64, 8 = "
                 "int8, 32 = source dtype")
      ->check(CLI::IsMember({4, 8, 32}))
      ->capture_default_str()
      ->group("widths");
  app.add_option("--mla-bits", o.mla_bits, "MLA projections")
      ->check(CLI::IsMember({4, 8, 32}))
      ->default_str("max(bits, 8)")
      ->group("widths");
  app.add_option("--head-bits", o.head_bits, "lm_head")
      ->check(CLI::IsMember({4, 8, 32}))
      ->default_str("max(bits, 8)")
      ->group("widths");
  app.add_option("--layout", o.layout,
                 "aligned: expert records on 4 KiB boundaries (one exact O_DIRECT read); packed: "
                 "back to back")
      ->check(CLI::IsMember({"aligned", "packed"}))
      ->capture_default_str()
      ->group("layout");
  app.add_option("--stripe", stripe,
                 "spread expert records round-robin (expert e -> DIR[e % N]) over these "
                 "directories, one per drive; run the engine with K3_DIRS=DIR1,DIR2,...")
      ->type_name("DIR,DIR,...")
      ->group("layout");
  app.add_option("--shards", shards,
                 "source shard numbers to convert, e.g. 1,3,5-8 (disjoint runs add up)")
      ->type_name("LIST")
      ->default_str("all")
      ->group("work");
  app.add_option("--jobs", o.jobs, "quantisation threads")
      ->check(CLI::Range(1, 1024))
      ->default_str("all cores")
      ->group("work");
  app.add_flag("--verify-full", o.verify_full,
               "re-read every written byte and compare with the source (quantised matrices "
               "re-derived)")
      ->group("work");
  app.add_option("--kill-at-byte", o.kill_at_byte,
                 "testing: SIGKILL itself after this many output bytes (fault injection)")
      ->group("");
  const k3::ToolArgs parsed = k3::parse_tool_args(app, {argv + 1, argv + argc});
  if (parsed.status >= 0) return parsed.finish();

  // SIGINT / SIGTERM: exit 130 / 143 at once (apps/stop_signals.h); a rerun checks what the cut
  // left and rewrites what fails, as after a kill.
  k3::apps::install_stop_handlers(k3::apps::StopMode::at_once);
  try {
    if (!shards.empty()) o.shards = k3::repack::parse_shard_list(shards);
    if (!stripe.empty()) {
      size_t start = 0;
      while (start <= stripe.size()) {
        const size_t comma = stripe.find(',', start);
        const std::string d =
            stripe.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (d.empty()) throw k3::Error("--stripe: empty directory name in \"" + stripe + "\"");
        o.stripe.push_back(d);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    }
    // Per-shard lines on a terminal (next to the progress bar); a log gets the progress lines
    // every few seconds and the one-line summary below.
    const bool tty = ::isatty(STDERR_FILENO) != 0;
    const k3::repack::Summary s = k3::repack::run(o, [tty](const std::string& line) {
      if (tty) std::fprintf(stderr, "%s\n", line.c_str());
    });
    for (const std::string& line : s.damaged)
      std::fprintf(stderr, "k3_repack: %s; rewritten\n", line.c_str());
    std::printf(
        "k3_repack: %s -> %s: %lld of %lld shards complete (%lld written, %lld kept), %.3f GB "
        "read, %.3f GB written in %.1f s (%.2f GB/s)%s\n",
        o.source.c_str(), o.dest.c_str(), static_cast<long long>(s.shards_present),
        static_cast<long long>(s.shards_total), static_cast<long long>(s.shards_written),
        static_cast<long long>(s.shards_kept), static_cast<double>(s.bytes_read) / 1e9,
        static_cast<double>(s.bytes_written) / 1e9, s.seconds,
        s.seconds > 0 ? static_cast<double>(s.bytes_written) / 1e9 / s.seconds : 0.0,
        o.verify_full ? (", " + std::to_string(s.tensors_verified) + " tensors verified").c_str()
                      : "");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3_repack: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

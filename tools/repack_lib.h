// tools/repack_lib.h — k3_repack: one streaming pass from a Hugging Face snapshot to the repacked
// container (docs/container.md): dense matrices stored pre-quantised with the engine's own
// quantisers (kernels/quant.h), routed experts byte-identical in (layer, expert id) records laid
// out for O_DIRECT, vision dropped, every file written temp + fsync + rename, resumable.
// Owns: tensor classes, the container layout, resume and verification. Does not own: the
// safetensors format (io/safetensors*.h) or the container record's keys (io/container.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "util/progress.h"

namespace k3::repack {

struct Options {
  std::string source;  // Hugging Face snapshot directory
  std::string dest;    // container directory (created when missing)
  int bits = 8;        // "bits" class (KDA q/k/v/g/o, latent, shared experts, dense MLP): 4|8|32
  int mla_bits = 0;    // MLA projections; 0 = max(bits, 8)
  int head_bits = 0;   // lm_head; 0 = max(bits, 8)
  std::string layout = "aligned";   // aligned (4 KiB expert records) | packed (back to back)
  std::vector<int64_t> shards;      // source shard numbers to convert; empty = all
  std::vector<std::string> stripe;  // expert records of expert e go to stripe[e % N]
  bool verify_full = false;         // re-read every output byte and compare with the source
  int jobs = 0;                     // quantisation threads; 0 = OpenMP default
  // Test hook (fault injection): SIGKILL this process once this many output bytes were produced
  // in this run (shards, then the index); 0 = off.
  uint64_t kill_at_byte = 0;
  // Where the run's progress line goes; no `write`: stderr (util/progress.h).
  ProgressSink progress;
};

struct Summary {
  int64_t shards_total = 0;    // output shards of the complete container
  int64_t shards_written = 0;  // this run
  int64_t shards_kept = 0;     // complete from an earlier run (size, header and CRC-32C checked)
  int64_t shards_present = 0;  // source shards whose output is complete now
  uint64_t bytes_read = 0;     // from the source, this run
  uint64_t bytes_written = 0;  // shard bytes written, this run
  uint64_t tensors_verified = 0;
  // Output files of an earlier run found damaged (their CRC-32C record, size or header, or
  // --verify-full) and rewritten: "path: why", one each.
  std::vector<std::string> damaged;
  double seconds = 0;
};

// Runs the conversion. `log` gets one line per shard (and per verification). Throws k3::Error
// naming the file (and tensor) on bad input (a non-finite source value included), a read or write
// error, or a file that still fails verification after it was rewritten; nothing half-written is
// left under a final name.
Summary run(const Options& options, const std::function<void(const std::string&)>& log = {});

// "1,3,5-8" -> {1, 3, 5, 6, 7, 8}. Throws k3::Error naming the bad item.
std::vector<int64_t> parse_shard_list(const std::string& text);

// Output shard name: "model-00003-of-000094.safetensors"; with stripe k >= 1 (of a striped
// container) "model-00003-of-000094-e2.safetensors".
std::string output_shard_name(int64_t number, int64_t total, int64_t stripe = 0);

}  // namespace k3::repack

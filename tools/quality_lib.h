// tools/quality_lib.h — the real-text quality measurement of a trained checkpoint
// (docs/testing.md §5): for one precision setting, held-out perplexity, KL divergence and top-1
// agreement against the exact (f32) setting's logits, and greedy agreement over 64 tokens. One
// implementation behind both `k3_bench quality` and tests/quality_gate_test.cpp, plus the bounds
// file (tests/data/k3-mini/quality_bounds.json) the gate checks every row against.
// Drives the engine in process through engine/engine.h only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "options/options.h"

namespace k3::quality {

// Tokens per held-out window (tests/data/k3-mini/heldout_text.u32) and tokens greedy-decoded
// from each held-out prompt.
inline constexpr int64_t kWindowTokens = 128;
inline constexpr int64_t kGreedyTokens = 64;

// One precision setting a user can pick: the K3_BITS / K3_MLA_BITS / K3_HEAD_BITS / K3_IDOT /
// K3_TOPP values it runs with, and whether it reads the model repacked by k3_repack
// (docs/container.md) instead of the snapshot.
struct Setting {
  std::string name;  // key in the bounds file ("exact", "bits4_idot", "defaults_topp0.9", ...)
  // 0 = not set (a container's stored width; the release default on a snapshot).
  int bits = 32, mla_bits = 32, head_bits = 32;
  bool idot = false;
  double top_p = 0;   // K3_TOPP (0 = off)
  int container = 0;  // > 0: measured on the model repacked with `k3_repack --bits <container>`

  // "K3_BITS=4 K3_MLA_BITS=8 K3_HEAD_BITS=8 K3_IDOT=1" (+ " K3_TOPP=0.9"); a container row
  // starts with "container --bits N:" and leaves out the widths it does not set.
  std::string env() const;
  // `base` (cache and ISA choices) with this setting's precision fields.
  LoadOptions apply(LoadOptions base) const;
};

// Every row of the table, the exact reference first, the container rows last.
std::vector<Setting> settings();
// The setting called `name`; throws k3::Error listing the names when there is none.
Setting setting(const std::string& name);

// The held-out fixtures: windows of kWindowTokens ids (heldout_text.u32, u32 little-endian, back
// to back) and chat prompts (heldout_prompts.jsonl, {"ids": [...]} a line). Throws k3::Error
// naming the file when one is missing or malformed.
struct Fixtures {
  std::vector<std::vector<int64_t>> windows;
  std::vector<std::vector<int64_t>> prompts;
  static Fixtures load(const std::string& dir);
};

// One setting's figures against the reference.
struct Row {
  std::string setting;
  std::string env;       // Setting::env()
  std::string describe;  // Engine::describe() of the engine that ran it
  double ppl = 0;        // exp(mean NLL) over every predicted held-out token
  double kl_mean = 0;    // KL(exact || setting) per position, nats: mean and max
  double kl_max = 0;
  double top1 = 0;           // fraction of positions whose argmax equals the exact one's
  double greedy = 0;         // mean over prompts of the fraction of the 64 greedy tokens equal
  double first_diverge = 0;  // mean over prompts of the first differing index (64 = none)
  int64_t positions = 0;     // predicted positions (windows x (kWindowTokens - 1))
  double seconds = 0;        // load + measurement wall time
};

// The exact setting's results, computed once; every measure() is judged against them.
class Reference {
 public:
  // Runs `model_dir` at the exact setting (base's cache and ISA choices) over `fixtures`.
  Reference(const std::string& model_dir, const Fixtures& fixtures, const LoadOptions& base);

  // Measures `s` on `model_dir` (by default the reference's own; a test passes a corrupted copy).
  Row measure(const Setting& s, const std::string& model_dir = "") const;

  const Row& row() const { return row_; }  // the reference's own figures (KL 0, agreement 1)
  // How often each routed expert was picked over the held-out windows: [layer][expert] (dense
  // layers: empty).
  const std::vector<std::vector<int64_t>>& expert_use() const { return expert_use_; }

 private:
  std::string model_dir_;
  const Fixtures& fixtures_;
  LoadOptions base_;
  int64_t vocab_ = 0;
  std::vector<std::vector<float>> logits_;    // per window: [kWindowTokens - 1][vocab]
  std::vector<double> lse_;                   // log-sum-exp of every reference position
  std::vector<int64_t> top1_;                 // argmax of every reference position
  std::vector<std::vector<int64_t>> greedy_;  // per prompt: kGreedyTokens ids
  std::vector<std::vector<int64_t>> expert_use_;
  Row row_;
  // Containers made for container rows (k3_repack --bits N -> directory), removed with this.
  mutable std::map<int, std::string> containers_;

 public:
  ~Reference();
  Reference(const Reference&) = delete;
  Reference& operator=(const Reference&) = delete;
};

// What a row may measure at worst (quality_bounds.json: {setting: {ppl_max, kl_mean_max,
// top1_min, greedy_min}}).
struct Bound {
  double ppl_max = 0, kl_mean_max = 0, top1_min = 0, greedy_min = 0;
};
using Bounds = std::map<std::string, Bound>;

// The bound of a measured row: ppl x 1.01, KL x 1.25 + 1e-6, top-1 agreement - 0.02, greedy
// agreement - 0.10 (docs/testing.md §5 says why).
Bound bound_from(const Row& row);
Bounds read_bounds(const std::string& path);  // throws k3::Error naming the file and key
void write_bounds(const std::string& path, const std::vector<Row>& rows);

// The checks `row` fails against `bound`, one line each ("ppl 251.3 > ppl_max 250.0"); empty when
// it passes. A NaN figure fails every check it enters.
std::vector<std::string> violations(const Row& row, const Bound& bound);

// One line of a row's figures ("exact  ppl 778.5639 | KL mean 0 max 0 | ... | 9.1 s | <describe>").
std::string summary(const Row& row);

// The rows as a Markdown table (README.md), with the bound beside each figure when `bounds` has
// the row.
std::string markdown(const std::vector<Row>& rows, const Bounds& bounds = {});

}  // namespace k3::quality

// tools/quality_lib.h — the real-text quality measurement of a trained checkpoint
// (docs/testing.md §5): for one precision setting, held-out perplexity, KL divergence and top-1
// agreement against the exact (f32) setting's logits, greedy agreement over 64 tokens, and KL and
// top-1 agreement against the second oracle (the training model's own float64 forward,
// tests/data/k3-mini/oracle.safetensors). One implementation behind both `k3_bench quality` and
// tests/quality_gate_test.cpp, plus the bounds file (tests/data/k3-mini/quality_bounds.json) and
// the fixed ceilings (settings()) the gate checks every row against.
// Drives the engine in process through engine/engine.h only (the oracle file is read with io/).
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

// What a setting may cost at most, whatever was measured: written in settings() by hand, never by
// --write-bounds, so that regenerating the bounds cannot bless a regression (docs/testing.md §5).
struct Ceiling {
  double ppl_ratio = 0;       // maximum ppl / the exact reference's ppl
  double kl_mean = 0;         // maximum mean KL(exact || setting), nats
  double top1 = 0;            // minimum top-1 agreement with exact
  double greedy = 0;          // minimum greedy agreement with exact
  double oracle_kl_mean = 0;  // maximum mean KL(oracle || setting), nats
  double oracle_top1 = 0;     // minimum top-1 agreement with the oracle
};

// One precision setting a user can pick: the K3_BITS / K3_MLA_BITS / K3_HEAD_BITS / K3_IDOT /
// K3_TOPP values it runs with, and whether it reads the model repacked by k3_repack
// (docs/container.md) instead of the snapshot.
struct Setting {
  std::string name;  // key in the bounds file ("exact", "bits4_idot", "defaults_topp0.8", ...)
  // 0 = not set (a container's stored width; the release default on a snapshot).
  int bits = 32, mla_bits = 32, head_bits = 32;
  bool idot = false;
  double top_p = 0;   // K3_TOPP (0 = off)
  int container = 0;  // > 0: measured on the model repacked with `k3_repack --bits <container>`
  Ceiling ceiling;

  // "K3_BITS=4 K3_MLA_BITS=8 K3_HEAD_BITS=8 K3_IDOT=1" (+ " K3_TOPP=0.8"); a container row
  // starts with "container --bits N:" and leaves out the widths it does not set.
  std::string env() const;
  // `base` (cache and ISA choices) with this setting's precision fields.
  LoadOptions apply(LoadOptions base) const;
};

// Every row of the table, the exact reference first, the container rows last.
std::vector<Setting> settings();
// The setting called `name`; throws k3::Error listing the names when there is none.
Setting setting(const std::string& name);

// The second oracle (oracle.safetensors, tools/train/make_fixtures.py): the training model's own
// float64 forward on the first ids of window 0. The vocabulary is covered by `logit_ids`: every
// id with its own lm_head row, then one representative of each of the two groups of ids sharing
// a row, weighing the group's size (every member has its representative's logit, in the oracle
// and in the engine: tests/oracle_trained_test.cpp checks it).
struct Oracle {
  std::vector<int64_t> logit_ids;  // [K]
  std::vector<double> weight;      // [K]: 1, or the group's size for the last two
  std::vector<double> logits;      // [T][K]
  size_t positions = 0;            // T (the ids are window 0's first T)
};

// The held-out fixtures: windows of kWindowTokens ids (heldout_text.u32, u32 little-endian, back
// to back), chat prompts (heldout_prompts.jsonl, {"ids": [...]} a line) and the oracle
// (oracle.safetensors). Throws k3::Error naming the file when one is missing or malformed.
struct Fixtures {
  std::vector<std::vector<int64_t>> windows;
  std::vector<std::vector<int64_t>> prompts;
  Oracle oracle;
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
  double ppl_ratio = 0;      // ppl / the exact reference's ppl
  // Against the oracle, over its positions: KL(oracle || setting) mean and max, and the fraction
  // of positions where the oracle's top id is also a top id of the setting.
  double oracle_kl_mean = 0, oracle_kl_max = 0, oracle_top1 = 0;
  double experts_kept = 0;  // routed picks made / (top-k x routed tokens) over the windows
  double seconds = 0;       // load + measurement wall time
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

// What a row may measure at worst, from a measurement (quality_bounds.json: {setting: {ppl_max,
// kl_mean_max, top1_min, greedy_min, oracle_kl_mean_max, oracle_top1_min}}).
struct Bound {
  double ppl_max = 0, kl_mean_max = 0, top1_min = 0, greedy_min = 0;
  double oracle_kl_mean_max = 0, oracle_top1_min = 0;
};
using Bounds = std::map<std::string, Bound>;

// The bound of a measured row: ppl x 1.01, KL x 1.25 + 1e-6, top-1 agreement - 0.02, greedy
// agreement - 0.10, KL against the oracle x 1.25 + 1e-9, top-1 against the oracle - 2 of its
// positions (docs/testing.md §5 says why).
Bound bound_from(const Row& row, size_t oracle_positions);
Bounds read_bounds(const std::string& path);  // throws k3::Error naming the file and key
// Throws k3::Error, writing nothing, when a row is outside its setting's ceiling.
void write_bounds(const std::string& path, const std::vector<Row>& rows, size_t oracle_positions);

// The checks `row` fails, one line each ("ppl 251.3 > ppl_max 250.0"); empty when it passes:
// against `bound`, against the setting's ceiling, and the expert drop (a K3_TOPP row must keep
// fewer than every routed pick, any other row all of them). A NaN figure fails every check it
// enters.
std::vector<std::string> violations(const Row& row, const Bound& bound);
// The checks of the setting's ceiling and expert drop alone (what --write-bounds refuses to write).
std::vector<std::string> ceiling_violations(const Row& row);

// One line of a row's figures ("exact  ppl 778.5639 | KL mean 0 max 0 | ... | 9.1 s | <describe>").
std::string summary(const Row& row);

// The rows as a Markdown table (README.md): beside each bounded figure its bound when `bounds`
// has the row, and its setting's ceiling ("(≤ 0.0181 · ≤ 0.03)").
std::string markdown(const std::vector<Row>& rows, const Bounds& bounds = {});

}  // namespace k3::quality

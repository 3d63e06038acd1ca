#include "options/options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <type_traits>

#include "help_layout.h"
#include "util/error.h"

namespace k3 {
namespace {

// ---- values ---------------------------------------------------------------------------------

int64_t parse_int(const std::string& value, const std::string& source, int64_t lo, int64_t hi) {
  int64_t out = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (value.empty() || ec != std::errc() || ptr != end)
    throw Error(source + ": expected an integer, got \"" + value + "\"");
  if (out < lo || out > hi)
    throw Error(source + ": " + value + " is outside [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  return out;
}

double parse_double(const std::string& value, const std::string& source, double lo, double hi) {
  size_t used = 0;
  double out = 0;
  try {
    out = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size())
    throw Error(source + ": expected a number, got \"" + value + "\"");
  if (!(out >= lo && out <= hi))
    throw Error(source + ": " + value + " is outside [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  return out;
}

bool parse_bool(const std::string& value, const std::string& source) {
  if (value == "1" || value == "true" || value == "yes" || value == "on") return true;
  if (value == "0" || value == "false" || value == "no" || value == "off") return false;
  throw Error(source + ": expected 0 or 1 (or true / false), got \"" + value + "\"");
}

std::vector<std::string> split_list(const std::string& value) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(value);
  while (std::getline(in, item, ',')) {
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.erase(item.begin());
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.pop_back();
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : sep) + item;
  return out;
}

std::string number_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// How one row's value is parsed into Options and shown back (its default, its effective value).
struct Value {
  std::function<void(Options&, const std::string& value, const std::string& source)> set;
  std::function<std::string(const Options&)> get;
  std::string range;     // "0..100", "4|8|32", "" (any text)
  bool is_bool = false;  // a flag: --x, --no-x, --x=0/1/true/false; the variable takes 0/1
};

// A field of Options, as a captureless lambda: FIELD(sampling.temperature).
#define FIELD(path) [](Options& o) -> decltype(auto) { return (o.path); }
template <class F>
using FieldType = std::remove_reference_t<decltype(std::declval<F>()(std::declval<Options&>()))>;
template <class F>
const FieldType<F>& read(F f, const Options& o) {
  return f(const_cast<Options&>(o));
}

template <class F>
Value integer(F f, int64_t lo, int64_t hi) {
  return {[f, lo, hi](Options& o, const std::string& v, const std::string& s) {
            f(o) = static_cast<FieldType<F>>(parse_int(v, s, lo, hi));
          },
          [f](const Options& o) { return std::to_string(read(f, o)); },
          std::to_string(lo) + ".." + (hi >= (int64_t{1} << 24) ? "" : std::to_string(hi))};
}

// [lo, hi], or (lo, hi] when `above_lo`.
template <class F>
Value real(F f, double lo, double hi, bool above_lo = false) {
  return {[f, lo, hi, above_lo](Options& o, const std::string& v, const std::string& s) {
            const double x = parse_double(v, s, lo, hi);
            if (above_lo && x <= lo) throw Error(s + ": must be greater than " + number_text(lo));
            f(o) = x;
          },
          [f](const Options& o) { return number_text(read(f, o)); },
          (above_lo ? "(" : "[") + number_text(lo) + ", " + number_text(hi) + "]"};
}

template <class F>
Value boolean(F f) {
  return {[f](Options& o, const std::string& v, const std::string& s) { f(o) = parse_bool(v, s); },
          [f](const Options& o) { return std::string(read(f, o) ? "1" : "0"); }, "0|1", true};
}

template <class F>
Value text(F f) {
  return {[f](Options& o, const std::string& v, const std::string&) { f(o) = v; },
          [f](const Options& o) { return read(f, o); }, ""};
}

template <class F>
Value list(F f) {
  return {[f](Options& o, const std::string& v, const std::string&) { f(o) = split_list(v); },
          [f](const Options& o) { return join(read(f, o), ","); }, "a,b,..."};
}

template <class F>
Value choice(F f, std::vector<std::string> choices, std::string note = "") {
  std::string range = join(choices, "|");
  return {[f, choices, note](Options& o, const std::string& v, const std::string& s) {
            if (std::find(choices.begin(), choices.end(), v) == choices.end()) {
              std::string expected;
              for (size_t i = 0; i < choices.size(); ++i)
                expected += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
              throw Error(s + ": expected " + expected + ", got \"" + v + "\"" + note);
            }
            f(o) = v;
          },
          [f](const Options& o) { return read(f, o); }, range};
}

// Dense-matrix bit widths: 4 (int4 groups of 64), 8 (int8 per row) or 32 (f32); `chosen` records
// that the user set it.
template <class F, class C>
Value bits(F f, C chosen) {
  return {[f, chosen](Options& o, const std::string& v, const std::string& s) {
            const int64_t b = parse_int(v, s, 1, 64);
            if (b != 4 && b != 8 && b != 32)
              throw Error(s + "=" + v +
                          " is not a supported width: use 4 (int4 g64), 8 (int8) or 32 (f32)");
            f(o) = static_cast<int>(b);
            chosen(o) = true;
          },
          [f](const Options& o) { return std::to_string(read(f, o)); }, "4|8|32"};
}

// "auto" (stored as -1) or an integer in [lo, hi].
template <class F>
Value auto_or_int(F f, int64_t lo, int64_t hi) {
  return {[f, lo, hi](Options& o, const std::string& v, const std::string& s) {
            f(o) = static_cast<FieldType<F>>(v == "auto" ? -1 : parse_int(v, s, lo, hi));
          },
          [f](const Options& o) {
            return read(f, o) < 0 ? std::string("auto") : std::to_string(read(f, o));
          },
          "auto|" + std::to_string(lo) + ".." + std::to_string(hi)};
}

// ---- the table ------------------------------------------------------------------------------

enum class Group {
  kModel,
  kQuantization,
  kExperts,
  kSampling,
  kChat,
  kServer,
  kSecurity,
  kValidation
};
const Group kGroups[] = {Group::kModel, Group::kQuantization, Group::kExperts,  Group::kSampling,
                         Group::kChat,  Group::kServer,       Group::kSecurity, Group::kValidation};

const char* group_name(Group g) {
  switch (g) {
    case Group::kModel:
      return "model";
    case Group::kQuantization:
      return "quantization";
    case Group::kExperts:
      return "experts & I/O";
    case Group::kSampling:
      return "sampling";
    case Group::kChat:
      return "chat";
    case Group::kServer:
      return "server";
    case Group::kSecurity:
      return "security";
    case Group::kValidation:
      return "validation";
  }
  return "?";
}

// The programs a row is listed for in --help (every program accepts every flag).
enum : unsigned { kKimi = 1, kServe = 2, kChatApp = 4, kTokenize = 8, kRender = 16 };
constexpr unsigned kEngine = kKimi | kServe | kChatApp;
constexpr unsigned kAll = kEngine | kTokenize | kRender;

struct OptionRow {
  // CLI11 names: "--think,!--no-think", "-n,--ngen"; the first long one is the row's name
  // ("think", "ngen"). A short name is llama-cli's where it means the same (-m -p -n -c -t -s).
  const char* flags;
  const char* env;  // "K3_THINK"; nullptr when flag-only
  Group group;
  unsigned listed;  // programs whose --help lists it
  const char* help;
  Value value;
  // coli serve / web / chat's default where it differs from kimi_k3's (the member initialiser);
  // parsed like any other value.
  const char* coli_default = nullptr;
  // Shown instead of the default where the value is worked out at run time (kimi_k3, coli).
  const char* shown_default = nullptr;
  const char* coli_shown_default = nullptr;
  // Another variable read for this row when `env` is not set (an older name); not in the table.
  const char* env_alias = nullptr;
  // kimi_k3's and coli's --help wording where `help` (the table's, about every program) speaks of
  // the other program: each program's help speaks of itself only.
  const char* kimi_help = nullptr;
  const char* coli_help = nullptr;
};

std::string row_name(const OptionRow& r) {
  const std::string flags = r.flags;
  const size_t long_name = flags.find("--");
  return flags.substr(long_name + 2, flags.find(',', long_name) - long_name - 2);
}

const std::vector<OptionRow>& option_rows() {
  static const std::vector<OptionRow> rows = {
      // model
      {.flags = "-m,--model",
       .env = "COLI_MODEL",
       .group = Group::kModel,
       .listed = kAll,
       .help = "model directory (Hugging Face snapshot); also the first positional argument "
               "(coli serve, web, chat: the built-in trained tiny K3 when none is given)",
       .value = text(FIELD(model_dir)),
       .coli_shown_default = "built-in assets/k3-mini",
       .kimi_help = "model directory (Hugging Face snapshot); also the first positional argument",
       .coli_help = "model directory (Hugging Face snapshot); also the first positional argument "
                    "(serve, web, chat: the built-in trained tiny K3 when none is given)"},
      {"-p,--prompt", nullptr, Group::kModel, kKimi,
       "prompt text (plain completion); also the positional argument after the model directory",
       text(FIELD(prompt))},
      {"--ids",
       nullptr,
       Group::kModel,
       kKimi,
       "prompt as token ids, comma or space separated (no BOS added)",
       {[](Options& o, const std::string& v, const std::string& s) {
          try {
            o.ids = parse_id_list(v);
          } catch (const Error& e) {
            throw Error(s + ": " + e.what());
          }
        },
        [](const Options& o) {
          std::vector<std::string> items;
          for (int64_t id : o.ids) items.push_back(std::to_string(id));
          return join(items, ",");
        },
        "id,id,..."}},
      {.flags = "-n,--ngen",
       .env = "K3_NGEN",
       .group = Group::kModel,
       .listed = kKimi | kChatApp,
       .help = "tokens to generate (coli chat: the reply budget, when given)",
       .value = integer(FIELD(ngen), 0, int64_t{1} << 24),
       .coli_shown_default = "up to --max-tokens",
       .kimi_help = "tokens to generate",
       .coli_help = "the reply budget in tokens, when given"},
      {.flags = "-c,--ctx,--maxt",
       .env = "COLI_CTX",
       .group = Group::kModel,
       .listed = kEngine,
       .help = "context capacity in tokens (kimi_k3: 0 = prompt + ngen)",
       .value = integer(FIELD(runtime.max_tokens), 0, int64_t{1} << 24),
       .coli_default = "8192",
       .env_alias = "K3_MAXT",
       .kimi_help = "context capacity in tokens (0 = prompt + ngen)",
       .coli_help = "context capacity in tokens"},
      {"-t,--threads", nullptr, Group::kModel, kEngine,
       "compute threads (0 = OpenMP default: OMP_NUM_THREADS or all cores)",
       integer(FIELD(runtime.threads), 0, 1024)},
      {"--chunk", "K3_CHUNK", Group::kModel, kEngine,
       "prefill: prompt tokens run layer-major together (1 = token at a time; same logits; auto = "
       "the largest power of two to 4096 whose buffers take a sixteenth of the free memory)",
       auto_or_int(FIELD(load.chunk), 1, 4096)},
      {"--kda-chunked,!--no-kda-chunked", "K3_KDA_CHUNKED", Group::kModel, kEngine,
       "prefill: a chunk's KDA recurrence in the chunk (WY/UT) form instead of token by token "
       "(close, not bit-identical logits; decode and --chunk 1 unchanged)",
       boolean(FIELD(load.kda_chunked))},
      // quantization
      {"--bits", "K3_BITS", Group::kQuantization, kEngine,
       "KDA/latent/shared/dense matrices in RAM: 4 = int4 g64, 8 = int8, 32 = f32 (a repacked "
       "container keeps its stored width unless set)",
       bits(FIELD(load.bits), FIELD(load.bits_chosen))},
      {"--mla-bits", "K3_MLA_BITS", Group::kQuantization, kEngine, "MLA matrices in RAM",
       bits(FIELD(load.mla_bits), FIELD(load.mla_bits_chosen))},
      {"--head-bits", "K3_HEAD_BITS", Group::kQuantization, kEngine, "lm_head in RAM",
       bits(FIELD(load.head_bits), FIELD(load.head_bits_chosen))},
      {"--mmap,!--no-mmap", "K3_MMAP", Group::kQuantization, kEngine,
       "repacked container: use its prepared matrices in place from a read-only file mapping "
       "(clean page cache) instead of copying them; refuses tensors that need conversion",
       boolean(FIELD(load.mmap))},
      {"--idot,!--no-idot", "K3_IDOT", Group::kQuantization, kEngine,
       "MXFP4 experts, int4 and int8 matrices: integer dots on int8 activations (off = float "
       "kernels)",
       boolean(FIELD(load.idot))},
      {"--isa", "K3_ISA", Group::kQuantization, kEngine,
       "kernel variant (auto = the best this CPU runs)",
       choice(FIELD(load.isa), {"auto", "scalar", "avx2", "avx512"})},
      // experts & I/O
      {"--dirs",
       "K3_DIRS",
       Group::kExperts,
       kEngine,
       "more directories holding shards of the model (a split over drives; ',' or ';' separated; "
       "each shard in one place)",
       {[](Options& o, const std::string& v, const std::string&) {
          std::string items = v;
          std::replace(items.begin(), items.end(), ';', ',');
          o.load.extra_dirs = split_list(items);
        },
        [](const Options& o) { return join(o.load.extra_dirs, ","); }, "dir,dir,..."}},
      {"--expert-parallel,!--no-expert-parallel", "K3_EXPERT_PARALLEL", Group::kExperts,
       kKimi | kServe,
       "under mpirun -np N: routed expert e of every layer on rank e mod N, rank 0 runs the rest "
       "(docs/scale-out.md)",
       boolean(FIELD(load.expert_parallel))},
      {"--ep-timeout", "K3_EP_TIMEOUT", Group::kExperts, kKimi | kServe,
       "--expert-parallel: seconds rank 0 waits for a rank's experts before it reports the rank "
       "as failed",
       real(FIELD(load.ep_timeout), 0.0, 86400.0, true)},
      {"--ep-weights",
       "K3_EP_WEIGHTS",
       Group::kExperts,
       kKimi | kServe,
       "--expert-parallel on unequal hosts: one weight per rank, each rank's share of every "
       "layer's experts in proportion (none = equal, expert e on rank e mod N)",
       {[](Options& o, const std::string& v, const std::string& s) {
          o.load.ep_weights.clear();
          for (const std::string& item : split_list(v))
            o.load.ep_weights.push_back(parse_double(item, s, 0.0, 1e6));
          if (std::none_of(o.load.ep_weights.begin(), o.load.ep_weights.end(),
                           [](double w) { return w > 0; }))
            throw Error(s + "=" + v + ": needs a positive weight (one per rank, e.g. 2,1,1)");
        },
        [](const Options& o) {
          std::vector<std::string> items;
          for (double w : o.load.ep_weights) items.push_back(number_text(w));
          return join(items, ",");
        },
        "w0,w1,..."}},
      {"--topp",
       "K3_TOPP",
       Group::kExperts,
       kEngine,
       "quality lever: keep routed experts up to this cumulative weight (0 < p < 1), renormalised; "
       "0 = all (compare logits before use)",
       {[](Options& o, const std::string& v, const std::string& s) {
          o.load.expert_top_p = parse_double(v, s, 0.0, 1.0);
          if (o.load.expert_top_p >= 1.0) o.load.expert_top_p = 0.0;
        },
        [](const Options& o) { return number_text(o.load.expert_top_p); }, "0..1"}},
      {"--experts-in-memory,!--no-experts-in-memory", nullptr, Group::kExperts, kEngine,
       "read every routed expert into RAM at load (models that fit)",
       boolean(FIELD(load.experts_in_memory))},
      {"--expert-gb", "K3_EXPERT_GB", Group::kExperts, kEngine,
       "routed-expert cache in RAM, GB over all MoE layers (at least one slot per layer; lowered "
       "when memory is short)",
       real(FIELD(load.cache.expert_gb), 0.0, 1e6, true)},
      {"--direct,!--no-direct", "K3_DIRECT", Group::kExperts, kEngine,
       "expert reads with O_DIRECT (off = buffered with read-ahead advice; automatic where the "
       "filesystem refuses it)",
       boolean(FIELD(load.cache.direct))},
      {"--pin,!--no-pin", "K3_PIN", Group::kExperts, kEngine,
       "pin each layer's most used experts (up to half its slots) from the routing history",
       boolean(FIELD(load.cache.pin))},
      {"--pipe,!--no-pipe", "K3_PIPE", Group::kExperts, kEngine,
       "compute on each routed expert as soon as its read lands, while the rest stream (off = wait "
       "for all reads first)",
       boolean(FIELD(load.cache.pipe))},
      {"--load-threads", "K3_LOAD_THREADS", Group::kExperts, kEngine,
       "expert reader threads where io_uring is unavailable (or with K3_IO_ENGINE=threads)",
       integer(FIELD(load.cache.load_threads), 1, 16)},
      {"--io-engine", "K3_IO_ENGINE", Group::kExperts, kEngine,
       "expert reads: auto (io_uring when the kernel allows, else threads), uring, threads",
       choice(FIELD(load.cache.io_engine), {"auto", "uring", "threads"})},
      {"--prefetch,!--no-prefetch", "K3_PREFETCH", Group::kExperts, kEngine,
       "read ahead the experts the next MoE layer's router picks for the current layer's input "
       "(timing only)",
       boolean(FIELD(load.cache.prefetch))},
      {"--usage-decay", "COLI_USAGE_DECAY", Group::kExperts, kEngine,
       "routing history: counters multiplied by this when saved; 0.99 = ~69-run half-life",
       real(FIELD(load.cache.usage_decay), 0.0, 1.0, true)},
      {"--state-dir", "K3_STATE_DIR", Group::kExperts, kEngine,
       "directory for the routing history (never the model directory)",
       text(FIELD(load.cache.state_dir)), nullptr, "$XDG_CACHE_HOME/kimi_k3 or ~/.cache/kimi_k3"},
      {.flags = "--vulkan,!--no-vulkan",
       .env = "COLI_VULKAN",
       .group = Group::kExperts,
       .listed = kEngine,
       .help = "routed experts on a Vulkan device too (the expert tier, f32 numerics as "
               "K3_IDOT=0; off: no device is ever opened)",
       .value = boolean(FIELD(load.vulkan.enabled)),
       .env_alias = "K3_VK"},
      {.flags = "--vk-tier-gb",
       .env = "COLI_VK_TIER_GB",
       .group = Group::kExperts,
       .listed = kEngine,
       .help = "device memory for the expert tier, GB (0 = what the device has free less the "
               "reserve)",
       .value = real(FIELD(load.vulkan.tier_gb), 0.0, 1e6),
       .env_alias = "K3_VK_GB"},
      {"--vk-tier-reserve-gb", "COLI_VK_TIER_RESERVE_GB", Group::kExperts, kEngine,
       "device memory the automatic tier size leaves free, GB",
       real(FIELD(load.vulkan.reserve_gb), 0.0, 1e6)},
      {.flags = "--vk-tier-rate",
       .env = "COLI_VK_TIER_RATE",
       .group = Group::kExperts,
       .listed = kEngine,
       .help = "expert uploads to the device per token at most",
       .value = integer(FIELD(load.vulkan.rate), 0, 4096),
       .env_alias = "K3_VK_UP"},
      {"--vk-gemm-rows", "COLI_VK_TIER_GEMM_ROWS", Group::kExperts, kEngine,
       "rows of one expert from which the device takes the tiled GEMM (fewer: GEMV; same bits)",
       integer(FIELD(load.vulkan.gemm_rows), 1, 4096)},
      {"--vk-staged", "COLI_VK_STAGED", Group::kExperts, kEngine,
       "experts in device-local memory written through a staging buffer (1) or in host-visible "
       "memory written in place (0); auto = staged without a large host-visible window",
       choice(FIELD(load.vulkan.staged), {"auto", "1", "0"})},
      {"--vk-device-cap-mb", "COLI_VK_DEVICE_CAP_MB", Group::kExperts, kEngine,
       "cap on the device memory the tier takes, MB (0 = none; tests emulate small devices)",
       integer(FIELD(load.vulkan.device_cap_mb), 0, int64_t{1} << 24)},
      {"--vk-tier-sync", "COLI_VK_TIER_SYNC", Group::kExperts, kEngine,
       "promotions finish uploading before the next MoE step, so residency depends only on the "
       "routing (reproducible runs; off: an uploader thread publishes them when done)",
       boolean(FIELD(load.vulkan.sync))},
      {"--vk-prefill", "COLI_VK_PREFILL", Group::kExperts, kEngine,
       "prompt chunks stream cold experts through device staging slots, never promoted: auto = "
       "when rows x CPU time per row exceeds the upload time on a GPU (docs/vulkan.md), on, off",
       choice(FIELD(load.vulkan.prefill), {"auto", "on", "off"})},
      {"--vk-prefill-slots", "COLI_VK_PREFILL_SLOTS", Group::kExperts, kEngine,
       "staging slots for streamed experts, per MoE step of a prompt chunk",
       integer(FIELD(load.vulkan.prefill_slots), 1, 4096)},
      {"--vk-dense", "COLI_VK_DENSE", Group::kExperts, kEngine,
       "the dense matrices of prompt chunks (attention, shared experts, dense MLP) on the device "
       "too, in the format K3_BITS made them, f32 activations: auto = on a discrete GPU, on, off",
       choice(FIELD(load.vulkan.dense), {"auto", "on", "off"})},
      {"--vk-dense-rows", "COLI_VK_DENSE_ROWS", Group::kExperts, kEngine,
       "rows of a prompt chunk from which its dense matrices run on the device (fewer: the CPU)",
       integer(FIELD(load.vulkan.dense_rows), 2, 1 << 20)},
      // sampling
      {.flags = "--temp",
       .env = "COLI_TEMP",
       .group = Group::kSampling,
       .listed = kEngine,
       .help = "sampling temperature (0 = greedy; coli's default is the model card's)",
       .value = real(FIELD(sampling.temperature), 0.0, 100.0),
       .coli_default = "0.6",
       .kimi_help = "sampling temperature (0 = greedy)",
       .coli_help = "sampling temperature (0 = greedy; the default is the model card's)"},
      {.flags = "--top-p",
       .env = "COLI_TOP_P",
       .group = Group::kSampling,
       .listed = kEngine,
       .help = "nucleus sampling mass (1 = off; coli's default is the model card's)",
       .value = real(FIELD(sampling.top_p), 0.0, 1.0, true),
       .coli_default = "0.95",
       .kimi_help = "nucleus sampling mass (1 = off)",
       .coli_help = "nucleus sampling mass (1 = off; the default is the model card's)"},
      {"--top-k", "COLI_TOP_K", Group::kSampling, kEngine,
       "keep only the k most likely tokens (0 = off)",
       integer(FIELD(sampling.top_k), 0, int64_t{1} << 24)},
      {"--min-p", "COLI_MIN_P", Group::kSampling, kEngine,
       "drop tokens less likely than min-p x the most likely one (0 = off)",
       real(FIELD(sampling.min_p), 0.0, 1.0)},
      {.flags = "-s,--seed",
       .env = "COLI_SEED",
       .group = Group::kSampling,
       .listed = kKimi | kChatApp,
       .help = "sampling seed (not given: a random one, printed in kimi_k3's summary; coli chat: "
               "+1 per reply)",
       .value = integer(FIELD(sampling.seed), 0, INT64_MAX),
       .shown_default = "random",
       .kimi_help = "sampling seed (not given: a random one, printed in the summary)",
       .coli_help = "sampling seed (not given: a random one; +1 per reply)"},
      // chat
      {"--chat", nullptr, Group::kChat, kKimi | kChatApp,
       "one chat turn: this user message, rendered with the K3 chat template",
       text(FIELD(text.chat))},
      {"--system", nullptr, Group::kChat, kKimi | kChatApp,
       "system message of the chat turn (implies a chat turn)", text(FIELD(text.system))},
      {"--think,!--no-think", "K3_THINK", Group::kChat, kKimi | kChatApp,
       "open the think channel (off = answer directly)", boolean(FIELD(text.think))},
      {"--effort", "K3_EFFORT", Group::kChat, kKimi | kChatApp,
       "thinking effort (none = no effort message)",
       choice(FIELD(text.effort), {"low", "high", "max", "none"}, " (the release rejects medium)")},
      {"--show-think,!--no-show-think,!--hide-think", "COLI_SHOW_THINK", Group::kChat,
       kKimi | kChatApp, "print the model's reasoning (--hide-think = off)",
       boolean(FIELD(text.show_think))},
      {"--labels,!--no-labels", nullptr, Group::kChat, kKimi | kChatApp,
       "print [think] / [response] labels even when stdout is not a terminal",
       boolean(FIELD(text.labels))},
      {"--allow-special,!--no-allow-special", nullptr, Group::kChat, kKimi | kTokenize,
       "raw text: special-token spellings become special tokens (otherwise they stay plain text)",
       boolean(FIELD(text.allow_special))},
      {"--bos,!--no-bos", nullptr, Group::kChat, kKimi,
       "prepend [BOS] to the prompt (the release never does)", boolean(FIELD(text.bos))},
      {"--output",
       nullptr,
       Group::kChat,
       kKimi,
       "stdout format: text, or jsonl (one JSON event per line: token, tool_call, done)",
       {[](Options& o, const std::string& v, const std::string& s) {
          if (v != "text" && v != "jsonl")
            throw Error(s + ": expected text or jsonl, got \"" + v + "\"");
          o.text.jsonl = v == "jsonl";
        },
        [](const Options& o) { return std::string(o.text.jsonl ? "jsonl" : "text"); },
        "text|jsonl"}},
      {"--json-schema", nullptr, Group::kChat, kKimi,
       "FILE: the answer is JSON matching this JSON Schema, enforced while sampling "
       "(docs/structured_output.md)",
       text(FIELD(text.json_schema))},
      {"--grammar", nullptr, Group::kChat, kKimi,
       "FILE: the answer matches this GBNF grammar (llama.cpp syntax), enforced while sampling",
       text(FIELD(text.grammar))},
      {"--raw,!--no-raw", nullptr, Group::kChat, kChatApp,
       "print replies as plain text (no Markdown styling)", boolean(FIELD(serve.raw))},
      // server
      {"--host", "COLI_HOST", Group::kServer, kServe,
       "address to listen on (beyond loopback needs an API key or --insecure-bind)",
       text(FIELD(serve.host))},
      {"--port", "COLI_PORT", Group::kServer, kServe,
       "TCP port (0 = any free port, printed at start-up)", integer(FIELD(serve.port), 0, 65535)},
      {"--model-id", "COLI_MODEL_ID", Group::kServer, kServe, "the model id clients name",
       text(FIELD(serve.model_id))},
      {"--alias", nullptr, Group::kServer, kServe,
       "more model ids, comma separated: listed by /v1/models, accepted under --strict-model",
       list(FIELD(serve.aliases))},
      {"--strict-model,!--no-strict-model,!--accept-any-model", nullptr, Group::kServer, kServe,
       "404 for a request's model other than --model-id and the aliases (off: any name gets the "
       "served model; --accept-any-model = off)",
       boolean(FIELD(serve.strict_model))},
      {"--parallel", "COLI_PARALLEL", Group::kServer, kServe,
       "sessions served at once, decoded in one batch (each holds its own context state, all "
       "reserved at start)",
       integer(FIELD(serve.parallel), 1, 64)},
      {"--max-queue", "COLI_MAX_QUEUE", Group::kServer, kServe,
       "requests that may wait when every session is busy (more get 429)",
       integer(FIELD(serve.max_queue), 0, 1024)},
      {"--queue-timeout", "COLI_QUEUE_TIMEOUT", Group::kServer, kServe,
       "seconds a request may wait in the queue (then 429)",
       real(FIELD(serve.queue_timeout), 0.1, 86400)},
      {"--max-tokens", "COLI_MAX_TOKENS", Group::kServer, kServe | kChatApp,
       "ceiling on a request's max_tokens", integer(FIELD(serve.max_tokens), 1, int64_t{1} << 30)},
      {"--max-body-mb", "COLI_MAX_BODY_MB", Group::kServer, kServe,
       "largest request body in MiB (more gets 413)", real(FIELD(serve.max_body_mb), 0.001, 1024)},
      {"--sse-ping-interval", "COLI_SSE_PING", Group::kServer, kServe,
       "seconds of stream silence before a ': ping' comment (0 = off)",
       real(FIELD(serve.sse_ping), 0, 3600)},
      {"--drain-timeout", nullptr, Group::kServer, kServe,
       "seconds SIGTERM lets the running request finish",
       real(FIELD(serve.drain_timeout), 0, 86400)},
      {"--max-connections", "COLI_MAX_CONNECTIONS", Group::kServer, kServe,
       "live connections; more are closed at once", integer(FIELD(serve.max_connections), 1, 4096)},
      {"--max-connections-per-ip", "COLI_MAX_CONNECTIONS_PER_IP", Group::kServer, kServe,
       "live connections from one address (auto: 8 per remote address; local clients share the "
       "global cap)",
       auto_or_int(FIELD(serve.max_connections_per_ip), 1, 4096)},
      {"--read-deadline", "COLI_READ_DEADLINE", Group::kServer, kServe,
       "seconds a client has to send a whole request (line, headers, body); then 408 / closed",
       real(FIELD(serve.read_deadline), 0.5, 3600)},
      {"--webui,!--no-webui", nullptr, Group::kServer, kServe, "serve the web page at /",
       boolean(FIELD(serve.web_ui))},
      {"--reasoning",
       "COLI_REASONING",
       Group::kServer,
       kServe,
       "thinking when a request does not say (auto = on)",
       {[](Options& o, const std::string& v, const std::string& s) {
          if (v != "on" && v != "off" && v != "auto")
            throw Error(s + ": expected on, off or auto, got \"" + v + "\"");
          o.serve.reasoning = v != "off";
        },
        [](const Options& o) { return std::string(o.serve.reasoning ? "on" : "off"); },
        "on|off|auto"}},
      {"--reasoning-field", nullptr, Group::kServer, kServe,
       "the reasoning field's name in responses",
       choice(FIELD(serve.reasoning_field), {"reasoning_content", "reasoning", "both"})},
      {"--ckpt", "COLI_K3_CKPT", Group::kServer, kServe | kChatApp,
       "recurrent-state checkpoints for prefix reuse (auto = 2: on disk with --ckpt-dir, else in "
       "RAM "
       "when memory allows)",
       auto_or_int(FIELD(serve.ckpt_slots), 0, 8)},
      {"--ckpt-dir", "COLI_K3_CKPT_DIR", Group::kServer, kServe | kChatApp,
       "keep the checkpoints in this directory (0700, files 0600) instead of RAM",
       text(FIELD(serve.ckpt_dir))},
      {"--cache-dir", "COLI_CACHE_DIR", Group::kServer, kServe,
       "prefix cache on disk that survives restarts (prompt-boundary states with their MLA rows, "
       "keyed tags; 0700, files 0600; empty = off)",
       text(FIELD(serve.cache_dir))},
      {"--cache-gb", "COLI_CACHE_GB", Group::kServer, kServe,
       "bound of the --cache-dir prefix cache in GB (least recently used out)",
       real(FIELD(serve.cache_gb), 0.001, 1e6)},
      {"--ckpt-keep,!--no-ckpt-keep", nullptr, Group::kServer, kServe | kChatApp,
       "leave the disk checkpoints behind at exit", boolean(FIELD(serve.ckpt_keep))},
      // security
      {"--api-key", "COLI_API_KEY", Group::kSecurity, kServe,
       "required API key(s), comma separated (Bearer or x-api-key); prefer the variable or "
       "--api-key-file",
       list(FIELD(serve.api_keys))},
      {"--api-key-file", "COLI_API_KEY_FILE", Group::kSecurity, kServe,
       "file of API keys, one per line (# comments); must not be group/world readable",
       text(FIELD(serve.api_key_file))},
      {"--allowed-host", "COLI_ALLOWED_HOSTS", Group::kSecurity, kServe,
       "extra Host header names, comma separated (* = no check)", list(FIELD(serve.allowed_hosts))},
      {"--cors-origin", "COLI_CORS_ORIGINS", Group::kSecurity, kServe,
       "extra exact CORS origins, comma separated", list(FIELD(serve.cors_origins))},
      {"--insecure-bind,!--no-insecure-bind", "COLI_ALLOW_INSECURE_BIND", Group::kSecurity, kServe,
       "allow a non-loopback bind without an API key", boolean(FIELD(serve.insecure_bind))},
      {"--log-prompts,!--no-log-prompts", nullptr, Group::kSecurity, kServe,
       "log request bodies (off: prompts never reach the log)", boolean(FIELD(serve.log_prompts))},
      // validation
      {"--stats,!--no-stats", "K3_STATS", Group::kValidation, kKimi,
       "print the per-stage time breakdown", boolean(FIELD(debug.stats))},
      {"--prompt-ids,!--no-prompt-ids", "K3_CHAT_IDS", Group::kValidation, kKimi,
       "print the prompt's token ids (after tokenizing / chat rendering) to stderr",
       boolean(FIELD(debug.prompt_ids))},
      {"--layers", "K3_LAYERS", Group::kValidation, kKimi, "run only the first N layers (0 = all)",
       integer(FIELD(load.layers), 0, 4096)},
      {"--trace", "K3_TRACE", Group::kValidation, kKimi,
       "after prefill, write per-layer tensors to this .safetensors file",
       text(FIELD(debug.trace_path))},
      {"--logits", "K3_LOGITS", Group::kValidation, kKimi,
       "write raw f32 [T][vocab] logits of every prefill position to this file",
       text(FIELD(debug.logits_path))},
      {"--x0", "K3_X0", Group::kValidation, kKimi,
       "raw f32 [T][hidden] file whose rows replace the embedding", text(FIELD(debug.x0_path))},
      {"--prefix-log,!--no-prefix-log", "K3_PREFIX_LOG", Group::kValidation, kServe | kChatApp,
       "log prefix-reuse and checkpoint decisions on stderr", boolean(FIELD(serve.prefix_log))},
      {"--load-delay-ms", "K3_LOAD_DELAY_MS", Group::kValidation, kEngine,
       "sleep this long after every loaded layer (tests of a stopped load; the sleep is cut short "
       "by a stop)",
       integer(FIELD(load.load_delay_ms), 0, 600000)},
      {"--token-delay-ms", "COLI_TOKEN_DELAY_MS", Group::kValidation, kServe | kChatApp,
       "sleep this long after every generated token and every 32-token prefill piece (client "
       "testing: a stream or a prefill a client can cut)",
       integer(FIELD(serve.token_delay_ms), 0, 60000)},
      {"--script-ids",
       nullptr,
       Group::kValidation,
       kServe | kChatApp,
       "the first generated ids of every reply come from this list (drives tool calls and faults "
       "through test models)",
       {[](Options& o, const std::string& v, const std::string& s) {
          if (v.empty()) return;
          try {
            o.serve.script_ids = parse_id_list(v);
          } catch (const Error& e) {
            throw Error(s + ": " + e.what());
          }
        },
        [](const Options& o) {
          std::vector<std::string> items;
          for (int64_t id : o.serve.script_ids) items.push_back(std::to_string(id));
          return join(items, ",");
        },
        "id,id,..."}},
  };
  return rows;
}

#undef FIELD

// ---- programs -------------------------------------------------------------------------------

struct Program {
  const char* name;
  unsigned mask;
  bool coli;    // the coli defaults (OptionRow::coli_default) apply
  bool prompt;  // takes a positional prompt after the model directory
  const char* usage;
};

const Program kPrograms[] = {
    {"kimi_k3", kKimi, false, true,
     "usage: kimi_k3 <model_dir> \"prompt\" [-n N] [options]\n"
     "       kimi_k3 <model_dir> --chat \"question\" [--system \"...\"] [-n N] [options]\n"
     "       kimi_k3 <model_dir> --ids 1,2,3 [-n N] [options]\n"
     "       kimi_k3 -m <model_dir> -p \"prompt\" [-n N] [options]\n"
     "Runs Kimi K3 once on a prompt: text streamed to stdout, the summary on stderr.\n"},
    {"coli serve", kServe, true, false,
     "usage: coli serve [<model_dir>] [options]\n"
     "The HTTP API and the web page at /. OpenAI: /v1/chat/completions, /v1/completions,\n"
     "/v1/responses, /v1/models; Anthropic: /v1/messages, /v1/messages/count_tokens; and\n"
     "/health, /metrics, /slots, /tokenize, /detokenize, /props, /apply-template; llama-server:\n"
     "/completion. Without a model directory it serves the built-in trained tiny K3\n"
     "(assets/k3-mini).\n"},
    {"coli web", kServe, true, false,
     "usage: coli web [<model_dir>] [options]\n"
     "coli serve, printing the web page's URL (default model: the built-in assets/k3-mini).\n"},
    {"coli chat", kChatApp, true, false,
     "usage: coli chat [<model_dir>] [options]\n"
     "A terminal chat with the model loaded once (/help lists the commands). Without a model\n"
     "directory it runs the built-in trained tiny K3 (assets/k3-mini).\n"},
    {"coli tokenize", kTokenize, false, false,
     "usage: coli tokenize <model_dir> [--allow-special] < lines.jsonl\n"
     "JSON lines {\"text\": ...} on stdin -> {\"ids\": [...]} on stdout (other keys copied).\n"},
    {"coli render", kRender, false, false,
     "usage: coli render <model_dir> < lines.jsonl\n"
     "JSON lines {\"messages\": [...], \"tools\": ..., \"options\": {...}} -> {\"text\", \"ids\"} "
     "(the K3 chat template).\n"},
};

const Program& find_program(const std::string& name) {
  for (const Program& p : kPrograms)
    if (name == p.name) return p;
  throw Error("no option table for the program \"" + name + "\"");
}

// The defaults of `program`: the member initialisers, then the program's own.
Options program_defaults(const Program& program) {
  Options o;
  if (program.coli)
    for (const OptionRow& r : option_rows())
      if (r.coli_default) r.value.set(o, r.coli_default, std::string(r.flags) + " (default)");
  return o;
}

std::string shown_default(const OptionRow& r, const Options& defaults, bool coli) {
  if (coli && r.coli_shown_default) return r.coli_shown_default;
  if (r.shown_default) return r.shown_default;
  const std::string v = r.value.get(defaults);
  if (r.value.is_bool) return v == "1" ? "on" : "off";
  return v.empty() ? "none" : v;
}

// "--[no-]think", "--show-think, --[no-]show-think, --hide-think", "--ctx, --maxt".
std::string flag_display(const OptionRow& r) {
  std::vector<std::string> names = split_list(r.flags), shown;
  for (const std::string& n : names) {
    if (n[0] != '!') {
      const bool has_no =
          std::find(names.begin(), names.end(), "!--no-" + n.substr(2)) != names.end();
      shown.push_back(has_no ? "--[no-]" + n.substr(2) : n);
    } else if (std::find(names.begin(), names.end(), "--" + n.substr(6)) == names.end()) {
      shown.push_back(n.substr(1));
    }
  }
  return join(shown, ", ");
}

bool is_coli(const Program& program) {
  return std::string_view(program.name).starts_with("coli");
}

// The row's help in `program`'s --help: its own wording where the table's speaks of another.
const char* program_help(const OptionRow& r, const Program& program) {
  const char* own = is_coli(program) ? r.coli_help : r.kimi_help;
  return own ? own : r.help;
}

// Every spelling of the row's flags, with their dashes: "-m", "--model", "--no-think".
std::vector<std::string> flag_names(const OptionRow& r) {
  std::vector<std::string> names = split_list(r.flags);
  for (std::string& n : names)
    if (n[0] == '!') n.erase(0, 1);
  return names;
}

std::string help_text(const Program& program) {
  const Options defaults = program_defaults(program);
  std::ostringstream out;
  out << program.usage;
  for (Group g : kGroups) {
    bool any = false;
    for (const OptionRow& r : option_rows()) {
      if (r.group != g || !(r.listed & program.mask)) continue;
      if (!any) out << "\n" << group_name(g) << ":\n";
      any = true;
      std::string left = "  " + flag_display(r);
      if (!r.value.is_bool)
        left += " <" + (r.value.range.empty() ? std::string("text") : r.value.range) + ">";
      help_layout::entry(out, left, program_help(r, program),
                         "[default " + shown_default(r, defaults, program.coli) +
                             (r.env ? std::string(", env ") + r.env : "") +
                             (r.env_alias ? std::string(" or ") + r.env_alias : "") + "]");
    }
  }
  help_layout::other(out);
  out << "\nA flag beats its environment variable, which beats the default. Boolean flags take\n"
         "--x, --no-x or --x=0/1/true/false. An unknown K3_* or COLI_* variable is an error.\n";
  return out.str();
}

// Edits from a to b: insert, delete, replace, or swap two neighbours ("chta" -> "chat" is one).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string without_dashes(const std::string& s) {
  const size_t start = s.find_first_not_of('-');
  return start == std::string::npos ? std::string() : s.substr(start);
}

// Every flag the program accepts, its listed rows first (a tie goes to a flag its help shows).
std::vector<std::string> accepted_flags(const Program& program) {
  std::vector<std::string> names = {"--help", "--version"};
  for (bool listed : {true, false})
    for (const OptionRow& r : option_rows())
      if (((r.listed & program.mask) != 0) == listed)
        for (const std::string& n : flag_names(r)) names.push_back(n);
  return names;
}

bool is_bool_word(const std::string& v) {
  for (const char* w : {"0", "1", "true", "false", "yes", "no", "on", "off"})
    if (v == w) return true;
  return false;
}

}  // namespace

std::map<std::string, std::string> environment_map(char** envp) {
  std::map<std::string, std::string> env;
  for (char** entry = envp; entry && *entry; ++entry) {
    const std::string name_value = *entry;
    const size_t eq = name_value.find('=');
    if (eq != std::string::npos) env[name_value.substr(0, eq)] = name_value.substr(eq + 1);
  }
  return env;
}

std::string require_builtin_model(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::filesystem::path(dir) / "config.json", ec)) return dir;
  throw Error("no model directory given and the built-in model is missing: " + dir +
              "/config.json not found (it is assets/k3-mini of the source tree this build came "
              "from); pass a model directory, --model DIR or COLI_MODEL");
}

std::string model_note(const Options& options) {
  return options.builtin_model ? " (built-in trained tiny K3, no --model given)" : "";
}

std::vector<int64_t> parse_id_list(const std::string& text) {
  std::vector<int64_t> ids;
  std::string token;
  auto flush = [&] {
    if (token.empty()) return;
    ids.push_back(parse_int(token, "token id \"" + token + "\"", 0, INT32_MAX));
    token.clear();
  };
  for (char ch : text) {
    if (ch == ',' || ch == ' ' || ch == '\t' || ch == '\n')
      flush();
    else
      token += ch;
  }
  flush();
  if (ids.empty()) throw Error("no token ids in \"" + text + "\"");
  return ids;
}

std::string options_table_markdown() {
  const Options kimi = program_defaults(find_program("kimi_k3"));
  const Options coli = program_defaults(find_program("coli serve"));
  std::ostringstream out;
  out << "| flag | variable | default | range | group | meaning |\n|---|---|---|---|---|---|\n";
  for (Group g : kGroups) {
    for (const OptionRow& r : option_rows()) {
      if (r.group != g) continue;
      std::string def = shown_default(r, kimi, false);
      if (shown_default(r, coli, true) != def)
        def += " (coli: " + shown_default(r, coli, true) + ")";
      std::string flags = flag_display(r);
      std::string range = r.value.range;
      std::replace(range.begin(), range.end(), '|', '/');  // a | would end the cell
      out << "| `" << flags << "` | " << (r.env ? std::string("`") + r.env + "`" : "—") << " | "
          << def << " | " << (range.empty() ? "text" : range) << " | " << group_name(g) << " | "
          << r.help << " |\n";
    }
  }
  return out.str();
}

std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string w = without_dashes(word);
  if (w.size() < 2) return "";
  const size_t most = std::max<size_t>(1, w.size() / 3);
  std::string best, prefix;
  size_t best_distance = most + 1;
  for (const std::string& candidate : candidates) {
    const std::string c = without_dashes(candidate);
    // A two-letter word is only a slip of a longer name (--ot: --out), never of another short one.
    if (c.empty() || c == w || (w.size() < 3 && c.size() < 3)) continue;
    const size_t d = edit_distance(w, c);
    if (d < best_distance) best_distance = d, best = candidate;
    if (c.size() >= 3 && w.starts_with(c) && c.size() > without_dashes(prefix).size())
      prefix = candidate;
  }
  return best.empty() ? prefix : best;
}

std::string unknown_argument_message(const std::string& arg,
                                     const std::vector<std::string>& option_names) {
  if (arg.size() < 2 || arg[0] != '-') return "unexpected argument \"" + arg + "\"";
  const std::string name = arg.substr(0, arg.find('='));
  const std::string near = nearest_name(name, option_names);
  return "unknown option " + name + (near.empty() ? "" : " (did you mean " + near + "?)");
}

void check_single_dash(const std::vector<std::string>& args,
                       const std::vector<std::string>& long_names,
                       const std::vector<std::string>& value_flags) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (i > 0 &&
        std::find(value_flags.begin(), value_flags.end(), args[i - 1]) != value_flags.end())
      continue;
    if (a.size() < 3 || a[0] != '-' || a[1] == '-') continue;
    const std::string name = "-" + a.substr(0, a.find('='));
    if (std::find(long_names.begin(), long_names.end(), name) != long_names.end())
      throw Error("unknown option " + a.substr(0, a.find('=')) + " (did you mean " + name + "?)");
  }
}

namespace {

namespace fs = std::filesystem;

// `path` with each missing part replaced by the nearest name in its directory, when every
// missing part has one ("assets/k3-mni" -> "assets/k3-mini"); "" otherwise.
std::string nearest_existing_path(const std::string& path) {
  fs::path built;
  bool changed = false;
  for (const fs::path& part : fs::path(path)) {
    const fs::path next = built.empty() ? part : built / part;
    std::error_code ec;
    if (part.empty() || part == "." || part == ".." || fs::exists(next, ec)) {
      built = next;
      continue;
    }
    std::vector<std::string> siblings;
    for (const auto& entry : fs::directory_iterator(built.empty() ? "." : built, ec))
      siblings.push_back(entry.path().filename().string());
    std::sort(siblings.begin(), siblings.end());
    const std::string near = ec ? std::string() : nearest_name(part.string(), siblings);
    if (near.empty()) return "";
    built = built.empty() ? fs::path(near) : built / near;
    changed = true;
  }
  return changed ? built.string() : "";
}

bool has_config(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "config.json", ec);
}

bool has_safetensors(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".safetensors") return true;
  return false;
}

// A directory below `dir` that holds config.json: a subdirectory, or a Hugging Face cache
// entry's snapshots/<revision>/. "" when none does.
std::string model_below(const fs::path& dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const fs::path& base : {dir, dir / "snapshots"})
    for (const auto& entry : fs::directory_iterator(base, ec))
      if (entry.is_directory(ec) && has_config(entry.path())) found.push_back(entry.path());
  std::sort(found.begin(), found.end());
  return found.empty() ? "" : found.front().string();
}

}  // namespace

void check_model_dir(const std::string& program, const Options& options, ModelNeeds needs) {
  if (options.builtin_model) return;
  const std::string& dir = options.model_dir;
  const fs::path path(dir);
  std::error_code ec;
  const std::string needed = needs == ModelNeeds::kWeights
                                 ? "config.json and the *.safetensors shards"
                                 : "tiktoken.model and tokenizer_config.json";
  if (!fs::exists(path, ec)) {
    const bool prompt_like = dir.find_first_of(" \t\n?!,;\"") != std::string::npos;
    const bool kimi = program == "kimi_k3" && options.source("model") != OptionSource::kFlag;
    if (kimi && prompt_like)
      throw Error("\"" + dir +
                  "\" is not a model directory; it looks like a prompt. The model directory "
                  "comes first: kimi_k3 <model_dir> \"" +
                  dir + "\", or kimi_k3 -m <model_dir> -p \"" + dir + "\"");
    std::string message = dir + ": no such directory";
    if (const std::string near = nearest_existing_path(dir); !near.empty())
      message += " (did you mean " + near + "?)";
    else if (kimi && dir.find('/') == std::string::npos)
      message += "; if \"" + dir + "\" is the prompt, the model directory comes first: kimi_k3 " +
                 "<model_dir> \"" + dir + "\"";
    throw Error(message);
  }
  if (!fs::is_directory(path, ec)) {
    const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
    if (has_config(parent) || fs::is_regular_file(parent / "tiktoken.model", ec))
      throw Error(dir + " is a file of the model directory " + parent.string() +
                  ": pass the directory itself (" + program + " " + parent.string() + " ...)");
    throw Error(dir + " is a file, not a model directory (" + program +
                " takes the directory that holds " + needed + ")");
  }
  if (needs == ModelNeeds::kTokenizer) return;
  if (!has_config(path)) {
    std::string message = dir +
                          " has no config.json: not a model directory (a Hugging Face "
                          "snapshot holds config.json, model.safetensors.index.json and "
                          "the model-*.safetensors shards)";
    if (const std::string below = model_below(path); !below.empty())
      message += "; did you mean " + below + "?";
    throw Error(message);
  }
  if (fs::exists(path / "model.safetensors.index.json", ec) || has_safetensors(path)) return;
  for (const std::string& extra : options.load.extra_dirs)
    if (has_safetensors(extra)) return;
  throw Error(dir + " has config.json but no weights: no model.safetensors.index.json and no " +
              "*.safetensors file" + (options.load.extra_dirs.empty() ? "" : " (nor in --dirs)") +
              " (a download that has not finished?)");
}

void check_environment(const std::map<std::string, std::string>& env) {
  std::vector<std::string> known;
  for (const OptionRow& r : option_rows())
    for (const char* name : {r.env, r.env_alias})
      if (name) known.push_back(name);
  for (const auto& [name, value] : env) {
    if (name.rfind("K3_", 0) != 0 && name.rfind("COLI_", 0) != 0) continue;
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    // A typo must not silently change nothing.
    const std::string near = nearest_name(name, known);
    throw Error("unknown environment variable " + name +
                (near.empty() ? std::string() : " (did you mean " + near + "?)"));
  }
}

Options parse_kimi_k3_options(const std::vector<std::string>& args,
                              const std::map<std::string, std::string>& env) {
  return parse_options("kimi_k3", args, env);
}

Options parse_options(const std::string& program_name, const std::vector<std::string>& args,
                      const std::map<std::string, std::string>& env, bool needs_model) {
  const Program& program = find_program(program_name);
  check_environment(env);
  const std::vector<OptionRow>& rows = option_rows();
  {
    std::vector<std::string> long_names = {"--help", "--version"}, value_flags;
    for (const OptionRow& r : rows)
      for (const std::string& n : flag_names(r)) {
        if (n.starts_with("--")) long_names.push_back(n);
        if (!r.value.is_bool) value_flags.push_back(n);
      }
    check_single_dash(args, long_names, value_flags);
  }

  CLI::App app{program_name};
  app.set_help_flag();  // handled below so that --help works without a model directory
  app.allow_extras();   // unknown arguments are named below, with the nearest known flag
  bool help = false, version = false;
  app.add_flag("-h,--help", help);
  app.add_flag("--version", version);
  std::string model_positional, prompt_positional;
  app.add_option("model_dir", model_positional);
  CLI::Option* prompt_option =
      program.prompt ? app.add_option("prompt", prompt_positional) : nullptr;
  std::vector<std::string> given(rows.size());
  std::vector<CLI::Option*> cli(rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    cli[i] = rows[i].value.is_bool ? app.add_flag(rows[i].flags, given[i])
                                   : app.add_option(rows[i].flags, given[i]);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ArgumentMismatch& e) {
    // CLI11 says "--ngen: 1 required TEXT missing".
    const std::string what = e.what();
    const size_t colon = what.find(':');
    if (what.starts_with("-") && colon != std::string::npos && what.ends_with(" missing"))
      throw Error(what.substr(0, colon) + " needs a value (" + what.substr(0, colon) +
                  " VALUE or " + what.substr(0, colon) + "=VALUE)");
    throw Error(what);
  } catch (const CLI::ParseError& e) {
    throw Error(e.what());
  }

  Options o = program_defaults(program);
  if (help || version) {
    o.show_help = help;
    o.show_version = !help;
    o.help_text = help ? help_text(program) : version_text(program_name) + "\n";
    return o;
  }
  if (const std::vector<std::string> extras = app.remaining(); !extras.empty()) {
    std::string message = unknown_argument_message(extras.front(), accepted_flags(program));
    if (extras.front()[0] != '-')
      message += program.prompt
                     ? " (the model directory and the prompt are given already; quote a prompt "
                       "that has spaces)"
                     : " (" + program_name + " takes one model directory)";
    throw Error(message);
  }
  // A boolean flag takes its value after '=': in "--idot 0" the 0 would be a positional.
  const std::vector<CLI::Option*>& order = app.parse_order();
  for (size_t k = 1; k < order.size(); ++k) {
    if (order[k]->get_name() != "model_dir" && order[k] != prompt_option) continue;
    const auto previous = std::find(cli.begin(), cli.end(), order[k - 1]);
    const std::string& positional =
        order[k] == prompt_option ? prompt_positional : model_positional;
    if (previous != cli.end() && rows[previous - cli.begin()].value.is_bool &&
        is_bool_word(positional) &&
        (given[previous - cli.begin()] == "true" || given[previous - cli.begin()] == "false"))
      throw Error("--" + row_name(rows[previous - cli.begin()]) + " takes its value after '=' (--" +
                  row_name(rows[previous - cli.begin()]) + "=" + positional +
                  "), not as the next argument");
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const OptionRow& r = rows[i];
    const std::string name = row_name(r);
    const char* env_name = r.env && env.count(r.env)               ? r.env
                           : r.env_alias && env.count(r.env_alias) ? r.env_alias
                                                                   : nullptr;
    if (r.env && r.env_alias && env.count(r.env) && env.count(r.env_alias) &&
        env.at(r.env) != env.at(r.env_alias) && cli[i]->count() == 0)
      throw Error(std::string(r.env) + "=" + env.at(r.env) + " and " + r.env_alias + "=" +
                  env.at(r.env_alias) + " disagree (" + r.env_alias + " is the older name of " +
                  r.env + "): unset one");
    std::string value;
    if (cli[i]->count() > 0) {
      value = given[i];
      r.value.set(o, value, "--" + name);
      o.sources[name] = OptionSource::kFlag;
    } else if (env_name) {
      value = env.at(env_name);
      r.value.set(o, value, env_name);
      o.sources[name] = OptionSource::kEnvironment;
    } else {
      value = r.value.get(o);
    }
    o.effective.push_back(std::string(r.env ? r.env : ("--" + name).c_str()) + "=" + value);
  }
  if (o.load.cache.state_dir.empty()) {  // the per-user cache directory
    if (env.count("XDG_CACHE_HOME") && !env.at("XDG_CACHE_HOME").empty())
      o.load.cache.state_dir = env.at("XDG_CACHE_HOME") + "/kimi_k3";
    else if (env.count("HOME") && !env.at("HOME").empty())
      o.load.cache.state_dir = env.at("HOME") + "/.cache/kimi_k3";
  }
  // The positionals: "<model_dir> [prompt]". With -m / --model the first one is the prompt
  // (llama-cli's `-m DIR "text"`); with -p / --prompt both belong to the model directory's place.
  std::vector<std::string> positionals;
  for (const std::string* p : {&model_positional, &prompt_positional})
    if (!p->empty()) positionals.push_back(*p);
  const bool model_flag = o.source("model") == OptionSource::kFlag;
  const bool prompt_flag = o.given("prompt");
  if (model_flag && !positionals.empty()) {
    if (program.prompt && prompt_flag)
      throw Error("unexpected argument \"" + positionals.front() +
                  "\" (-m and -p give the model directory and the prompt already)");
    if (!program.prompt || positionals.size() > 1)
      throw Error("the model directory is given twice: -m/--model " + o.model_dir + " and \"" +
                  positionals.front() + "\"");
    o.prompt = positionals.front();
  } else {
    if (!positionals.empty()) o.model_dir = positionals.front();
    if (positionals.size() > 1) {
      if (prompt_flag)
        throw Error("the prompt is given twice: -p/--prompt \"" + o.prompt + "\" and \"" +
                    positionals[1] + "\"");
      o.prompt = positionals[1];
    }
  }
  if (!o.prompt.empty() && o.given("ids"))
    throw Error("give either a text prompt or --ids, not both");
  if (needs_model && o.model_dir.empty() && program.coli) {
    o.model_dir = require_builtin_model(builtin_model_dir());
    o.builtin_model = true;
  }
  if (needs_model && o.model_dir.empty())
    throw Error(
        "no model directory: pass it first on the command line, or set --model / COLI_MODEL");
  return o;
}

}  // namespace k3

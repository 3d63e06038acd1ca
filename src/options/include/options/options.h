// options/options.h — every run-time option, typed, built in exactly one place from one table
// (options.cpp: flag, environment variable, group, programs, help). The defaults are the member
// initialisers below and nowhere else (the table reads them from a default-constructed Options;
// a program whose default differs, e.g. coli serve's temperature, says so in its table row).
// A flag beats the environment, which beats the default. An unknown K3_* or COLI_* variable or
// an unparsable value is an error naming it. Nothing below apps/ reads the environment: apps
// pass it in.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace k3 {

// The routed-expert cache (experts/expert_cache.h).
struct CacheOptions {
  double expert_gb =
      8;  // K3_EXPERT_GB: RAM for cached experts over all MoE layers, GB (>= 1 slot per layer)
  bool direct = true;  // K3_DIRECT: O_DIRECT expert reads (0 = buffered with read-ahead advice)
  bool pin = true;     // K3_PIN: pin each layer's most used experts from the routing history
  std::string
      state_dir;  // K3_STATE_DIR: where .coli_usage is kept ("" = beside the model when writable)
  double usage_decay = 1;  // COLI_USAGE_DECAY: history counters × this when saved (0 < d <= 1)
  bool pipe = true;        // K3_PIPE: compute on arrived experts while the rest are read
  int load_threads = 4;    // K3_LOAD_THREADS: reader threads where io_uring is unavailable (1..16)
  std::string io_engine = "auto";  // K3_IO_ENGINE: auto, uring, threads
  bool prefetch = false;           // K3_PREFETCH: read the next MoE layer's predicted experts ahead
};

// The Vulkan expert tier (docs/vulkan.md). Nothing opens a device unless `enabled`.
struct VulkanOptions {
  bool enabled = false;          // COLI_VULKAN (K3_VK): routed experts on a Vulkan device
  double tier_gb = 0;            // COLI_VK_TIER_GB (K3_VK_GB): device memory for experts (0 = auto)
  double reserve_gb = 1;         // COLI_VK_TIER_RESERVE_GB: device memory left free in auto sizing
  int64_t rate = 16;             // COLI_VK_TIER_RATE (K3_VK_UP): expert uploads per token at most
  int64_t gemm_rows = 16;        // COLI_VK_TIER_GEMM_ROWS: rows from which an expert takes the GEMM
  int64_t device_cap_mb = 0;     // COLI_VK_DEVICE_CAP_MB: cap on the device memory taken (0 = none)
  std::string staged = "auto";   // COLI_VK_STAGED: uploads through staging: auto, 1, 0
  bool sync = false;             // COLI_VK_TIER_SYNC: promotions uploaded before the next step
  std::string prefill = "auto";  // COLI_VK_PREFILL: prompt chunks stream cold experts: auto/on/off
  int64_t prefill_slots = 64;    // COLI_VK_PREFILL_SLOTS: streamed experts per MoE step at most
  std::string dense = "auto";    // COLI_VK_DENSE: prompt chunks' dense matrices on the device:
                                 // auto (a discrete GPU), on, off
  int64_t dense_rows = 16;       // COLI_VK_DENSE_ROWS: rows of a chunk from which they go there
  bool validation = false;       // Khronos validation layer on, errors counted (tests; no option)
};

// How dense matrices are held in RAM and how experts are computed (docs/quant_formats.md). The
// member defaults are the release defaults of the option table; exact() is the f32 reference.
struct LoadOptions {
  int bits = 4;       // K3_BITS: KDA, latent, shared-expert and dense matrices (4, 8, 32)
  int mla_bits = 8;   // K3_MLA_BITS: MLA projections
  int head_bits = 8;  // K3_HEAD_BITS: lm_head
  // Whether each width above was chosen (flag, variable or code) rather than left at its default:
  // a repacked container's stored widths are kept unless chosen (docs/container.md §5).
  bool bits_chosen = false, mla_bits_chosen = false, head_bits_chosen = false;
  bool mmap = false;  // K3_MMAP: map a container's prepared matrices read-only instead of copying
  bool idot =
      true;  // K3_IDOT: integer dots for MXFP4 experts, int4 and int8 matrices (0 = float kernels)
  int64_t layers = 0;              // K3_LAYERS: run only the first N layers (0 = all)
  std::string isa = "auto";        // K3_ISA: kernel variant: auto, scalar, avx2, avx512
  bool experts_in_memory = false;  // --experts-in-memory: all routed experts in RAM (small models)
  std::vector<std::string> extra_dirs;  // K3_DIRS: more directories holding shards (one drive each)
  double expert_top_p = 0;  // K3_TOPP: keep routed experts up to this cumulative weight (0 = off)
  // K3_CHUNK: prompt tokens per layer-major prefill chunk (1..4096; 1 = token at a time; -1 =
  // auto: model/state.h's auto_prefill_chunk, resolved when the model loads)
  int64_t chunk = -1;
  // K3_KDA_CHUNKED: a prompt chunk's KDA recurrence in the chunk (WY / UT) form instead of token
  // by token (not bit-identical; K3_CHUNK=1 and decode are unchanged)
  bool kda_chunked = false;
  int64_t load_delay_ms = 0;  // K3_LOAD_DELAY_MS: debug sleep after every loaded layer
  CacheOptions cache;
  VulkanOptions vulkan;
  // --expert-parallel (K3_EXPERT_PARALLEL): under mpirun, routed expert e of every layer is
  // computed by rank e mod N (docs/scale-out.md §2).
  bool expert_parallel = false;
  double ep_timeout = 60;  // K3_EP_TIMEOUT: seconds rank 0 waits for a rank's answer
  // K3_EP_WEIGHTS: one weight per rank, experts shared in proportion (empty = equal: e mod N)
  std::vector<double> ep_weights;

  // f32 weights and the exact MXFP4 kernel: the settings the goldens are matched at.
  static LoadOptions exact() {
    LoadOptions o;
    o.bits = o.mla_bits = o.head_bits = 32;
    o.bits_chosen = o.mla_bits_chosen = o.head_bits_chosen = true;
    o.idot = false;
    return o;
  }
};

struct RuntimeOptions {
  int64_t max_tokens = 0;  // COLI_CTX (or K3_MAXT): context capacity (0 = prompt + ngen)
  int threads = 0;         // OMP_NUM_THREADS-like override via -t / --threads (0 = OpenMP default)
};

struct SamplingOptions {
  double temperature = 0.0;  // COLI_TEMP: 0 = greedy
  double top_p = 1.0;        // COLI_TOP_P: nucleus mass (1 = off)
  int64_t top_k = 0;         // COLI_TOP_K: keep the k most likely (0 = off)
  double min_p = 0.0;        // COLI_MIN_P: drop tokens below min_p x the top probability (0 = off)
  uint64_t seed = 0;  // COLI_SEED: sampling seed (the apps draw one when --seed is not given)
};

struct DebugOptions {
  std::string trace_path;   // K3_TRACE: safetensors file of per-layer tensors after prefill
  std::string logits_path;  // K3_LOGITS: raw f32 [T][vocab] of every prefill position
  std::string x0_path;      // K3_X0: raw f32 [T][hidden] rows replacing the embedding
  bool stats = false;       // K3_STATS: per-stage time breakdown after the run
  bool prompt_ids = false;  // K3_CHAT_IDS: print the prompt's token ids to stderr
};

// The text front end: chat turns, thinking, how output is shown (docs/chat_format.md §6).
struct TextOptions {
  std::string chat;    // --chat: one chat turn with this user message
  std::string system;  // --system: system message (implies a chat turn)
  bool think = true;   // --[no-]think / K3_THINK: open the think channel (0 = answer directly)
  std::string effort = "max";  // K3_EFFORT: thinking effort low | high | max | none
  bool show_think =
      true;             // --[no-]show-think / --hide-think / COLI_SHOW_THINK: print the reasoning
  bool labels = false;  // --labels: "[think] " / "[response] " labels even off a TTY
  bool allow_special = false;  // --allow-special: special-token spellings in raw text are specials
  bool bos = false;            // --bos: prepend [BOS] (the release never does)
  bool jsonl = false;          // --output jsonl: one JSON event per line on stdout
  std::string json_schema;     // --json-schema FILE: the answer matches this JSON Schema
  std::string grammar;         // --grammar FILE: the answer matches this GBNF grammar
};

// coli serve / web / chat (docs/serving.md §3.3, §4).
struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model_id = "kimi-k3";
  std::vector<std::string> aliases;
  bool strict_model = false;          // --strict-model: 404 for other model names (off: any name)
  std::vector<std::string> api_keys;  // COLI_API_KEY (comma separated)
  std::string api_key_file;
  std::vector<std::string> allowed_hosts, cors_origins;
  bool insecure_bind = false;
  int64_t parallel = 4;  // coli serve: sessions at once (coli chat and kimi_k3 run one)
  int64_t max_queue = 8;
  double queue_timeout = 300;
  int64_t max_tokens = 16384;  // ceiling of a request's max_tokens
  double max_body_mb = 8;
  double sse_ping = 10;
  double drain_timeout = 30;
  int64_t max_connections = 64;
  double read_deadline = 30;
  int64_t max_connections_per_ip = -1;  // -1 = auto: 8 per remote address, loopback uncapped
  bool log_prompts = false;
  bool web_ui = true;     // --[no-]webui: serve the web page
  bool reasoning = true;  // thinking when a request does not say
  std::string reasoning_field = "reasoning_content";
  int ckpt_slots = -1;  // -1 = auto
  std::string ckpt_dir;
  bool ckpt_keep = false;
  std::string cache_dir;  // --cache-dir: the prefix cache on disk ("" = off)
  double cache_gb = 8;    // --cache-gb: its bound
  bool prefix_log = false;
  int token_delay_ms = 0;
  std::vector<int64_t> script_ids;  // debug: scripted generated ids
  bool raw = false;                 // chat: plain text
};

// Where an option's value came from.
enum class OptionSource { kDefault, kEnvironment, kFlag };

struct Options {
  std::string model_dir;  // positional or -m / --model / COLI_MODEL
  // coli serve / web / chat given no model: model_dir is builtin_model_dir().
  bool builtin_model = false;
  // Text prompt (plain completion): the positional after the model directory, or -p / --prompt
  // (then every positional is the model directory's; with -m / --model the positional is it).
  std::string prompt;
  std::vector<int64_t> ids;  // --ids 1,2,3 (given("ids") tells an --ids run)
  int64_t ngen = 16;         // -n / --ngen / K3_NGEN: tokens to generate
  LoadOptions load;
  RuntimeOptions runtime;
  SamplingOptions sampling;
  DebugOptions debug;
  TextOptions text;
  ServeOptions serve;
  bool show_help = false;
  bool show_version = false;
  std::string help_text;  // --help: the program's help; --version: the version line
  // "name=value" lines of the effective options, for the start-up banner.
  std::vector<std::string> effective;
  // Where each option came from, by its long flag name without dashes ("temp", "ngen", "ids").
  std::map<std::string, OptionSource, std::less<>> sources;

  // "Was this option given?" — by a flag or its environment variable (name as in `sources`).
  bool given(std::string_view name) const { return source(name) != OptionSource::kDefault; }
  OptionSource source(std::string_view name) const {
    const auto it = sources.find(name);
    return it == sources.end() ? OptionSource::kDefault : it->second;
  }
};

// Parses argv (argv[0] excluded) and the environment for kimi_k3. Throws k3::Error with a
// one-line message naming the flag or variable on any problem; an unknown flag names the nearest
// known one ("unknown option --chta (did you mean --chat?)").
Options parse_kimi_k3_options(const std::vector<std::string>& args,
                              const std::map<std::string, std::string>& env);
// The same table for another program: "kimi_k3", "coli serve", "coli web", "coli chat",
// "coli tokenize" or "coli render" (anything else throws). The program picks the help (its
// groups, the flags it lists) and its defaults. `needs_model` false lets it run without a
// model directory.
Options parse_options(const std::string& program, const std::vector<std::string>& args,
                      const std::map<std::string, std::string>& env, bool needs_model = true);

// The unknown K3_* / COLI_* variables of `env`: throws k3::Error "unknown environment variable
// COLI_TMEP (did you mean COLI_TEMP?)" for the first one. Other names are not ours to judge.
void check_environment(const std::map<std::string, std::string>& env);

// The "did you mean" of every program (flags, variables, commands, paths): the candidate nearest
// to `word` when it is near enough to be a slip — at most max(1, |word| / 3) edits (insert,
// delete, replace, or swap two neighbours), else the longest candidate that `word` starts with
// (--temperature: --temp). Leading dashes are ignored on both sides; a one-letter word gets none
// and a two-letter one only a longer name (--ot: --out). Ties go to the earlier candidate. ""
// when none is near.
std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates);

// The error for an argument a program does not take: "unknown option --chta (did you mean
// --chat?)" for a flag (`arg` starting with '-', any "=value" dropped), else `unexpected
// argument "x"`. `option_names` are the program's flags with their dashes ("--chat", "-m").
std::string unknown_argument_message(const std::string& arg,
                                     const std::vector<std::string>& option_names);

// "-ngen" (one dash before a long name) would read as "-n gen": throws k3::Error "unknown option
// -ngen (did you mean --ngen?)" for the first argument that is one dash and a long flag's name.
// An argument right after `value_flags` (flags that take a value) is that value and not judged.
void check_single_dash(const std::vector<std::string>& args,
                       const std::vector<std::string>& long_names,
                       const std::vector<std::string>& value_flags);

// What a program reads of its model directory.
enum class ModelNeeds {
  kTokenizer,  // coli tokenize / render: tiktoken.model and tokenizer_config.json
  kWeights,    // kimi_k3, coli serve / web / chat: config.json and the safetensors shards
};
// Throws k3::Error saying what options.model_dir is when it is not a model directory: a path
// that does not exist (with the nearest existing spelling: assets/k3-mni -> assets/k3-mini), a
// file (config.json or a shard: "pass the directory X"), text that looks like a prompt (kimi_k3:
// the model directory comes first), a directory without config.json or without weights (no
// model.safetensors.index.json and no *.safetensors, here or in --dirs). `program` ("kimi_k3",
// "coli serve", ...) words the hints. The built-in model is not checked (builtin_model).
void check_model_dir(const std::string& program, const Options& options, ModelNeeds needs);

// "<program> <version> (git <hash>, <build type> build; kernels scalar avx2 avx512, this CPU
// runs <isa>)", for --version on every binary.
std::string version_text(const std::string& program);

// The process environment as a map, from `envp` (apps pass `environ`; nothing below apps/ reads
// the environment itself).
std::map<std::string, std::string> environment_map(char** envp);

// The built-in trained tiny K3 (~11M parameters, trained on the Brown corpus by tools/train/):
// assets/k3-mini in this build's source tree. coli serve / web / chat run it when no model
// directory is given (kimi_k3 always needs one: `kimi_k3 "prompt"` would read as a directory).
std::string builtin_model_dir();
// `dir` when it holds a model (config.json); else throws k3::Error naming the missing path and
// how to give a model instead.
std::string require_builtin_model(const std::string& dir);
// What the start-up lines say after the model directory: " (built-in trained tiny K3, no
// --model given)" for the built-in model, else "".
std::string model_note(const Options& options);

// Parses "1,2,3" or "1 2 3" into ids. Throws k3::Error.
std::vector<int64_t> parse_id_list(const std::string& text);

// The option table as Markdown ("| flag | variable | default | range | group | meaning |"), each
// row with kimi_k3's default and coli's where it differs. docs/options.md holds a copy between
// "<!-- options-table -->" markers: apps/k3_options_md regenerates it, options_test checks it.
std::string options_table_markdown();

}  // namespace k3

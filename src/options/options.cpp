#include "options/options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <functional>
#include <optional>
#include <sstream>

#include "util/error.h"

namespace k3 {
namespace {

using Setter = std::function<void(Options&, const std::string& value, const std::string& source)>;

struct OptionRow {
  const char* flag;     // "--bits"; nullptr when environment-only
  const char* env;      // "K3_BITS"; nullptr when flag-only
  const char* fallback; // default, as text (parsed by the setter like any other value)
  const char* help;
  Setter set;
  bool is_switch = false;  // a flag without a value ("--stats" means "1"); the variable takes 0/1
};

int64_t parse_int(const std::string& value, const std::string& source, int64_t lo, int64_t hi) {
  int64_t out = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (value.empty() || ec != std::errc() || ptr != end)
    throw Error(source + ": expected an integer, got \"" + value + "\"");
  if (out < lo || out > hi)
    throw Error(source + ": " + value + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
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
    throw Error(source + ": " + value + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return out;
}

bool parse_bool(const std::string& value, const std::string& source) {
  if (value == "1" || value == "true" || value == "yes" || value == "on") return true;
  if (value == "0" || value == "false" || value == "no" || value == "off") return false;
  throw Error(source + ": expected 0 or 1, got \"" + value + "\"");
}

// Dense-matrix bit widths: 4 (int4 groups of 64), 8 (int8 per row) or 32 (f32).
int parse_bits(const std::string& value, const std::string& source) {
  const int64_t bits = parse_int(value, source, 1, 64);
  if (bits != 4 && bits != 8 && bits != 32)
    throw Error(source + "=" + value + " is not a supported width: use 4 (int4 g64), 8 (int8) or 32 (f32)");
  return static_cast<int>(bits);
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

const std::vector<OptionRow>& option_rows() {
  static const std::vector<OptionRow> rows = {
      {"--model", "COLI_MODEL", "", "model directory (Hugging Face snapshot)",
       [](Options& o, const std::string& v, const std::string&) { if (!v.empty()) o.model_dir = v; }},
      {"--ids", nullptr, "", "prompt as token ids, comma or space separated (no BOS added)",
       [](Options& o, const std::string& v, const std::string& s) {
         if (v.empty()) return;
         try {
           o.ids = parse_id_list(v);
         } catch (const Error& e) {
           throw Error(s + ": " + e.what());
         }
         o.ids_given = true;
       }},
      {"--ngen", "K3_NGEN", "16", "tokens to generate",
       [](Options& o, const std::string& v, const std::string& s) { o.ngen = parse_int(v, s, 0, int64_t{1} << 24); }},
      {"--ctx,--maxt", "K3_MAXT", "0", "context capacity in tokens (0 = prompt + ngen; coli serve/chat: 8192)",
       [](Options& o, const std::string& v, const std::string& s) { o.runtime.max_tokens = parse_int(v, s, 0, int64_t{1} << 24); }},
      {"--threads", nullptr, "0", "compute threads (0 = OpenMP default: OMP_NUM_THREADS or all cores)",
       [](Options& o, const std::string& v, const std::string& s) { o.runtime.threads = static_cast<int>(parse_int(v, s, 0, 1024)); }},
      {"--temp", "COLI_TEMP", "0", "sampling temperature (0 = greedy)",
       [](Options& o, const std::string& v, const std::string& s) { o.sampling.temperature = parse_double(v, s, 0.0, 100.0); }},
      {"--top-p", "COLI_TOP_P", "1", "nucleus sampling mass in (0, 1] (1 = off)",
       [](Options& o, const std::string& v, const std::string& s) {
         o.sampling.top_p = parse_double(v, s, 0.0, 1.0);
         if (o.sampling.top_p <= 0.0) throw Error(s + ": must be greater than 0");
       }},
      {"--top-k", "COLI_TOP_K", "0", "keep only the k most likely tokens (0 = off)",
       [](Options& o, const std::string& v, const std::string& s) { o.sampling.top_k = parse_int(v, s, 0, int64_t{1} << 24); }},
      {"--min-p", "COLI_MIN_P", "0", "drop tokens less likely than min-p x the most likely one (0 = off)",
       [](Options& o, const std::string& v, const std::string& s) { o.sampling.min_p = parse_double(v, s, 0.0, 1.0); }},
      {"--seed", "COLI_SEED", "", "sampling seed (default: from the clock, printed in the summary)",
       [](Options& o, const std::string& v, const std::string& s) {
         if (v.empty()) return;
         o.sampling.seed = static_cast<uint64_t>(parse_int(v, s, 0, INT64_MAX));
         o.sampling.seed_set = true;
       }},
      {"--chat", nullptr, "", "one chat turn: this user message, rendered with the K3 chat template",
       [](Options& o, const std::string& v, const std::string&) { o.text.chat = v; }},
      {"--system", nullptr, "", "system message of the chat turn (implies a chat turn)",
       [](Options& o, const std::string& v, const std::string&) { o.text.system = v; }},
      {"--think", "K3_THINK", "1", "chat: open the think channel (K3_THINK=0: answer directly)",
       [](Options& o, const std::string& v, const std::string& s) { o.text.think = parse_bool(v, s); }, true},
      {"--no-think", nullptr, "0", "chat: answer directly (same as K3_THINK=0)",
       [](Options& o, const std::string& v, const std::string& s) { if (parse_bool(v, s)) o.text.think = false; }, true},
      {"--effort", "K3_EFFORT", "max", "chat: thinking effort low, high or max (none = no effort message)",
       [](Options& o, const std::string& v, const std::string& s) {
         if (v != "low" && v != "high" && v != "max" && v != "none")
           throw Error(s + ": expected low, high, max or none, got \"" + v + "\" (the release rejects medium)");
         o.text.effort = v;
       }},
      {nullptr, "COLI_SHOW_THINK", "1", "print the model's reasoning (0 = hide it)",
       [](Options& o, const std::string& v, const std::string& s) { o.text.show_think = parse_bool(v, s); }},
      {"--hide-think", nullptr, "0", "do not print the model's reasoning (same as COLI_SHOW_THINK=0)",
       [](Options& o, const std::string& v, const std::string& s) { if (parse_bool(v, s)) o.text.show_think = false; }, true},
      {"--labels", nullptr, "0", "print [think] / [response] labels even when stdout is not a terminal",
       [](Options& o, const std::string& v, const std::string& s) { o.text.labels = parse_bool(v, s); }, true},
      {"--allow-special", nullptr, "0", "raw text: special-token spellings become special tokens (otherwise they stay plain text)",
       [](Options& o, const std::string& v, const std::string& s) { o.text.allow_special = parse_bool(v, s); }, true},
      {"--bos", nullptr, "0", "prepend [BOS] to the prompt (the release never does)",
       [](Options& o, const std::string& v, const std::string& s) { o.text.bos = parse_bool(v, s); }, true},
      {"--output", nullptr, "text", "stdout format: text, or jsonl (one JSON event per line: token, tool_call, done)",
       [](Options& o, const std::string& v, const std::string& s) {
         if (v != "text" && v != "jsonl") throw Error(s + ": expected text or jsonl, got \"" + v + "\"");
         o.text.jsonl = v == "jsonl";
       }},
      {"--bits", "K3_BITS", "4", "KDA/latent/shared/dense matrices in RAM: 4 = int4 g64, 8 = int8, 32 = f32",
       [](Options& o, const std::string& v, const std::string& s) { o.load.bits = parse_bits(v, s); }},
      {"--mla-bits", "K3_MLA_BITS", "8", "MLA matrices in RAM: 4, 8 or 32",
       [](Options& o, const std::string& v, const std::string& s) { o.load.mla_bits = parse_bits(v, s); }},
      {"--head-bits", "K3_HEAD_BITS", "8", "lm_head in RAM: 4, 8 or 32",
       [](Options& o, const std::string& v, const std::string& s) { o.load.head_bits = parse_bits(v, s); }},
      {"--idot", "K3_IDOT", "1", "MXFP4 experts and int4 matrices: 1 = integer dots on int8 activations, 0 = float kernels",
       [](Options& o, const std::string& v, const std::string& s) { o.load.idot = parse_bool(v, s); }},
      {"--isa", "K3_ISA", "auto", "kernel variant: auto (best this CPU runs), scalar, avx2, avx512",
       [](Options& o, const std::string& v, const std::string& s) {
         if (v != "auto" && v != "scalar" && v != "avx2" && v != "avx512")
           throw Error(s + ": expected auto, scalar, avx2 or avx512, got \"" + v + "\"");
         o.load.isa = v;
       }},
      {"--chunk", "K3_CHUNK", "32", "prefill: prompt tokens run layer-major together, 1..512 (1 = token at a time; same logits)",
       [](Options& o, const std::string& v, const std::string& s) { o.load.chunk = parse_int(v, s, 1, 512); }},
      {"--dirs", "K3_DIRS", "", "more directories holding shards of the model (a split over drives; ',' or ';' separated; each shard in one place)",
       [](Options& o, const std::string& v, const std::string&) {
         std::string list = v;
         std::replace(list.begin(), list.end(), ';', ',');
         o.load.extra_dirs = split_list(list);
       }},
      {"--topp", "K3_TOPP", "0", "quality lever: keep routed experts up to this cumulative weight (0 < p < 1), renormalised; 0 = all (compare logits before use)",
       [](Options& o, const std::string& v, const std::string& s) {
         o.load.expert_top_p = parse_double(v, s, 0.0, 1.0);
         if (o.load.expert_top_p >= 1.0) o.load.expert_top_p = 0.0;
       }},
      {"--experts-in-memory", nullptr, "0", "read every routed expert into RAM at load (models that fit)",
       [](Options& o, const std::string& v, const std::string& s) { o.load.experts_in_memory = parse_bool(v, s); }, true},
      {"--expert-gb", "K3_EXPERT_GB", "8", "routed-expert cache in RAM, GB over all MoE layers (at least one slot per layer; lowered when memory is short)",
       [](Options& o, const std::string& v, const std::string& s) {
         o.load.cache.expert_gb = parse_double(v, s, 0.0, 1e6);
         if (o.load.cache.expert_gb <= 0.0) throw Error(s + ": must be greater than 0");
       }},
      {"--direct", "K3_DIRECT", "1", "expert reads with O_DIRECT (0 = buffered with read-ahead advice; automatic where the filesystem refuses it)",
       [](Options& o, const std::string& v, const std::string& s) { o.load.cache.direct = parse_bool(v, s); }},
      {"--pin", "K3_PIN", "1", "pin each layer's most used experts (up to half its slots) from the routing history",
       [](Options& o, const std::string& v, const std::string& s) { o.load.cache.pin = parse_bool(v, s); }},
      {"--pipe", "K3_PIPE", "1", "compute on each routed expert as soon as its read lands, while the rest stream (0 = wait for all reads first)",
       [](Options& o, const std::string& v, const std::string& s) { o.load.cache.pipe = parse_bool(v, s); }},
      {"--load-threads", "K3_LOAD_THREADS", "4", "expert reader threads, 1..16, where io_uring is unavailable (or with K3_IO_ENGINE=threads)",
       [](Options& o, const std::string& v, const std::string& s) { o.load.cache.load_threads = static_cast<int>(parse_int(v, s, 1, 16)); }},
      {"--io-engine", "K3_IO_ENGINE", "auto", "expert reads: auto (io_uring when the kernel allows, else threads), uring, threads",
       [](Options& o, const std::string& v, const std::string& s) {
         if (v != "auto" && v != "uring" && v != "threads")
           throw Error(s + ": expected auto, uring or threads, got \"" + v + "\"");
         o.load.cache.io_engine = v;
       }},
      {"--prefetch", "K3_PREFETCH", "0", "read ahead the experts the next MoE layer's router picks for the current layer's input (timing only)",
       [](Options& o, const std::string& v, const std::string& s) { o.load.cache.prefetch = parse_bool(v, s); }},
      {"--usage-decay", "COLI_USAGE_DECAY", "1", "routing history: counters multiplied by this (0 < d <= 1) when saved; 0.99 = ~69-run half-life",
       [](Options& o, const std::string& v, const std::string& s) {
         o.load.cache.usage_decay = parse_double(v, s, 0.0, 1.0);
         if (o.load.cache.usage_decay <= 0.0) throw Error(s + ": must be greater than 0");
       }},
      {"--state-dir", "K3_STATE_DIR", "", "directory for the routing history (default $XDG_CACHE_HOME/kimi_k3 or ~/.cache/kimi_k3; never the model directory)",
       [](Options& o, const std::string& v, const std::string&) { o.load.cache.state_dir = v; }},
      {"--stats", "K3_STATS", "0", "print the per-stage time breakdown (1 = on)",
       [](Options& o, const std::string& v, const std::string& s) { o.debug.stats = parse_bool(v, s); }, true},
      {"--prompt-ids", "K3_CHAT_IDS", "0", "print the prompt's token ids (after tokenizing / chat rendering) to stderr",
       [](Options& o, const std::string& v, const std::string& s) { o.debug.prompt_ids = parse_bool(v, s); }, true},
      {"--layers", "K3_LAYERS", "0", "run only the first N layers (validation; 0 = all)",
       [](Options& o, const std::string& v, const std::string& s) { o.load.layers = parse_int(v, s, 0, 4096); }},
      {"--trace", "K3_TRACE", "", "after prefill, write per-layer tensors to this .safetensors file",
       [](Options& o, const std::string& v, const std::string&) { o.debug.trace_path = v; }},
      {"--logits", "K3_LOGITS", "", "write raw f32 [T][vocab] logits of every prefill position to this file",
       [](Options& o, const std::string& v, const std::string&) { o.debug.logits_path = v; }},
      {"--x0", "K3_X0", "", "raw f32 [T][hidden] file whose rows replace the embedding",
       [](Options& o, const std::string& v, const std::string&) { o.debug.x0_path = v; }},
      // coli serve / web / chat.
      {"--host", "COLI_HOST", "127.0.0.1", "serve: address to listen on (beyond loopback needs an API key or --insecure-bind)",
       [](Options& o, const std::string& v, const std::string&) { o.serve.host = v; }},
      {"--port", "COLI_PORT", "8000", "serve: TCP port (0 = any free port, printed at start-up)",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.port = static_cast<int>(parse_int(v, s, 0, 65535)); }},
      {"--model-id", "COLI_MODEL_ID", "kimi-k3", "serve: the model id clients name",
       [](Options& o, const std::string& v, const std::string&) { o.serve.model_id = v; }},
      {"--alias", nullptr, "", "serve: more accepted model ids, comma separated",
       [](Options& o, const std::string& v, const std::string&) { o.serve.aliases = split_list(v); }},
      {"--accept-any-model", nullptr, "0", "serve: accept any model id",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.accept_any_model = parse_bool(v, s); }, true},
      {"--api-key", "COLI_API_KEY", "", "serve: required API key(s), comma separated (Bearer or x-api-key)",
       [](Options& o, const std::string& v, const std::string&) { o.serve.api_keys = split_list(v); }},
      {"--api-key-file", "COLI_API_KEY_FILE", "", "serve: file of API keys, one per line (# comments); must not be group/world readable",
       [](Options& o, const std::string& v, const std::string&) { o.serve.api_key_file = v; }},
      {"--allowed-host", "COLI_ALLOWED_HOSTS", "", "serve: extra Host header names, comma separated (* = no check)",
       [](Options& o, const std::string& v, const std::string&) { o.serve.allowed_hosts = split_list(v); }},
      {"--cors-origin", "COLI_CORS_ORIGINS", "", "serve: extra exact CORS origins, comma separated",
       [](Options& o, const std::string& v, const std::string&) { o.serve.cors_origins = split_list(v); }},
      {"--insecure-bind", "COLI_ALLOW_INSECURE_BIND", "0", "serve: allow a non-loopback bind without an API key",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.insecure_bind = parse_bool(v, s); }, true},
      {"--max-queue", "COLI_MAX_QUEUE", "8", "serve: requests that may wait behind the running one (more get 429)",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.max_queue = parse_int(v, s, 0, 1024); }},
      {"--queue-timeout", "COLI_QUEUE_TIMEOUT", "300", "serve: seconds a request may wait in the queue (then 429)",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.queue_timeout = parse_double(v, s, 0.1, 86400); }},
      {"--max-tokens", "COLI_MAX_TOKENS", "16384", "serve: ceiling on a request's max_tokens",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.max_tokens = parse_int(v, s, 1, int64_t{1} << 30); }},
      {"--max-body-mb", "COLI_MAX_BODY_MB", "8", "serve: largest request body in MiB (more gets 413)",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.max_body_mb = parse_double(v, s, 0.001, 1024); }},
      {"--sse-ping-interval", "COLI_SSE_PING", "10", "serve: seconds of stream silence before a ': ping' comment (0 = off)",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.sse_ping = parse_double(v, s, 0, 3600); }},
      {"--drain-timeout", nullptr, "30", "serve: seconds SIGTERM lets the running request finish",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.drain_timeout = parse_double(v, s, 0, 86400); }},
      {"--max-connections", "COLI_MAX_CONNECTIONS", "64", "serve: live connections; more are closed at once",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.max_connections = parse_int(v, s, 1, 4096); }},
      {"--max-connections-per-ip", nullptr, "auto", "serve: live connections from one address (auto: 8 per remote address; local clients share the global cap)",
       [](Options& o, const std::string& v, const std::string& s) {
         o.serve.max_connections_per_ip = v == "auto" ? -1 : parse_int(v, s, 1, 4096);
       }},
      {"--read-deadline", "COLI_READ_DEADLINE", "30", "serve: seconds a client has to send a whole request (line, headers, body); then 408 / closed",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.read_deadline = parse_double(v, s, 0.5, 3600); }},
      {"--log-prompts", nullptr, "0", "serve: log request bodies (off: prompts never reach the log)",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.log_prompts = parse_bool(v, s); }, true},
      {"--no-webui", nullptr, "0", "serve: do not serve the web page",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.no_webui = parse_bool(v, s); }, true},
      {"--reasoning", "COLI_REASONING", "auto", "serve: thinking when a request does not say: on, off, auto (= on)",
       [](Options& o, const std::string& v, const std::string& s) {
         if (v != "on" && v != "off" && v != "auto") throw Error(s + ": expected on, off or auto, got \"" + v + "\"");
         o.serve.reasoning = v != "off";
       }},
      {"--reasoning-field", nullptr, "reasoning_content", "serve: reasoning field name: reasoning_content, reasoning or both",
       [](Options& o, const std::string& v, const std::string& s) {
         if (v != "reasoning_content" && v != "reasoning" && v != "both")
           throw Error(s + ": expected reasoning_content, reasoning or both, got \"" + v + "\"");
         o.serve.reasoning_field = v;
       }},
      {"--ckpt", "COLI_K3_CKPT", "auto", "recurrent-state photos: auto (2 in RAM when memory allows), or 0-8 slots",
       [](Options& o, const std::string& v, const std::string& s) {
         o.serve.ckpt_slots = v == "auto" ? -1 : static_cast<int>(parse_int(v, s, 0, 8));
       }},
      {"--ckpt-dir", "COLI_K3_CKPT_DIR", "", "keep the photos in this directory (0700, files 0600) instead of RAM",
       [](Options& o, const std::string& v, const std::string&) { o.serve.ckpt_dir = v; }},
      {"--ckpt-keep", nullptr, "0", "leave the disk photos behind at exit",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.ckpt_keep = parse_bool(v, s); }, true},
      {"--prefix-log", "K3_PREFIX_LOG", "0", "log prefix-reuse and checkpoint decisions on stderr",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.prefix_log = parse_bool(v, s); }, true},
      {"--token-delay-ms", "COLI_TOKEN_DELAY_MS", "0", "debug: sleep this long after every generated token (client testing)",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.token_delay_ms = static_cast<int>(parse_int(v, s, 0, 60000)); }},
      {"--script-ids", nullptr, "", "debug: the first generated ids of every reply come from this list (drives tool calls and faults through test models)",
       [](Options& o, const std::string& v, const std::string& s) {
         if (!v.empty()) o.serve.script_ids = parse_id_list(v);
         (void)s;
       }},
      {"--raw", nullptr, "0", "chat: print replies as plain text (no Markdown styling)",
       [](Options& o, const std::string& v, const std::string& s) { o.serve.raw = parse_bool(v, s); }, true},
  };
  return rows;
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

std::vector<int64_t> parse_id_list(const std::string& text) {
  std::vector<int64_t> ids;
  std::string token;
  auto flush = [&] {
    if (token.empty()) return;
    ids.push_back(parse_int(token, "token id \"" + token + "\"", 0, INT32_MAX));
    token.clear();
  };
  for (char ch : text) {
    if (ch == ',' || ch == ' ' || ch == '\t' || ch == '\n') flush();
    else token += ch;
  }
  flush();
  if (ids.empty()) throw Error("no token ids in \"" + text + "\"");
  return ids;
}

std::string options_table_markdown() {
  std::ostringstream out;
  out << "| variable | flag | default | meaning |\n|---|---|---|---|\n";
  for (const auto& r : option_rows()) {
    out << "| " << (r.env ? std::string("`") + r.env + "`" : "—") << " | "
        << (r.flag ? std::string("`") + r.flag + "`" : "—") << " | "
        << (*r.fallback ? r.fallback : "—") << " | " << r.help << " |\n";
  }
  return out.str();
}

Options parse_kimi_k3_options(const std::vector<std::string>& args,
                              const std::map<std::string, std::string>& env) {
  return parse_options("kimi_k3", args, env);
}

Options parse_options(const std::string& program, const std::vector<std::string>& args,
                      const std::map<std::string, std::string>& env, bool needs_model) {
  // Unknown K3_* variables are refused: a typo must not silently change nothing.
  for (const auto& [name, value] : env) {
    if (name.rfind("K3_", 0) != 0) continue;
    bool known = false;
    for (const auto& r : option_rows()) known = known || (r.env && name == r.env);
    if (!known) throw Error("unknown environment variable " + name + " (see --help for the supported K3_* variables)");
  }

  CLI::App app{program + " — run Kimi K3 on one machine"};
  app.set_help_flag();  // handled below so that --help works without a model directory
  bool help = false;
  app.add_flag("-h,--help", help, "print this help");
  std::string model_positional, prompt_positional;
  app.add_option("model_dir", model_positional, "model directory");
  app.add_option("prompt", prompt_positional, "text prompt");
  std::vector<std::optional<std::string>> given(option_rows().size());
  for (size_t i = 0; i < option_rows().size(); ++i) {
    const OptionRow& r = option_rows()[i];
    if (!r.flag) continue;
    const std::string help_text = std::string(r.help) + (r.env ? std::string(" [") + r.env + "]" : "") +
                                  (*r.fallback ? std::string(" (default ") + r.fallback + ")" : "");
    if (r.is_switch)
      app.add_flag_callback(r.flag, [&given, i] { given[i] = "1"; }, help_text);
    else
      app.add_option_function<std::string>(r.flag, [&given, i](const std::string& v) { given[i] = v; }, help_text);
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    throw Error(e.what());
  }

  Options o;
  if (help) {
    o.show_help = true;
    o.help_text = app.help() + "\nEnvironment variables:\n" + options_table_markdown();
    return o;
  }
  for (size_t i = 0; i < option_rows().size(); ++i) {
    const OptionRow& r = option_rows()[i];
    std::string value = r.fallback, source = std::string(r.flag ? r.flag : r.env) + " (default)";
    if (given[i]) {
      value = *given[i];
      source = r.flag;
    } else if (r.env && env.count(r.env)) {
      value = env.at(r.env);
      source = r.env;
    }
    r.set(o, value, source);
    o.effective.push_back(std::string(r.env ? r.env : r.flag) + "=" + value);
  }
  if (o.load.cache.state_dir.empty()) {  // the per-user cache directory
    if (env.count("XDG_CACHE_HOME") && !env.at("XDG_CACHE_HOME").empty()) o.load.cache.state_dir = env.at("XDG_CACHE_HOME") + "/kimi_k3";
    else if (env.count("HOME") && !env.at("HOME").empty()) o.load.cache.state_dir = env.at("HOME") + "/.cache/kimi_k3";
  }
  if (!model_positional.empty()) o.model_dir = model_positional;
  o.prompt = prompt_positional;
  if (!o.prompt.empty() && o.ids_given)
    throw Error("give either a text prompt or --ids, not both");
  if (needs_model && o.model_dir.empty()) throw Error("no model directory: pass it first on the command line, or set --model / COLI_MODEL");
  return o;
}

}  // namespace k3

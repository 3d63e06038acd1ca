// apps/kimi_k3.cpp — the one-shot engine CLI:
//   kimi_k3 <model_dir> "prompt" --ngen N            plain completion, text streamed to stdout
//   kimi_k3 <model_dir> --chat "q" [--system "s"]    one chat turn (reasoning, then the answer)
//   kimi_k3 <model_dir> --ids 1,2,3 --ngen N         ids in, one line of ids out
//   kimi_k3 -m <model_dir> -p "prompt" -n N          the same with llama-cli's short flags
// The summary (load time, prefill and decode rates, finish reason, peak RSS) goes to stderr.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/stop_signals.h"
#include "engine/constraint.h"
#include "engine/engine.h"
#include "engine/expert_parallel.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/service.h"
#include "engine/trace.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "options/options.h"
#include "text/output_parser.h"
#include "text/prompt.h"
#include "text/utf8.h"
#include "util/error.h"
#include "util/sys.h"

extern char** environ;

namespace {

// Ctrl-C / SIGTERM: the first one stops the run at the next check — between tensors while the
// weights load, before the next layer during the prefill, after the current token while
// generating (the reply so far and the summary are printed; exit status 130 for SIGINT, 143 for
// SIGTERM: apps/stop_signals.h). A second signal ends the process at once, with the same status.
std::atomic<bool> g_stop{false};
int stopped_status() {
  const int sig = k3::apps::stop_signal();
  return k3::apps::stop_status(sig != 0 ? sig : SIGINT);
}

// Streams a chat reply: reasoning dimmed on a terminal (or hidden), content plain, tool calls on
// their own lines; "[think] " / "[response] " labels on a terminal or with --labels.
class ChatPrinter {
 public:
  ChatPrinter(const k3::TextOptions& options, bool tty) : options_(options), tty_(tty) {}

  void print(const k3::text::OutputEvent& event) {
    using Kind = k3::text::OutputEvent::Kind;
    switch (event.kind) {
      case Kind::reasoning:
        reasoning_bytes_ += event.text.size();
        if (!options_.show_think || event.text.empty()) return;
        if (state_ != State::reasoning) {
          if (options_.labels || tty_) write("[think] ");
          if (tty_) write("\x1b[2m");
          state_ = State::reasoning;
        }
        write(event.text);
        break;
      case Kind::content:
        if (event.text.empty()) return;
        enter_content();
        write(event.text);
        break;
      case Kind::tool_call:
        enter_content();
        write("\n[tool call] " + event.call.name + " " + event.call.arguments_json + "\n");
        break;
      case Kind::end_of_message:
        break;
    }
  }

  void finish() {
    if (state_ == State::reasoning && tty_) write("\x1b[0m");
    write("\n");
  }
  size_t reasoning_bytes() const { return reasoning_bytes_; }

 private:
  enum class State { none, reasoning, content };
  void enter_content() {
    if (state_ == State::content) return;
    if (state_ == State::reasoning) {
      if (tty_) write("\x1b[0m");
      write("\n\n");
    }
    if (options_.labels || tty_) write("[response] ");
    state_ = State::content;
  }
  static void write(const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }

  const k3::TextOptions& options_;
  bool tty_;
  State state_ = State::none;
  size_t reasoning_bytes_ = 0;
};

// Where generated tokens go. One per run: ids (one line at the end), plain text, a parsed chat
// reply, or JSON lines. token() sees every generated id (the stop id included).
class Output {
 public:
  virtual ~Output() = default;
  virtual void token(int64_t id) = 0;
  virtual void finish(const k3::GenerateResult& result, size_t prompt_tokens) = 0;
};

void write_stdout(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// One line of ids, written (and flushed) as each id is generated, so a pipe that is cut by a
// signal still holds every id generated before it.
class IdsOutput : public Output {
 public:
  void token(int64_t id) override {
    std::string text;
    if (!first_) text.push_back(' ');
    text.append(std::to_string(id));
    write_stdout(text);
    first_ = false;
  }
  void finish(const k3::GenerateResult&, size_t) override { write_stdout("\n"); }

 private:
  bool first_ = true;
};

bool contains(const std::vector<int64_t>& ids, int64_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

class TextOutput : public Output {
 public:
  TextOutput(const k3::text::Tokenizer& tokenizer, std::vector<int64_t> stop_ids)
      : tokenizer_(tokenizer), stop_ids_(std::move(stop_ids)) {}
  void token(int64_t id) override {
    if (contains(stop_ids_, id)) return;
    write_stdout(decoder_.push(tokenizer_.token_bytes(static_cast<int32_t>(id))));
  }
  void finish(const k3::GenerateResult&, size_t) override {
    write_stdout(decoder_.finish() + "\n");
  }

 private:
  const k3::text::Tokenizer& tokenizer_;
  std::vector<int64_t> stop_ids_;
  k3::text::Utf8StreamDecoder decoder_;
};

// The stop ids that end a chat reply without being shown: every stop id except <|end_of_msg|>
// (an extra eos_token_id of the config, e.g. [EOS]); <|end_of_msg|> itself goes to the parser,
// which knows it.
std::vector<int64_t> silent_stops(std::vector<int64_t> stop_ids,
                                  const k3::text::Tokenizer& tokenizer) {
  const std::optional<int32_t> end_of_message = tokenizer.special_id("<|end_of_msg|>");
  std::erase_if(stop_ids, [&](int64_t id) { return end_of_message && id == *end_of_message; });
  return stop_ids;
}

class ChatOutput : public Output {
 public:
  ChatOutput(const k3::text::Tokenizer& tokenizer, const k3::TextOptions& options, bool tty,
             std::vector<int64_t> stop_ids)
      : silent_stops_(silent_stops(std::move(stop_ids), tokenizer)),
        parser_(tokenizer, options.think),
        printer_(options, tty) {}
  void token(int64_t id) override {
    if (contains(silent_stops_, id)) return;
    events_.clear();
    parser_.push(static_cast<int32_t>(id), events_);
    for (const auto& e : events_) printer_.print(e);
  }
  void finish(const k3::GenerateResult&, size_t) override {
    events_.clear();
    parser_.finish(events_);
    for (const auto& e : events_) printer_.print(e);
    printer_.finish();
  }

 private:
  std::vector<int64_t> silent_stops_;
  k3::text::OutputParser parser_;
  ChatPrinter printer_;
  std::vector<k3::text::OutputEvent> events_;
};

// --output jsonl: {"event":"token","id":N,"channel":"content"|"reasoning","text":...} per
// generated id (text: what became visible, possibly ""), {"event":"tool_call",...} per call, and
// {"event":"done",...} with the finish reason and the counts and rates.
class JsonlOutput : public Output {
 public:
  JsonlOutput(const k3::text::Tokenizer* tokenizer, bool chat, bool think,
              std::vector<int64_t> stop_ids)
      : tokenizer_(tokenizer), stop_ids_(std::move(stop_ids)) {
    if (chat) {
      parser_.emplace(*tokenizer, think);
      silent_stops_ = silent_stops(stop_ids_, *tokenizer);
    }
  }
  void token(int64_t id) override {
    if (parser_) {
      if (contains(silent_stops_, id)) return emit(id, {});
      events_.clear();
      parser_->push(static_cast<int32_t>(id), events_);
      emit(id, events_);
    } else {
      const bool stop = contains(stop_ids_, id);
      const std::string text =
          tokenizer_ && !stop ? decoder_.push(tokenizer_->token_bytes(static_cast<int32_t>(id)))
                              : std::string();
      line({{"event", "token"}, {"id", id}, {"channel", "content"}, {"text", text}});
    }
  }
  void finish(const k3::GenerateResult& result, size_t prompt_tokens) override {
    if (parser_) {
      events_.clear();
      parser_->finish(events_);
      emit(-1, events_);
    } else if (tokenizer_) {
      if (const std::string tail = decoder_.finish(); !tail.empty())
        line({{"event", "token"}, {"id", -1}, {"channel", "content"}, {"text", tail}});
    }
    const double tps = result.decode_seconds > 0
                           ? static_cast<double>(result.decode_steps) / result.decode_seconds
                           : 0.0;
    line({{"event", "done"},
          {"finish_reason", k3::finish_reason_name(result.finish)},
          {"prompt_tokens", prompt_tokens},
          {"completion_tokens", result.tokens.size()},
          {"prefill_s", result.prefill_seconds},
          {"decode_s", result.decode_seconds},
          {"decode_tps", tps}});
  }

 private:
  static void line(const nlohmann::ordered_json& event) { write_stdout(event.dump() + "\n"); }
  void emit(int64_t id, const std::vector<k3::text::OutputEvent>& events) {
    using Kind = k3::text::OutputEvent::Kind;
    bool any = false;
    for (const auto& e : events) {
      if (e.kind == Kind::tool_call) {
        line({{"event", "tool_call"},
              {"id", id},
              {"name", e.call.name},
              {"arguments", e.call.arguments_json},
              {"complete", e.call.complete}});
      } else if (e.kind != Kind::end_of_message) {
        line({{"event", "token"},
              {"id", id},
              {"channel", e.kind == Kind::reasoning ? "reasoning" : "content"},
              {"text", e.text}});
      } else {
        continue;
      }
      any = true;
    }
    if (!any && id >= 0) line({{"event", "token"}, {"id", id}, {"channel", "none"}, {"text", ""}});
  }

  const k3::text::Tokenizer* tokenizer_;
  std::vector<int64_t> stop_ids_;
  std::vector<int64_t> silent_stops_;  // chat: see silent_stops()
  std::optional<k3::text::OutputParser> parser_;
  k3::text::Utf8StreamDecoder decoder_;
  std::vector<k3::text::OutputEvent> events_;
};

// The prompt of a text run: a chat turn (--chat / --system) or plain completion text.
std::vector<int64_t> text_prompt(const k3::Options& opt, const k3::text::Tokenizer& tokenizer,
                                 bool chat) {
  std::vector<int32_t> ids;
  if (opt.text.bos) {
    const auto bos = tokenizer.special_id("[BOS]");
    if (!bos) throw k3::Error("--bos: the vocabulary has no [BOS] token");
    ids.push_back(*bos);
  }
  if (chat) {
    const std::string& question = opt.text.chat.empty() ? opt.prompt : opt.text.chat;
    const auto segments =
        k3::text::one_turn_segments(opt.text.system, question, opt.text.think, opt.text.effort);
    if (!segments.ok()) throw k3::Error("chat prompt: " + segments.status().message());
    k3::text::encode_segments(tokenizer, *segments, ids);
  } else {
    size_t replaced = 0;
    tokenizer.encode(opt.prompt, opt.text.allow_special, ids, &replaced);
    if (replaced)
      std::fprintf(stderr,
                   "kimi_k3: the prompt had %zu invalid UTF-8 sequence(s), replaced by U+FFFD\n",
                   replaced);
  }
  return std::vector<int64_t>(ids.begin(), ids.end());
}

int run(int argc, char** argv) {
  k3::apps::install_stop_handlers(k3::apps::StopMode::at_check, &g_stop);
  const std::vector<std::string> args(argv + 1, argv + argc);
  const k3::Options opt = k3::parse_kimi_k3_options(args, k3::environment_map(environ));
  if (opt.show_help || opt.show_version) {
    std::fputs(opt.help_text.c_str(), stdout);
    return 0;
  }
  // Before the prompt checks: `kimi_k3 "Hello there"` read the text as the model directory.
  k3::check_model_dir("kimi_k3", opt, k3::ModelNeeds::kWeights);
  // mpirun -np N kimi_k3 … --expert-parallel: ranks 1..N-1 serve their experts to rank 0
  // (docs/scale-out.md §2) and never see the prompt.
  if (opt.load.expert_parallel && k3::expert_parallel_join(&argc, &argv) > 0)
    return k3::expert_parallel_worker(opt.model_dir, opt.load);
  const bool ids_run = opt.given("ids");
  const bool chat = !opt.text.chat.empty() || !opt.text.system.empty();
  if (!opt.text.chat.empty() && !opt.prompt.empty())
    throw k3::Error("give the question either with --chat or as the prompt, not both");
  if (ids_run && chat) throw k3::Error("--ids cannot be combined with --chat / --system");
  if (!ids_run && opt.prompt.empty() && opt.text.chat.empty())
    throw k3::Error(
        "no prompt: pass a text prompt after the model directory (or -p \"text\"), --chat "
        "\"question\" or --ids 1,2,3");
  if (opt.runtime.threads > 0) omp_set_num_threads(opt.runtime.threads);
  // Structured output: the grammar is read and checked before the weights load.
  std::optional<k3::ConstraintSpec> constraint_spec;
  if (!opt.text.json_schema.empty() || !opt.text.grammar.empty()) {
    if (!opt.text.json_schema.empty() && !opt.text.grammar.empty())
      throw k3::Error("give --json-schema or --grammar, not both");
    if (ids_run) throw k3::Error("--json-schema / --grammar need a text or --chat prompt");
    const bool schema = !opt.text.json_schema.empty();
    const std::string& file = schema ? opt.text.json_schema : opt.text.grammar;
    std::ifstream in(file, std::ios::binary);
    if (!in) throw k3::Error(file + ": cannot read the " + (schema ? "JSON Schema" : "grammar"));
    const std::string source((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
    k3::ConstraintSpec spec;
    try {
      if (schema) {
        spec.gbnf = k3::grammar::json_schema_to_gbnf(source);
      } else {
        k3::grammar::Grammar::parse(source);
        spec.gbnf = source;
      }
    } catch (const std::exception& e) {
      throw k3::Error(file + ": " + e.what());
    }
    spec.raw = !chat;
    spec.answer_open = chat && !opt.text.think;
    constraint_spec = std::move(spec);
  }

  // The prompt is tokenized and checked against the context before any weight is read.
  std::vector<int64_t> prompt;
  k3::EngineOptions eo;
  eo.model_dir = opt.model_dir;
  eo.load = opt.load;
  eo.cancel = &g_stop;
  eo.require_tokenizer = !ids_run;
  eo.keep_tokenizer = !ids_run || opt.text.jsonl;  // ids out: the vocabulary is not needed
  eo.context = opt.runtime.max_tokens;
  eo.context_name = "--ctx / COLI_CTX";
  eo.before_weights = [&](const k3::EngineInfo&, const k3::text::Tokenizer* tokenizer) {
    prompt = ids_run ? opt.ids : text_prompt(opt, *tokenizer, chat);
    if (opt.runtime.max_tokens > 0 &&
        static_cast<int64_t>(prompt.size()) + opt.ngen > opt.runtime.max_tokens)
      throw k3::Error(k3::context_overflow_message(
          "the prompt", static_cast<int64_t>(prompt.size()), opt.runtime.max_tokens, opt.ngen,
          "--ngen " + std::to_string(opt.ngen)));
  };
  k3::Result<std::unique_ptr<k3::Engine>> loaded = k3::Engine::load(eo);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kimi_k3: %s: stopped while loading (%s)\n",
                 k3::apps::stop_signal() == SIGTERM ? "SIGTERM" : "SIGINT",
                 loaded.status().message().c_str());
    return stopped_status();
  }
  const k3::Engine& engine = **loaded;
  const k3::EngineInfo& config = engine.info();
  const k3::text::Tokenizer* tokenizer = engine.tokenizer();
  if (opt.debug.prompt_ids) {
    std::string line = "prompt ids:";
    for (int64_t id : prompt) {
      line.push_back(' ');
      line.append(std::to_string(id));
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }

  const int64_t capacity = opt.runtime.max_tokens > 0
                               ? opt.runtime.max_tokens
                               : static_cast<int64_t>(prompt.size()) + opt.ngen;
  k3::Session session(engine, capacity);
  if (!opt.debug.x0_path.empty()) session.set_input_rows(k3::read_f32_file(opt.debug.x0_path));

  const bool want_all_logits = !opt.debug.logits_path.empty() || !opt.debug.trace_path.empty();
  std::vector<float> all_logits;
  k3::TraceRecorder recorder(config.hidden_size, config.num_experts_per_token);
  k3::PrefillHooks hooks;
  if (want_all_logits) hooks.all_logits = &all_logits;
  if (!opt.debug.trace_path.empty()) hooks.observer = &recorder;

  const uint64_t seed =
      opt.given("seed")
          ? opt.sampling.seed
          : static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  k3::Sampler sampler(opt.sampling, seed);
  std::unique_ptr<k3::OutputConstraint> constraint;
  if (constraint_spec) {
    auto made = k3::OutputConstraint::create(engine, *constraint_spec);
    if (!made.ok()) throw k3::Error(made.status().message());
    constraint = std::move(made).value();
    sampler.set_constraint(constraint.get());
  }
  k3::GenerateSettings settings;
  settings.max_new_tokens = opt.ngen;
  settings.stop_ids = k3::stop_ids(engine);
  settings.cancel = &g_stop;  // the prefill stops before the next layer, decode after the token

  std::unique_ptr<Output> output;
  if (opt.text.jsonl)
    output = std::make_unique<JsonlOutput>(tokenizer, chat, opt.text.think, settings.stop_ids);
  else if (ids_run)
    output = std::make_unique<IdsOutput>();
  else if (chat)
    output = std::make_unique<ChatOutput>(*tokenizer, opt.text, isatty(STDOUT_FILENO) == 1,
                                          settings.stop_ids);
  else
    output = std::make_unique<TextOutput>(*tokenizer, settings.stop_ids);
  const auto on_token = [&](int64_t id) {
    output->token(id);
    return !g_stop.load();
  };
  const k3::GenerateResult result =
      k3::generate(session, prompt, sampler, settings, on_token, hooks);

  if (!opt.debug.logits_path.empty()) k3::write_f32_file(opt.debug.logits_path, all_logits);
  if (!opt.debug.trace_path.empty())
    recorder.write(opt.debug.trace_path, prompt, all_logits, config.vocab_size);
  output->finish(result, prompt.size());

  const double prefill_s = result.prefill_seconds, decode_s = result.decode_seconds;
  if (opt.debug.stats)
    std::fprintf(stderr, "%s\nstages: %s\n", engine.describe().c_str(),
                 session.stats().summary.c_str());
  // Resident memory by use (dense weights, experts, session state, scratch, I/O) and by backing:
  // with K3_MMAP=1 the dense weights show up as file-backed (clean page cache), not as private
  // anonymous memory.
  const k3::MemorySplit split = engine.memory();
  const std::string memory = " (" + k3::describe_memory(split) + ")";
  // The load's read rate: the files' bytes it read (matrices used in place from a K3_MMAP=1
  // mapping are not read at load; they are counted apart).
  const uint64_t mapped = std::min(config.load_file_bytes, split.mapped_weights);
  char mapped_note[48] = "";
  if (mapped > 0)
    std::snprintf(mapped_note, sizeof mapped_note, ", %.2f GB mapped",
                  static_cast<double>(mapped) / 1e9);
  std::fprintf(stderr,
               "load %.3f s (%.2f GB/s read%s) | prefill %zu tok %.1f tok/s | decode %lld tok "
               "%.1f tok/s | %s | threads %d | peak RSS %.1f MB%s | %s%s\n",
               engine.load_seconds(),
               engine.load_seconds() > 0 ? static_cast<double>(config.load_file_bytes - mapped) /
                                               1e9 / engine.load_seconds()
                                         : 0.0,
               mapped_note, prompt.size(),
               prefill_s > 0 ? static_cast<double>(prompt.size()) / prefill_s : 0.0,
               static_cast<long long>(result.decode_steps),
               decode_s > 0 ? static_cast<double>(result.decode_steps) / decode_s : 0.0,
               k3::finish_reason_name(result.finish), omp_get_max_threads(),
               static_cast<double>(k3::peak_rss_bytes()) / 1e6, memory.c_str(),
               engine.describe_experts().c_str(),
               opt.sampling.temperature > 0 ? (" | seed " + std::to_string(seed)).c_str() : "");
  if (const std::string device = engine.describe_device(); !device.empty())
    std::fprintf(stderr, "%s\n", device.c_str());
  if (constraint)
    std::fprintf(stderr, "grammar: %llu masks, %.1f us each, %zu states%s\n",
                 static_cast<unsigned long long>(constraint->masks()),
                 constraint->masks()
                     ? 1e6 * constraint->mask_seconds() / static_cast<double>(constraint->masks())
                     : 0.0,
                 constraint->states(), constraint->complete() ? "" : " (the answer was cut)");
  if (const std::string ep = engine.describe_expert_parallel(static_cast<int64_t>(prompt.size()) +
                                                             result.decode_steps);
      !ep.empty())
    std::fprintf(stderr, "%s\n", ep.c_str());
  engine.save_history();
  return g_stop.load() ? stopped_status() : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int status = 1;
  try {
    status = run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kimi_k3: %s\n", e.what());
  }
  // --expert-parallel: rank 0 stops the other ranks (or ends the job when one failed).
  return k3::expert_parallel_leave(status);
}

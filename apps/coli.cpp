// apps/coli.cpp — the launcher.
//   coli serve [model_dir]   the OpenAI-compatible HTTP API (+ the web page)   (coli_serve.cpp)
//   coli web [model_dir]     the same, printing the page's URL                  (coli_serve.cpp)
//   coli chat [model_dir]    a terminal chat with the model kept loaded          (coli_chat.cpp)
// (no model_dir: the built-in trained tiny K3, options.h builtin_model_dir())
// Machine interfaces over JSON lines (stdin → stdout), reading only the tokenizer files of a
// model directory (no weights needed):
//   coli tokenize <model_dir> [--allow-special]   {"text": ...} → {"ids": [...]} (other keys
//   copied) coli render <model_dir>                       {"messages", "tools", "options"} →
//   {"text", "ids"}
// Every input line gets exactly one output line, in order: a bad or blank input line gives an
// {"error": ...} line and the next line is read; nothing stops early. Output lines are strict
// JSON (text/pyjson.h DumpStyle::kStrictCompact).
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "apps/coli_commands.h"
#include "apps/stop_signals.h"
#include "engine/expert_parallel.h"
#include "options/options.h"
#include "text/chat.h"
#include "text/prompt.h"
#include "text/pyjson.h"
#include "text/tokenizer.h"
#include "util/error.h"

extern char** environ;

namespace {

using k3::text::PyValue;

PyValue ids_value(const std::vector<int32_t>& ids) {
  PyValue::Array items;
  items.reserve(ids.size());
  for (int32_t id : ids) items.push_back(PyValue::integer(id));
  return PyValue::array(std::move(items));
}

// The input's other keys, copied to the output line (e.g. "name"), minus `skip`.
void copy_keys(const PyValue& input, const std::vector<std::string>& skip, PyValue& output) {
  if (!input.is_object()) return;
  for (const auto& member : input.as_object()) {
    bool skipped = false;
    for (const auto& s : skip) skipped = skipped || member.key == s;
    if (!skipped && !output.contains(member.key)) output.set(member.key, member.value);
  }
}

// One output line, always valid JSON (a copied 1e999 or NaN comes back as null, not Infinity).
std::string json_line(const PyValue& value) {
  std::string line = k3::text::dumps(value, k3::text::DumpStyle::kStrictCompact);
  line.push_back('\n');
  return line;
}

PyValue error_line(const std::string& message, size_t line_number, const PyValue* input) {
  PyValue out = PyValue::object();
  out.set("error", PyValue::string(message));
  out.set("line", PyValue::integer(static_cast<int64_t>(line_number)));
  if (input && input->is_object())
    if (const PyValue* name = input->find("name")) out.set("name", *name);
  return out;
}

// Reads JSON lines from stdin and answers each with `handle` (which must be thread-safe),
// in input order. Lines are taken in batches (up to 1024 lines or 8 MiB) and a batch is answered
// by all hardware threads, so counting the tokens of a large file uses every core.
template <class Handle>
void for_each_line(Handle handle) {
  const size_t threads = std::max(1u, std::thread::hardware_concurrency());
  struct Line {
    size_t number;
    std::string text, answer;
  };
  std::vector<Line> batch;
  auto answer = [&](Line& l) {
    // One output line per input line, blank ones included (an error line), so answers can be
    // matched to inputs by position.
    if (l.text.find_first_not_of(" \t\r") == std::string::npos) {
      l.answer = json_line(error_line("blank line: expected a JSON object", l.number, nullptr));
      return;
    }
    const k3::Result<PyValue> parsed = k3::text::parse_pyjson(l.text);
    l.answer = parsed.ok() ? json_line(handle(*parsed, l.number))
                           : json_line(error_line("malformed JSON: " + parsed.status().message(),
                                                  l.number, nullptr));
  };
  auto flush = [&] {
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i = next++; i < batch.size(); i = next++) answer(batch[i]);
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < std::min(threads, batch.size()); ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    for (const Line& l : batch) std::fwrite(l.answer.data(), 1, l.answer.size(), stdout);
    batch.clear();
  };
  size_t line_number = 0, batch_bytes = 0;
  std::string text;
  while (std::getline(std::cin, text)) {
    batch_bytes += text.size();
    batch.push_back({++line_number, std::move(text), {}});
    if (batch.size() >= 1024 || batch_bytes >= (size_t{8} << 20)) {
      flush();
      batch_bytes = 0;
    }
  }
  flush();
  std::fflush(stdout);
}

// The model's tokenizer, refused like the engine refuses it (docs/tokenizer.md §1.4).
k3::text::Tokenizer load_checked(const std::string& dir) {
  k3::text::Tokenizer tokenizer = k3::text::Tokenizer::load(dir);
  k3::text::check_model_tokenizer(tokenizer, dir);
  return tokenizer;
}

int tokenize(const k3::Options& opt) {
  const k3::text::Tokenizer tokenizer = load_checked(opt.model_dir);
  for_each_line([&](const PyValue& input, size_t line_number) {
    const PyValue* text = input.find("text");
    if (!text || !text->is_string())
      return error_line("expected an object with a string \"text\"", line_number, &input);
    std::vector<int32_t> ids;
    tokenizer.encode(text->as_string(), opt.text.allow_special, ids);
    PyValue out = PyValue::object();
    out.set("ids", ids_value(ids));
    copy_keys(input, {"text"}, out);
    return out;
  });
  return 0;
}

int render(const k3::Options& opt) {
  const k3::text::Tokenizer tokenizer = load_checked(opt.model_dir);
  for_each_line([&](const PyValue& input, size_t line_number) {
    if (!input.is_object())
      return error_line("expected an object with \"messages\"", line_number, &input);
    const k3::Result<std::vector<k3::text::Segment>> segments = k3::text::render_request(input);
    if (!segments.ok()) return error_line(segments.status().message(), line_number, &input);
    std::vector<int32_t> ids;
    k3::text::encode_segments(tokenizer, *segments, ids);
    PyValue out = PyValue::object();
    out.set("text", PyValue::string(k3::text::join_segments(*segments)));
    out.set("ids", ids_value(ids));
    copy_keys(input,
              {"messages", "tools", "options", "text", "ids", "segments", "error", "error_type",
               "error_text"},
              out);
    return out;
  });
  return 0;
}

const char* kUsage =
    "usage: coli <command> [<model_dir>] [options]\n\n"
    "commands:\n"
    "  serve      HTTP API on 127.0.0.1:8000 and the web page at /: OpenAI /v1/chat/completions,\n"
    "             /v1/completions, /v1/responses, /v1/models; Anthropic /v1/messages,\n"
    "             /v1/messages/count_tokens; /health, /metrics, /slots, /tokenize, /detokenize,\n"
    "             /props, /apply-template; llama-server /completion\n"
    "  web        the same, and prints the web page's URL\n"
    "  chat       terminal chat (model loaded once; /help lists the commands)\n"
    "  tokenize   JSON lines {\"text\": ...} on stdin → {\"ids\": [...]} on stdout (other keys "
    "copied);\n"
    "             --allow-special turns special-token spellings into special tokens\n"
    "  render     JSON lines {\"messages\": [...], \"tools\": ..., \"options\": {...}} → "
    "{\"text\", \"ids\"}\n"
    "             (the K3 chat template; options.entry build_chat_segments | "
    "apply_chat_template)\n\n"
    "The model directory may also come from --model or COLI_MODEL; serve, web and chat run the\n"
    "built-in trained tiny K3 (assets/k3-mini: ~11M parameters, Brown-corpus English) without\n"
    "one. tokenize and render read only tiktoken.model and tokenizer_config.json. Invalid UTF-8\n"
    "in input text is replaced by U+FFFD.\n"
    "`coli <command> --help` lists the command's options; `coli --version` prints the version.\n";

const std::vector<std::string> kCommands = {"serve", "web", "chat", "tokenize", "render"};

// Why `word` (argv[1]) is not a command, and the nearest one: one line, then the commands.
std::string not_a_command(const std::string& word) {
  std::string message;
  if (word.starts_with("-")) {
    message = k3::unknown_argument_message(word, {"--help", "--version"}) +
              ": the command comes first (coli <command> [<model_dir>] [options])";
  } else if (std::error_code ec; std::filesystem::is_directory(word, ec)) {
    message = "unknown command '" + word + "': a directory; the command comes first (coli serve " +
              word + ", coli chat " + word + ")";
  } else {
    const std::string near = k3::nearest_name(word, kCommands);
    message =
        "unknown command '" + word + "'" + (near.empty() ? "" : " (did you mean '" + near + "'?)");
  }
  return "coli: " + message +
         "\ncommands: serve, web, chat, tokenize, render (`coli --help` says what each does)\n";
}

int run(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::fputs(kUsage, stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::printf("%s\n", k3::version_text("coli").c_str());
    return 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  const bool engine_command = command == "serve" || command == "web" || command == "chat";
  if (std::find(kCommands.begin(), kCommands.end(), command) == kCommands.end()) {
    std::fputs(not_a_command(command).c_str(), stderr);
    return 2;
  }
  const std::map<std::string, std::string> env = k3::environment_map(environ);
  k3::Options opt;
  try {
    opt = k3::parse_options("coli " + command, args, env);
  } catch (const k3::Error& e) {
    std::fprintf(stderr, "coli %s: %s\n", command.c_str(), e.what());
    return 2;
  }
  if (opt.show_help || opt.show_version) {
    std::fputs(opt.help_text.c_str(), stdout);
    return 0;
  }
  try {
    k3::check_model_dir("coli " + command, opt,
                        engine_command ? k3::ModelNeeds::kWeights : k3::ModelNeeds::kTokenizer);
  } catch (const k3::Error& e) {
    std::fprintf(stderr, "coli %s: %s\n", command.c_str(), e.what());
    return 2;
  }
  // mpirun -np N coli serve … --expert-parallel: ranks 1..N-1 serve their experts to rank 0
  // (docs/scale-out.md §2) and never touch HTTP.
  if (engine_command && opt.load.expert_parallel && k3::expert_parallel_join(&argc, &argv) > 0)
    return k3::expert_parallel_worker(opt.model_dir, opt.load);
  try {
    if (command == "serve" || command == "web") {
      // Every connection thread would otherwise get a malloc arena of its own, and each keeps
      // the freed megabytes of the large bodies it parsed (measured: +18 MB of RSS per new
      // connection carrying a 6 MB prompt, never returned even after malloc_trim; with two
      // arenas the growth stops). The engine worker's big buffers are allocated once.
      mallopt(M_ARENA_MAX, 2);
      return coli::serve(opt, command == "web");
    }
    if (command == "chat") return coli::chat(opt);
  } catch (const coli::UsageError& e) {
    std::fprintf(stderr, "coli %s: %s\n", command.c_str(), e.what());
    return 2;
  }
  return command == "tokenize" ? tokenize(opt) : render(opt);
}

}  // namespace

int main(int argc, char** argv) {
  // SIGINT / SIGTERM end every command with 130 / 143 (apps/stop_signals.h); `serve` and `web`
  // take them on a thread of their own and drain, `chat` gives Ctrl-C its own meaning.
  k3::apps::install_stop_handlers(k3::apps::StopMode::at_once);
  int status = 1;
  try {
    status = run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coli: %s\n", e.what());
  }
  // --expert-parallel: rank 0 stops the other ranks (or ends the job when one failed).
  return k3::expert_parallel_leave(status);
}

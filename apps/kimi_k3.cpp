// apps/kimi_k3.cpp — the one-shot engine CLI: `kimi_k3 <model_dir> --ids 1,2,3 --ngen N`.
// With --ids, stdout is exactly one line: the generated ids separated by single spaces. The
// summary (load time, prefill and decode rates, peak RSS) goes to stderr.
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/trace.h"
#include "io/file.h"
#include "util/error.h"
#include "util/sys.h"

extern char** environ;

namespace {

std::map<std::string, std::string> environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::vector<float> read_f32_file(const std::string& path) {
  const std::string bytes = k3::read_text_file(path);
  if (bytes.size() % 4 != 0) throw k3::Error(path + ": size " + std::to_string(bytes.size()) + " is not a multiple of 4 (raw f32 expected)");
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

int run(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const k3::Options opt = k3::parse_kimi_k3_options(args, environment());
  if (opt.show_help) {
    std::printf("usage: kimi_k3 <model_dir> --ids 1,2,3 [--ngen N] [options]\n\n%s", opt.help_text.c_str());
    return 0;
  }
  if (!opt.prompt.empty() && !opt.ids_given)
    throw k3::Error("text prompts need the tokenizer, which this build does not have yet; pass token ids with --ids");
  if (!opt.ids_given) throw k3::Error("no prompt: pass token ids with --ids 1,2,3");
  if (opt.runtime.threads > 0) omp_set_num_threads(opt.runtime.threads);

  k3::Engine engine(opt.model_dir, opt.load);
  const k3::K3Config& config = engine.config();
  const int64_t capacity = opt.runtime.max_tokens > 0 ? opt.runtime.max_tokens
                                                      : static_cast<int64_t>(opt.ids.size()) + opt.ngen;
  if (static_cast<int64_t>(opt.ids.size()) + opt.ngen > capacity)
    throw k3::Error("K3_MAXT=" + std::to_string(capacity) + " cannot hold the prompt (" + std::to_string(opt.ids.size()) +
                    " tokens) plus --ngen " + std::to_string(opt.ngen));
  k3::Session session(engine, capacity);
  if (!opt.debug.x0_path.empty()) session.set_input_rows(read_f32_file(opt.debug.x0_path));

  const bool want_all_logits = !opt.debug.logits_path.empty() || !opt.debug.trace_path.empty();
  std::vector<float> all_logits;
  k3::TraceRecorder recorder(config.hidden_size, config.num_experts_per_token);
  k3::PrefillHooks hooks;
  if (want_all_logits) hooks.all_logits = &all_logits;
  if (!opt.debug.trace_path.empty()) hooks.observer = &recorder;

  const double t0 = k3::now_seconds();
  std::vector<float> logits = session.prefill(opt.ids, hooks);
  const double t1 = k3::now_seconds();
  if (!opt.debug.logits_path.empty())
    k3::write_file_atomic(opt.debug.logits_path, all_logits.data(), all_logits.size() * sizeof(float));
  if (!opt.debug.trace_path.empty()) recorder.write(opt.debug.trace_path, opt.ids, all_logits, config.vocab_size);

  std::vector<int64_t> generated;
  uint64_t seed = opt.sampling.seed_set ? opt.sampling.seed
                                        : static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  k3::Sampler sampler(opt.sampling, seed);
  if (opt.ngen > 0 && !engine.model().has_head())
    throw k3::Error(opt.model_dir + ": the snapshot has no lm_head, so nothing can be generated (use --ngen 0 with K3_TRACE)");
  int64_t decode_steps = 0;
  for (int64_t j = 0; j < opt.ngen; ++j) {
    const int64_t id = sampler.sample(logits);
    generated.push_back(id);
    bool stop = false;
    for (int64_t eos : config.eos_token_ids) stop = stop || id == eos;
    if (stop || j + 1 == opt.ngen) break;
    logits = session.step(id);
    ++decode_steps;
  }
  const double t2 = k3::now_seconds();

  std::string line;
  for (size_t i = 0; i < generated.size(); ++i) {
    if (i) line.push_back(' ');
    line.append(std::to_string(generated[i]));
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);

  const double prefill_s = t1 - t0, decode_s = t2 - t1;
  if (opt.debug.stats)
    std::fprintf(stderr, "%s\nstages: %s\n", engine.describe().c_str(), session.stats().summary().c_str());
  std::fprintf(stderr,
               "load %.2f s | prefill %zu tok %.1f tok/s | decode %lld tok %.1f tok/s | threads %d | peak RSS %.1f MB%s\n",
               engine.load_seconds(), opt.ids.size(), prefill_s > 0 ? static_cast<double>(opt.ids.size()) / prefill_s : 0.0,
               static_cast<long long>(decode_steps), decode_s > 0 ? static_cast<double>(decode_steps) / decode_s : 0.0,
               omp_get_max_threads(), static_cast<double>(k3::peak_rss_bytes()) / 1e6,
               opt.sampling.temperature > 0 ? (" | seed " + std::to_string(seed)).c_str() : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kimi_k3: %s\n", e.what());
    return 1;
  }
}

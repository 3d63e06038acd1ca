// k3_bench grammar (bench/grammar_bench.h). For each schema, tokens are drawn uniformly from the
// allowed set (the most adversarial sampler: long strings, deep nesting) and every mask is timed:
// a state met for the first time walks the vocabulary's trie; a state met again copies its mask.
#include "grammar_bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "engine/constraint.h"
#include "engine/engine.h"
#include "grammar/json_schema.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3bench {
namespace {

struct GrammarBenchArgs : CommonOptions {
  std::string model_dir = "assets/k3-mini";  // its tokenizer, and its decode step for scale
  int64_t tokens = 300;                      // masks per schema at most
  uint64_t seed = 1;
};

using Clock = std::chrono::steady_clock;

struct Schema {
  const char* name;
  const char* json;  // nullptr: any JSON object
};

const Schema kSchemas[] = {
    {"weather (object, bounded int, short string)",
     R"({"type":"object","properties":{"city":{"type":"string","maxLength":24},"days":{"type":"integer","minimum":1,"maximum":14}},"required":["city","days"],"additionalProperties":false})"},
    {"free strings and arrays",
     R"({"type":"object","properties":{"title":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}}},"required":["title","tags"]})"},
    {"nested records, enums, formats",
     R"({"type":"object","properties":{"id":{"type":"string","format":"uuid"},"when":{"type":"string","format":"date-time"},"items":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{4}$"},"qty":{"type":"integer","minimum":1,"maximum":99},"kind":{"enum":["a","b","c"]}},"required":["sku","qty","kind"],"additionalProperties":false},"maxItems":4}},"required":["id","when","items"],"additionalProperties":false})"},
    {"recursive tree ($ref)",
     R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"number"},"kids":{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":3}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/n"})"},
    {"json_object (any object)", nullptr},
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

int run_grammar_bench(const GrammarBenchArgs& args) {
  const k3::Isa isa = apply_common_options(args);
  k3::LoadOptions load;
  load.isa = args.isa;
  const k3::Engine engine(args.model_dir, load);
  const size_t vocab = static_cast<size_t>(engine.info().vocab_size);
  std::printf("== machine\ncpu: %s\nisa: %s, %d threads\n", k3::cpu_model_name().c_str(),
              k3::isa_name(isa), omp_get_max_threads());
  std::printf("model: %s (vocabulary %zu)\n", args.model_dir.c_str(), vocab);

  // The decode step this cost is added to: 32 tokens of one session, median.
  std::vector<double> step_us;
  {
    k3::Session session(engine, 64);
    std::vector<int64_t> ids = {1000};
    session.prefill(ids);
    for (int i = 0; i < 32; ++i) {
      const auto t0 = Clock::now();
      session.step(1000 + i);
      step_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
  }
  const double step = percentile(step_us, 0.5);
  // The same step with its head restricted to one block of 16 ids (a grammar that allows one
  // token: Session::restrict_next_logits).
  std::vector<double> narrow_us;
  {
    k3::Session session(engine, 64);
    std::vector<int64_t> ids = {1000};
    session.prefill(ids);
    std::vector<uint64_t> one((vocab + 63) / 64, 0);
    one[1000 / 64] |= uint64_t{1} << (1000 % 64);
    for (int i = 0; i < 32; ++i) {
      session.restrict_next_logits(one);
      const auto t0 = Clock::now();
      session.step(1000 + i);
      narrow_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
  }
  const double narrow = percentile(narrow_us, 0.5);
  std::printf(
      "decode step (median of 32): %.0f us; with the head restricted to one block of 16 "
      "ids: %.0f us (%.2f of it)\n\n",
      step, narrow, narrow / step);

  std::printf(
      "| schema | masks | first-visit states | median us | p90 us | p99 us | max us | "
      "mean us | median / step | head rows computed (median) |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937_64 rng(args.seed);
  std::vector<double> all, all_rows;
  std::vector<float> logits(vocab);
  for (const Schema& s : kSchemas) {
    k3::ConstraintSpec spec;
    spec.gbnf = s.json ? k3::grammar::json_schema_to_gbnf(s.json) : k3::grammar::json_object_gbnf();
    spec.answer_open = true;
    auto made = k3::OutputConstraint::create(engine, spec);
    if (!made.ok()) throw k3::Error(made.status().message());
    k3::OutputConstraint& c = **made;
    std::vector<double> us, rows;  // rows: the share of the head a restricted step computes
    for (int64_t t = 0; t < args.tokens && !c.complete(); ++t) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      const auto t0 = Clock::now();
      c.mask(logits);
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      std::vector<int64_t> allowed;
      for (size_t id = 0; id < vocab; ++id)
        if (logits[id] == 0.0f) allowed.push_back(static_cast<int64_t>(id));
      if (allowed.empty()) throw k3::Error(std::string(s.name) + ": no token allowed");
      const std::vector<uint64_t>* bits = c.allowed_next();
      rows.push_back(bits ? k3::restricted_head_share(*bits, vocab) : 1.0);
      c.accept(allowed[rng() % allowed.size()]);
    }
    double mean = 0;
    for (double u : us) mean += u;
    mean /= static_cast<double>(us.size());
    all.insert(all.end(), us.begin(), us.end());
    all_rows.insert(all_rows.end(), rows.begin(), rows.end());
    std::printf("| %s | %zu | %zu | %.1f | %.1f | %.1f | %.0f | %.1f | %.2f%% | %.2f%% |\n", s.name,
                us.size(), c.states(), percentile(us, 0.5), percentile(us, 0.9),
                percentile(us, 0.99), percentile(us, 1.0), mean, 100.0 * percentile(us, 0.5) / step,
                100.0 * percentile(rows, 0.5));
  }
  std::printf(
      "\nRESULT grammar median_us=%.1f p90_us=%.1f step_us=%.0f median_share=%.3f%% "
      "narrow_step_ratio=%.2f head_rows_median=%.2f%%\n",
      percentile(all, 0.5), percentile(all, 0.9), step, 100.0 * percentile(all, 0.5) / step,
      narrow / step, 100.0 * percentile(all_rows, 0.5));
  return 0;
}

}  // namespace

Subcommand register_grammar(CLI::App& app) {
  auto a = std::make_shared<GrammarBenchArgs>();
  Command sub(app, "grammar",
              "structured output: per-token mask cost on a set of schemas beside a decode step");
  sub.option("--model", a->model_dir, "model directory (tokenizer and decode step)").show_default();
  sub.option("--tokens", a->tokens, "masks per schema at most").show_default();
  sub.option("--seed", a->seed, "token draw seed").show_default();
  add_common_options(sub, *a);
  return {sub.app(), [a] { return run_grammar_bench(*a); }};
}

}  // namespace k3bench

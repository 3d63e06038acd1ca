// k3_tokenizer_bench — tokenizer throughput in process (a benchmark, never a test assertion).
//
//   k3_tokenizer_bench <model_dir> <corpus_file> [passes]
//
// Loads k3::text::Tokenizer from <model_dir>, reads <corpus_file> (UTF-8), encodes the whole file
// as one ordinary-text segment (the tokenizer does Moonshot's 400k/25k pre-chunking itself) once to
// warm up and then `passes` times (default 5), one thread. Prints machine facts, every pass, and
// one line for bench/tokenizer_bench.mjs:
//   OURS mb_s=<best> median_mb_s=<median> bytes=<n> ids=<n> fnv=<FNV-1a 32 of the ids' bytes>
// MB = 10^6 bytes of UTF-8 input. The fnv/ids pair lets the caller check both tokenizers produced
// the same ids.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "options/options.h"
#include "text/tokenizer.h"
#include "util/hash.h"
#include "util/sys.h"

namespace {

// FNV-1a 32 of the ids' bytes (little-endian int32, as tokenizer_bench.mjs hashes them).
uint32_t fnv1a(const std::vector<int32_t>& ids) {
  return k3::fnv1a_32_bytes(ids.data(), ids.size() * sizeof(int32_t));
}

int run(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--version") {
    std::printf("%s\n", k3::version_text("k3_tokenizer_bench").c_str());
    return 0;
  }
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: k3_tokenizer_bench <model_dir> <corpus_file> [passes]\n");
    return 2;
  }
  const std::string model_dir = argv[1];
  const std::string corpus_path = argv[2];
  const int passes = argc == 4 ? std::max(1, std::atoi(argv[3])) : 5;

  std::printf("machine: cpu \"%s\", %u hardware threads, 1 thread used\n",
              k3::cpu_model_name().c_str(), std::thread::hardware_concurrency());

  const double t_load = k3::now_seconds();
  const k3::text::Tokenizer tokenizer = k3::text::Tokenizer::load(model_dir);
  std::printf("tokenizer: %s loaded in %.0f ms\n", model_dir.c_str(),
              (k3::now_seconds() - t_load) * 1e3);

  std::ifstream in(corpus_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "k3_tokenizer_bench: cannot read %s\n", corpus_path.c_str());
    return 1;
  }
  const std::string corpus((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::printf("corpus: %s, %zu bytes\n", corpus_path.c_str(), corpus.size());

  std::vector<int32_t> ids;
  ids.reserve(corpus.size() / 2);
  tokenizer.encode(corpus, false, ids);  // warm-up (page faults, thread_local buffers)
  const size_t n_ids = ids.size();
  const uint32_t hash = fnv1a(ids);

  std::vector<double> mb_s;
  for (int p = 0; p < passes; p++) {
    ids.clear();
    const double t0 = k3::now_seconds();
    tokenizer.encode(corpus, false, ids);
    const double dt = k3::now_seconds() - t0;
    if (ids.size() != n_ids || fnv1a(ids) != hash) {
      std::fprintf(stderr, "k3_tokenizer_bench: pass %d gave different ids\n", p);
      return 1;
    }
    mb_s.push_back(static_cast<double>(corpus.size()) / dt / 1e6);
    std::printf("pass %d: %.3f s, %.2f MB/s\n", p, dt, mb_s.back());
  }
  std::vector<double> sorted = mb_s;
  std::sort(sorted.begin(), sorted.end());
  const double best = sorted.back();
  const double median = sorted[sorted.size() / 2];
  std::printf("OURS mb_s=%.3f median_mb_s=%.3f bytes=%zu ids=%zu fnv=%08x\n", best, median,
              corpus.size(), n_ids, hash);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3_tokenizer_bench: %s\n", e.what());
    return 1;
  }
}

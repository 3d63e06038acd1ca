// bench/k3_bench.cpp — benchmarks (not tests). `k3_bench decode <model_dir> [--tokens N]`:
// decode tokens per second with the f32 engine, printed with the machine facts beside it.
#include <omp.h>
#include <sys/utsname.h>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "util/error.h"
#include "util/sys.h"

namespace {

void print_machine() {
  struct utsname u {};
  uname(&u);
  std::printf("machine: %s %s, %d OpenMP threads\n", u.sysname, u.machine, omp_get_max_threads());
}

int decode(const std::string& dir, int64_t tokens) {
  k3::LoadOptions load;
  k3::Engine engine(dir, load);
  k3::Session session(engine, tokens + 2);
  const int64_t first[1] = {1};
  std::vector<float> logits = session.prefill(first);
  const double t0 = k3::now_seconds();
  for (int64_t i = 0; i < tokens; ++i) logits = session.step(k3::argmax(logits));
  const double dt = k3::now_seconds() - t0;
  print_machine();
  std::printf("decode: %lld tokens in %.3f s = %.2f tok/s (load %.2f s)\n", static_cast<long long>(tokens), dt,
              static_cast<double>(tokens) / dt, engine.load_seconds());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() >= 2 && args[0] == "decode") {
      const int64_t tokens = args.size() >= 4 && args[2] == "--tokens" ? std::stoll(args[3]) : 16;
      return decode(args[1], tokens);
    }
    std::fprintf(stderr, "usage: k3_bench decode <model_dir> [--tokens N]\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3_bench: %s\n", e.what());
    return 1;
  }
}

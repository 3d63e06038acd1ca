// bench/ep_bench.cpp — `k3_bench ep` (benchmarks, not tests).
//
//   k3_bench ep [--delay 0.1ms] [--rate 10gbit]
//       --expert-parallel over 1, 2 and 3 ranks, each in its own network namespace with shaped
//       links (root): the namespaces, links and mpirun are shell work, so this runs
//       bench/ep_netns.sh with this build's kimi_k3 and k3_synth (docs/scale-out.md §2.7).
#include <sys/wait.h>

#include <cctype>
#include <cstdlib>
#include <memory>
#include <string>

#include "bench_common.h"
#include "util/error.h"

namespace k3bench {

Subcommand register_ep(CLI::App& app) {
  struct EpArgs {
    std::string delay = "0.1ms", rate = "10gbit";
  };
  auto a = std::make_shared<EpArgs>();
  Command c(
      app, "ep",
      "--expert-parallel over 1, 2 and 3 ranks in network namespaces with shaped links (root; "
      "bench/ep_netns.sh, docs/scale-out.md §2.7)");
  c.option("--delay", a->delay, "one-way link delay (tc netem, where the kernel has it)")
      .show_default();
  c.option("--rate", a->rate, "link rate (tc)").show_default();
  return {c.app(), [a] {
            std::error_code ec;
            const fs::path build =
                fs::read_symlink("/proc/self/exe", ec).parent_path().parent_path();
            if (ec)
              throw k3::Error("k3_bench ep: cannot find the build folder from /proc/self/exe");
            const auto quoted = [](const std::string& s) {
              for (char ch : s)
                if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '/' &&
                    ch != '_' && ch != '-')
                  throw k3::Error("k3_bench ep: \"" + s + "\": letters, digits and ./_- only");
              return s;
            };
            const std::string command = "bash " + quoted(K3_BENCH_SOURCE_DIR "/ep_netns.sh") + " " +
                                        quoted((build / "apps" / "kimi_k3").string()) + " " +
                                        quoted((build / "tools" / "k3_synth").string()) + " " +
                                        quoted(a->delay) + " " + quoted(a->rate);
            const int status = std::system(command.c_str());
            return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
          }};
}

}  // namespace k3bench

#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need. Idempotent: apt-get runs only
# when something is missing, so a prepared machine pays nothing.
#   scripts/setup.sh          what building and running the programs needs (`make run`, `make install`);
#                             glslc and the Vulkan headers build the Vulkan expert tier (the
#                             loader, libvulkan1, is only needed to use it: docs/vulkan.md); Open MPI
#                             builds and launches --expert-parallel (docs/scale-out.md)
#   scripts/setup.sh --test   also the tests' and benchmarks' packages (`make build`, `make test`):
#                             GoogleTest, Google Benchmark, numpy, clang-format, Chromium, tmux, Node.js,
#                             Mesa's Vulkan drivers (lavapipe, the CPU device the Vulkan tests run on),
#                             vulkaninfo, the Khronos validation layers, PCRE2 (the reference
#                             matcher of the grammar tests) and nginx (the replica test)
#   scripts/setup.sh --train  also the training tool's packages (tools/train/README.md): Debian's
#                             torch, OpenBLAS behind its BLAS calls (the reference BLAS it would
#                             otherwise get runs matmuls ~4x slower) and jemalloc (training
#                             re-faults GBs of freed pages per step with glibc's allocator)
set -euo pipefail
packages=(g++ cmake make ninja-build pkg-config liburing-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
          libreadline-dev glslc libvulkan-dev openmpi-bin libopenmpi-dev)
test_packages=(libgtest-dev libgmock-dev libbenchmark-dev python3-numpy clang-format chromium tmux
               mesa-vulkan-drivers vulkan-tools vulkan-validationlayers libpcre2-dev nginx)
tests=0
case "${1:-}" in
  "") ;;
  --test) packages+=("${test_packages[@]}"); tests=1 ;;
  --train) packages+=("${test_packages[@]}" python3-torch libopenblas0-pthread libjemalloc2); tests=1 ;;
  *)
    echo "setup: unknown argument '$1' (expected nothing, --test or --train)" >&2
    exit 2
    ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js + npm run the test oracles (npm tiktoken); a machine that has them (any source) keeps them.
if ((tests)); then
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

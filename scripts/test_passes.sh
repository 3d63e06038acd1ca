#!/usr/bin/env bash
# The test passes of `make test` and `make asan` (Makefile; docs/testing.md §6 has the timings).
#
#   scripts/test_passes.sh test BUILD JOBS
#     the build of BUILD and its tests, while the sanitizer build of BUILD-asan compiles beside
#     them in the cores' idle time, then the sanitized tests;
#   scripts/test_passes.sh asan BUILD JOBS
#     the sanitizer build, then the sanitized tests.
# The Makefile configures both folders.
#
# Why beside: the Release tests leave ~15 % of two cores idle (processes starting, files synced,
# servers waiting on their clients), the Release build ~5 % (links, its last long files). The
# build runs under SCHED_IDLE (chrt --idle): it gets a core only when no test wants it, and a
# test that wakes takes the core back at once. At nice 19 instead the tests took 40 s longer
# (their wake-ups waited for the compiler's time slice), at SCHED_IDLE 5 s (docs/testing.md §6).
# Anything the tests or the build print on failure is shown; the build's own lines go to
# BUILD-asan/build.log.
set -uo pipefail
if [ $# -ne 3 ] || { [ "$1" != test ] && [ "$1" != asan ]; }; then
  echo "usage: $0 test|asan BUILD JOBS" >&2
  exit 2
fi
mode=$1 build=$2 jobs=$3
asan=$build-asan

# Parsers, kernels and the text front end under AddressSanitizer + UndefinedBehaviorSanitizer (the
# npm differential fuzz drives the sanitized coli too), and the Vulkan tier's host side on lavapipe.
targets=(text_tests kernel_tests file_tests service_tests vk_tests coli kimi_k3 k3_options_md
         k3_synth k3_repack)
suites='Safetensors|ModelFiles|Kernels|Mxfp4|Config|Options|Tokenizer|Utf8|Pretokenize|ChunkText'
suites+='|UnicodeTables|Chat|PyJson|OutputParser|TextRobustness|TextReview|Service|ServeApi'
suites+='|HttpFraming|Serve.Fuzz|ChunkKernels|ChunkedPrefill|ChunkedSynth|Engines/ReadQueueTest'
suites+='|ReadQueue|ReadTicket|ExpertCache|Repack|Container|VkBlock|VkMxfp4|VkDense|VkTier'

if [ "$mode" = test ]; then
  log=$asan/build.log
  echo "== the Release build and tests; beside them, in the idle time, the sanitizer build (its" \
    "lines: $log)"
  start=$SECONDS
  # Without SCHED_IDLE, nice 19. In a process group of its own (set -m), so that stopping it
  # reaches Ninja or make, which end their compilers; not in a session of its own: where the kernel
  # groups tasks by session (autogroup), a group gets its share whatever its tasks' policies.
  idle=(chrt --idle 0)
  chrt --idle 0 true 2>/dev/null || idle=(nice -n 19)
  set -m
  "${idle[@]}" cmake --build "$asan" -j "$jobs" --target "${targets[@]}" >"$log" 2>&1 &
  builder=$!
  set +m
  stop_builder() {
    if jobs -rp | grep -qx "$builder"; then
      kill -TERM -- "-$builder" 2>/dev/null
      wait "$builder" 2>/dev/null
    fi
  }
  trap 'stop_builder; exit 130' INT
  trap 'stop_builder; exit 143' TERM
  cmake --build "$build" -j "$jobs" &&
    (cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 600)
  rc=$?
  if [ $rc -ne 0 ]; then
    stop_builder
    exit $rc
  fi
  tests_done=$SECONDS
  wait "$builder"
  rc=$?
  trap - INT TERM
  if [ $rc -ne 0 ]; then
    tail -n 80 "$log"
    echo "the sanitizer build failed (its whole output: $log)"
    exit $rc
  fi
  echo "== the sanitizer build ended $((SECONDS - tests_done)) s after the Release tests" \
    "($((SECONDS - start)) s in all)"
else
  cmake --build "$asan" -j "$jobs" --target "${targets[@]}" || exit
fi

echo "== the sanitized tests"
cd "$asan" && ctest --output-on-failure -j "$jobs" --timeout 600 -R "^($suites)" -E '^Chat.Tmux'

#!/usr/bin/env bash
# `k3_bench load` on the tiny fixture, with itself as the peer: every figure the issue asks for is
# printed (load s, GB/s, the drive probe, user vs sys, page faults, peak RSS, the peer's) and the
# RESULT line has its ratio. Timings are not checked, only that the fields are there and numeric.
# Usage: bench_load_test.sh <k3_bench> <kimi_k3> <model_dir>
set -u
bench=$1 kimi=$2 model=$3
out=$("$bench" load "$model" --kimi "$kimi" --cold --probe-gb 0.05 \
      --peer "$kimi $model --ids 1 -n 1" 2>&1)
status=$?
if [ $status -ne 0 ]; then
  echo "k3_bench load exited $status:"; echo "$out"; exit 1
fi
num='[0-9]+(\.[0-9]+)?'
fail=0
for pattern in \
    "^cpu: " \
    "^run 1: load $num s = $num GB/s of the resident weights' file bytes$" \
    "^drive probe: (O_DIRECT sequential read .*: $num GB/s|unavailable \(.*\).*)$" \
    "^cold: the page cache of every file of .* is dropped" \
    "^  kimi_k3: wall $num s \| user $num s, sys $num s \| page faults minor [0-9]+, major [0-9]+ \| peak RSS $num MB" \
    "^quantization work: .* = $num core-s$" \
    "^floor: max\(bytes / drive = $num s, work / [0-9]+ cores = $num s\) = $num s" \
    "^  peer: wall $num s \| user $num s, sys $num s \| page faults minor [0-9]+, major [0-9]+ \| peak RSS $num MB" \
    "^ours / peer: load $num" \
    "^RESULT load $num s ratio=$num$" \
    "^RESULT load_gbps $num GB/s ratio=" \
    "^RESULT load_drive_probe $num GB/s" \
    "^RESULT load_(user|sys) $num s" \
    "^RESULT load_(minor|major)_faults $num faults" \
    "^RESULT load_peak_rss $num MB" \
    "^RESULT load_peer $num s ratio=$num$" \
    "^RESULT load_peer_peak_rss $num MB"; do
  if ! grep -qE -- "$pattern" <<<"$out"; then
    echo "missing: $pattern"; fail=1
  fi
done
[ $fail -eq 0 ] || { echo "--- output:"; echo "$out"; }
exit $fail

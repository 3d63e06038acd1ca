#!/usr/bin/env bash
# `k3_bench decode` and `k3_bench stream` on the tiny fixture print their physical floors (issue 33
# item 5): bytes from RAM per token and tok/s / the DRAM floor, the chunked prefill's FLOP/s / the
# FMA peak (and / the int8 dot-product peak of the integer kernels it runs), streamed s/token / the drive floor, and the prefill's disk bytes per token at each chunk
# size with logits identical across sizes (item 3); `k3_bench kernels` (one small MXFP4 expert) prints
# each kernel's cycles per weight byte beside its cpu share, the core clock, and what binds the
# one-row kernel (item 4) and its ratio paired pass by pass with the probe, and SiTU's ns per
# element. Only that the figures are there and numeric: timings are never assertions.
# Usage: bench_floors_test.sh <k3_bench> <model_dir>
set -u
bench=$1 model=$2
num='[0-9]+(\.[0-9]+)?'
fail=0
check() {  # check <output> <pattern>...
  local out=$1; shift
  for pattern in "$@"; do
    grep -qE -- "$pattern" <<<"$out" || { echo "missing: $pattern"; fail=1; }
  done
}
decode=$("$bench" decode "$model" --tokens 2 --dram-gib 0.0625 2>&1) || { echo "$decode"; exit 1; }
check "$decode" \
  "^floors: DRAM read probe $num GB/s .*, FMA peak $num GFLOP/s" \
  "^prefill C=32: $num GFLOP/s of weight multiply-adds = $num.x the FMA peak \(32 rows per chunk\)" \
  "^decode bytes from RAM per token: $num MB .*; DRAM floor $num tok/s; measured = $num.x the floor" \
  "^RESULT decode_model_ram_bytes_per_token $num MB" \
  "^RESULT decode_model_vs_dram_floor $num tok/s ratio=$num$" \
  "^RESULT decode_model_prefill_C32_gflops $num GFLOP/s ratio=$num$" \
  "-> ok$"
# Beside the FMA peak, the integer kernels' own roof (with integer dots on, every ISA but the
# scalar code has one).
if grep -q "^floors: .*, int8 dot peak" <<<"$decode"; then
  check "$decode" \
    "^floors: .*, int8 dot peak [0-9]+ GOP/s \(" \
    "^  = $num.x the int8 dot peak, the roof of the integer kernels it runs \(K3_IDOT=1\)$" \
    "^RESULT decode_model_prefill_C32_vs_int8_dot_peak $num x ratio=$num$"
else  # the scalar code, or integer dots off (K3_IDOT=0): the FMA peak alone
  check "$decode" "^floors: DRAM read probe $num GB/s .*, FMA peak $num GFLOP/s \("
fi
stream=$("$bench" stream "$model" --probe-gb 0.01 --tokens 2 --prefill 4 --expert-gb 0.0001 \
          --chunks 1,4,16 --chunk-prompt 16 2>&1) || { echo "$stream"; exit 1; }
check "$stream" \
  "^drive: O_DIRECT, 8 x 4 MiB in flight, the shards read whole: $num GB/s" \
  "^  pipe: $num MB/token from the drive / $num GB/s = $num s/token floor; measured $num.x" \
  "^RESULT stream_(wait_all|pipe|pipe_prefetch)_vs_drive_floor $num x ratio=$num$" \
  "^== prefill of 16 tokens \(.*\) at each chunk size, routed experts from the drive" \
  "^ +1 +$num +$num +$num +$num +$num +$num% +$num \(reference\)$" \
  "^ +4 +$num +$num +$num +$num +$num +$num% +$num identical$" \
  "^ +16 +$num +$num +$num +$num +$num +$num% +$num identical$" \
  "^RESULT stream_prefill_C16 $num ms/token" \
  "^RESULT stream_prefill_C16_disk_mb_per_token $num MB/token ratio=$num$" \
  "^RESULT stream_prefill_C16_layer_cover $num fraction ratio=$num$"
# Fewer experts applied per token as the chunk grows: each distinct expert of a chunk once.
reads() { awk -v c="$1" '$1 == c && $NF ~ /^(identical|\(reference\))$/ { print $5 }' <<<"$stream"; }
awk -v a="$(reads 1)" -v b="$(reads 16)" 'BEGIN { exit !(b + 0 < a + 0) }' \
  || { echo "experts applied/token did not fall from C = 1 ($(reads 1)) to C = 16 ($(reads 16))"; fail=1; }
# `k3_bench kernels` kept short: one expert, 10 ms a figure, 3 paired passes, a 64 MiB probe.
short_kernels() { "$bench" kernels --experts 1 --seconds 0.01 --no-ggml --dram-gib 0.0625 \
                  --pair-passes 3 "$@" 2>&1; }
kernels=$(short_kernels --only mxfp4_idot_rows) || { echo "$kernels"; exit 1; }
check "$kernels" \
  "^core clock: $num GHz with [0-9]+ threads busy .*; TSC $num GHz\)" \
  "^figure +rows +MB/pass +best ms +med ms +GB/s +med +passes +cpu +cyc/B +per-row$" \
  "^mxfp4_idot_rows1 +1 +$num +$num +$num +$num +$num +[0-9]+ +[0-9]+% +$num *$" \
  "^DRAM reference in core cycles per byte: $num" \
  "^RESULT mxfp4_idot_rows(1|4|16|64)_cycles_per_byte $num cyc/B" \
  "^RESULT dram_probe_cycles_per_byte $num cyc/B" \
  "^RESULT core_clock $num GHz" \
  "^mxfp4_idot_rows1 paired with the probe, 3 passes: GB/s / the mean of the probe passes beside it: median $num \($num to $num; probe passes $num to $num GB/s, median $num; cpu [0-9]+%\)$" \
  "^mxfp4_idot_rows1 +>= 0.80 x DRAM probe +$num  (met|MISSED)  \(paired; x the highest probe $num\)(  \(contended: cpu [0-9]+%, not meaningful\))?$" \
  "^RESULT mxfp4_idot_rows1_paired $num x ratio=$num$"
# The same kernel on dense-shaped matrices (at least four of 47 MB), paired with the probe too,
# here starting 8 bytes past a 4 KiB boundary as a snapshot's weights may.
dense=$(short_kernels --only mxfp4_idot_12288x7168 --offset 8) || { echo "$dense"; exit 1; }
check "$dense" \
  "^== MXFP4 12288x7168 \(dense shape\), idot, [0-9]+ distinct matrices rotated, each starting 8 bytes past a 4 KiB boundary$" \
  "^mxfp4_idot_12288x7168_rows1 +1 +$num +$num +$num +$num +$num +[0-9]+ +[0-9]+% +$num *$" \
  "^mxfp4_idot_12288x7168_rows1 paired with the probe, 3 passes: GB/s / the mean of the probe passes beside it: median $num " \
  "^RESULT mxfp4_idot_12288x7168_rows1_paired $num x ratio=$num$"
# What binds the one-row kernel: measured on one core from the LLC where one expert fits there.
if grep -q "^mxfp4_idot_rows1_in_cache: skipped" <<<"$kernels"; then
  check "$kernels" "^mxfp4_idot_rows1_in_cache: skipped \(one expert, $num MB, is over 2/3 of the LLC\)"
else
  check "$kernels" \
    "^mxfp4_idot_rows1_in_cache +1 +$num +$num +$num +$num +$num +[0-9]+ +[0-9]+% +$num *$" \
    "^mxfp4_idot: $num cycles/byte on one core from the LLC = [0-9]+% of the DRAM run's $num; bound by (its instructions|its instructions and memory stalls|memory stalls)$" \
    "^RESULT mxfp4_idot_rows1_in_cache_cycles_per_byte $num cyc/B" \
    "^  on a workstation core with $num GB/s of DRAM \(300 GB/s / 32 cores\) at $num GHz the memory takes $num cycles/byte: the instructions' $num are [0-9]+% of it \((memory|instruction)-bound there\)$" \
    "^RESULT mxfp4_idot_rows1_vs_workstation_core $num x ratio=$num$"
fi
# The int8 integer-dot kernel's own cycles per byte from the LLC, and what binds it.
int8=$(short_kernels --only int8_idot_12288x7168) || { echo "$int8"; exit 1; }
check "$int8" \
  "^int8_idot_12288x7168_rows1_in_cache +1 +$num +$num +$num +$num +$num +[0-9]+ +[0-9]+% +$num *$" \
  "^int8_idot_12288x7168: $num cycles/byte on one core from the LLC = [0-9]+% of the DRAM run's $num; bound by (its instructions|its instructions and memory stalls|memory stalls)$" \
  "^RESULT int8_idot_12288x7168_rows1_vs_workstation_core $num x ratio=$num$"
# SiTU per element on every ISA the CPU runs (the scalar twin always).
situ=$("$bench" kernels --only situ --seconds 0.01 --no-ggml --dram-gib 0.0625 2>&1) \
  || { echo "$situ"; exit 1; }
check "$situ" \
  "^== SiTU-GLU, one thread, 98,304 elements$" \
  "^situ_scalar +$num ns/element: x$num the scalar twin, x$num glibc's tanhf/expf \($num\)$" \
  "^RESULT situ_scalar $num ns/element ratio=$num$"
[ $fail -eq 0 ] || {
  echo "--- decode:"; echo "$decode"; echo "--- stream:"; echo "$stream"
  echo "--- kernels:"; echo "$kernels"; echo "--- dense:"; echo "$dense"; echo "--- int8:"; echo "$int8"
  echo "--- situ:"; echo "$situ"
}
exit $fail

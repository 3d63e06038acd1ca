#!/usr/bin/env bash
# kimi_k3 is linked with apps/kimi_k3_hot.ld (the code a run executes, grouped; written by
# scripts/hot_text.py), and the sections that script lists still make up at least 90 % of the
# bytes it recorded (the section also holds the padding between functions, ~1 %). Less means
# functions it names were renamed, moved to another file or removed: their code is back in
# `.text`, spread over windows a run maps (docs/streaming.md §1.11), and the script is due. New
# functions on a run's path are not seen here; the k3-mini peak in docs/streaming.md §1.12 is.
# Usage: hot_text_test.sh <kimi_k3> <kimi_k3_hot.ld>
set -u
program=$1 script=$2
want=$(sed -nE 's/^ +[0-9]+ sections, ([0-9]+) bytes\. \*\/$/\1/p' "$script")
if [ -z "$want" ]; then
  echo "$script: no 'N sections, B bytes. */' line in its header"; exit 1
fi
command -v readelf >/dev/null || { echo "readelf (binutils) is missing"; exit 2; }
[ -f "$program" ] || { echo "$program: no such program"; exit 2; }
# The section's size is the 4th field after its name (type, address, offset, size): the index
# before the name is "[ 9]" or "[15]", one field or two.
hex=$(readelf -SW "$program" |
      awk '{ for (i = 1; i < NF; i++) if ($i == ".text.k3_hot") print $(i + 4) }')
if [ -z "$hex" ]; then
  echo "$program has no .text.k3_hot section: it was linked without $script (apps/CMakeLists.txt)"
  exit 1
fi
have=$((16#$hex))
echo "$program: .text.k3_hot holds $have bytes; $script recorded $want"
if [ $((have * 10)) -lt $((want * 9)) ]; then
  echo "under 90 %: functions it lists were renamed, moved or removed; run" \
       "scripts/hot_text.py --build <a Release build folder> and commit $script"
  exit 1
fi

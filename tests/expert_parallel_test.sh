#!/usr/bin/env bash
# tests/expert_parallel_test.sh — `mpirun -np N kimi_k3 … --expert-parallel` (docs/scale-out.md §2).
#
#   tests/expert_parallel_test.sh <kimi_k3> <k3_synth> <coli> <demo-model>
#
# On tests/data/k3-tiny (16 experts) and a synthetic tiny-dims checkpoint with 64 experts, with a
# 40-token prompt and 8 greedy tokens: the prefill logits (--logits) and the tokens (--ids) of 2
# and 3 ranks are byte-identical (cmp) to one node's, for K3_CHUNK=1 and 32 (two chunks), with the
# integer-dot experts (the default) and, on the synthetic model, the float ones (K3_IDOT=0) and an
# uneven map (--ep-weights 1,2,1; a weight list that is not one per rank is refused). The
# summary names every other rank's counters. Then: a rank that sees another config.json, or a
# longer shard, stops the start-up with an error naming the rank and the file; a worker killed
# with SIGKILL mid-decode is reported by rank 0, naming the rank, within --ep-timeout (3 s), and
# the job ends (no hang).
# Through `coli serve` on the build's demo checkpoint (<build>/tests/demo-model, read-only here):
# one streamed greedy chat request gives one node's text with 2 and 3 ranks, SIGTERM to rank 0
# ends every rank (exit 143) after the per-rank counters; with its worker killed, a request fails
# (500) naming the rank, later ones fail at once, and /health says degraded.
# Ranks run on loopback with --oversubscribe; Open MPI's run-as-root variables are set here only
# (CI runs as root). Every wait is bounded (EP_TEST_TIMEOUT seconds per run, default 60).
set -euo pipefail

if [[ $# -ne 4 ]]; then
  echo "usage: $0 <kimi_k3> <k3_synth> <coli> <demo-model>" >&2
  exit 2
fi
kimi=$(readlink -f "$1")
synth=$(readlink -f "$2")
coli=$(readlink -f "$3")
demo=$(readlink -f "$4")
here=$(cd "$(dirname "$0")" && pwd)
limit=${EP_TEST_TIMEOUT:-60}
if ! command -v mpirun >/dev/null; then
  echo "FAIL: mpirun is not installed (scripts/setup.sh installs Debian's openmpi-bin)"
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_plm_rsh_agent=false  # one node: never look for ssh
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
[[ -n "${EP_TEST_KEEP:-}" ]] && trap - EXIT

failures=0
fail() {
  echo "FAIL  $*"
  failures=$((failures + 1))
}
pass() { echo "PASS  $*"; }

"$synth" --preset tiny --experts 64 --out "$tmp/synth64" >/dev/null
prompt=$(seq -s, 11 50)  # 40 ids
run_one() {  # <out prefix> <model> [env…]: one node
  local out=$1 model=$2
  shift 2
  env "$@" timeout "$limit" "$kimi" "$model" --ids "$prompt" --ngen 8 --logits "$out.f32" \
    >"$out.ids" 2>"$out.err"
}
ep_flags=()
run_ep() {  # <out prefix> <ranks> <model> [env…]; more flags in ep_flags
  local out=$1 n=$2 model=$3
  shift 3
  env "$@" timeout "$limit" mpirun -np "$n" --oversubscribe "$kimi" "$model" --ids "$prompt" \
    --ngen 8 --logits "$out.f32" --expert-parallel "${ep_flags[@]}" >"$out.ids" 2>"$out.err"
}

check_same() {  # <name> <model> [env…]
  local name=$1 model=$2
  shift 2
  if ! run_one "$tmp/$name.one" "$model" "$@"; then
    fail "$name: one node failed: $(tail -3 "$tmp/$name.one.err")"
    return
  fi
  for n in 2 3; do
    local o="$tmp/$name.np$n"
    if ! run_ep "$o" "$n" "$model" "$@"; then
      fail "$name -np $n: the run failed: $(tail -5 "$o.err")"
      continue
    fi
    if ! cmp -s "$tmp/$name.one.f32" "$o.f32"; then
      fail "$name -np $n: the logits differ from one node's ($(cmp "$tmp/$name.one.f32" "$o.f32" 2>&1 | head -1))"
      continue
    fi
    if ! cmp -s "$tmp/$name.one.ids" "$o.ids"; then
      fail "$name -np $n: the tokens differ: one node $(cat "$tmp/$name.one.ids"), $n ranks $(cat "$o.ids")"
      continue
    fi
    local r
    for ((r = 1; r < n; r++)); do
      if ! grep -qE "expert-parallel: $n ranks .*\| rank $r: [1-9][0-9]* pairs" "$o.err"; then
        fail "$name -np $n: the summary has no pairs for rank $r: $(grep expert-parallel "$o.err")"
        continue 2
      fi
    done
    pass "$name -np $n: logits ($(stat -c %s "$o.f32") bytes) and tokens ($(cat "$o.ids")) identical"
  done
}

for C in 1 32; do
  check_same "k3-tiny.C$C" "$here/data/k3-tiny" K3_CHUNK=$C
  check_same "synth64.C$C" "$tmp/synth64" K3_CHUNK=$C
done
check_same "synth64.C32.idot0" "$tmp/synth64" K3_CHUNK=32 K3_IDOT=0

# --ep-weights 1,2,1: rank 1 owns half the experts; still one node's bits, and rank 1 computes
# more pairs than rank 2 (this fixture's routing: fixed by its seed).
ep_flags=(--ep-weights 1,2,1)
o="$tmp/weights"
if ! run_ep "$o" 3 "$tmp/synth64" K3_CHUNK=32; then
  fail "--ep-weights 1,2,1: the run failed: $(tail -5 "$o.err")"
elif ! cmp -s "$tmp/synth64.C32.one.f32" "$o.f32" || ! cmp -s "$tmp/synth64.C32.one.ids" "$o.ids"; then
  fail "--ep-weights 1,2,1: logits or tokens differ from one node's"
else
  p1=$(grep -o 'rank 1: [0-9]* pairs' "$o.err" | grep -o '[0-9]* pairs' | cut -d' ' -f1)
  p2=$(grep -o 'rank 2: [0-9]* pairs' "$o.err" | grep -o '[0-9]* pairs' | cut -d' ' -f1)
  if [[ -z "$p1" || -z "$p2" ]] || ((p1 <= p2)); then
    fail "--ep-weights 1,2,1: rank 1 should compute more pairs than rank 2: $(grep expert-parallel: "$o.err")"
  else
    pass "--ep-weights 1,2,1: one node's bits; rank 1 $p1 pairs, rank 2 $p2"
  fi
fi
ep_flags=(--ep-weights 1,1)
if run_ep "$tmp/weights2" 3 "$tmp/synth64"; then
  fail "--ep-weights 1,1 with 3 ranks: accepted"
elif ! grep -q "ep-weights gives 2 weights for a job of 3 ranks" "$tmp/weights2.err"; then
  fail "--ep-weights 1,1 with 3 ranks: no error naming both: $(grep -v '^[-[]' "$tmp/weights2.err" | head -3)"
else
  pass "--ep-weights 1,1 with 3 ranks: refused"
fi
ep_flags=()

# Start-up check: rank 1 reads a copy whose config.json differs (one more key).
cp -r "$tmp/synth64" "$tmp/other"
python3 - "$tmp/other/config.json" <<'EOF'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["k3_test_marker"] = 1
json.dump(c, open(p, "w"))
EOF
if timeout "$limit" mpirun --oversubscribe -np 1 "$kimi" "$tmp/synth64" --ids 1,2 --ngen 1 \
  --expert-parallel : -np 1 "$kimi" "$tmp/other" --ids 1,2 --ngen 1 --expert-parallel \
  >"$tmp/mismatch.out" 2>"$tmp/mismatch.err"; then
  fail "mismatch: the job ran with a rank that sees another config.json"
elif [[ $? -eq 124 ]]; then
  fail "mismatch: the job hung ($limit s)"
elif ! grep -q "kimi_k3: expert-parallel: the ranks do not see the same model: rank 1: config.json" \
  "$tmp/mismatch.err"; then
  fail "mismatch: no error naming rank 1 and config.json: $(head -5 "$tmp/mismatch.err")"
else
  pass "mismatch: $(grep -o 'rank 1: config.json[^(]*' "$tmp/mismatch.err")"
fi

# A rank whose copy of a shard is longer (4 KiB appended): its own load refuses the file, and
# rank 0 reports it with the rank and the file.
rm -rf "$tmp/other"
cp -r "$tmp/synth64" "$tmp/other"
shard=$(ls "$tmp/other"/model-*.safetensors | sed -n 3p)
truncate -s +4096 "$shard"
if timeout "$limit" mpirun --oversubscribe -np 1 "$kimi" "$tmp/synth64" --ids 1,2 --ngen 1 \
  --expert-parallel : -np 1 "$kimi" "$tmp/other" --ids 1,2 --ngen 1 --expert-parallel \
  >"$tmp/shard.out" 2>"$tmp/shard.err"; then
  fail "shard: the job ran with a rank whose shard is longer"
elif ! grep -qF "the ranks do not see the same model: rank 1: $shard" "$tmp/shard.err"; then
  fail "shard: no error naming rank 1 and $(basename "$shard"): $(grep kimi_k3 "$tmp/shard.err" | head -3)"
else
  pass "shard: rank 1 and $(basename "$shard") named"
fi

# A worker killed mid-decode. --enable-recovery keeps mpirun from ending the job itself, so rank 0
# must notice (without it mpirun ends every rank at once, which cannot hang either). On a copy of
# k3-tiny without its eos_token_id: greedy from 1,2,3 the fixture writes its eos after 177 ids,
# and the decode must still be running when the worker dies.
cp -r "$here/data/k3-tiny" "$tmp/tiny-no-eos"
sed -i 's/"eos_token_id": 770/"eos_token_id": null/' "$tmp/tiny-no-eos/config.json"
if grep -q '"eos_token_id": 770' "$tmp/tiny-no-eos/config.json"; then
  fail "kill: the copy of k3-tiny still has its eos_token_id"
fi
err="$tmp/kill.err"
ids="$tmp/kill.ids"
timeout "$limit" mpirun --enable-recovery -np 2 --oversubscribe "$kimi" "$tmp/tiny-no-eos" \
  --ids 1,2,3 --ngen 50000 --ctx 50010 --ep-timeout 3 --expert-parallel >"$ids" 2>"$err" &
job=$!
pids+=("$job")
worker=""
for _ in $(seq $((limit * 10))); do
  worker=$(grep -o 'rank 1 of 2 serves .*(pid [0-9]*)' "$err" 2>/dev/null | grep -o '[0-9]*)$' | tr -d ')' || true)
  [[ -n "$worker" && -s "$ids" ]] && break
  sleep 0.1
done
if [[ -z "$worker" || ! -s "$ids" ]]; then
  fail "kill: the job did not start decoding: $(tail -5 "$err")"
else
  kill -9 "$worker"
  killed_at=$(date +%s)
  status=0
  wait "$job" || status=$?
  if [[ $status -eq 124 ]]; then
    fail "kill: the job did not end within $limit s after its worker was killed"
  elif ! grep -q "kimi_k3: expert-parallel: rank 1 sent no answer for MoE layer [0-9]* within 3 s" "$err"; then
    fail "kill: rank 0 did not name rank 1: $(grep -v '^\[' "$err" | head -8)"
  else
    pass "kill: '$(grep -o 'rank 1 sent no answer[^(]*' "$err")' $(($(date +%s) - killed_at)) s after the kill, $(wc -w <"$ids") tokens before"
  fi
fi

# coli serve: one streamed greedy request, one node vs 2 and 3 ranks; then SIGTERM to rank 0.
[[ -f "$demo/config.json" ]] || {
  echo "FAIL: the demo model is missing at $demo (build the k3_test_demo_model target)"
  exit 1
}
wait_for() {  # <file> <pattern>: bounded
  for _ in $(seq $((limit * 10))); do
    grep -q "$1" "$2" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
ask() {  # <port> [question]: the streamed reply's text (reasoning and content)
  local question=${2:-Tell me about rivers.}
  curl -sN --max-time "$limit" "http://127.0.0.1:$1/v1/chat/completions" \
    -H 'content-type: application/json' \
    -d '{"model":"kimi-k3","messages":[{"role":"user","content":"'"$question"'"}],
         "temperature":0,"max_tokens":16,"stream":true}' |
    python3 -c '
import json, sys
text, done = "", False
for line in sys.stdin:
    line = line.strip()
    if line == "data: [DONE]": done = True
    elif line.startswith("data: "):
        for c in json.loads(line[6:]).get("choices", []):
            d = c.get("delta") or {}
            text += (d.get("reasoning_content") or "") + (d.get("content") or "")
print(text if done else "NO [DONE]: " + text)'
}
serve_reply() {  # <name> <ranks>: starts the server, asks, SIGTERMs rank 0; sets $reply
  local name=$1 n=$2 out="$tmp/$1.out" err="$tmp/$1.err" job
  reply=""
  if ((n == 1)); then
    "$coli" serve --model "$demo" --port 0 >"$out" 2>"$err" &
  else
    mpirun -np "$n" --oversubscribe "$coli" serve --model "$demo" --port 0 --expert-parallel \
      >"$out" 2>"$err" &
  fi
  job=$!
  pids+=("$job")
  if ! wait_for "listening on http://127.0.0.1:" "$out" || ! wait_for " loaded in " "$err"; then
    fail "$name: the server did not start: $(tail -5 "$err")"
    kill -9 "$job" 2>/dev/null
    return
  fi
  local port ranks
  port=$(grep -o '127.0.0.1:[0-9]*' "$out" | head -1 | cut -d: -f2)
  reply=$(ask "$port")
  # Four more questions: one after another on one node, at once on the ranks (the sessions'
  # decode steps are then batched: docs/serving.md §3.10).
  replies=""
  local i asks=()
  for i in "${!QUESTIONS[@]}"; do
    if ((n == 1)); then
      ask "$port" "${QUESTIONS[$i]}" >"$tmp/$name.q$i"
    else
      ask "$port" "${QUESTIONS[$i]}" >"$tmp/$name.q$i" &
      asks+=($!)
    fi
  done
  ((${#asks[@]})) && wait "${asks[@]}"
  for i in "${!QUESTIONS[@]}"; do replies+="$(cat "$tmp/$name.q$i")|"; done
  if ((n > 1)); then
    # /metrics: the exchange and every rank's counters, as the last answers carried them.
    local metrics
    metrics=$(curl -s --max-time "$limit" "http://127.0.0.1:$port/metrics")
    if ! grep -qx "k3_ep_ranks $n" <<<"$metrics" ||
      ! grep -qE "^k3_ep_rank_pairs_total\{rank=\"$((n - 1))\"\} [1-9][0-9]*$" <<<"$metrics" ||
      ! grep -qE '^k3_ep_bytes_sent_total [1-9]' <<<"$metrics"; then
      fail "$name: /metrics lacks the per-rank counters: $(grep '^k3_ep' <<<"$metrics" | head -20)"
    fi
    local steps rows
    steps=$(awk '$1 == "k3_decode_steps_total" {print $2}' <<<"$metrics")
    rows=$(awk '$1 == "k3_decode_rows_total" {print $2}' <<<"$metrics")
    if ! awk -v s="$steps" -v r="$rows" 'BEGIN {exit !(s > 0 && r > s)}'; then
      fail "$name: the concurrent questions were never decoded in one batch (steps $steps, rows $rows)"
    fi
  fi
  ranks=$( ((n == 1)) && echo "$job" || pgrep -P "$job")
  local rank0="" r
  for r in $ranks; do grep -q "(pid $r)" "$err" || rank0=$r; done
  kill -TERM "$rank0"
  local status=0
  for _ in $(seq $((limit * 10))); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$job" 2>/dev/null; then
    fail "$name: still running $limit s after SIGTERM to rank 0"
    kill -9 "$job" $ranks 2>/dev/null
    return
  fi
  wait "$job" || status=$?
  for r in $ranks; do  # gone, or a zombie not yet reaped by its new parent
    for _ in $(seq $((limit * 10))); do
      [[ ! -e /proc/$r || "$(awk '{print $3}' "/proc/$r/stat" 2>/dev/null)" == Z ]] && break
      sleep 0.1
    done
    if [[ -e /proc/$r && "$(awk '{print $3}' "/proc/$r/stat" 2>/dev/null)" != Z ]]; then
      fail "$name: rank pid $r survived SIGTERM to rank 0"
    fi
  done
  [[ $status -eq 143 ]] || fail "$name: exit status $status after SIGTERM to rank 0 (expected 143)"
  if ((n > 1)) && ! grep -qE "^coli: expert-parallel: $n ranks \| exchange [0-9.]+ ms/token.*\| rank $((n - 1)): [1-9][0-9]* pairs" "$err"; then
    fail "$name: no per-rank counters at exit: $(grep expert-parallel: "$err")"
  fi
}
QUESTIONS=("What is a lake?" "Name three seas." "Why is the sky blue?" "Count to five.")
serve_reply serve.one 1
expected=$reply
expected_four=$replies
if [[ -z "$expected" || "$expected" == NO* ]]; then
  fail "serve one node: no reply ($expected)"
else
  for n in 2 3; do
    serve_reply "serve.np$n" "$n"
    if [[ "$reply" != "$expected" ]]; then
      fail "serve -np $n: the streamed reply differs: one node '$expected', $n ranks '$reply'"
    elif [[ "$replies" != "$expected_four" || "$replies" == *NO* ]]; then
      fail "serve -np $n: four concurrent replies differ from one node's one by one: '$expected_four' vs '$replies'"
    else
      pass "serve -np $n: the streamed reply and four batched concurrent ones are one node's, /metrics has every rank's counters, SIGTERM to rank 0 ended every rank"
    fi
  done
fi

# coli serve with a worker killed: the next request fails naming the rank (500) within
# --ep-timeout, later ones at once, /health says degraded; SIGTERM to rank 0 still ends the job.
out="$tmp/servekill.out"
err="$tmp/servekill.err"
mpirun --enable-recovery -np 2 --oversubscribe "$coli" serve --model "$demo" --port 0 \
  --expert-parallel --ep-timeout 3 >"$out" 2>"$err" &
job=$!
pids+=("$job")
if ! wait_for "listening on http://127.0.0.1:" "$out" || ! wait_for " loaded in " "$err" ||
  ! wait_for "rank 1 of 2 serves" "$err"; then
  fail "serve kill: the server did not start: $(tail -5 "$err")"
else
  port=$(grep -o '127.0.0.1:[0-9]*' "$out" | head -1 | cut -d: -f2)
  kill -9 "$(grep -o 'rank 1 of 2 serves .*(pid [0-9]*)' "$err" | grep -o '[0-9]*)$' | tr -d ')')"
  req() {
    curl -s --max-time "$limit" -o "$tmp/servekill.$1" -w '%{http_code}' \
      "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
      -d '{"model":"kimi-k3","messages":[{"role":"user","content":"Hi"}],"max_tokens":4}'
  }
  first=$(req 1)
  second=$(req 2)
  health=$(curl -s --max-time "$limit" -o "$tmp/servekill.health" -w '%{http_code}' "http://127.0.0.1:$port/health")
  if [[ $first != 500 ]] || ! grep -q "rank 1 sent no answer for MoE layer" "$tmp/servekill.1"; then
    fail "serve kill: first request $first $(cat "$tmp/servekill.1")"
  elif [[ $second != 500 ]] || ! grep -q "rank 1 sent no answer.*restart it" "$tmp/servekill.2"; then
    fail "serve kill: second request $second $(cat "$tmp/servekill.2")"
  elif [[ $health != 503 ]] || ! grep -q '"status":"degraded"' "$tmp/servekill.health"; then
    fail "serve kill: /health $health $(head -c 300 "$tmp/servekill.health")"
  else
    pass "serve kill: 500 naming rank 1, then 500 at once, /health 503 degraded"
  fi
  for r in $(pgrep -P "$job"); do kill -TERM "$r"; done
  for _ in $(seq $((limit * 10))); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$job" 2>/dev/null; then fail "serve kill: the job still runs after SIGTERM to rank 0"; fi
fi

if ((failures)); then
  echo "expert_parallel_test: $failures failed"
  exit 1
fi
echo "expert_parallel_test: all passed"

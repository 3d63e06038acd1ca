#!/usr/bin/env bash
# bench/ep_netns.sh — `k3_bench ep`: --expert-parallel across simulated hosts (docs/scale-out.md
# §2.7). Not a test: it needs root (network namespaces) and prints figures.
#
#   bench/ep_netns.sh <kimi_k3> <k3_synth> [delay rate]      e.g. 0.1ms 10gbit, or 1ms 1gbit
#
# Each rank runs in its own network namespace (k3ep0, k3ep1, …) behind a veth pair on one bridge,
# its link shaped by `tc`: netem delay and rate where the kernel has netem, else tbf (rate only;
# the line says so). mpirun (in the root namespace) starts the ranks through an rsh agent that
# enters the rank's namespace, and MPI talks TCP only (no shared memory between "hosts").
# The model: k3_synth's demo dims with 256 experts per layer (33 MB of experts); every rank's expert cache holds 40%
# of all experts, so one rank's cache cannot hold them and 3 ranks' can. For 1 (one node, no MPI),
# 2 and 3 ranks it prints decode s/token, expert bytes read per token (every rank), the exchange
# time per token and its share of the decode time, and the speed-up over one node.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 <kimi_k3> <k3_synth> [delay rate]" >&2
  exit 2
fi
kimi=$(readlink -f "$1")
synth=$(readlink -f "$2")
delay=${3:-0.1ms}
rate=${4:-10gbit}
ngen=${EP_BENCH_NGEN:-512}
maxn=3
[[ $(id -u) -eq 0 ]] || { echo "k3_bench ep: needs root (ip netns)" >&2; exit 1; }
for t in ip tc mpirun; do command -v $t >/dev/null || { echo "k3_bench ep: $t missing" >&2; exit 1; }; done
work=$(mktemp -d)
cleanup() {
  for ((i = 0; i < maxn; i++)); do ip netns del "k3ep$i" 2>/dev/null || true; done
  ip link del k3epbr 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cleanup
work=$(mktemp -d)

"$synth" --preset demo --experts 256 --out "$work/model" >/dev/null
cache_gb=$(python3 - "$work/model/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1])); c = c.get("text_config", c)
R, I, E = c["routed_expert_hidden_size"], c["moe_intermediate_size"], c["num_experts"]
moe = c["num_hidden_layers"] - c["first_k_dense_replace"]
expert = 3 * (I * R // 2 + I * R // 32)
print("%.9f" % (0.4 * moe * E * expert / 1e9))
EOF
)

shaping="netem delay $delay rate $rate"
ip link add k3epbr type bridge
ip addr add 10.77.0.254/24 dev k3epbr
ip link set k3epbr up
for ((i = 0; i < maxn; i++)); do
  ns=k3ep$i
  ip netns add $ns
  ip link add k3epv$i type veth peer name eth0 netns $ns
  ip link set k3epv$i master k3epbr up
  ip netns exec $ns ip addr add 10.77.0.$((i + 1))/24 dev eth0
  ip netns exec $ns ip link set eth0 up
  ip netns exec $ns ip link set lo up
  if ! ip netns exec $ns tc qdisc add dev eth0 root netem delay "$delay" rate "$rate" 2>/dev/null; then
    ip netns exec $ns tc qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 50ms
    shaping="tbf rate $rate (no netem in this kernel: the delay $delay is not simulated)"
  fi
done
cat >"$work/agent" <<'EOF'
#!/usr/bin/env bash
# rsh agent: "<host> <command…>" → the command inside host 10.77.0.N's namespace k3ep(N-1)
host=$1
shift
exec ip netns exec "k3ep$((${host##*.} - 1))" bash -c "$*"
EOF
chmod +x "$work/agent"

export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=("$work/model" --ids "$(seq -s, 11 26)" --ngen "$ngen" --expert-gb "$cache_gb")
echo "k3_bench ep: demo dims, 256 experts/layer, cache $cache_gb GB per rank (40% of the experts), $ngen tokens; links: $shaping"
printf '%-6s %10s %16s %14s %8s %9s\n' ranks s/token "expert MB/token" "exchange ms/t" share speed-up
base=""
for ((n = 1; n <= maxn; n++)); do
  if ((n == 1)); then
    ip netns exec k3ep0 "$kimi" "${common[@]}" >/dev/null 2>"$work/r1.err"
  else
    hosts=$(for ((i = 1; i <= n; i++)); do printf '10.77.0.%d:1,' $i; done)
    mpirun --oversubscribe -np $n --host "${hosts%,}" --mca plm_rsh_agent "$work/agent" \
      --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
      "$kimi" "${common[@]}" --expert-parallel >/dev/null 2>"$work/r$n.err"
  fi
  python3 - "$work/r$n.err" "$n" "$ngen" "${base:-0}" >"$work/r$n.row" <<'EOF'
import re, sys
text = open(sys.argv[1]).read(); n = int(sys.argv[2]); ngen = int(sys.argv[3]); base = float(sys.argv[4])
m = re.search(r"decode (\d+) tok ([0-9.]+) tok/s", text)
if not m: sys.exit("no summary line:\n" + text[-2000:])
steps, rate = int(m.group(1)), float(m.group(2))
s_tok = 1 / rate if rate > 0 else float("nan")
ranks = re.findall(r"rank \d+: [^|]*? ([0-9.]+) MB read", text)
if ranks: mb = sum(float(x) for x in ranks)  # every rank, rank 0 included
else: mb = 1e3 * float(re.search(r"experts: .*?\| ([0-9.]+) GB read", text).group(1))
tokens = steps + 16
ex = re.search(r"exchange ([0-9.]+) ms/token", text)
ex_ms = float(ex.group(1)) if ex else 0.0
print("%-6d %10.4f %16.3f %14.3f %7.1f%% %8.2fx" % (n, s_tok, mb / tokens, ex_ms,
      100 * ex_ms / 1e3 / s_tok if s_tok > 0 else 0, (base / s_tok) if base > 0 else 1.0))
EOF
  cat "$work/r$n.row"
  if ((n == 1)); then base=$(python3 -c "import re;t=open('$work/r1.err').read();print(1/float(re.search(r'decode \d+ tok ([0-9.]+) tok/s',t).group(1)))"); fi
done
echo "(the ranks share this machine's cores and drive: the figures that transfer are the bytes read per token and the exchange per token)"

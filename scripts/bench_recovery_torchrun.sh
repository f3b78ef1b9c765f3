#!/usr/bin/env bash
# The peer of bench_recovery.sh: torchrun's elastic agent (c10d rendezvous,
# default settings, --nnodes 1:2 --max_restarts 3), two agents of G workers
# running examples/pytorch/elastic.py (DDP over gloo, a checkpoint every
# step). After step 50 the second agent (not the one hosting the c10d
# store) and its workers are killed with SIGKILL, as when a node dies; the
# time from the kill until the surviving agent's workers report a step at
# the smaller world size is printed, for RUNS runs.
#
#   scripts/bench_recovery_torchrun.sh [G] [RUNS]   (defaults 2 and 1)
#
# Killing only the agent is not a node loss under torchrun: its workers
# are not stopped with it and the job goes on at the old world size. As in
# bench_launch.sh, Debian's torchrun 1.13 runs through a wrapper that fixes
# Std.from_str on Python 3.11. It kills every examples/pytorch/elastic.py
# process of this machine when it ends.
set -euo pipefail
g=${1:-2}
runs=${2:-1}
tmp=$(mktemp -d)
cleanup() { pkill -9 -f "$tmp/torchrun.py" 2>/dev/null || true; pkill -9 -f "examples/pytorch/elastic.py" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
cd "$(dirname "$0")/.."
cp scripts/torchrun_debian.py "$tmp/torchrun.py"
stamp() { while IFS= read -r l; do echo "$(date +%s%3N) $l"; done; }
for i in $(seq "$runs"); do
  d=$tmp/run$i; mkdir -p "$d"
  port=$(/usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  export ELASTIC_STEPS=100000 ELASTIC_STEP_SLEEP=0.05 ELASTIC_GLOBAL=16 GPUCOORD_CHECKPOINT_DIR=$d/ck
  args=(--nnodes 1:2 --nproc_per_node "$g" --max_restarts 3 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:$port --rdzv_id bench$i examples/pytorch/elastic.py)
  (/usr/bin/python3 "$tmp/torchrun.py" "${args[@]}" 2>&1 | stamp >"$d/a.log") &
  until ss -ltn | grep -q ":$port "; do sleep 0.05; done
  /usr/bin/python3 "$tmp/torchrun.py" "${args[@]}" >"$d/b.log" 2>&1 &
  b=$!
  until grep -q "step 50/" "$d/a.log" 2>/dev/null; do sleep 0.05; done
  victims="$b $(pgrep -P "$b" | tr '\n' ' ')"
  t0=$(date +%s%3N)
  kill -9 $victims
  until grep -q "world $((g))$" "$d/a.log" 2>/dev/null; do sleep 0.1; done
  first=$(grep -m1 "world $((g))$" "$d/a.log" | cut -d' ' -f1)
  echo "run $i: $((2*g)) ranks -> $g: first step at the smaller world size $((first - t0)) ms after the kill"
  pkill -9 -f "$tmp/torchrun.py" 2>/dev/null || true
  pkill -9 -f "examples/pytorch/elastic.py" 2>/dev/null || true
  sleep 1
done

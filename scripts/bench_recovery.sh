#!/usr/bin/env bash
# Recovery after a node loss: a native job on 2 worker agents x G ranks
# (tp 2, pp 2) checkpointing every step; after step 20 one agent is killed
# with SIGKILL; the times from the kill to detection (the coordinator's
# "node disconnected" or gossip line), to the new generation, and to the
# first step the new generation reports, as medians over RUNS.
#
#   scripts/bench_recovery.sh [G] [RUNS] [torch]     (defaults 4 and 5)
#
# With "torch" the job is examples/pytorch/elastic.py (DDP over gloo, a
# checkpoint every step, 50 ms per step) on 2 agents x G ranks, as
# bench_recovery_torchrun.sh runs it under torchrun, and the last time is
# until the survivors print a step at the smaller world size.
set -euo pipefail
g=${1:-4}
runs=${2:-5}
program=${3:-native}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
go build -o "$tmp/gpucoord" ./cmd/gpucoord
B=$tmp/gpucoord
ms() { date -d "$1" +%s%3N; }   # an RFC 3339 time in ms
stamp() { while IFS= read -r l; do echo "$(date +%s%3N) $l"; done; }
for i in $(seq "$runs"); do
  d=$tmp/run$i; mkdir -p "$d"
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  "$B" coordinator --listen 127.0.0.1:$port --data-dir "$d/etcd" >"$d/coord.log" 2>&1 & pids+=($!)
  until grep -q "elected leader" "$d/coord.log"; do sleep 0.05; done
  "$B" worker --coordinator 127.0.0.1:$port --name w0 --gpus-per-node "$g" --state-dir "$d/w0" >"$d/w0.log" 2>&1 & pids+=($!)
  "$B" worker --coordinator 127.0.0.1:$port --name w1 --gpus-per-node "$g" --state-dir "$d/w1" >"$d/w1.log" 2>&1 & w1=$!; pids+=($w1)
  if [ "$program" = torch ]; then
    (tail -F "$d/w0.log" 2>/dev/null | stamp >"$d/w0.stamped") & pids+=($!)
    ("$B" launch --coordinator 127.0.0.1:$port --nodes 2 --gpus-per-node "$g" --min-nodes 1 --max-restarts 1 --checkpoint-dir "$d/ckpt" \
        --env ELASTIC_STEPS=100000 --env ELASTIC_STEP_SLEEP=0.05 --env ELASTIC_GLOBAL=16 -- /usr/bin/python3 examples/pytorch/elastic.py \
        >"$d/launch.out" 2>&1) & pids+=($!)
    until grep -q 'step 50/' "$d/w0.log" 2>/dev/null; do sleep 0.02; done
    t0=$(date +%s%3N); kill -9 "$w1"
    until grep -q "world $g\$" "$d/w0.stamped" 2>/dev/null; do sleep 0.02; done
    first=$(grep -m1 "world $g\$" "$d/w0.stamped" | cut -d' ' -f1)
  else
    ("$B" launch --coordinator 127.0.0.1:$port --nodes 2 --gpus-per-node "$g" --tp 2 --pp 2 --min-nodes 1 --max-restarts 1 \
        --checkpoint-every 1 --checkpoint-dir "$d/ckpt" --steps 100000 --json examples/jobs/mlp.yaml 2>&1 | stamp >"$d/launch.out") & pids+=($!)
    until grep -q '{"step":20,' "$d/launch.out" 2>/dev/null; do sleep 0.02; done
    t0=$(date +%s%3N); kill -9 "$w1"
    until grep -q '"generation":2,"dp":' "$d/launch.out" 2>/dev/null; do sleep 0.02; done
    first=$(grep -m1 '"generation":2,"dp":' "$d/launch.out" | cut -d' ' -f1)
  fi
  det=$(grep -m1 -E 'node disconnected|failed its gossip' "$d/coord.log" | sed -E 's/^time=([^ ]+).*/\1/')
  gen=$(grep -m1 'new generation' "$d/coord.log" | sed -E 's/^time=([^ ]+).*/\1/')
  echo "$(( $(ms "$det") - t0 )) $(( $(ms "$gen") - t0 )) $(( first - t0 ))" >>"$tmp/results"
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; pids=()
  pkill -9 -f "$d/" 2>/dev/null || true
  pkill -9 -f "tail -F $d/" 2>/dev/null || true
  sleep 0.5
done
med() { awk -v c="$1" '{print $c}' "$tmp/results" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
printf '%s: %d ranks (2 agents x %d), %d runs, ms after the SIGKILL (median):\n' "$program" $((2*g)) "$g" "$runs"
printf '  detection %s   new generation %s   first step of the new generation %s\n' "$(med 1)" "$(med 2)" "$(med 3)"
cat "$tmp/results" | sed 's/^/  run: /'

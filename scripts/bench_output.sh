#!/usr/bin/env bash
# Rank output through the launcher: 4 ranks each print LINES lines (default
# 100000, about 34 bytes each), shown behind their tags by gpucoord launch
# --standalone (--output all, and --output failed for the cost of starting
# alone) and by torchrun --tee 3 (Debian's torch 1.13, through
# scripts/torchrun_debian.py so that it starts on Python 3.11). Each prints
# the wall and CPU seconds (bash's time) of RUNS runs, alternating, and how
# many lines reached the launcher's output.
set -euo pipefail
runs=${1:-5} lines=${2:-100000}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/gpucoord" ./cmd/gpucoord
cp scripts/torchrun_debian.py "$tmp/torchrun.py"
cat > "$tmp/rank.sh" <<SH
#!/bin/sh
seq 1 $lines | sed "s/^/rank \$RANK says line /"
SH
chmod +x "$tmp/rank.sh"
TIMEFORMAT='%R wall s, %U user s, %S sys s'
measure() { # name, then the command
  local name=$1; shift
  local n
  { time "$@" >"$tmp/out" 2>&1; } 2>"$tmp/time"
  n=$(grep -c "says line" "$tmp/out" || true)
  echo "$name: $(cat "$tmp/time"), $n of $((4 * lines)) lines"
}
for _ in $(seq "$runs"); do
  measure "gpucoord --output all   " "$tmp/gpucoord" launch --standalone --nodes 1 --gpus-per-node 4 -- "$tmp/rank.sh"
  measure "gpucoord --output failed" "$tmp/gpucoord" launch --standalone --nodes 1 --gpus-per-node 4 --output failed -- "$tmp/rank.sh"
  measure "torchrun --tee 3        " /usr/bin/python3 "$tmp/torchrun.py" --standalone --nproc_per_node 4 --monitor_interval 0.1 --tee 3 --no_python "$tmp/rank.sh"
done

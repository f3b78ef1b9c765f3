#!/usr/bin/env bash
# Time from starting a launcher to every rank running a trivial program,
# gpucoord launch --standalone against torchrun --standalone, side by side
# on this machine (the runs alternate, so both see the same load).
#
#   scripts/bench_launch.sh [RUNS] [RANKS]      (defaults 10 and 4)
#
# Each rank runs `sh -c 'date +%s%N > DIR/$RANK'`; launch-to-running is the
# latest rank's timestamp minus the launcher's start, and total is the time
# until the launcher exits. Medians over RUNS are printed as a table.
#
# Debian's torch 1.13 torchrun fails on Python 3.11 before it starts a
# worker (Std.from_str("0") returns None because Python 3.11's IntFlag no
# longer iterates zero and multi-bit members); the torchrun runs here go
# through scripts/torchrun_debian.py, which fixes that function and then
# calls torch.distributed.run.main unchanged.
set -euo pipefail
runs=${1:-10}
ranks=${2:-4}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/gpucoord" ./cmd/gpucoord
cp scripts/torchrun_debian.py "$tmp/torchrun.py"
prog='date +%s%N > "$BENCH_DIR/$RANK"'
now() { date +%s%N; }
measure() { # name, then the command
  local name=$1; shift
  local dir="$tmp/out-$name-$RANDOM"
  mkdir -p "$dir"
  local t0 t1
  t0=$(now)
  BENCH_DIR=$dir "$@" >"$tmp/log" 2>&1 || { echo "$name failed:"; cat "$tmp/log"; exit 1; }
  t1=$(now)
  local n last
  n=$(ls "$dir" | wc -l)
  [ "$n" = "$ranks" ] || { echo "$name: $n of $ranks ranks ran"; cat "$tmp/log"; exit 1; }
  last=$(cat "$dir"/* | sort -n | tail -1)
  echo "$name $(( (last - t0) / 1000000 )) $(( (t1 - t0) / 1000000 ))" >> "$tmp/results"
}
half=$((ranks / 2))
for i in $(seq "$runs"); do
  measure torchrun /usr/bin/python3 "$tmp/torchrun.py" --standalone --nproc_per_node "$ranks" --no_python /bin/sh -c "$prog"
  measure gpucoord-1x$ranks "$tmp/gpucoord" launch --standalone --nodes 1 --gpus-per-node "$ranks" -- /bin/sh -c "$prog"
  measure gpucoord-2x$half "$tmp/gpucoord" launch --standalone --nodes 2 --gpus-per-node "$half" -- /bin/sh -c "$prog"
done
printf '%-16s %22s %14s\n' launcher "launch-to-running ms" "total ms"
for name in torchrun gpucoord-1x$ranks gpucoord-2x$half; do
  med() { grep "^$name " "$tmp/results" | awk -v c="$1" '{print $c}' | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
  printf '%-16s %22s %14s\n' "$name" "$(med 2)" "$(med 3)"
done
echo "($runs runs each, alternating; $(nproc) cores)"

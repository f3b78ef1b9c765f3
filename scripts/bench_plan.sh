#!/usr/bin/env bash
# The whole `gpucoord plan` process for 32,768 GPUs (gpt-1t on 4,096
# dgx-h100 nodes, tp 8, pp 32, dp 128): wall milliseconds (median, min,
# max) and peak RSS of RUNS runs of the text form and of --json, beside
# `gpucoord --version`, the process starting and exiting alone, run in the
# same rounds so that all three see the same load (the goal is 100 ms).
#
#   scripts/bench_plan.sh [RUNS]                       (default 10)
#   BASE=/tmp/old/gpucoord scripts/bench_plan.sh       also times BASE,
#       alternating with the new build run by run, and checks that both
#       print the same bytes
#   GPUCOORD=/tmp/new/gpucoord scripts/bench_plan.sh   times that binary
#       instead of building one
#
# The load average (1, 5, 15 minutes) is printed before and after: on a
# shared machine compare the plan rows with the --version row, not with
# another session's figures.
set -euo pipefail
runs=${1:-10}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=${GPUCOORD:-}
if [ -z "$bin" ]; then
  bin=$tmp/gpucoord
  CGO_ENABLED=0 "${GO:-go}" build -o "$bin" ./cmd/gpucoord
fi
bins=(new)
declare -A path=([new]=$bin)
if [ -n "${BASE:-}" ]; then
  bins=(base new)
  path[base]=$BASE
fi
plan=(plan --nodes 4096 --model gpt-1t --tp 8 --pp 32 --zero 1 --global-batch 8192 --recompute full --sequence-parallel)
measure() { # binary name, row name, output file, then the arguments
  local b=$1 row=$2 out=$3; shift 3
  local t0=$EPOCHREALTIME
  /usr/bin/time -f %M -o "$tmp/rss" "${path[$b]}" "$@" >"$out" || { echo "$b $*: exit $?" >&2; exit 1; }
  local t1=$EPOCHREALTIME
  echo "$b $row $(( (${t1/./} - ${t0/./}) / 1000 )).$(( (${t1/./} - ${t0/./}) / 100 % 10 )) $(cat "$tmp/rss")" >>"$tmp/results"
}
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
for _ in $(seq "$runs"); do
  for b in "${bins[@]}"; do
    measure "$b" version /dev/null --version
    measure "$b" text "$tmp/$b.txt" "${plan[@]}"
    measure "$b" json "$tmp/$b.json" "${plan[@]}" --json
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-5s %-10s %8s %8s %8s %12s\n' binary command "med ms" "min ms" "max ms" "med RSS MiB"
for b in "${bins[@]}"; do
  for row in version text json; do
    col() { grep "^$b $row " "$tmp/results" | awk -v c="$1" '{print $c}' | sort -n; }
    med() { awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
    printf '%-5s %-10s %8s %8s %8s %12s\n' "$b" "$row" "$(col 3 | med)" "$(col 3 | head -1)" "$(col 3 | tail -1)" \
      "$(col 4 | med | awk '{printf "%.1f", $1/1024}')"
  done
done
echo "($runs runs each; text is ${plan[*]}, json the same with --json)"
if [ -n "${BASE:-}" ]; then
  for f in txt json; do
    cmp -s "$tmp/base.$f" "$tmp/new.$f" && echo "$f: base and new print the same $(wc -c <"$tmp/new.$f") bytes" ||
      { echo "$f: base and new differ" >&2; exit 1; }
  done
fi

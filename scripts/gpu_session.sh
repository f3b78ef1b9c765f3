#!/usr/bin/env bash
# Every GPU check of docs/GPU.md in one run of at most BUDGET seconds
# (default 540), for a GPU machine lent for a few minutes: the NCCL tests,
# the planner against the reference GPT (one shape at a time), the engine
# over NCCL against TCP, then the all-reduce bench against PyTorch (one
# round). Each stage has a time limit; whatever ran is kept. Build first,
# where Go is: scripts/gpu_nccl.sh build. Then, from the module root:
#
#   OUT=DIR scripts/gpu_session.sh
#
# DIR gets at most eight files: env.txt, tests.txt, plan-vs-gpu.md,
# train_summary.txt, bench_summary.txt, bench_ops.txt, session.log and
# logs.tar.gz (every stage's raw output and the plan check's per-shape logs).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?set OUT to the results folder}
budget=${BUDGET:-540}
export PYTHON=${PYTHON:-python3}
start=$(date +%s)
work=$(mktemp -d)
mkdir -p "$out" "$work/plan-logs"
exec > >(tee "$out/session.log") 2>&1

left() { echo $((budget - ($(date +%s) - start))); }
# stage NAME SECONDS CMD...: run CMD for at most SECONDS (less if the budget
# is nearer), saying how long it took and how it ended.
stage() {
	local name=$1 limit=$2 t0 rc
	shift 2
	[ "$(left)" -lt "$limit" ] && limit=$(left)
	if [ "$limit" -lt 20 ]; then
		echo "== $name: skipped, $(left) s left"
		return 0
	fi
	echo "== $name: at most $limit s ($(date -u +%T))"
	t0=$(date +%s)
	timeout -k 5 "$limit" "$@"
	rc=$?
	echo "== $name: exit $rc after $(($(date +%s) - t0)) s"
}
finish() {
	cp "$work"/*.txt "$work"/*.md "$out"/ 2>/dev/null
	tar -C "$work" -czf "$out/logs.tar.gz" .
	echo "== done after $(($(date +%s) - start)) s"
}
trap finish EXIT

stage tests 110 scripts/gpu_nccl.sh run tests "$work"

names=$(GPT_DEVICE=${GPT_DEVICE:-cuda} scripts/gpu_plan_check.sh --list | cut -d: -f1)
for n in $names; do
	STEPS=${STEPS:-6} WARMUP=${WARMUP:-2} REUSE=1 GPUCOORD=bin/gpu/gpucoord LOGDIR=$work/plan-logs \
		stage "plan $n" 60 scripts/gpu_plan_check.sh "$n"
	[ "$(left)" -lt 260 ] && break   # keep time for train and bench
done
done_names=$(for n in $names; do [ -s "$work/plan-logs/$n.gpt.rc" ] && echo "$n"; done)
if [ -n "$done_names" ]; then
	# shellcheck disable=SC2086
	STEPS=${STEPS:-6} WARMUP=${WARMUP:-2} REUSE=1 GPUCOORD=bin/gpu/gpucoord LOGDIR=$work/plan-logs \
		OUT=$work/plan-vs-gpu.md stage "plan tables" 30 scripts/gpu_plan_check.sh $done_names
fi

stage train 100 scripts/gpu_nccl.sh run train "$work"
ROUNDS=${ROUNDS:-1} stage bench 400 scripts/gpu_nccl.sh run bench "$work"

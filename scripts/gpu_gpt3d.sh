#!/usr/bin/env bash
# examples/pytorch/gpt3d.py on NCCL: 50 steps at tp 2, pp 2, dp 2 (eight
# ranks; on a machine with fewer GPUs they share them, each rank with its
# own NCCL_HOSTID) under `gpucoord launch --standalone`, against the same
# program in one process on the GPU, in float64 and in float32. Build
# bin/gpu/gpucoord first where Go is (scripts/gpu_nccl.sh build), carry it,
# and run from the module root on the GPU machine:
#
#   OUT=DIR scripts/gpu_gpt3d.sh
#
# DIR gets gpt3d.txt (the comparison) and each run's output.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?set OUT to the results folder}
py=${PYTHON:-python3}
gpucoord=$PWD/bin/gpu/gpucoord
prog=$PWD/examples/pytorch/gpt3d.py
mkdir -p "$out"
{
	date -u
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
	$py -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())' || true
} >"$out/env.txt" 2>&1
for dt in float64 float32; do
	t0=$(date +%s%N)
	GPT3D_DTYPE=$dt GPT3D_DEVICE=cuda timeout 120 $py "$prog" >"$out/one-$dt.txt" 2>&1
	echo "one process $dt: exit $? in $((($(date +%s%N) - t0) / 1000000)) ms"
	t0=$(date +%s%N)
	timeout -k 5 240 "$gpucoord" launch --standalone --nodes 2 --gpus-per-node 4 --tp 2 --pp 2 \
		--env GPT3D_DTYPE=$dt --env GPT3D_BACKEND=nccl -- \
		sh -c 'NCCL_HOSTID=gpt3d-$RANK exec "$0" "$@"' "$py" "$prog" >"$out/nccl-$dt.txt" 2>&1
	echo "tp 2 pp 2 dp 2 on NCCL $dt: exit $? in $((($(date +%s%N) - t0) / 1000000)) ms"
done | tee "$out/gpt3d.txt"
$py - "$out" <<'PY' | tee -a "$out/gpt3d.txt"
import re, sys
d = sys.argv[1]
def steps(f):
    m = {}
    for line in open(f, errors="replace"):
        r = re.search(r"step (\d+) loss ([-0-9.e+]+)", line)
        if r:
            m[int(r.group(1))] = float(r.group(2))
    return m
for dt in ("float64", "float32"):
    a, b = steps(f"{d}/one-{dt}.txt"), steps(f"{d}/nccl-{dt}.txt")
    common = sorted(set(a) & set(b))
    if not common:
        print(f"{dt}: {len(a)} steps in one process, {len(b)} on NCCL: nothing to compare")
        continue
    rel = [(abs(a[n] - b[n]) / abs(a[n]), n) for n in common]
    worst = max(rel)
    within = max((n for n in common if all(r <= 1e-5 for r, k in rel if k <= n)), default=0)
    print(f"{dt}: {len(a)} steps in one process, {len(b)} on NCCL; loss {a[common[0]]:.6f} -> {a[common[-1]]:.6f}; "
          f"largest relative difference {worst[0]:.3g} (step {worst[1]}); within 1e-5 through step {within}")
PY

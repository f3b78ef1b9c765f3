#!/usr/bin/env bash
# The checks of gpucoord's NCCL path that need a GPU: collectives/nccl on
# real NCCL (host and device buffers), `gpucoord bench --backend nccl` side
# by side with PyTorch's NCCL all_reduce, and `gpucoord train --backend
# nccl` against `--backend tcp`. docs/GPU.md ("NCCL pre-flight and the
# engine over NCCL") says what to look at; docs/NCCL.md what has run.
#
# Where Go is (no GPU needed; nothing here uses cgo):
#   scripts/gpu_nccl.sh build
# builds bin/gpu/gpucoord and bin/gpu/nccl.test. Carry bin/gpu and the
# working tree to the GPU machine (NCCL 2.14 or later, a CUDA runtime,
# /usr/bin/python3 with torch; no Go) and run from the module root:
#   scripts/gpu_nccl.sh run [tests|bench|train|all] [OUTDIR]
# Results go to OUTDIR (default $OUT, else ./gpu-results), seven files at
# most: env.txt, tests.txt, bench.jsonl, bench_summary.txt, bench_ops.txt,
# train.jsonl and train_summary.txt. Each stage is meant to fit in 10 minutes on one H100
# (estimated; not yet timed).
# ROUNDS (default 3) sets how often the bench peers alternate.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=bin/gpu

if [ "${1:-}" = build ]; then
	export GOTOOLCHAIN=local CGO_ENABLED=0
	mkdir -p "$bin"
	go build -trimpath -ldflags='-s -w' -o "$bin/gpucoord" ./cmd/gpucoord
	go test -c -o "$bin/nccl.test" ./collectives/nccl
	ls -l "$bin"
	exit 0
fi
[ "${1:-}" = run ] || { echo "usage: $0 build | run [tests|bench|train|all] [OUTDIR]" >&2; exit 2; }
stage=${2:-all}
out=${3:-${OUT:-gpu-results}}
mkdir -p "$out"
py=${PYTHON:-python3}  # a python3 with torch (on the GPU machines here, plain python3)
gpucoord=$PWD/$bin/gpucoord
rounds=${ROUNDS:-3}

# The libraries: the loader's, or a PyTorch wheel's (nvidia-nccl-cu*,
# nvidia-cuda-runtime-cu*) when the loader has none.
if ! ldconfig -p | grep -q 'libnccl.so.2 ' && [ -z "${GPUCOORD_NCCL_LIBRARY:-}" ]; then
	d=$($py -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null || true)
	[ -n "$d" ] && export GPUCOORD_NCCL_LIBRARY=$d/lib/libnccl.so.2
fi
if ! ldconfig -p | grep -q 'libcudart.so' && [ -z "${GPUCOORD_CUDART_LIBRARY:-}" ]; then
	d=$($py -c 'import nvidia.cuda_runtime as m; print(m.__path__[0])' 2>/dev/null || true)
	[ -n "$d" ] && export GPUCOORD_CUDART_LIBRARY=$(ls "$d"/lib/libcudart.so* | head -1)
fi
{
	date -u
	uname -m
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
	echo "NCCL:   ${GPUCOORD_NCCL_LIBRARY:-libnccl.so.2 from the loader}"
	echo "cudart: ${GPUCOORD_CUDART_LIBRARY:-libcudart.so* from the loader}"
	$py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' || true
} | tee "$out/env.txt"

if [ "$stage" = tests ] || [ "$stage" = all ]; then
	# Every collective on host and device memory against naive references,
	# mismatch detection and abort over real NCCL; then busbw of host
	# (staged) and device buffers at 4 KiB, 1 MiB and 64 MiB.
	(
		cd collectives/nccl
		GPUCOORD_NCCL_GPU=1 "../../$bin/nccl.test" -test.count=1 -test.v \
			-test.run 'TestRealGPU|TestUnavailableOnThisMachine'
		GPUCOORD_NCCL_GPU=1 "../../$bin/nccl.test" -test.count=1 -test.run '^$' \
			-test.bench BenchmarkRealAllReduce -test.benchtime 20x
	) 2>&1 | tee "$out/tests.txt"
fi

if [ "$stage" = bench ] || [ "$stage" = all ]; then
	# All-reduce at 8 KiB and 64 MiB, 2 and 4 processes sharing the GPUs
	# (several per GPU on one GPU), gpucoord on device buffers against
	# torch.distributed NCCL on device tensors, waiting per call (as a
	# gpucoord call does) and per sample; the order rotates every round.
	: >"$out/bench.jsonl"
	peers=(gpucoord torch-nccl torch-nccl-nosync)
	for round in $(seq 1 "$rounds"); do
		for np in 2 4; do
			for i in 0 1 2; do
				peer=${peers[$(((i + round) % 3))]}
				case $peer in
				gpucoord) "$gpucoord" bench allreduce --backend nccl --np "$np" --sizes 8K,64M --jsonl ;;
				torch-nccl) $py scripts/torch_nccl_allreduce.py -n "$np" -s 8K -s 64M ;;
				torch-nccl-nosync) $py scripts/torch_nccl_allreduce.py -n "$np" -s 8K -s 64M --no-sync ;;
				esac | $py -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    r.setdefault("peer", "gpucoord-nccl"); r["round"] = int(sys.argv[1])
    print(json.dumps(r), flush=True)' "$round" | tee -a "$out/bench.jsonl"
			done
		done
	done
	$py - "$out/bench.jsonl" <<'PY' | tee "$out/bench_summary.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cells = {}
for r in rows:
    cells.setdefault((r["n"], r["bytes"], r["peer"]), []).append(r)
print("%3s %9s %-18s %6s %12s %12s %8s %s" % ("n", "bytes", "peer", "runs", "median time", "busbw GB/s", "correct", "gpucoord vs torch-nccl"))
for (n, b, peer), rs in sorted(cells.items()):
    t = statistics.median(r["median_s"] for r in rs)
    bw = statistics.median(r["busbw_gbps"] for r in rs)
    ref = cells.get((n, b, "torch-nccl"))
    vs = ""
    if peer == "gpucoord-nccl" and ref:
        rt = statistics.median(r["median_s"] for r in ref)
        rb = statistics.median(r["busbw_gbps"] for r in ref)
        vs = "busbw %.2fx, time %.2fx" % (bw / rb, t / rt)
    print("%3d %9d %-18s %6d %10.1f us %12.3f %8s %s" % (n, b, peer, len(rs), t * 1e6, bw, all(r["correct"] for r in rs), vs))
PY
	# Every operation, 2 and 4 ranks, the text table users see.
	for np in 2 4; do
		for op in allreduce reducescatter allgather broadcast; do
			"$gpucoord" bench "$op" --backend nccl --np "$np" --sizes 8K,1M,64M --budget 1s
		done
	done 2>&1 | tee "$out/bench_ops.txt"
fi

if [ "$stage" = train ] || [ "$stage" = all ]; then
	# The engine's groups over NCCL against TCP: the same losses, step by
	# step (1e-5 relative; the reductions add in another order).
	tmp=$(mktemp -d)
	: >"$out/train.jsonl"
	for layout in "4 --tp 2 --pp 2 --steps 20" "8 --tp 2 --pp 2 --dp 2 --zero 1 --steps 10"; do
		for backend in tcp nccl; do
			# shellcheck disable=SC2086
			"$gpucoord" train --backend "$backend" --json --np $layout examples/jobs/mlp.yaml >"$tmp/$backend.jsonl"
		done
		$py - "$tmp/tcp.jsonl" "$tmp/nccl.jsonl" "$layout" "$out/train.jsonl" <<'PY' | tee -a "$out/train_summary.txt"
import json, sys
tcp, nccl = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
with open(sys.argv[4], "a") as f:
    for backend, rs in (("tcp", tcp), ("nccl", nccl)):
        for r in rs:
            f.write(json.dumps(dict(r, backend=backend, layout="--np " + sys.argv[3])) + "\n")
assert len(tcp) == len(nccl) > 0, (len(tcp), len(nccl))
rel = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(tcp, nccl))
ms = lambda rs: 1e3 * sum(r["seconds"] for r in rs) / len(rs)
print("--np %s: %d steps, final loss tcp %.6f nccl %.6f, largest relative difference %.2g (%s), %.1f vs %.1f ms/step"
      % (sys.argv[3], len(tcp), tcp[-1]["loss"], nccl[-1]["loss"], rel, "ok" if rel <= 1e-5 else "DIFFERENT", ms(tcp), ms(nccl)))
PY
	done
	rm -rf "$tmp"
fi

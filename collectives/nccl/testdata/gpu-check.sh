#!/usr/bin/env bash
# Runs the checks of collectives/nccl that need NCCL and a GPU (docs/NCCL.md,
# "What remains to be checked on a GPU machine"). Run from the module root on
# a machine with an NVIDIA driver, libnccl.so.2 and a CUDA runtime:
#   bash collectives/nccl/testdata/gpu-check.sh
# If NCCL and libcudart come from pip wheels (nvidia-nccl-cu12,
# nvidia-cuda-runtime-cu12, as PyTorch installs them), they are found through
# python3; otherwise the system's loader search path is used.
set -euo pipefail
export GOTOOLCHAIN=local
if [ -z "${GPUCOORD_NCCL_LIBRARY:-}" ] && python3 -c 'import nvidia.nccl' 2>/dev/null; then
	GPUCOORD_NCCL_LIBRARY="$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])')/lib/libnccl.so.2"
	export GPUCOORD_NCCL_LIBRARY
fi
if [ -z "${GPUCOORD_CUDART_LIBRARY:-}" ] && python3 -c 'import nvidia.cuda_runtime' 2>/dev/null; then
	d="$(python3 -c 'import nvidia.cuda_runtime as m; print(m.__path__[0])')/lib"
	GPUCOORD_CUDART_LIBRARY="$(ls "$d"/libcudart.so* | head -1)"
	export GPUCOORD_CUDART_LIBRARY
fi
echo "NCCL:   ${GPUCOORD_NCCL_LIBRARY:-libnccl.so.2 (loader search path)}"
echo "cudart: ${GPUCOORD_CUDART_LIBRARY:-libcudart.so* (loader search path)}"
nvidia-smi -L || true
export GPUCOORD_NCCL_GPU=1
# 1. The fake-library tests still pass next to a real NCCL.
go test -race -count=1 ./collectives/nccl
# 2. Every operation on the GPUs against naive references, mismatch, abort.
go test -race -count=1 -v -run 'TestRealGPU|TestUnavailableOnThisMachine' ./collectives/nccl
# 3. Bandwidth with host staging (compare with nccl-tests all_reduce_perf).
go test -count=1 -run '^$' -bench 'BenchmarkRealAllReduce' -benchtime 20x ./collectives/nccl

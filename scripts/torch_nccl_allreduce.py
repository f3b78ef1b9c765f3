#!/usr/bin/python3
"""PyTorch torch.distributed NCCL all_reduce on GPU tensors: the peer that
`gpucoord bench allreduce --backend nccl` is compared with (scripts/gpu_nccl.sh).

  /usr/bin/python3 scripts/torch_nccl_allreduce.py -n 4 -s 8K -s 64M [--no-sync]

N local processes, float32 SUM. Rank r runs on GPU r mod GPUs; where ranks
share a GPU each gets an NCCL_HOSTID of its own, host/(r div GPUs), as
gpucoord places them (nccl.PlaceLocal): NCCL refuses two ranks of one host
on one GPU.

Timing is gpucoord bench's protocol (internal/bench): warm-up, one call on
known data checked on every rank, a 3-call probe (slowest rank) that sets
the batch (samples of at least --min-sample, at most 100 calls) and the
samples (7..50 within --budget), then samples of `batch` back-to-back calls
after a barrier, each timed as the slowest rank's, median reported. By
default the host waits for every call (torch.cuda.synchronize), as a
gpucoord call returns once its result is in place; --no-sync launches the
calls of a sample back to back and waits once, as nccl-tests does.

Prints one JSON line per size: peer, n, bytes, iters, batch, median_s, min_s,
algbw_gbps, busbw_gbps (GB = 1e9 bytes; busbw = algbw * 2(n-1)/n), correct.
Every child is killed by its PID on failure or timeout.
"""
import argparse, json, os, socket, subprocess, sys, time


def parse_size(s):
    for suf, mul in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if s.endswith(suf):
            return int(s[: -len(suf)]) * mul
    return int(s)


def nccl_version(torch):
    v = torch.cuda.nccl.version()  # a tuple since torch 1.9, an int before
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def worker(a):
    import torch
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = rank % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%s" % os.environ["MASTER_PORT"],
                            rank=rank, world_size=world)

    def barrier():
        dist.barrier(device_ids=[dev])
        torch.cuda.synchronize()

    for nbytes in a.sizes:
        x = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")

        def call():
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            if a.sync:
                torch.cuda.synchronize()

        x.fill_(rank + 1)
        call()
        torch.cuda.synchronize()
        ok = bool(torch.all(x == world * (world + 1) / 2).item())
        for _ in range(a.warmup):
            call()
        barrier()
        t0 = time.perf_counter()
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        probe = torch.tensor([(time.perf_counter() - t0) / 3, 0.0 if ok else 1.0], dtype=torch.float64, device="cuda")
        dist.all_reduce(probe, op=dist.ReduceOp.MAX)
        t_probe, wrong = probe.tolist()
        batch = a.batch or max(1, min(100, int(-(-a.min_sample // max(t_probe, 1e-9)))))
        iters = a.iters or max(7, min(50, int(a.budget / max(t_probe * batch, 1e-9))))
        samples = []
        for _ in range(iters):
            barrier()
            t0 = time.perf_counter()
            for _ in range(batch):
                call()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) / batch)
        s = torch.tensor(samples, dtype=torch.float64, device="cuda")
        dist.all_reduce(s, op=dist.ReduceOp.MAX)
        s = sorted(s.tolist())
        med = s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
        if rank == 0:
            alg = nbytes / med / 1e9
            print(json.dumps({"peer": "torch-nccl" + ("" if a.sync else "-nosync"), "n": world, "bytes": nbytes,
                              "iters": iters, "batch": batch, "median_s": med, "min_s": s[0],
                              "algbw_gbps": alg, "busbw_gbps": alg * 2 * (world - 1) / world,
                              "correct": wrong == 0, "torch": torch.__version__,
                              "nccl": nccl_version(torch)}), flush=True)
        del x
    dist.destroy_process_group()
    return 0


def launch(a):
    import torch
    gpus = max(1, torch.cuda.device_count())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    host = socket.gethostname()
    args = [sys.executable, os.path.abspath(__file__), "--worker", "--warmup", str(a.warmup), "--iters", str(a.iters),
            "--batch", str(a.batch), "--min-sample", str(a.min_sample), "--budget", str(a.budget)]
    args += sum((["-s", str(x)] for x in a.sizes), [])
    if not a.sync:
        args.append("--no-sync")
    procs = []
    try:
        for r in range(a.n):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.n), MASTER_PORT=str(port),
                       NCCL_HOSTID="%s/%d" % (host, r // gpus))
            procs.append(subprocess.Popen(args, env=env, stdout=None if r == 0 else subprocess.DEVNULL))
        deadline = time.time() + a.timeout
        rc = 0
        for p in procs:
            rc |= p.wait(timeout=max(0.1, deadline - time.time()))
        return rc
    except subprocess.TimeoutExpired:
        print(json.dumps({"peer": "torch-nccl", "n": a.n, "error": "timeout %ss" % a.timeout}), flush=True)
        return 124
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=2, help="number of processes")
    ap.add_argument("-s", "--size", dest="sizes", action="append", type=parse_size,
                    help="bytes (suffix K, M, G); repeatable; default 8K and 64M")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=0, help="timed samples (0: 7..50 within --budget)")
    ap.add_argument("--batch", type=int, default=0, help="calls per sample (0: enough for --min-sample, at most 100)")
    ap.add_argument("--min-sample", type=float, default=0.01)
    ap.add_argument("--budget", type=float, default=3.0, help="seconds of samples per size, as gpucoord bench")
    ap.add_argument("--no-sync", dest="sync", action="store_false", help="wait once per sample, not per call")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.sizes = a.sizes or [8 << 10, 64 << 20]
    return worker(a) if a.worker else launch(a)


if __name__ == "__main__":
    sys.exit(main())

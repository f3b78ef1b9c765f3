#!/usr/bin/env python3
"""An elastic PyTorch DDP program written for torchrun: it survives the loss
of a node because it checkpoints every step and resumes from the last one.

It reads torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RESTART_COUNT) and GPUCOORD_CHECKPOINT_DIR (falling back to
./checkpoints under plain torchrun). Each step trains on a global batch of
GLOBAL samples that depend only on the step, split evenly over the ranks, so
the loss of a step does not depend on how many ranks computed it. Rank 0
writes model, optimizer and step to DIR/latest.pt after every step (to a
temporary file, then os.replace: a kill never leaves half a checkpoint); on
start every rank loads it if it exists and goes on with the next step.

Under gpucoord: `gpucoord launch --coordinator ADDR --nodes 2
--gpus-per-node 2 --min-nodes 1 --max-restarts 3 -- /usr/bin/python3
examples/pytorch/elastic.py`; kill one node's agent and the job goes on at
the smaller world size from the last step, and finishes.

Environment: ELASTIC_STEPS (default 30), ELASTIC_GLOBAL (16),
ELASTIC_STEP_SLEEP (seconds per step, default 0).
"""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("ELASTIC_STEPS", "30"))
GLOBAL = int(os.environ.get("ELASTIC_GLOBAL", "16"))
SLEEP = float(os.environ.get("ELASTIC_STEP_SLEEP", "0"))


def batch(step):
    """The global batch of a step: a function of the step only."""
    g = torch.Generator().manual_seed(10_000 + step)
    return torch.randn(GLOBAL, 16, generator=g), torch.randn(GLOBAL, 4, generator=g)


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    if GLOBAL % world:
        print(f"rank {rank}: global batch {GLOBAL} does not split over {world} ranks", file=sys.stderr)
        sys.exit(2)
    ckdir = os.environ.get("GPUCOORD_CHECKPOINT_DIR", "checkpoints")
    os.makedirs(ckdir, exist_ok=True)
    path = os.path.join(ckdir, "latest.pt")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        if rank == 0:
            print(f"resumed after step {start} on {world} ranks (restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')})", flush=True)
    ddp = DDP(model)
    per = GLOBAL // world
    for step in range(start, STEPS):
        x, y = batch(step)
        x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP averages the gradients: the global batch's mean
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            tmp = path + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, path)
            print(f"step {step + 1}/{STEPS} loss {total.item() / world:.6f} world {world}", flush=True)
        dist.barrier()  # nobody starts a step before its checkpoint is in place
        if SLEEP:
            time.sleep(SLEEP)
    if rank == 0:
        print(f"done: {STEPS} steps, world {world}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

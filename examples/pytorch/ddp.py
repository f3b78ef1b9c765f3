#!/usr/bin/env python3
"""A small PyTorch DistributedDataParallel program written for torchrun.

It reads only torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT through init_method="env://"), trains a tiny MLP
with gloo on CPU for a few steps on data that depends on the rank, and at
the end checks that every rank holds the same parameters: it prints one
line per rank,

    rank R/W final-params SHA256

and exits 3 if any rank's parameters differ from rank 0's. It runs the same
under `torchrun --nproc-per-node 2 examples/pytorch/ddp.py` and under
`gpucoord launch --standalone --nodes 2 --gpus-per-node 2 -- /usr/bin/python3
examples/pytorch/ddp.py`.
"""
import hashlib
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("DDP_STEPS", "5"))


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights everywhere
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    for step in range(STEPS):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP all-reduces the gradients
        opt.step()
        if rank == 0:
            print(f"step {step + 1}/{STEPS} loss {loss.item():.6f}", flush=True)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    print(f"rank {rank}/{world} final-params {digest}", flush=True)
    ref = flat.clone()
    dist.broadcast(ref, 0)
    same = torch.tensor([1 if torch.equal(ref, flat) else 0])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    dist.destroy_process_group()
    if same.item() != 1:
        print(f"rank {rank}: parameters differ between ranks", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A PyTorch DDP program written for torchrun that checkpoints every step
into GPUCOORD_CHECKPOINT_DIR with sharded files, tells gpucoord about it
over the progress channel, and resumes where gpucoord says.

Each rank writes only its own files of step N under
GPUCOORD_CHECKPOINT_DIR/N, then says "checkpoint N"; gpucoord commits the
step once every rank has said so and each node's files have their copies
on other nodes. A restarted job resumes after the committed step, given in
GPUCOORD_RESUME_STEP, the same on every rank; gpucoord has gathered the
files of that step (every rank's, from whichever nodes hold them) into each
node's GPUCOORD_CHECKPOINT_DIR first, so the job resumes at any world size.

The files are written with torch.distributed.checkpoint (DCP) when this
PyTorch has it (2.2 and later: dcp.save and dcp.load); with an older one
each rank writes its own slice of the flattened state (shard-R-of-W.pt)
and rank 0 a small index, which a restart at any world size reads back.

Each step trains on a global batch of GLOBAL samples that depend only on
the step, split over the ranks (DDP averages the gradients), so the run does
not depend on the world size. At the end every rank prints

    rank R/W final-params SHA256

and the program exits 3 if any rank's parameters differ from rank 0's.

    gpucoord launch --coordinator ADDR --nodes 2 --gpus-per-node 2 \\
        --min-nodes 1 --max-restarts 3 -- /usr/bin/python3 examples/pytorch/checkpointed.py

Environment: CKPT_STEPS (default 40), CKPT_GLOBAL (24), CKPT_STEP_SLEEP
(seconds per step, 0). For tests of hang detection, CKPT_HANG_RANK and
CKPT_HANG_STEP make that rank, in the first generation only, block after
that step's update in a receive no rank will ever send to.
"""
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpucoord_progress import Progress, checkpoint_dir, resume_step  # noqa: E402

STEPS = int(os.environ.get("CKPT_STEPS", "40"))
GLOBAL = int(os.environ.get("CKPT_GLOBAL", "24"))
SLEEP = float(os.environ.get("CKPT_STEP_SLEEP", "0"))
HANG_RANK = int(os.environ.get("CKPT_HANG_RANK", "-1"))
HANG_STEP = int(os.environ.get("CKPT_HANG_STEP", "0"))

try:
    import torch.distributed.checkpoint as dcp

    HAVE_DCP = hasattr(dcp, "save") and hasattr(dcp, "load")
except Exception:  # Debian's torch 1.13 cannot even import its precursor
    HAVE_DCP = False


def batch(step):
    """The global batch of a step: a function of the step only."""
    g = torch.Generator().manual_seed(20_000 + step)
    return torch.randn(GLOBAL, 16, generator=g), torch.randn(GLOBAL, 4, generator=g)


def state_tensors(model, opt):
    """Every tensor of the training state, by name: parameters and the
    optimizer's momentum buffers (created by the first step)."""
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, p in enumerate(model.parameters()):
        buf = opt.state[p].get("momentum_buffer")
        if buf is None:
            buf = torch.zeros_like(p)
            opt.state[p]["momentum_buffer"] = buf
        out[f"momentum.{i}"] = buf
    return out


def save(step, tensors, rank, world):
    d = checkpoint_dir(step)
    os.makedirs(d, exist_ok=True)
    if HAVE_DCP:
        dcp.save(tensors, checkpoint_id=d)
        return
    names = sorted(tensors)
    flat = torch.cat([tensors[n].detach().reshape(-1) for n in names])
    per = (flat.numel() + world - 1) // world
    torch.save(flat[rank * per:(rank + 1) * per].clone(), os.path.join(d, f"shard-{rank}-of-{world}.pt"))
    if rank == 0:
        index = {"world": world, "names": names, "shapes": [list(tensors[n].shape) for n in names]}
        with open(os.path.join(d, "index.json.tmp"), "w") as f:
            json.dump(index, f)
        os.replace(os.path.join(d, "index.json.tmp"), os.path.join(d, "index.json"))


def load(step, tensors):
    d = checkpoint_dir(step)
    if HAVE_DCP:
        dcp.load(tensors, checkpoint_id=d)  # in place
        return
    with open(os.path.join(d, "index.json")) as f:
        index = json.load(f)
    flat = torch.cat([torch.load(os.path.join(d, f"shard-{r}-of-{index['world']}.pt")) for r in range(index["world"])])
    at = 0
    for name, shape in zip(index["names"], index["shapes"]):
        n = 1
        for s in shape:
            n *= s
        with torch.no_grad():
            tensors[name].copy_(flat[at:at + n].reshape(shape))
        at += n


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    if GLOBAL % world:
        print(f"rank {rank}: global batch {GLOBAL} does not split over {world} ranks", file=sys.stderr)
        sys.exit(2)
    prog = Progress()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    tensors = state_tensors(model, opt)
    start = resume_step()
    if start > 0:
        load(start, tensors)
        print(f"rank {rank}/{world} resumed after step {start} ({'dcp' if HAVE_DCP else 'shards'})", flush=True)
    ddp = DDP(model)
    per = GLOBAL // world
    first_generation = os.environ.get("GPUCOORD_RESTART_COUNT", "0") == "0"
    for step in range(start, STEPS):
        began = time.monotonic()
        x, y = batch(step)
        x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if first_generation and rank == HANG_RANK and step + 1 == HANG_STEP:
            print(f"rank {rank}: waiting for a message no rank sends", flush=True)
            dist.recv(torch.zeros(1), src=(rank + 1) % world)
        save(step + 1, tensors, rank, world)
        prog.checkpoint(step + 1)
        prog.step(step + 1, loss=total.item() / world, seconds=time.monotonic() - began)
        if rank == 0:
            print(f"step {step + 1}/{STEPS} loss {total.item() / world:.6f} world {world}", flush=True)
        if SLEEP:
            time.sleep(SLEEP)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    print(f"rank {rank}/{world} final-params {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}", flush=True)
    ref = flat.clone()
    dist.broadcast(ref, 0)
    same = torch.tensor([1 if torch.equal(ref, flat) else 0])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    prog.close()
    dist.destroy_process_group()
    if same.item() != 1:
        print(f"rank {rank}: parameters differ between ranks", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A small GPT trained with tensor, pipeline and data parallelism under
gpucoord, whose loss equals the same model trained in one process.

    gpucoord launch --standalone --nodes 2 --gpus-per-node 4 --tp 2 --pp 2 \\
        -- python3 examples/pytorch/gpt3d.py
    python3 examples/pytorch/gpt3d.py            # one process: the reference

- Tensor parallelism as Megatron-LM does it: the attention's query, key and
  value projections and the MLP's first linear are column-parallel (each TP
  rank holds a slice of the heads or of the hidden units), the attention's
  output projection and the MLP's second linear row-parallel (their outputs
  are summed over the TP group). The identity-forward/all-reduce-backward
  operator before a column-parallel block and the all-reduce-forward one
  after a row-parallel block keep the replicated parts' gradients whole.
- Pipeline parallelism: the blocks split evenly over the stages (the first
  also holds the embeddings, the last the final norm, the head and the
  loss); micro-batches run the 1F1B schedule over send and receive
  between neighbouring stages.
- Data parallelism: each DP replica trains its slice of the global batch;
  the gradients are averaged over the DP group before the update.

The groups come from gpucoord_groups.build() (GPUCOORD_GROUPS). Every rank
makes the whole model from the same seed and keeps its part, and each
step's batch depends only on the step, so the run does not depend on the
layout. The last stage's first TP rank of DP replica 0 prints

    step N loss L

Environment: GPT3D_STEPS (default 50), GPT3D_MICRO (micro-batches per
replica, 4), GPT3D_BATCH (global batch, 16), GPT3D_DTYPE (float32 or
float64), GPT3D_LR (SGD's learning rate, 0.3). The sums over TP and DP run
in another order than in one process: in float64 the 50 steps' losses
agree within 1e-5; in float32 training grows the last-bit differences
sooner.
"""
import math
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

STEPS = int(os.environ.get("GPT3D_STEPS", "50"))
MICRO = int(os.environ.get("GPT3D_MICRO", "4"))
BATCH = int(os.environ.get("GPT3D_BATCH", "16"))
DTYPE = getattr(torch, os.environ.get("GPT3D_DTYPE", "float32"))
VOCAB, SEQ, HIDDEN, HEADS, LAYERS = 64, 16, 32, 4, 4
LR = float(os.environ.get("GPT3D_LR", "0.3"))


class Single:
    """The groups of a one-process run: no communication at all."""
    tp = pp = dp = None
    tp_rank = pp_rank = dp_rank = 0
    tp_size = pp_size = dp_size = 1
    pp_ranks = [0]


def reduce_tp(x, g):
    if g.tp_size > 1:
        dist.all_reduce(x, group=g.tp)
    return x


class CopyToTP(torch.autograd.Function):
    """Identity forward, all-reduce of the gradient over TP backward."""

    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return x

    @staticmethod
    def backward(ctx, grad):
        return reduce_tp(grad.clone(), ctx.g), None


class ReduceFromTP(torch.autograd.Function):
    """All-reduce over TP forward, identity backward."""

    @staticmethod
    def forward(ctx, x, g):
        return reduce_tp(x.clone(), g)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def full_weights():
    """The whole model's parameters, the same on every rank."""
    gen = torch.Generator().manual_seed(1234)

    def rand(*shape, scale=0.02):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(DTYPE)

    w = {"wte": rand(VOCAB, HIDDEN), "wpe": rand(SEQ, HIDDEN), "head": rand(HIDDEN, VOCAB)}
    for layer in range(LAYERS):
        w[f"{layer}.qkv"] = rand(HIDDEN, 3 * HIDDEN)
        w[f"{layer}.proj"] = rand(HIDDEN, HIDDEN)
        w[f"{layer}.fc1"] = rand(HIDDEN, 4 * HIDDEN)
        w[f"{layer}.fc2"] = rand(4 * HIDDEN, HIDDEN)
    return w


class Stage:
    """This rank's part of the model: its stage's blocks, its TP slices."""

    def __init__(self, g):
        self.g = g
        w = full_weights()
        per = LAYERS // g.pp_size
        self.layers = range(g.pp_rank * per, (g.pp_rank + 1) * per)
        self.first, self.last = g.pp_rank == 0, g.pp_rank == g.pp_size - 1
        t, n = g.tp_rank, g.tp_size
        head_dim, heads = HIDDEN // HEADS, HEADS // n
        self.heads = heads
        p = {}
        if self.first:
            p["wte"], p["wpe"] = w["wte"], w["wpe"]
        if self.last:
            p["head"] = w["head"]
        cols = slice(t * heads * head_dim, (t + 1) * heads * head_dim)
        hid = slice(t * 4 * HIDDEN // n, (t + 1) * 4 * HIDDEN // n)
        for layer in self.layers:
            qkv = w[f"{layer}.qkv"].view(HIDDEN, 3, HIDDEN)[:, :, cols]
            p[f"{layer}.qkv"] = qkv.reshape(HIDDEN, -1)
            p[f"{layer}.proj"] = w[f"{layer}.proj"][cols, :]
            p[f"{layer}.fc1"] = w[f"{layer}.fc1"][:, hid]
            p[f"{layer}.fc2"] = w[f"{layer}.fc2"][hid, :]
        self.params = {k: v.clone().requires_grad_(True) for k, v in p.items()}

    def forward(self, x):
        """x: token ids (first stage) or the previous stage's activations."""
        g, p = self.g, self.params
        if self.first:
            x = p["wte"][x] + p["wpe"][: x.shape[1]]
        b, s, _ = x.shape
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
        for layer in self.layers:
            h = CopyToTP.apply(torch.nn.functional.layer_norm(x, (HIDDEN,)), g)
            qkv = (h @ p[f"{layer}.qkv"]).view(b, s, 3, self.heads, HIDDEN // HEADS)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
            att = (q @ k.transpose(-1, -2)) / math.sqrt(HIDDEN // HEADS)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(b, s, -1)
            x = x + ReduceFromTP.apply(y @ p[f"{layer}.proj"], g)
            h = CopyToTP.apply(torch.nn.functional.layer_norm(x, (HIDDEN,)), g)
            x = x + ReduceFromTP.apply(torch.nn.functional.gelu(h @ p[f"{layer}.fc1"]) @ p[f"{layer}.fc2"], g)
        if self.last:
            x = torch.nn.functional.layer_norm(x, (HIDDEN,)) @ p["head"]
        return x


def batch(step):
    """The step's global batch, the same everywhere: sequences that count
    up by 3 (mod the vocabulary) from a random start, which the model can
    learn to continue."""
    gen = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    tokens = (start + 3 * torch.arange(SEQ + 1)) % VOCAB
    return tokens[:, :-1], tokens[:, 1:]


def train_step(stage, g, step):
    """One step of 1F1B over this replica's micro-batches; returns the
    replica's loss (last stage) or None."""
    x, y = batch(step)
    per = BATCH // g.dp_size
    x, y = x[g.dp_rank * per:(g.dp_rank + 1) * per], y[g.dp_rank * per:(g.dp_rank + 1) * per]
    mb = per // MICRO
    xs, ys = x.split(mb), y.split(mb)
    prev = g.pp_ranks[g.pp_rank - 1] if not stage.first else None
    nxt = g.pp_ranks[g.pp_rank + 1] if not stage.last else None
    shape = (mb, SEQ, HIDDEN)
    sends, held, total = [], [], 0.0

    def forward(i):
        nonlocal total
        if stage.first:
            inp = xs[i]
        else:
            inp = torch.empty(shape, dtype=DTYPE)
            dist.recv(inp, src=prev)
            inp.requires_grad_(True)
        out = stage.forward(inp)
        if stage.last:
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, VOCAB), ys[i].reshape(-1)) / MICRO
            total += loss.item()
            held.append((inp, loss))
        else:
            sends.append(dist.isend(out.detach().contiguous(), dst=nxt))
            held.append((inp, out))

    def backward():
        inp, out = held.pop(0)
        if stage.last:
            out.backward()
        else:
            grad = torch.empty(shape, dtype=DTYPE)
            dist.recv(grad, src=nxt)
            out.backward(grad)
        if not stage.first:
            sends.append(dist.isend(inp.grad.contiguous(), dst=prev))

    warmup = min(g.pp_size - g.pp_rank - 1, MICRO)
    for i in range(warmup):
        forward(i)
    for i in range(warmup, MICRO):
        forward(i)
        backward()
    for _ in range(warmup):
        backward()
    for s in sends:
        s.wait()
    # Data parallelism: the replicas' gradients averaged, then the update.
    for p in stage.params.values():
        if g.dp_size > 1:
            dist.all_reduce(p.grad, group=g.dp)
            p.grad /= g.dp_size
        with torch.no_grad():
            p -= LR * p.grad
        p.grad = None
    if not stage.last:
        return None
    loss = torch.tensor([total], dtype=torch.float64)
    if g.dp_size > 1:
        dist.all_reduce(loss, group=g.dp)
        loss /= g.dp_size
    return loss.item()


def main():
    if os.environ.get("GPUCOORD_GROUPS"):
        from gpucoord_groups import build
        dist.init_process_group("gloo")
        g = build()
    else:
        g = Single()
    if BATCH % (g.dp_size * MICRO) or LAYERS % g.pp_size or HEADS % g.tp_size:
        sys.exit(f"batch {BATCH} over dp {g.dp_size} x {MICRO} micro-batches, {LAYERS} layers over pp {g.pp_size}, {HEADS} heads over tp {g.tp_size}: one does not split")
    stage = Stage(g)
    for step in range(1, STEPS + 1):
        loss = train_step(stage, g, step)
        if loss is not None and g.tp_rank == 0 and g.dp_rank == 0:
            print(f"step {step} loss {loss:.9f}", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

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

Under gpucoord every rank speaks the progress channel (gpucoord_progress)
and the job checkpoints every step, independently of the layout: each
rank of DP replica 0 writes its slices of the global tensors, by name,
each with its offsets in the whole tensor, under GPUCOORD_CHECKPOINT_DIR/N
(tp<T>-pp<P>.pt). A restarted job (GPUCOORD_RESUME_STEP) assembles the
whole tensors from every file there and cuts its own slices, so it
resumes under any tp, pp and dp: a job gpucoord re-plans after a loss
goes on on the same curve.

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
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpucoord_progress import Progress, checkpoint_dir, resume_step  # noqa: E402

STEPS = int(os.environ.get("GPT3D_STEPS", "50"))
MICRO = int(os.environ.get("GPT3D_MICRO", "4"))
BATCH = int(os.environ.get("GPT3D_BATCH", "16"))
DTYPE = getattr(torch, os.environ.get("GPT3D_DTYPE", "float32"))
VOCAB, SEQ, HIDDEN, HEADS, LAYERS = 64, 16, 32, 4, 4
LR = float(os.environ.get("GPT3D_LR", "0.3"))
# GPT3D_BACKEND=nccl puts each rank on GPU LOCAL_RANK (modulo the GPUs
# there are; ranks sharing one GPU need their own NCCL_HOSTID);
# GPT3D_DEVICE=cuda runs the one-process reference on a GPU.
BACKEND = os.environ.get("GPT3D_BACKEND", "gloo")
if BACKEND == "nccl":
    DEVICE = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(DEVICE)
else:
    DEVICE = torch.device(os.environ.get("GPT3D_DEVICE", "cpu"))


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
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(DEVICE, DTYPE)

    w = {"wte": rand(VOCAB, HIDDEN), "wpe": rand(SEQ, HIDDEN), "head": rand(HIDDEN, VOCAB)}
    for layer in range(LAYERS):
        w[f"{layer}.qkv"] = rand(HIDDEN, 3 * HIDDEN)
        w[f"{layer}.proj"] = rand(HIDDEN, HIDDEN)
        w[f"{layer}.fc1"] = rand(HIDDEN, 4 * HIDDEN)
        w[f"{layer}.fc2"] = rand(4 * HIDDEN, HIDDEN)
    return w


class Stage:
    """This rank's part of the model: its stage's blocks, its TP slices of
    the whole tensors w (full_weights(), or a checkpoint's)."""

    def __init__(self, g, w):
        self.g = g
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
        c0, h0 = t * heads * head_dim, t * 4 * HIDDEN // n
        cols, hid = slice(c0, c0 + heads * head_dim), slice(h0, h0 + 4 * HIDDEN // n)
        # Where each parameter lies in its whole tensor: the shape it is
        # cut from and its offsets there (a checkpoint's pieces).
        self.pieces = {k: (tuple(w[k].shape), (0, 0)) for k in p}
        for layer in self.layers:
            qkv = w[f"{layer}.qkv"].view(HIDDEN, 3, HIDDEN)[:, :, cols]
            p[f"{layer}.qkv"] = qkv.reshape(HIDDEN, -1)
            self.pieces[f"{layer}.qkv"] = ((HIDDEN, 3, HIDDEN), (0, 0, c0))
            p[f"{layer}.proj"] = w[f"{layer}.proj"][cols, :]
            self.pieces[f"{layer}.proj"] = (tuple(w[f"{layer}.proj"].shape), (c0, 0))
            p[f"{layer}.fc1"] = w[f"{layer}.fc1"][:, hid]
            self.pieces[f"{layer}.fc1"] = (tuple(w[f"{layer}.fc1"].shape), (0, h0))
            p[f"{layer}.fc2"] = w[f"{layer}.fc2"][hid, :]
            self.pieces[f"{layer}.fc2"] = (tuple(w[f"{layer}.fc2"].shape), (h0, 0))
        self.params = {k: v.clone().requires_grad_(True) for k, v in p.items()}

    def save(self, step):
        """Write this rank's slices of step's state: each parameter by its
        whole tensor's name, with that tensor's shape and its offsets."""
        g, d = self.g, checkpoint_dir(step)
        os.makedirs(d, exist_ok=True)
        out = {}
        for k, v in self.params.items():
            shape, offset = self.pieces[k]
            local = v.detach()
            if len(shape) == 3:  # qkv: (HIDDEN, 3, heads of this rank)
                local = local.view(HIDDEN, 3, -1)
            out[k] = {"shape": shape, "offset": offset, "data": local.to("cpu").clone()}
        path = os.path.join(d, f"tp{g.tp_rank}-pp{g.pp_rank}.pt")
        torch.save(out, path + ".tmp")
        os.replace(path + ".tmp", path)


    def forward(self, x):
        """x: token ids (first stage) or the previous stage's activations."""
        g, p = self.g, self.params
        if self.first:
            x = p["wte"][x] + p["wpe"][: x.shape[1]]
        b, s, _ = x.shape
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=DEVICE), 1)
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


def load_weights(step):
    """The whole tensors of step's checkpoint, assembled from every rank's
    slices there, whatever layout wrote them."""
    d = checkpoint_dir(step)
    w = {}
    files = sorted(f for f in os.listdir(d) if f.endswith(".pt"))
    if not files:
        sys.exit(f"no checkpoint files of step {step} in {d}")
    for f in files:
        for k, piece in torch.load(os.path.join(d, f)).items():
            shape, offset, data = piece["shape"], piece["offset"], piece["data"]
            if k not in w:
                w[k] = torch.full(shape, float("nan"), dtype=data.dtype)
            w[k][tuple(slice(o, o + n) for o, n in zip(offset, data.shape))] = data
    for k, v in w.items():
        if torch.isnan(v).any():
            sys.exit(f"checkpoint of step {step} in {d}: {k} is not whole (files: {files})")
        w[k] = v.view(HIDDEN, 3 * HIDDEN) if v.dim() == 3 else v
        w[k] = w[k].to(DEVICE, DTYPE)
    return w


def batch(step):
    """The step's global batch, the same everywhere: sequences that count
    up by 3 (mod the vocabulary) from a random start, which the model can
    learn to continue."""
    gen = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    tokens = (start + 3 * torch.arange(SEQ + 1)) % VOCAB
    tokens = tokens.to(DEVICE)
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
    held, total = [], 0.0

    def exchange(send=None, dst=None, src=None):
        """Send to dst and receive from src in one batch, as Megatron-LM's
        send_forward_recv_backward does: the two neighbours post matching
        batches (one send and one receive each), which NCCL needs, and
        neither waits on the other's receive to finish its send."""
        ops, buf = [], None
        if send is not None and dst is not None:
            ops.append(dist.P2POp(dist.isend, send.contiguous(), dst))
        if src is not None:
            buf = torch.empty(shape, dtype=DTYPE, device=DEVICE)
            ops.append(dist.P2POp(dist.irecv, buf, src))
        if ops:
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return buf

    def forward(i, inp):
        """Micro-batch i's forward; returns what goes to the next stage."""
        nonlocal total
        if stage.first:
            inp = xs[i]
        else:
            inp.requires_grad_(True)
        out = stage.forward(inp)
        if stage.last:
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, VOCAB), ys[i].reshape(-1)) / MICRO
            total += loss.item()
            held.append((inp, loss))
            return None
        held.append((inp, out))
        return out.detach()

    def backward(grad):
        """The oldest micro-batch's backward; returns what goes back."""
        inp, out = held.pop(0)
        if stage.last:
            out.backward()
        else:
            out.backward(grad)
        return None if stage.first else inp.grad

    # 1F1B: warm-up forwards, then one forward and one backward at a time,
    # then the remaining backwards.
    warmup = min(g.pp_size - g.pp_rank - 1, MICRO)
    remaining = MICRO - warmup
    for i in range(warmup):
        exchange(forward(i, exchange(src=prev)), nxt)
    inp = exchange(src=prev) if remaining else None
    for i in range(remaining):
        grad = exchange(forward(warmup + i, inp), nxt, nxt)
        back = backward(grad)
        if i == remaining - 1:
            exchange(back, prev)
        else:
            inp = exchange(back, prev, prev)
    for _ in range(warmup):
        exchange(backward(exchange(src=nxt)), prev)
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
    loss = torch.tensor([total], dtype=torch.float64, device=DEVICE)
    if g.dp_size > 1:
        dist.all_reduce(loss, group=g.dp)
        loss /= g.dp_size
    return loss.item()


def main():
    if os.environ.get("GPUCOORD_GROUPS"):
        from gpucoord_groups import build
        dist.init_process_group(BACKEND)
        g = build()
        # Every rank in one collective first: under NCCL, a batch of sends
        # and receives among some of the world's ranks must not be the
        # world's first call.
        dist.all_reduce(torch.ones(1, device=DEVICE))
    else:
        g = Single()
    if BATCH % (g.dp_size * MICRO) or LAYERS % g.pp_size or HEADS % g.tp_size:
        sys.exit(f"batch {BATCH} over dp {g.dp_size} x {MICRO} micro-batches, {LAYERS} layers over pp {g.pp_size}, {HEADS} heads over tp {g.tp_size}: one does not split")
    start = resume_step()
    stage = Stage(g, load_weights(start) if start > 0 else full_weights())
    if start > 0 and g.tp_rank == 0 and g.pp_rank == 0 and g.dp_rank == 0:
        print(f"resumed after step {start} at tp {g.tp_size} pp {g.pp_size} dp {g.dp_size}", flush=True)
    under = bool(os.environ.get("GPUCOORD_PROGRESS"))
    prog = Progress()
    last = g.pp_ranks[-1] if g.pp_size > 1 else None
    for step in range(start + 1, STEPS + 1):
        began = time.monotonic()
        loss = train_step(stage, g, step)
        if loss is not None and g.tp_rank == 0 and g.dp_rank == 0:
            print(f"step {step} loss {loss:.9f}", flush=True)
        if not under:
            continue
        # Every rank reports the loss: the last stage's, sent to the rest.
        t = torch.tensor([loss if loss is not None else 0.0], dtype=torch.float64, device=DEVICE)
        if g.pp_size > 1:
            dist.broadcast(t, src=last, group=g.pp)
        if g.dp_rank == 0:
            stage.save(step)
        prog.checkpoint(step)
        prog.step(step, loss=t.item(), seconds=time.monotonic() - began)
    prog.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

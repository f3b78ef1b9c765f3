#!/usr/bin/env python3
"""A reference GPT in plain PyTorch, to measure what `gpucoord plan` predicts.

It trains a decoder-only transformer on random tokens for a few steps and
prints ONE JSON line on stdout at the end (rank 0 only): the parameter
count, the shape, the model-state bytes it really allocated, the caching
allocator's peaks, the device memory in use, and the mean step,
forward+backward and optimizer-update times. Progress goes to stderr.

    python3 examples/pytorch/gpt.py --layers 8 --hidden 4096 --heads 32 \\
        --seq 2048 --vocab 51200 --micro-batch 8 --steps 10 --warmup 3
    gpucoord plan --cluster dgx-h100 --nodes 1 --gpus-per-node 1 \\
        --layers 8 --hidden 4096 --heads 32 --seq 2048 --vocab 51200 \\
        --micro-batch 8 --global-batch 8 --optimizer multi-tensor --json

scripts/gpu_plan_check.sh runs both for several shapes and writes the table.

The model is what the planner counts (topology.Model.LayerParams):
- bf16 parameters and gradients; fp32 master weights and Adam moments.
  Mixed precision is explicit, as Megatron-LM's Float16Optimizer does it:
  after backward every bf16 gradient is copied to an fp32 .grad of its
  master weight (a transient of 4 bytes a parameter), torch.optim.Adam
  (foreach=True for --optimizer multi-tensor, fused=True for fused) updates
  the masters, the fp32 gradients are dropped and the masters are copied
  back into the bf16 parameters. The bf16 gradients stay allocated between
  steps (zeroed, not freed), like Megatron-LM's gradient buffer.
  --fp32-grads instead accumulates every gradient into a persistent fp32
  main_grad as soon as it is produced (Megatron-LM's default for bf16) and
  hands that to Adam, with no copy.
- learned position embeddings (--position-embedding rope|none), tied
  input and output embeddings (--untied-embeddings), embedding, attention
  and residual dropout 0.1;
- pre-LN blocks: LayerNorm, QKV projection (grouped-query with --kv-heads),
  causal attention through scaled_dot_product_attention restricted to the
  flash kernel on CUDA (checked on a tiny input first; where flash cannot
  take the shape SDPA chooses, and the JSON's "attention" says so; GQA
  through SDPA's enable_gqa where it has it, else by repeating the key and
  value heads), output projection, LayerNorm, MLP of --ffn (default
  4*hidden) with GELU, or SwiGLU with --gated-mlp; every linear layer has
  a bias, every LayerNorm a weight and a bias, as GPT-2 and the planner;
- the loss is the plain F.cross_entropy(logits.float(), targets): the
  bf16 logits, their fp32 copy, the saved log-softmax and the logits'
  gradient are all materialised, with no fused kernel;
- --recompute full checkpoints every layer (torch.utils.checkpoint,
  use_reentrant=False) and keeps only each layer's input.

Under torchrun or `gpucoord launch` it reads RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT; with a world size above 1 it runs data
parallel (DDP over NCCL, gradients as bucket views, so no second gradient
copy; on the CPU over gloo, gradients averaged by hand in fp32) and
reports the largest figure over the ranks. Rank r uses GPU LOCAL_RANK, or GPU 0 when only one is visible (gpucoord worker --cuda sets
CUDA_VISIBLE_DEVICES to one GPU per rank).

Memory figures (bytes): model_state_bytes is the sum of the tensors the
model states really hold (bf16 params and grads, fp32 masters, Adam's
moments and step); peak_allocated_bytes and peak_reserved_bytes are
torch.cuda.max_memory_allocated/max_memory_reserved over every step,
warm-up included; fwd_bwd_peak_allocated_bytes and
update_peak_allocated_bytes split that peak by phase;
stored_activations_bytes is what forward leaves allocated for backward
(memory at the end of forward minus memory before it, last step);
activation_peak_bytes is peak_allocated_bytes - model_state_bytes;
device_used_bytes is total - free from torch.cuda.mem_get_info taken after
every step, the largest (the step that reserved most), with the caching
allocator's reservation at that moment (reserved_at_device_used_bytes:
the rest is the CUDA context and anything else on the GPU) and
device_total_bytes from torch.cuda.get_device_properties. Times (seconds)
are means over the measured steps after --warmup: step_seconds between
synchronisations, fwd_bwd_seconds and update_seconds with CUDA events.

Exit status: 0 done; 2 bad arguments, no PyTorch, or no CUDA device
(without --device cpu); 3 out of GPU memory (the JSON line is still
printed, with "error" set and the figures up to the failure).

--device cpu runs on the CPU to test the script's logic: the default
shape is then tiny (2 layers, hidden 64), memory figures are null, and on
PyTorch without scaled_dot_product_attention attention falls back to a
plain softmax(QK^T)V.
"""
import argparse
import json
import math
import os
import sys
import time

DEFAULTS = {  # issue 9's first measured shape, and a tiny one for --device cpu
    "cuda": dict(layers=8, hidden=4096, heads=32, seq=2048, vocab=51200, micro_batch=8),
    "cpu": dict(layers=2, hidden=64, heads=4, seq=32, vocab=128, micro_batch=2),
}
DROPOUT = 0.1


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="gpt.py",
        description="Train a reference GPT on random tokens and print its memory and step time as one JSON line.")
    p.add_argument("--layers", type=int, help="transformer layers (default 8; 2 with --device cpu)")
    p.add_argument("--hidden", type=int, help="hidden size (default 4096; 64 with --device cpu)")
    p.add_argument("--heads", type=int, help="attention heads (default 32; 4 with --device cpu)")
    p.add_argument("--kv-heads", type=int, default=0, help="key/value heads, grouped-query attention (default: --heads)")
    p.add_argument("--ffn", type=int, default=0, help="MLP inner size (default 4*hidden)")
    p.add_argument("--seq", type=int, help="sequence length (default 2048; 32 with --device cpu)")
    p.add_argument("--vocab", type=int, help="vocabulary size (default 51200; 128 with --device cpu)")
    p.add_argument("--micro-batch", type=int, help="sequences per step (default 8; 2 with --device cpu)")
    p.add_argument("--gated-mlp", action="store_true", help="SwiGLU MLP (three matrices) instead of GELU")
    p.add_argument("--untied-embeddings", action="store_true", help="the output layer has its own vocab x hidden matrix")
    p.add_argument("--position-embedding", choices=["learned", "rope", "none"], default="learned")
    p.add_argument("--recompute", choices=["none", "full"], default="none",
                   help="full: checkpoint every layer and recompute it in backward")
    p.add_argument("--optimizer", choices=["multi-tensor", "fused"], default="multi-tensor",
                   help="torch.optim.Adam with foreach=True (multi-tensor) or fused=True")
    p.add_argument("--fp32-grads", action="store_true",
                   help="accumulate gradients in persistent fp32 buffers (Megatron-LM's main_grad) instead of bf16")
    p.add_argument("--steps", type=int, default=10, help="measured steps (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="steps run before measuring (default 3)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu runs a tiny shape to test this script without a GPU")
    a = p.parse_args(argv)
    for k, v in DEFAULTS[a.device].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    kv = a.kv_heads or a.heads
    for name in ("layers", "hidden", "heads", "seq", "vocab", "micro_batch", "steps"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(a, name)}: must be at least 1")
    if a.warmup < 0 or a.ffn < 0 or a.kv_heads < 0:
        p.error("--warmup, --ffn and --kv-heads cannot be negative")
    if a.hidden % a.heads:
        p.error(f"--hidden {a.hidden}: must be a multiple of --heads {a.heads}")
    if a.heads % kv:
        p.error(f"--kv-heads {kv}: must divide --heads {a.heads}")
    if a.position_embedding == "rope" and (a.hidden // a.heads) % 2:
        p.error(f"--position-embedding rope: head size {a.hidden // a.heads} must be even")
    a.kv_heads = kv
    a.ffn = a.ffn or 4 * a.hidden
    return a


def fail(msg, code=2):
    print(f"gpt.py: {msg}", file=sys.stderr)
    sys.exit(code)


def main(argv):
    args = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        fail(f"PyTorch is not installed for {sys.executable} ({e})")
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("no CUDA device")
    try:
        return Run(torch, args).run()
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
        if "out of memory" not in str(e):
            raise
        fail(f"out of memory before the first step: {str(e).splitlines()[0]}", 3)


def build_model(torch, args, device, attention):
    """Returns the GPT as an nn.Module whose forward(x, y) returns the loss.
    attention is an AttentionKernel: which kernel, and whether grouped-query
    attention goes to it natively or with the key/value heads repeated."""
    nn = torch.nn
    F = torch.nn.functional
    import torch.utils.checkpoint as ckpt
    dt = torch.bfloat16
    kw = dict(device=device, dtype=dt)
    h, nh, kvh, hd = args.hidden, args.heads, args.kv_heads, args.hidden // args.heads
    sdpa = F.scaled_dot_product_attention if attention.kernel != "plain" else None

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(h, h + 2 * kvh * hd, **kw)
            self.proj = nn.Linear(h, h, **kw)

        def forward(self, x, rope):
            b, t, _ = x.shape
            qkv = self.qkv(x)
            q = qkv[..., :h].view(b, t, nh, hd)
            k = qkv[..., h:h + kvh * hd].view(b, t, kvh, hd)
            v = qkv[..., h + kvh * hd:].view(b, t, kvh, hd)
            if rope is not None:
                q, k = apply_rope(q, *rope), apply_rope(k, *rope)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (b, heads, t, hd)
            p = DROPOUT if self.training else 0.0
            extra = {}
            if kvh != nh and attention.gqa == "native":
                extra["enable_gqa"] = True
            elif kvh != nh:
                k = k.repeat_interleave(nh // kvh, dim=1)
                v = v.repeat_interleave(nh // kvh, dim=1)
            if sdpa is None:
                y = plain_attention(q, k, v, p)
            else:
                y = sdpa(q, k, v, dropout_p=p, is_causal=True, **extra)
            return self.proj(y.transpose(1, 2).reshape(b, t, h))

    def plain_attention(q, k, v, p):
        t = q.shape[-2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~mask, float("-inf")).float().softmax(-1).to(q.dtype)
        return F.dropout(att, p, training=p > 0) @ v

    def apply_rope(x, cos, sin):  # x: (b, t, heads, hd); cos, sin: (t, 1, hd/2)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(h, (2 if args.gated_mlp else 1) * args.ffn, **kw)
            self.down = nn.Linear(args.ffn, h, **kw)

        def forward(self, x):
            u = self.up(x)
            if args.gated_mlp:
                gate, lin = u.chunk(2, dim=-1)
                return self.down(F.silu(gate) * lin)
            return self.down(F.gelu(u))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(h, **kw)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm(h, **kw)
            self.mlp = MLP()
            self.drop = nn.Dropout(DROPOUT)

        def forward(self, x, rope):
            x = x + self.drop(self.attn(self.ln1(x), rope))
            return x + self.drop(self.mlp(self.ln2(x)))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(args.vocab, h, **kw)
            self.wpe = nn.Embedding(args.seq, h, **kw) if args.position_embedding == "learned" else None
            self.drop = nn.Dropout(DROPOUT)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.ln_f = nn.LayerNorm(h, **kw)
            self.head = nn.Linear(h, args.vocab, bias=False, **kw) if args.untied_embeddings else None
            if args.position_embedding == "rope":
                inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
                ang = torch.outer(torch.arange(args.seq, device=device, dtype=torch.float32), inv)[:, None, :]
                self.register_buffer("cos", ang.cos().to(dt), persistent=False)
                self.register_buffer("sin", ang.sin().to(dt), persistent=False)
            with torch.no_grad():
                for name, prm in self.named_parameters():
                    if name.endswith("bias"):
                        prm.zero_()
                    elif ".ln" in name or name.startswith("ln_f"):
                        prm.fill_(1.0)
                    else:
                        prm.normal_(0.0, 0.02)

        def forward(self, idx, targets):
            t = idx.shape[1]
            x = self.wte(idx)
            if self.wpe is not None:
                x = x + self.wpe(torch.arange(t, device=idx.device))
            x = self.drop(x)
            rope = (self.cos[:t], self.sin[:t]) if args.position_embedding == "rope" else None
            for blk in self.blocks:
                if args.recompute == "full" and self.training:
                    x = ckpt.checkpoint(blk, x, rope, use_reentrant=False)
                else:
                    x = blk(x, rope)
            x = self.ln_f(x)
            logits = F.linear(x, self.head.weight if self.head is not None else self.wte.weight)
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    return GPT()


class AttentionKernel:
    """The attention kernel a run uses: kernel is "flash" (CUDA, SDPA
    restricted to the flash kernel, so a shape it cannot take fails instead
    of silently using another), "sdpa" (SDPA's own choice: on the CPU, or
    where flash cannot take the shape) or "plain" (no SDPA in this PyTorch:
    softmax(QK^T)V written out); gqa is "native" (SDPA's enable_gqa) or
    "repeat" (key and value heads repeated to the query heads, a copy),
    None without grouped-query attention; why says why flash was not used."""

    def __init__(self, torch, args, device):
        import contextlib
        self.context = contextlib.nullcontext
        self.why = None
        self.gqa = None
        F = torch.nn.functional
        if not hasattr(F, "scaled_dot_product_attention"):
            self.kernel = "plain"
            self.gqa = "repeat" if args.kv_heads != args.heads else None
            return
        self.kernel = "sdpa"
        if device.type == "cuda":
            ctx = self._flash_context(torch)
            if ctx is None:
                self.why = "this PyTorch cannot restrict SDPA to the flash kernel"
            else:
                self.context = ctx
                self.kernel = "flash"
        if args.kv_heads == args.heads:
            err = self._probe(torch, args, device, False)
            if err and self.kernel == "flash":
                self.kernel, self.why, self.context = "sdpa", err, contextlib.nullcontext
            return
        self.gqa = "native"
        if self._probe(torch, args, device, True) is None:
            return
        self.gqa = "repeat"
        err = self._probe(torch, args, device, False)
        if err and self.kernel == "flash":
            self.kernel, self.why, self.context = "sdpa", err, contextlib.nullcontext

    @staticmethod
    def _flash_context(torch):
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            return lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])
        except ImportError:
            pass
        if hasattr(torch.backends.cuda, "sdp_kernel"):
            return lambda: torch.backends.cuda.sdp_kernel(
                enable_flash=True, enable_math=False, enable_mem_efficient=False)
        return None

    def _probe(self, torch, args, device, gqa):
        """Runs this run's attention forward and backward on a tiny input;
        returns None if it works, else the error's first line."""
        hd = args.hidden // args.heads
        kvh = args.kv_heads if gqa else args.heads
        dt = torch.bfloat16 if device.type == "cuda" else torch.float32
        q = torch.randn(1, args.heads, 16, hd, device=device, dtype=dt, requires_grad=True)
        k = torch.randn(1, kvh, 16, hd, device=device, dtype=dt, requires_grad=True)
        extra = {"enable_gqa": True} if gqa else {}
        try:
            with self.context():
                y = torch.nn.functional.scaled_dot_product_attention(q, k, k, dropout_p=DROPOUT, is_causal=True, **extra)
                y.sum().backward()
            return None
        except (TypeError, RuntimeError) as e:
            return (str(e).strip().splitlines() or [type(e).__name__])[0]

    def describe(self):
        s = self.kernel
        if self.gqa:
            s += f", grouped-query {self.gqa}"
        return s


class Run:
    """One training run: setup, steps, measurements, the JSON report."""

    def __init__(self, torch, args):
        self.torch, self.args = torch, args
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        self.cuda = args.device == "cuda"
        if self.cuda:
            n = torch.cuda.device_count()
            idx = self.local if self.local < n else 0
            torch.cuda.set_device(idx)
            self.device = torch.device("cuda", idx)
        else:
            self.device = torch.device("cpu")
        self.dist = None
        if self.world > 1:
            if args.fp32_grads:
                fail("--fp32-grads runs with a world size of 1 only")
            import torch.distributed as dist
            dist.init_process_group("nccl" if self.cuda else "gloo", init_method="env://")
            self.dist = dist

    def log(self, msg):
        if self.rank == 0:
            print(f"gpt.py: {msg}", file=sys.stderr, flush=True)

    def run(self):
        torch, args = self.torch, self.args
        torch.manual_seed(args.seed)  # the same initial weights on every rank
        self.attention = AttentionKernel(torch, args, self.device)
        if self.attention.why:
            self.log(f"flash attention not used: {self.attention.why}")
        model = build_model(torch, args, self.device, self.attention)
        model.train()
        params = list(model.parameters())
        self.n_params = sum(p.numel() for p in params)
        masters = [p.detach().float() for p in params]
        for m in masters:
            m.requires_grad_(True)
        if args.fp32_grads:
            self.setup_main_grads(params, masters)
        self.model = model
        if self.dist is not None and self.cuda:
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.model = DDP(model, device_ids=[self.device.index], gradient_as_bucket_view=True)
        torch.manual_seed(args.seed + 1 + self.rank)  # each rank its own data and dropout
        self.params, self.masters = params, masters
        self.opt, self.opt_name = self.make_optimizer(masters)
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        self.log(f"{self.n_params / 1e6:.1f}M parameters, {args.layers} layers, hidden {args.hidden}, "
                 f"seq {args.seq}, micro-batch {args.micro_batch}, world {self.world}, "
                 f"{self.opt_name} Adam, attention {self.attention.describe()}, recompute {args.recompute}")
        m = self.measure = Measure(torch, self.cuda)
        err = None
        with self.attention.context():
            for i in range(args.warmup + args.steps):
                try:
                    self.step(i >= args.warmup)
                except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
                    if "out of memory" not in str(e):
                        raise
                    err = f"out of memory at step {i + 1}: {str(e).splitlines()[0]}"
                    break
                if i == 0:
                    self.model_state = self.model_state_bytes()
        report = self.report(err)
        if self.dist is not None:
            self.dist.destroy_process_group()
        if self.rank == 0:
            print(json.dumps(report), flush=True)
        if err:
            self.log(err)
            return 3
        return 0

    def setup_main_grads(self, params, masters):
        """--fp32-grads: a persistent fp32 buffer per parameter (the master's
        .grad) into which each bf16 gradient is added and freed as soon as
        autograd produces it, when this PyTorch has post-accumulate hooks
        (else after backward, which keeps every bf16 gradient until then)."""
        torch = self.torch
        for p, m in zip(params, masters):
            m.grad = torch.zeros_like(m)
            p.main_grad = m.grad
        self.hooked = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
        if self.hooked:
            def hook(p):
                p.main_grad.add_(p.grad)
                p.grad = None
            for p in params:
                p.register_post_accumulate_grad_hook(hook)

    def make_optimizer(self, masters):
        torch, args = self.torch, self.args
        lr = 1e-4
        if args.optimizer == "fused":
            try:
                return torch.optim.Adam(masters, lr=lr, fused=True), "fused"
            except (RuntimeError, TypeError) as e:
                if self.cuda:
                    fail(f"--optimizer fused: {e}")
                self.log(f"fused Adam is not available on this CPU build ({e}); using multi-tensor")
        return torch.optim.Adam(masters, lr=lr, foreach=True), "multi-tensor"

    def step(self, measured):
        torch, args, m = self.torch, self.args, self.measure
        x = torch.randint(0, args.vocab, (args.micro_batch, args.seq), device=self.device)
        y = torch.randint(0, args.vocab, (args.micro_batch, args.seq), device=self.device)
        m.begin()
        before = m.allocated()
        loss = self.model(x, y)
        m.stored = m.allocated() - before if m.cuda else None
        loss.backward()
        if self.dist is not None and not self.cuda:
            self.average_grads_gloo()
        if self.args.fp32_grads and not self.hooked:
            for p in self.params:
                p.main_grad.add_(p.grad)
                p.grad = None
        m.mid()
        self.update()
        m.end(measured)
        self.loss = loss

    def average_grads_gloo(self):
        """Data parallel on the CPU: gloo cannot reduce bf16 in every
        PyTorch, so the gradients are averaged in one fp32 buffer."""
        torch = self.torch
        grads = [p.grad for p in self.params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        self.dist.all_reduce(flat)
        flat /= self.world
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))

    @staticmethod
    def _copy(torch, dst, src):
        if hasattr(torch, "_foreach_copy_"):
            torch._foreach_copy_(dst, src)
        else:
            for d, s in zip(dst, src):
                d.copy_(s)

    def update(self):
        torch = self.torch
        with torch.no_grad():
            if not self.args.fp32_grads:
                for p, mw in zip(self.params, self.masters):
                    mw.grad = p.grad.float()  # Megatron-LM: main_param.grad = model_param.main_grad.float()
            self.opt.step()
            if self.args.fp32_grads:
                torch._foreach_zero_([mw.grad for mw in self.masters])
            else:
                for mw in self.masters:
                    mw.grad = None
                torch._foreach_zero_([p.grad for p in self.params])
            self._copy(torch, self.params, self.masters)

    def model_state_bytes(self):
        def nbytes(t):
            return t.numel() * t.element_size()
        st = {
            "params": sum(nbytes(p) for p in self.params),
            "grads": sum(nbytes(p.grad) for p in self.params if p.grad is not None),
            "master": sum(nbytes(mw) for mw in self.masters),
            "moments": 0,
        }
        if self.args.fp32_grads:
            st["grads"] = sum(nbytes(mw.grad) for mw in self.masters)
        for s in self.opt.state.values():
            for v in s.values():
                if self.torch.is_tensor(v):
                    st["moments"] += nbytes(v)
        return st

    def report(self, err):
        args, m = self.args, self.measure
        if m.cuda:
            m._peaks()  # a step cut short by an error has not folded its peak in yet
        state = getattr(self, "model_state", None)
        state_total = sum(state.values()) if state else None
        r = {
            "script": "gpt.py",
            "device": self.torch.cuda.get_device_name(self.device) if self.cuda else "cpu",
            "torch": self.torch.__version__,
            "world_size": self.world,
            "shape": {
                "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "kv_heads": args.kv_heads,
                "ffn": args.ffn, "seq": args.seq, "vocab": args.vocab, "micro_batch": args.micro_batch,
                "gated_mlp": args.gated_mlp, "untied_embeddings": args.untied_embeddings,
                "position_embedding": args.position_embedding, "recompute": args.recompute,
                "fp32_grads": args.fp32_grads, "dropout": DROPOUT,
            },
            "optimizer": self.opt_name,
            "attention": self.attention.describe(),
            "parameters": self.n_params,
            "warmup_steps": args.warmup,
            "steps": len(m.steps),
            "model_state_bytes": state_total,
            "model_state": state,
            "peak_allocated_bytes": m.peak_alloc,
            "peak_reserved_bytes": m.peak_reserved,
            "fwd_bwd_peak_allocated_bytes": m.peak_fb,
            "update_peak_allocated_bytes": m.peak_up,
            "stored_activations_bytes": m.stored,
            "activation_peak_bytes": m.peak_alloc - state_total if m.cuda and state_total is not None else None,
            "device_used_bytes": m.used,
            "reserved_at_device_used_bytes": m.used_reserved,
            "device_total_bytes": m.total,
            "step_seconds": _mean(m.steps),
            "fwd_bwd_seconds": _mean(m.fb),
            "update_seconds": _mean(m.up),
            "tokens_per_second": None,
            "loss": float(self.loss.item()) if getattr(self, "loss", None) is not None else None,
        }
        if r["step_seconds"]:
            r["tokens_per_second"] = args.micro_batch * args.seq * self.world / r["step_seconds"]
        if err:
            r["error"] = err
        if self.dist is not None:
            self.max_over_ranks(r)
        return r

    def max_over_ranks(self, r):
        """Every figure becomes the largest any rank saw."""
        keys = [k for k in ("peak_allocated_bytes", "peak_reserved_bytes", "fwd_bwd_peak_allocated_bytes",
                            "update_peak_allocated_bytes", "stored_activations_bytes", "activation_peak_bytes",
                            "device_used_bytes", "reserved_at_device_used_bytes", "step_seconds",
                            "fwd_bwd_seconds", "update_seconds") if r[k] is not None]
        t = self.torch.tensor([float(r[k]) for k in keys], dtype=self.torch.float64,
                              device=self.device if self.cuda else "cpu")
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        for k, v in zip(keys, t.tolist()):
            r[k] = v if k.endswith("seconds") else int(v)


class Measure:
    """Times the phases of each step and follows the allocator's peaks. On
    CUDA the peak counters are reset between phases (they are host-side
    bookkeeping, so no synchronisation is needed to read them) and their
    maximum is kept here."""

    def __init__(self, torch, cuda):
        self.torch, self.cuda = torch, cuda
        self.steps, self.fb, self.up = [], [], []
        self.peak_alloc = self.peak_reserved = self.peak_fb = self.peak_up = None
        self.used = self.used_reserved = self.total = self.stored = None
        if cuda:
            self.peak_alloc = self.peak_reserved = self.peak_fb = self.peak_up = 0
            self.used = 0
            self.total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            self.ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]

    def allocated(self):
        return self.torch.cuda.memory_allocated() if self.cuda else 0

    def _peaks(self):
        c = self.torch.cuda
        a, r = c.max_memory_allocated(), c.max_memory_reserved()
        self.peak_alloc, self.peak_reserved = max(self.peak_alloc, a), max(self.peak_reserved, r)
        c.reset_peak_memory_stats()
        return a

    def begin(self):
        if self.cuda:
            self.torch.cuda.synchronize()
            self._peaks()
            self.ev[0].record()
        self.t0 = time.perf_counter()

    def mid(self):
        if self.cuda:
            self.peak_fb = max(self.peak_fb, self._peaks())
            self.ev[1].record()
        self.t1 = time.perf_counter()

    def end(self, measured):
        c = self.torch.cuda
        if self.cuda:
            self.ev[2].record()
            self.peak_up = max(self.peak_up, self._peaks())
            c.synchronize()
        t2 = time.perf_counter()
        if self.cuda:
            free, total = c.mem_get_info()
            used = total - free
            if used > self.used:
                self.used, self.used_reserved = used, c.memory_reserved()
        if not measured:
            return
        self.steps.append(t2 - self.t0)
        if self.cuda:
            self.fb.append(self.ev[0].elapsed_time(self.ev[1]) / 1e3)
            self.up.append(self.ev[1].elapsed_time(self.ev[2]) / 1e3)
        else:
            self.fb.append(self.t1 - self.t0)
            self.up.append(t2 - self.t1)


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

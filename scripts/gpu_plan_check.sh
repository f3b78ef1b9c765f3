#!/usr/bin/env bash
# The planner against a real GPU: for each shape below, train the reference
# GPT (examples/pytorch/gpt.py) on this machine's GPU 0, ask
# `gpucoord plan --cluster dgx-h100 --nodes 1 --gpus-per-node 1 --json` about
# the same shape, and write a markdown table of planned against measured
# memory and step time, with relative errors (plan - measured) / measured.
#
#   scripts/gpu_plan_check.sh [NAME...]      (default: every shape; NAME picks some)
#   scripts/gpu_plan_check.sh --list         (the shapes and their gpt.py flags)
#
# Environment:
#   GPUCOORD    the gpucoord binary (default ./bin/gpucoord; built with `go build`
#               when missing and Go is here; a GPU machine without Go needs it
#               copied: CGO_ENABLED=0 go build -o bin/gpucoord ./cmd/gpucoord)
#   PYTHON      a python3 with PyTorch (default python3); it also handles the JSON
#   OUT         file for the tables, or a directory to write plan-vs-gpu.md
#               into (default: stdout)
#   LOGDIR      where each shape's gpt.py JSON and stderr and plan JSON are kept
#               (default: a new temporary directory, named on stderr)
#   STEPS       measured steps per shape (default 10), WARMUP steps before (3)
#   CLUSTER     the plan's cluster (default dgx-h100)
#   GPT_DEVICE  cuda (default), or cpu to check this script without a GPU: tiny
#               shapes on the CPU, memory columns n/a
#   REUSE       1: keep a shape's gpt.py results already in LOGDIR (its
#               .gpt.rc) and only plan it again, so shapes can run one call
#               at a time under a time limit and one last call writes the
#               tables; also how a planner change is held to earlier runs
#
# The measured side (gpt.py's JSON): activation peak = torch.cuda.max_memory_allocated
# over all steps minus the bytes the model states hold; device used =
# total - free (torch.cuda.mem_get_info) after the step that reserved most,
# so it includes the CUDA context and the allocator's cache; times are means
# over STEPS steps after WARMUP. The planned side: activations is
# memory.per_gpu_bytes.activations (+ .transient when the planner reports
# it), total is .total, step is step.seconds; the plan's forward+backward is
# step.seconds - step.optimizer_seconds - step.dp_seconds. A plan that does
# not fit (exit 3) is still compared; a run that runs out of memory shows OOM.
#
# Every shape uses micro-batch = global batch, so one step is one micro-batch
# with no gradient accumulation. Each takes well under a minute on an H100
# (about half of it starting PyTorch and CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-3}
CLUSTER=${CLUSTER:-dgx-h100}
GPT_DEVICE=${GPT_DEVICE:-cuda}

# name|gpt.py flags. All fit in an 80 GB H100 with the multi-tensor Adam's
# transients; the first two are issue 9's measured rows.
gpu_shapes=(
  "gpt-l8-h4096|--layers 8 --hidden 4096 --heads 32 --seq 2048 --vocab 51200 --micro-batch 8"
  "gpt-l24-h2048|--layers 24 --hidden 2048 --heads 16 --seq 2048 --vocab 51200 --micro-batch 8"
  "gpt-l32-h1024|--layers 32 --hidden 1024 --heads 16 --seq 2048 --vocab 51200 --micro-batch 8"
  "gpt-l12-h4096-full|--layers 12 --hidden 4096 --heads 32 --seq 2048 --vocab 51200 --micro-batch 8 --recompute full"
  "gpt-l8-h4096-s8192|--layers 8 --hidden 4096 --heads 32 --seq 8192 --vocab 51200 --micro-batch 2"
  "llama-l8-h4096-gqa|--layers 8 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336 --gated-mlp --untied-embeddings --position-embedding rope --seq 4096 --vocab 128256 --micro-batch 1"
  "gpt-l24-h2048-fused|--layers 24 --hidden 2048 --heads 16 --seq 2048 --vocab 51200 --micro-batch 8 --optimizer fused"
  "gpt-l8-h4096-fp32grads|--layers 8 --hidden 4096 --heads 32 --seq 2048 --vocab 51200 --micro-batch 8 --fp32-grads"
  "gpt-l8-h4096-fused|--layers 8 --hidden 4096 --heads 32 --seq 2048 --vocab 51200 --micro-batch 8 --optimizer fused"
  "gpt-l8-h4096-fused-fp32grads|--layers 8 --hidden 4096 --heads 32 --seq 2048 --vocab 51200 --micro-batch 8 --optimizer fused --fp32-grads"
)
# The same variety, tiny, for GPT_DEVICE=cpu.
cpu_shapes=(
  "tiny-gpt|--layers 2 --hidden 64 --heads 4 --seq 32 --vocab 128 --micro-batch 2"
  "tiny-full|--layers 2 --hidden 64 --heads 4 --seq 32 --vocab 128 --micro-batch 2 --recompute full"
  "tiny-llama|--layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 160 --gated-mlp --untied-embeddings --position-embedding rope --seq 64 --vocab 300 --micro-batch 1"
  "tiny-fp32grads|--layers 2 --hidden 64 --heads 4 --seq 32 --vocab 128 --micro-batch 2 --fp32-grads --optimizer fused"
)
case $GPT_DEVICE in
  cuda) shapes=("${gpu_shapes[@]}") ;;
  cpu) shapes=("${cpu_shapes[@]}") ;;
  *) echo "gpu_plan_check.sh: GPT_DEVICE=$GPT_DEVICE: want cuda or cpu" >&2; exit 2 ;;
esac

if [ "${1:-}" = --list ]; then
  for s in "${shapes[@]}"; do echo "${s%%|*}: ${s#*|}"; done
  exit 0
fi
selected=()
if [ $# -eq 0 ]; then
  selected=("${shapes[@]}")
else
  for want in "$@"; do
    found=
    for s in "${shapes[@]}"; do
      if [ "${s%%|*}" = "$want" ]; then selected+=("$s"); found=1; fi
    done
    [ -n "$found" ] || { echo "gpu_plan_check.sh: no shape $want (--list shows them)" >&2; exit 2; }
  done
fi

if [ -z "${GPUCOORD:-}" ]; then
  GPUCOORD=./bin/gpucoord
  if [ ! -x "$GPUCOORD" ] && command -v go >/dev/null; then
    go build -o "$GPUCOORD" ./cmd/gpucoord
  fi
fi
[ -x "$GPUCOORD" ] || { echo "gpu_plan_check.sh: no gpucoord binary at $GPUCOORD (CGO_ENABLED=0 go build -o bin/gpucoord ./cmd/gpucoord, or set GPUCOORD)" >&2; exit 2; }
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 8)' 2>/dev/null || { echo "gpu_plan_check.sh: PYTHON=$PYTHON is not a python3" >&2; exit 2; }

if [ -z "${LOGDIR:-}" ]; then
  LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/gpu_plan_check.XXXXXX")
fi
mkdir -p "$LOGDIR"
echo "gpu_plan_check.sh: logs in $LOGDIR" >&2

# plan_flags GPT_FLAGS...: the gpucoord plan flags for the shape gpt.py
# would run (its own parser resolves the defaults: ffn 4h, kv-heads = heads).
plan_flags() {
  "$PYTHON" -B - "$@" <<'PY'
import sys
sys.path.insert(0, "examples/pytorch")
import gpt
a = gpt.parse_args(sys.argv[1:])
f = ["--layers", a.layers, "--hidden", a.hidden, "--heads", a.heads, "--kv-heads", a.kv_heads,
     "--ffn", a.ffn, "--seq", a.seq, "--vocab", a.vocab, "--micro-batch", a.micro_batch,
     "--global-batch", a.micro_batch, "--recompute", a.recompute, "--optimizer", a.optimizer,
     # the planner knows learned and rope; "none" has no parameters, as rope
     "--position-embedding", "learned" if a.position_embedding == "learned" else "rope"]
for on, flag in ((a.gated_mlp, "--gated-mlp"), (a.untied_embeddings, "--untied-embeddings"), (a.fp32_grads, "--fp32-grads")):
    if on:
        f.append(flag)
print(" ".join(str(x) for x in f))
PY
}

names=()
for s in "${selected[@]}"; do
  name=${s%%|*}
  read -r -a flags <<<"${s#*|}"
  names+=("$name")
  if [ "${REUSE:-}" = 1 ] && [ -s "$LOGDIR/$name.gpt.rc" ]; then
    echo "gpu_plan_check.sh: $name: gpt.py's run kept from $LOGDIR" >&2
  else
    echo "gpu_plan_check.sh: $name: gpt.py ${flags[*]}" >&2
    rc=0
    "$PYTHON" examples/pytorch/gpt.py "${flags[@]}" --device "$GPT_DEVICE" --steps "$STEPS" --warmup "$WARMUP" \
      >"$LOGDIR/$name.gpt.json" 2>"$LOGDIR/$name.gpt.err" || rc=$?
    echo "$rc" >"$LOGDIR/$name.gpt.rc"
    if [ "$rc" != 0 ]; then
      echo "gpu_plan_check.sh: $name: gpt.py exited $rc: $(tail -n 1 "$LOGDIR/$name.gpt.err")" >&2
    fi
  fi
  read -r -a pflags <<<"$(plan_flags "${flags[@]}")"
  prc=0
  "$GPUCOORD" plan --cluster "$CLUSTER" --nodes 1 --gpus-per-node 1 "${pflags[@]}" --json \
    >"$LOGDIR/$name.plan.json" 2>"$LOGDIR/$name.plan.err" || prc=$?
  if [ "$prc" != 0 ] && [ "$prc" != 3 ]; then  # 3: planned, does not fit
    echo "gpu_plan_check.sh: $name: gpucoord plan exited $prc: $(cat "$LOGDIR/$name.plan.err")" >&2
    : >"$LOGDIR/$name.plan.json"
  fi
done

table() {
  "$PYTHON" - "$LOGDIR" "$CLUSTER" "$STEPS" "$WARMUP" "${names[@]}" <<'PY'
import json, os, sys

logdir, cluster, steps, warmup, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
GiB = 2.0 ** 30


def load(path):
    """The JSON document in path (gpucoord's, indented), or its last line
    (gpt.py's); None when there is none."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    lines = [l for l in text.splitlines() if l.strip()]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def gib(b):
    return "n/a" if b is None else f"{b / GiB:.1f}"


def ms(s):
    if s is None:
        return "n/a"
    return f"{s * 1e3:.0f}" if s >= 0.01 else f"{s * 1e3:.2f}"


def err(plan, meas):
    if plan is None or meas is None or meas == 0:
        return "n/a"
    return f"{(plan - meas) / meas * 100:+.1f}%"


def shape(g, name):
    if not g:
        return name
    s = g["shape"]
    t = f"l {s['layers']}, h {s['hidden']}, {s['heads']} heads"
    if s["kv_heads"] != s["heads"]:
        t += f" ({s['kv_heads']} kv)"
    if s["ffn"] != 4 * s["hidden"] or s["gated_mlp"]:
        t += f", ffn {s['ffn']}" + (" gated" if s["gated_mlp"] else "")
    t += f", seq {s['seq']}, vocab {s['vocab']}, mb {s['micro_batch']}"
    if s["position_embedding"] != "learned":
        t += f", {s['position_embedding']}"
    if s["untied_embeddings"]:
        t += ", untied"
    if s["recompute"] != "none":
        t += f", recompute {s['recompute']}"
    if g["optimizer"] != "multi-tensor":
        t += f", {g['optimizer']} Adam"
    if s["fp32_grads"]:
        t += ", fp32 grads"
    return t


rows, details, meta = [], [], None
for name in names:
    g = load(os.path.join(logdir, name + ".gpt.json"))
    p = load(os.path.join(logdir, name + ".plan.json"))
    with open(os.path.join(logdir, name + ".gpt.rc")) as f:
        rc = f.read().strip()
    if g and not meta:
        meta = g
    oom = bool(g and g.get("error"))
    failed = g is None
    pm = p["memory"]["per_gpu_bytes"] if p else {}
    ps = (p or {}).get("step") or {}
    p_act = pm["activations"] + pm.get("transient", 0) if pm else None
    p_state = pm["params"] + pm["grads"] + pm["optimizer"] if pm else None
    p_total = pm.get("total")
    p_step = ps.get("seconds") or None  # absent, null or 0: not estimated
    p_fb = p_step - (ps.get("optimizer_seconds") or 0) - (ps.get("dp_seconds") or 0) if p_step else None
    mark = "OOM" if oom else f"failed ({rc})" if failed else None

    def m(key):
        return None if (g is None or oom) else g.get(key)

    act, used, step, fb = m("activation_peak_bytes"), m("device_used_bytes"), m("step_seconds"), m("fwd_bwd_seconds")
    fit = "" if not p else "" if p.get("fits") else " (plan: does not fit)"
    rows.append([shape(g, name) + fit, gib(p_act), mark or gib(act), err(p_act, act), gib(p_total),
                 mark or gib(used), err(p_total, used), ms(p_step), mark or ms(fb), mark or ms(step), err(p_step, step)])
    details.append([name, str(g["parameters"]) if g else "n/a", str(int(p["model"]["total_params"])) if p else "n/a",
                    gib(p_state), gib(g and g.get("model_state_bytes")), err(p_state, g and g.get("model_state_bytes")),
                    gib(m("peak_allocated_bytes")), gib(m("peak_reserved_bytes")), gib(m("fwd_bwd_peak_allocated_bytes")),
                    gib(m("update_peak_allocated_bytes")), gib(m("stored_activations_bytes")),
                    ms(p_fb), ms(fb), err(p_fb, fb), ms(ps.get("optimizer_seconds")), ms(m("update_seconds")),
                    err(ps.get("optimizer_seconds"), m("update_seconds")), g["attention"] if g else "n/a"])


def md(header, body):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(out)


if meta:
    dev = meta["device"]
    tot = meta.get("device_total_bytes")
    print(f"GPU: {dev}" + (f", {tot / GiB:.2f} GiB total" if tot else "") +
          f"; PyTorch {meta['torch']}; {warmup} warm-up steps, then the mean of {steps};"
          f" plan: --cluster {cluster} --nodes 1 --gpus-per-node 1.")
    print()
print(md(["shape", "plan activations GiB", "measured activation peak GiB", "err",
          "plan total GiB", "device memory used GiB", "err",
          "plan step ms", "measured fwd+bwd ms", "measured step ms", "err"], rows))
print()
print("Relative error = (plan - measured) / measured. Plan activations include the planner's transient"
      " term when it reports one; the measured activation peak is the allocator's peak minus the model-state"
      " bytes, so it includes every transient (loss layer, gradient buffers, the optimizer's); device memory"
      " used includes the CUDA context and the allocator's cache.")
print()
print(md(["shape", "params (gpt.py)", "params (plan)", "plan model state GiB", "measured model state GiB", "err",
          "peak allocated GiB", "peak reserved GiB", "fwd+bwd peak GiB", "update peak GiB", "stored activations GiB",
          "plan fwd+bwd ms", "measured fwd+bwd ms", "err", "plan optimizer ms", "measured update ms", "err",
          "attention"], details))
PY
}

if [ -n "${OUT:-}" ]; then
  [ -d "$OUT" ] && OUT=$OUT/plan-vs-gpu.md
  table >"$OUT"
  echo "gpu_plan_check.sh: table in $OUT" >&2
else
  table
fi

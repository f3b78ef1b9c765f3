"""Process groups for 3D-parallel PyTorch programs under gpucoord.

gpucoord lays a job's ranks out on a (tp, pp, dp) grid in a rank order
(Megatron-LM's tp-cp-dp-pp by default) and writes every TP, PP and DP group
of the generation, as lists of global ranks, into the file
GPUCOORD_GROUPS names. build() makes the torch.distributed process groups
from that file, exactly as the coordinator laid them out (nothing here
computes a layout: the file is the one rule's output), and checks that the
file and this rank's GPUCOORD_TP_RANK, GPUCOORD_PP_RANK and
GPUCOORD_DP_RANK agree.

    import torch.distributed as dist
    from gpucoord_groups import build

    dist.init_process_group("gloo")  # or "nccl"
    g = build()
    # g.tp, g.pp, g.dp: this rank's groups; g.tp_rank, g.pp_rank, g.dp_rank;
    # g.pp_ranks: its pipeline's global ranks, stage by stage.

Every rank must call build() once, after init_process_group, in the same
place of its program: torch.distributed.new_group is collective over the
world, so build() creates every group of every axis, in the file's order,
on every rank.
"""
import json
import os
from dataclasses import dataclass
from typing import List

import torch.distributed as dist


@dataclass
class Groups:
    tp: object
    pp: object
    dp: object
    tp_rank: int
    pp_rank: int
    dp_rank: int
    tp_size: int
    pp_size: int
    dp_size: int
    tp_ranks: List[int]
    pp_ranks: List[int]
    dp_ranks: List[int]


class LayoutMismatch(RuntimeError):
    """The groups file and this rank's environment disagree."""


def read(path=None):
    """Return the groups file's content (GPUCOORD_GROUPS unless path)."""
    path = path or os.environ.get("GPUCOORD_GROUPS")
    if not path:
        raise RuntimeError("GPUCOORD_GROUPS is not set: run this program under gpucoord launch")
    with open(path) as f:
        return json.load(f)


def check(layout, rank, env=os.environ):
    """Check that layout (read's) covers every rank once per axis, and that
    rank's place in its groups is what its environment says. Returns the
    rank's group of each axis and its index there."""
    world = layout["tp"] * layout["pp"] * layout["dp"]
    mine = {}
    for axis in ("tp", "pp", "dp"):
        groups = layout["groups"][axis]
        seen = sorted(r for g in groups for r in g)
        if seen != list(range(world)):
            raise LayoutMismatch(f"the {axis} groups do not cover ranks 0..{world - 1} once each: {groups}")
        if any(len(g) != layout[axis] for g in groups):
            raise LayoutMismatch(f"a {axis} group is not of size {layout[axis]}: {groups}")
        g = next(g for g in groups if rank in g)
        want = int(env.get(f"GPUCOORD_{axis.upper()}_RANK", g.index(rank)))
        size = int(env.get(f"GPUCOORD_{axis.upper()}_SIZE", layout[axis]))
        if g.index(rank) != want or size != layout[axis]:
            raise LayoutMismatch(
                f"rank {rank} is {axis} rank {g.index(rank)} of {layout[axis]} in the groups file, "
                f"but GPUCOORD_{axis.upper()}_RANK/SIZE say {want} of {size}")
        mine[axis] = (g, g.index(rank))
    return mine


def build(path=None):
    """Make every TP, PP and DP group of the groups file (collectively, on
    every rank) and return this rank's."""
    layout = read(path)
    rank = dist.get_rank()
    if dist.get_world_size() != layout["tp"] * layout["pp"] * layout["dp"]:
        raise LayoutMismatch(f"a world of {dist.get_world_size()} ranks for tp {layout['tp']} x pp {layout['pp']} x dp {layout['dp']}")
    mine = check(layout, rank)
    made = {}
    for axis in ("tp", "pp", "dp"):
        for g in layout["groups"][axis]:
            pg = dist.new_group(ranks=g)
            if rank in g:
                made[axis] = pg
    (tp, tpr), (pp, ppr), (dp, dpr) = mine["tp"], mine["pp"], mine["dp"]
    return Groups(tp=made["tp"], pp=made["pp"], dp=made["dp"], tp_rank=tpr, pp_rank=ppr, dp_rank=dpr,
                  tp_size=layout["tp"], pp_size=layout["pp"], dp_size=layout["dp"],
                  tp_ranks=tp, pp_ranks=pp, dp_ranks=dp)

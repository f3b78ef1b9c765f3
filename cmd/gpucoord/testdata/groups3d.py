"""Builds the 3D groups with gpucoord_groups and proves each by a
collective: the sum of global ranks over each group, which only the right
members give. Prints one line per rank."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.environ["GROUPS_MODULE_DIR"])
from gpucoord_groups import build  # noqa: E402

dist.init_process_group("gloo")
g = build()
rank = dist.get_rank()
sums = []
for pg, ranks in ((g.tp, g.tp_ranks), (g.pp, g.pp_ranks), (g.dp, g.dp_ranks)):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=pg)
    if int(t.item()) != sum(ranks):
        print(f"rank {rank}: sum {t.item()} over {ranks}", flush=True)
        sys.exit(4)
    sums.append(int(t.item()))
print(f"GROUPS rank={rank} tp={g.tp_ranks} pp={g.pp_ranks} dp={g.dp_ranks} sums={sums}", flush=True)
dist.destroy_process_group()

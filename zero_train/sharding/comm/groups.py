"""Who this rank is in a process group, and which backend carries its messages (no communication)."""

from __future__ import annotations

import os

import torch.distributed as dist

TORCH_COLLECTIVES_ENV = "ZT_TORCH_COLLECTIVES"
"""Set to 1 to run torch's collectives (the path NCCL takes) on gloo too: how a CPU test exercises the NCCL
branch (tests/sharding/test_nccl.py), and how gloo's own collectives are timed against our rings."""


def group_rank_and_size(process_group=None) -> tuple[int, int]:
    """(rank, world size) of this process in `process_group` (None: the default group; (0, 1) if none)."""
    if process_group is None and not dist.is_initialized():
        return 0, 1
    return dist.get_rank(process_group), dist.get_world_size(process_group)


def uses_p2p_rings(process_group=None) -> bool:
    """True on gloo, whose reduce-scatter and all-gather are slower than our isend/irecv rings (unless
    $ZT_TORCH_COLLECTIVES=1 forces torch's collectives, the NCCL path)."""
    return dist.get_backend(process_group) == "gloo" and os.environ.get(TORCH_COLLECTIVES_ENV) != "1"


def backend_name(process_group=None) -> str:
    """The group's backend ("gloo", "nccl", ...); "gloo" without a process group (nothing travels)."""
    if process_group is None and not dist.is_initialized():
        return "gloo"
    return str(dist.get_backend(process_group))


def global_rank(rank: int, process_group) -> int:
    """The default group's rank of `rank` in `process_group` (what point-to-point calls take)."""
    return dist.get_global_rank(process_group, rank) if process_group is not None else rank

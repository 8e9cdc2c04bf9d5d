"""Rank 0 builds first, the others after it (reading what it cached); an error on rank 0 reaches every rank.

Datasets-free: the offline default's packing (zero_train.hf.blocks) and datasets' (zero_train.hf.data) both use it.
"""

from __future__ import annotations

import torch.distributed as dist

from zero_train.runtime.errors import UsageError


def rank0_first(build, *, process_group=None):
    """build(is_first=True) on rank 0, then build(is_first=False) on the others (it reads what rank 0 cached).

    A UsageError on rank 0 is raised on every rank (one line each, no hang); without torch.distributed this
    is build(is_first=True).
    """
    if not dist.is_initialized():
        return build(is_first=True)
    is_first = dist.get_rank(process_group) == 0
    built, error = None, [None]
    if is_first:
        try:
            built = build(is_first=True)
        except UsageError as err:
            error = [str(err)]
    dist.broadcast_object_list(
        error, src=dist.get_global_rank(process_group, 0) if process_group else 0, group=process_group
    )
    if error[0] is not None:
        raise UsageError(error[0])
    return built if is_first else build(is_first=False)

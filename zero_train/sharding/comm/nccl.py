"""NCCL's side of the collectives (and any backend but gloo): torch's own collectives, one call each.

collectives.py chooses between this file and gloo.py per backend. NCCL runs real rings on its own stream and
pipelines them, so each operation is one torch call: the reduction to the owners is one reduce-scatter per
bucket, the all-gather one `all_gather_into_tensor` over equal slices (padding included), ZeRO-3's gather and
reduce-scatter `all_gather_into_tensor` / `reduce_scatter_tensor`. With async_op=True a call returns a work
handle at once; waiting on it makes the current stream wait for NCCL's (a collective with async_op=False
would join the streams at once and stall the backward of the layers below, docs/gpu.md).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from zero_train.sharding.comm.groups import group_rank_and_size


def reduce_scatter_parts(flat: torch.Tensor, process_group=None, *, starts, lengths, async_op=False):
    """ONE collective per bucket: part r of `flat` summed over the ranks into place on rank r.

    The parts are contiguous and in rank order (a bucket cut at the owners' boundaries), but unequal: only
    the ranks whose slice the bucket overlaps have one. Equal parts that fill the bucket go to
    `reduce_scatter_tensor` (NCCL's ReduceScatter, in place). Otherwise torch's `reduce_scatter` of the N
    parts: NCCL runs unequal ones as one group of N ncclReduce calls (ProcessGroupNCCL::reduce_scatter), one
    launch, each rank sending exactly its parts, as the old one-reduce-per-owner did in N launches. Padding
    every part to the largest would make it a ReduceScatter too, but sends N x the largest part: for a bucket
    inside one rank's slice, N times the bucket (docs/zero1.md#the-nccl-path).

    Returns:
        The work (with async_op), else None.
    """
    rank, _ = group_rank_and_size(process_group)
    parts = [flat[start : start + length] for start, length in zip(starts, lengths, strict=True)]
    if lengths[0] and all(length == lengths[0] for length in lengths):
        whole = flat[starts[0] : starts[0] + lengths[0] * len(lengths)]
        return dist.reduce_scatter_tensor(parts[rank], whole, group=process_group, async_op=async_op)
    return dist.reduce_scatter(parts[rank], parts, group=process_group, async_op=async_op)


def all_gather(flat: torch.Tensor, slices: torch.Tensor, rank: int, process_group, *, async_op: bool = False):
    """Every slice of `flat` from its rank, whole slices (padding included); the work with async_op."""
    return dist.all_gather_into_tensor(flat, slices[rank], group=process_group, async_op=async_op)


def reduce_scatter(flat: torch.Tensor, slices: torch.Tensor, rank: int, process_group):
    """Start summing slice `rank` of `flat` over the ranks into a new tensor.

    Returns:
        (work, finish): wait for the work, then `finish()` copies the sum into this rank's slice of `flat`.
    """
    out = torch.empty_like(slices[rank])
    work = dist.reduce_scatter_tensor(out, flat, group=process_group, async_op=True)
    return work, lambda: slices[rank].copy_(out)

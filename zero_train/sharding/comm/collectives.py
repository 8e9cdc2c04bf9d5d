"""The few collectives the sharders use, on flat buffers whose rank parts are given as (starts, lengths).

Each one chooses its backend's path here, in one line: gloo.py (our point-to-point rings and exchanges:
gloo's own reduce-scatter and all-gather are slower) or nccl.py (torch's collectives, NCCL's rings; any
backend but gloo). With one rank nothing travels.

    reduce_to_owners_(flat, ...)        part r of `flat` summed over the ranks onto rank r   (ZeRO-1, ZeRO-2)
    all_gather_(flat, ...)              slice r of `flat` from rank r to every rank          (ZeRO-1, ZeRO-2)
    all_reduce_(tensor, ...)            a small tensor (norms, flags) summed on every rank   (every stage)
    gather_slices(flat, ...)            asynchronous all-gather of equal slices              (ZeRO-3)
    reduce_scatter_slices(flat, ...)    asynchronous reduce-scatter of equal slices          (ZeRO-3)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from zero_train.sharding.comm import gloo, nccl
from zero_train.sharding.comm.groups import group_rank_and_size, uses_p2p_rings


def reduce_to_owners_(
    flat: torch.Tensor,
    recv_buffer: torch.Tensor | None,
    process_group=None,
    *,
    starts,
    lengths,
    async_op=False,
):
    """Sum part r of `flat` (`starts[r]`, `lengths[r]`) over the ranks onto rank r (other parts: partial sums).

    gloo: our ring (synchronous; overlap.py runs it on a communication thread). Other backends: one
    `nccl.reduce_scatter_parts` (one collective for the whole bucket).

    Returns:
        With async_op (not gloo): the works to wait on; else an empty list.
    """
    rank, world_size = group_rank_and_size(process_group)
    if world_size == 1:
        return []
    if uses_p2p_rings(process_group):
        assert not async_op, "the gloo ring is synchronous"
        gloo.ring_reduce_(flat, recv_buffer, process_group, starts, lengths)
        return []
    work = nccl.reduce_scatter_parts(flat, process_group, starts=starts, lengths=lengths, async_op=async_op)
    return [work] if async_op else []


def all_gather_(flat: torch.Tensor, process_group=None, *, lengths: list[int] | None = None) -> None:
    """Copy every rank's slice of `flat` to all ranks (in place: slice r comes from rank r).

    Args:
        flat: buffer of world_size equal slices; this rank's slice holds its values.
        process_group: the data-parallel group (None: default).
        lengths: elements at the start of each slice that carry data (gloo: only those travel);
            None: whole slices.
    """
    rank, world_size = group_rank_and_size(process_group)
    if world_size == 1:
        return
    slices = flat.view(world_size, -1)
    if not uses_p2p_rings(process_group):
        nccl.all_gather(flat, slices, rank, process_group)
        return
    gloo.ring_all_gather_(slices, process_group, lengths or [slices.shape[1]] * world_size)


def all_reduce_(tensor: torch.Tensor, process_group=None, op=dist.ReduceOp.SUM) -> None:
    """Reduce a small tensor (norms, flags) over the ranks, in place."""
    if group_rank_and_size(process_group)[1] > 1:
        dist.all_reduce(tensor, op=op, group=process_group)


class Pending:
    """An operation in flight: `wait()` blocks until its result is in place (idempotent)."""

    def __init__(self, works: list, finish=None):
        self._works, self._finish = works, finish

    def wait(self) -> None:
        """Wait for every message or collective of the operation, then finish it (the gloo sums)."""
        for work in self._works:
            work.wait()
        self._works = []
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()


def gather_slices(flat: torch.Tensor, process_group=None, *, tag: int = 0) -> Pending:
    """Start filling every slice of `flat` from its rank (this rank's slice holds its values already).

    `flat` holds N equal slices of P elements, contiguous. The call does not block: the caller computes while
    the bytes travel (ZeRO-3 prefetches the next block's gather) and waits when it needs them. Bytes each rank
    sends: (N - 1) P elements, what a ring sends.

    Args:
        flat: N equal slices, contiguous.
        process_group: the data-parallel group (None: the default group).
        tag: distinguishes this operation's messages from others in flight (gloo).
    """
    rank, world_size = group_rank_and_size(process_group)
    if world_size == 1:
        return Pending([])
    slices = flat.view(world_size, -1)
    if not uses_p2p_rings(process_group):
        return Pending([nccl.all_gather(flat, slices, rank, process_group, async_op=True)])
    return Pending(gloo.exchange_gather(slices, process_group, tag=tag))


def reduce_scatter_slices(flat: torch.Tensor, process_group=None, *, tag: int = 0) -> Pending:
    """Start summing slice `rank` of `flat` over the ranks into this rank's slice (the others: unchanged).

    The same shape as gather_slices above, the other direction: each is one NCCL call or one gloo exchange.

    Summation order (deterministic): on gloo own + rank 0's + rank 1's + ... (skipping its own); at N = 2 that
    is the same number as any all-reduce's a + b. The caller keeps `flat` alive until `wait()`.

    Args:
        flat: N equal slices of the gradients to sum, contiguous.
        process_group: the data-parallel group (None: the default group).
        tag: distinguishes this operation's messages from others in flight (gloo).
    """
    rank, world_size = group_rank_and_size(process_group)
    if world_size == 1:
        return Pending([])
    slices = flat.view(world_size, -1)
    if not uses_p2p_rings(process_group):
        work, finish = nccl.reduce_scatter(flat, slices, rank, process_group)
        return Pending([work], finish=finish)
    works, finish = gloo.exchange_reduce_scatter(slices, process_group, tag=tag)
    return Pending(works, finish=finish)

"""ZeRO-3's two collectives, both asynchronous: gather a unit's slices, reduce-scatter its gradients.

    pending = gather_slices(flat, rank, process_group, tag=...)     # flat[r P:(r+1) P] <- rank r's slice
    pending = reduce_scatter_slices(flat, rank, process_group, tag=...)   # flat[rank P:(rank+1) P] <- the
    ...                                                             #   sum over the ranks of that slice
    pending.wait()                                                  # before reading the result

`flat` holds N equal slices of P elements; this rank's own slice is both its contribution and the result.
Neither call blocks: the caller computes while the bytes travel and waits when it needs them (the next
block's gather is prefetched while this one computes; a block's gradients travel while backward goes on).

NCCL (and any backend but gloo): torch's all_gather_into_tensor / reduce_scatter_tensor with async_op=True,
real rings on NCCL's stream. gloo: every rank posts its N-1 sends and N-1 receives at once (isend/irecv, a
direct exchange); the reduce-scatter adds what it received when waited for, in rank order after its own
part: 3-5x faster than gloo's own collectives on loopback (docs/zero3.md#communication-3-psi-per-step).
Bytes each rank sends per call: (N - 1) P elements, what a ring sends; so a step sends the ZeRO paper's
3 Psi summed over the ranks, per (N - 1) / N: one gather in forward, one in backward, one reduce-scatter.

Messages carry a tag per (unit, collective), so operations in flight at the same time (a gather of the next
block, a reduce-scatter of the last) never pair the wrong buffers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from zero_train.sharding.collectives import global_rank, group_rank_and_size, uses_p2p_rings


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
        return Pending([dist.all_gather_into_tensor(flat, slices[rank], group=process_group, async_op=True)])
    works = []
    for peer in range(world_size):
        if peer != rank:
            works.append(
                dist.irecv(slices[peer], src=global_rank(peer, process_group), group=process_group, tag=tag)
            )
    for peer in range(world_size):
        if peer != rank:
            works.append(
                dist.isend(slices[rank], dst=global_rank(peer, process_group), group=process_group, tag=tag)
            )
    return Pending(works)


def reduce_scatter_slices(flat: torch.Tensor, process_group=None, *, tag: int = 0) -> Pending:
    """Start summing slice `rank` of `flat` over the ranks into this rank's slice (the others: unchanged).

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
        out = torch.empty_like(slices[rank])
        work = dist.reduce_scatter_tensor(out, flat, group=process_group, async_op=True)
        return Pending([work], finish=lambda: slices[rank].copy_(out))
    peers = [peer for peer in range(world_size) if peer != rank]
    received = torch.empty((len(peers), slices.shape[1]), dtype=flat.dtype, device=flat.device)
    works = [
        dist.irecv(received[k], src=global_rank(peer, process_group), group=process_group, tag=tag)
        for k, peer in enumerate(peers)
    ]
    for peer in peers:
        works.append(
            dist.isend(slices[peer], dst=global_rank(peer, process_group), group=process_group, tag=tag)
        )

    def add_received() -> None:
        for k in range(len(peers)):
            slices[rank].add_(received[k])

    return Pending(works, finish=add_received)

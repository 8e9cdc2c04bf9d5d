"""The layout's part in the peak model of our ZeRO-1/2 and torch-zero: what each rank owns, and what it costs.

Our sharders (zero_train.sharding) lay the tensors end to end in one flat buffer and give rank r the slice
[r P, (r + 1) P), P = ceil(Psi / N), tensors split at the cuts (sharding.partition): a rank owns P elements
(the last ones with data fewer, those past the end none) and updates its pieces, the largest of which sizes its
optimizer's temporaries. That is DeepSpeed's slicing, so the ranks that differ are DeepSpeed's distinct
partitions (flat_partition: at most 2 T + 6 of them at any N) and the ranks around the end of the data. The
padding (N P - Psi), ZeRO-2's buckets and the gloo ring's receive buffer follow in closed form from the bucket
groups (sharding.comm.buckets.bucket_groups, which do not depend on N).

torch's ZeroRedundancyOptimizer gives WHOLE tensors to ranks, sorted-greedy (largest first, to the least loaded
rank, lowest rank on ties); ranks that own nothing are alike and those that own something are at most the T
tensors, found with a heap (T log N, not the T x N scan).

tests/memory/test_rank_scaling.py checks every field against the sharders' own partition, buckets and accounting and
torch's greedy at small N, rank by rank.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from zero_train.memory.model.flat_partition import partition_of, slice_elements
from zero_train.memory.model.peak_terms import Run, our_gradient_bytes
from zero_train.sharding import accounting
from zero_train.sharding.accounting import default_bucket_elements
from zero_train.sharding.comm import gloo
from zero_train.sharding.comm.buckets import bucket_groups


@dataclass(kw_only=True, slots=True, frozen=True)
class Share:
    """What one rank owns: our ZeRO-1/2's slice of the flat buffer, torch's ZeroRedundancyOptimizer's tensors."""

    rank: int
    """The rank."""
    owned: int
    """Parameter elements whose optimizer state (and fp32 master) the rank holds."""
    largest: int
    """Elements of the largest tensor (or piece of one) it updates (its AdamW temporaries)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class SharderLayout:
    """What the peak model needs of one run's layout."""

    shares: tuple[Share, ...]
    """The lowest rank of every distinct share, in rank order (every other rank owns what one listed owns)."""
    share_of: Callable[[int], Share]
    """Any rank's share (0 <= rank < N)."""
    alike: bool
    """Every rank owns the same (one rank, or tensor sizes unknown: an even split)."""
    partition_elements: int = 0
    """Ours: P, the elements of one rank's slice of the flat buffers."""
    padding_elements: int = 0
    """Ours: padding elements in ONE flat buffer (N P - Psi, at its end)."""
    copied_bucket: int = 0
    """Ours (ZeRO-2): elements of the largest bucket that is copied (a tensor of reduce_bucket_size or more is not)."""
    largest_bucket: int = 0
    """Ours (ZeRO-2): elements of the largest bucket (its gradients wait for it)."""
    receive_elements: int = 0
    """Ours, on gloo with N > 1: the reduction ring's receive buffer (the largest any bucket needs)."""

    def share(self, rank: int) -> Share:
        """Rank `rank`'s share."""
        return self.shares[0] if self.alike else self.share_of(rank)


def _flat_share(run: Run, rank: int) -> Share:
    part = partition_of(run.shape, run.world_size, rank)
    owned = max(0, min((rank + 1) * part.elements, run.trained) - rank * part.elements)
    return Share(rank=rank, owned=owned, largest=part.largest_piece)


def sharder_layout(run: Run) -> SharderLayout:
    """Our sharders' element-balanced layout of `run`'s tensors (without tensor sizes: one tensor, an even split)."""
    psi, world_size, numels = run.trained, run.world_size, run.shape.trained_numels
    size = max(1, slice_elements(run.shape, world_size))
    tensors = numels or (psi,)
    if numels:
        filled = -(-psi // size)  # ranks holding data; the last of them may hold fewer than P
        # a full slice, the last one with data, the first without: the phases read a share's `owned` only
        # (foreach / fused optimizers: temporaries per updated element), so these stand for every rank
        ranks = {0, filled - 1, min(filled, world_size - 1)}
        distinct: dict[int, Share] = {}
        for share in sorted((_flat_share(run, rank) for rank in ranks), key=lambda share: share.rank):
            distinct.setdefault(share.owned, share)
        shares = tuple(distinct.values())
    else:
        shares = (Share(rank=0, owned=size, largest=min(run.largest_tensor, size)),)
    copied, largest, receive = _buckets(run, tensors, size)
    return SharderLayout(
        shares=shares,
        share_of=lambda rank: _flat_share(run, rank),
        alike=world_size == 1 or not numels,
        partition_elements=size,
        padding_elements=size * world_size - psi,
        copied_bucket=copied,
        largest_bucket=largest,
        receive_elements=receive,
    )


def _buckets(run: Run, numels: tuple[int, ...], size: int) -> tuple[int, int, int]:
    """ZeRO-2's buckets (sharding.comm.buckets.gradient_buckets), each from its flat range [start, stop) and P alone:
    (largest copied bucket, largest bucket, the gloo ring's receive buffer for the largest need)."""
    bucket_elements, world_size = our_bucket_elements(run, numels), run.world_size
    p2p = accounting.uses_p2p_backend(run.backend, world_size)
    in_place = our_gradient_bytes(run)[1] == run.element_bytes  # else a direct bucket is copied too
    offsets = [0]
    for numel in numels:
        offsets.append(offsets[-1] + numel)
    copied = largest = receive = 0
    for group in bucket_groups(numels, bucket_elements):
        start, stop = offsets[group[0]], offsets[group[-1] + 1]
        direct = len(group) == 1 and numels[group[0]] >= bucket_elements and in_place
        copied = copied if direct else max(copied, stop - start)
        largest = max(largest, stop - start)
        if p2p:
            first, last = start // size, (stop - 1) // size  # the ranks whose slice the bucket overlaps
            ends = (stop - start,) if first == last else ((first + 1) * size - start, stop - last * size)
            part = max(*ends, size if last - first >= 2 else 0)
            need = gloo.ring_receive_elements_of(
                parts=world_size, nonempty=last - first + 1, total=stop - start, largest=part
            )
            receive = max(receive, need)
    return copied, largest, receive


def our_bucket_elements(run: Run, numels: tuple[int, ...]) -> int:
    """The bucket size our zero1/zero2 engines use (engines/zero1.py reduce_bucket_size): the config's, else
    sharding.accounting.default_bucket_elements over the trainable tensors."""
    given = run.deepspeed.reduce_bucket_given
    return given if given is not None else default_bucket_elements(numels, run.deepspeed.reduce_bucket_size)


def whole_tensor_layout(run: Run) -> SharderLayout:
    """torch's ZeroRedundancyOptimizer's shares of `run`'s tensors (without tensor sizes: one even share that
    updates the largest known tensor)."""
    numels, world_size = run.shape.trained_numels, run.world_size
    if not numels:
        even = Share(rank=0, owned=-(-run.trained // world_size), largest=run.largest_tensor)
        return SharderLayout(shares=(even,), share_of=lambda rank: even, alike=True)
    loads: dict[int, int] = {}
    largest: dict[int, int] = {}
    for numel, owner in zip(numels, _greedy(numels, world_size), strict=True):
        loads[owner] = loads.get(owner, 0) + numel
        largest[owner] = max(largest.get(owner, 0), numel)
    by_rank = {rank: Share(rank=rank, owned=loads[rank], largest=largest[rank]) for rank in sorted(loads)}
    idle = [Share(rank=len(by_rank), owned=0, largest=0)] if len(by_rank) < world_size else []
    distinct: dict[tuple[int, int], Share] = {}
    for share in [*by_rank.values(), *idle]:
        distinct.setdefault((share.owned, share.largest), share)
    return SharderLayout(
        shares=tuple(sorted(distinct.values(), key=lambda share: share.rank)),
        share_of=lambda rank: by_rank.get(rank, Share(rank=rank, owned=0, largest=0)),
        alike=world_size == 1,
    )


def _greedy(numels: tuple[int, ...], world_size: int) -> list[int]:
    """Owner of each tensor under sorted-greedy (largest first, to the least loaded rank, lowest on ties), in
    T log N: ranks never chosen have load 0 and the lowest of them is the next in order (`fresh`), so the least
    loaded rank is that one or the top of a heap of the ranks already chosen, whichever (load, rank) is smaller."""
    owners = [0] * len(numels)
    chosen: list[tuple[int, int]] = []  # (load, rank)
    fresh = 0
    for index in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        if fresh < world_size and (not chosen or (0, fresh) < chosen[0]):
            load, rank, fresh = 0, fresh, fresh + 1
        else:
            load, rank = heapq.heappop(chosen)
        owners[index] = rank
        heapq.heappush(chosen, (load + numels[index], rank))
    return owners


def zero1_comm_buffers(run: Run, layout: SharderLayout) -> int:
    """Our ZeRO-1's padding of its two flat buffers plus, on gloo (N > 1), the ring's receive buffer (the
    sharder's own accounting.zero1_buffers, on the layout's numbers)."""
    e, receive, c = run.element_bytes, layout.receive_elements, our_gradient_bytes(run)[1]
    return accounting.BufferBytes(
        padding=layout.padding_elements * e,
        receive_elements=receive,
        receive=receive * c,
        partition_elements=layout.partition_elements,
        flat_buffers=2,
    ).comm_buffers


def zero2_buffers(run: Run, layout: SharderLayout) -> tuple[int, int]:
    """Our ZeRO-2's (comm_buffers bytes, largest bucket in elements): padding of the flat parameter buffer, the
    two bucket buffers and on gloo the receive buffer (the sharder's own accounting.zero2_buffers, on the layout's
    numbers)."""
    e, receive, c = run.element_bytes, layout.receive_elements, our_gradient_bytes(run)[1]
    buffers = accounting.BufferBytes(
        padding=layout.padding_elements * e,
        receive_elements=receive,
        receive=receive * c,
        partition_elements=layout.partition_elements,
        flat_buffers=1,
        bucket=2 * layout.copied_bucket * c,
    )
    return buffers.comm_buffers, layout.largest_bucket

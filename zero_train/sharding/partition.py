"""Which rank owns which parameter, and where each parameter lives in the flat buffers (pure arithmetic).

ZeRO-1 (the ZeRO paper's P_os, arXiv:1910.02054 section 5.1) gives each of the N data-parallel ranks
the optimizer state of about 1/N of the parameters. We assign WHOLE tensors to ranks, sorted-greedy
like torch's ZeroRedundancyOptimizer: largest tensor first, each to the least-loaded rank. Whole
tensors keep every optimizer exact (the update, the per-tensor gradient norm and the state of a
tensor never straddle two ranks), at the cost of an imbalance of at most one tensor.

The flat buffers (gradients, parameters) are laid out by owner: rank 0's tensors first, then rank
1's, ..., each rank's region padded to the size of the largest one, so that a rank's region is one
contiguous slice and a reduce-scatter / all-gather over equal chunks moves exactly the regions:

    | rank 0: t3 t0 ..... pad | rank 1: t1 t2 ....... | rank 2: t4 ........ pad |
    <------ region_size ------>

Nothing here talks to other processes; `tests/test_partition.py` checks it without spawning any.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def greedy_owners(
    numels: Sequence[int], world_size: int, start_loads: Sequence[int] | None = None
) -> list[int]:
    """Owner rank of each tensor: sorted-greedy (largest first, to the least-loaded rank, lowest rank on ties).

    Args:
        numels: element count of each tensor.
        world_size: number of ranks sharing the optimizer state.
        start_loads: elements each rank already owns (when a param group is added later).

    Returns:
        owners[i] = the rank that owns tensor i.
    """
    assert world_size >= 1
    loads = list(start_loads) if start_loads is not None else [0] * world_size
    assert len(loads) == world_size
    owners = [0] * len(numels)
    for index in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        owners[index] = rank
        loads[rank] += numels[index]
    return owners


@dataclass(frozen=True, slots=True)
class FlatLayout:
    """Where every tensor sits in a flat buffer of `world_size * region_size` elements."""

    numels: tuple[int, ...]
    """Element count of each tensor (in parameter order)."""
    owners: tuple[int, ...]
    """Rank that owns each tensor."""
    offsets: tuple[int, ...]
    """Start of each tensor in the flat buffer."""
    region_size: int
    """Elements per rank region (the largest rank's load; the others are padded up to it)."""
    world_size: int
    """Number of ranks."""
    active: tuple[bool, ...] = ()
    """Whether each tensor is trainable now; in each region the trainable ones come first (default: all)."""

    @property
    def total_size(self) -> int:
        """Elements in the flat buffer, padding included."""
        return self.region_size * self.world_size

    def region(self, rank: int) -> tuple[int, int]:
        """[start, stop) of `rank`'s contiguous region in the flat buffer."""
        return rank * self.region_size, (rank + 1) * self.region_size

    def owned(self, rank: int) -> list[int]:
        """Indices of the tensors `rank` owns, in buffer order."""
        return [i for i, owner in enumerate(self.owners) if owner == rank]

    def loads(self) -> list[int]:
        """Elements (without padding) each rank owns."""
        loads = [0] * self.world_size
        for numel, owner in zip(self.numels, self.owners, strict=True):
            loads[owner] += numel
        return loads

    def active_loads(self) -> list[int]:
        """Elements of the trainable tensors each rank owns: the prefix of each region that travels."""
        loads = [0] * self.world_size
        for numel, owner, active in zip(self.numels, self.owners, self.active, strict=True):
            loads[owner] += numel if active else 0
        return loads

    def padding(self) -> int:
        """Padding elements in the whole flat buffer."""
        return self.total_size - sum(self.numels)


def flat_layout(
    numels: Sequence[int], owners: Sequence[int], world_size: int, active: Sequence[bool] | None = None
) -> FlatLayout:
    """Lay the tensors out by owner: each rank's tensors contiguous (in index order) in its own region.

    Args:
        numels: element count of each tensor.
        owners: owner rank of each tensor (from `greedy_owners`).
        world_size: number of ranks.
        active: whether each tensor is trainable now (default: all). In each region the trainable
            tensors come first, so that the prefix which travels (`active_loads`) is contiguous.

    Returns:
        The layout; regions are all `max(loads)` elements long (at least 1, so no collective is empty).
    """
    assert len(numels) == len(owners)
    active = tuple(active) if active is not None else (True,) * len(numels)
    loads = [0] * world_size
    local_offsets = [0] * len(numels)
    for first in (True, False):  # trainable tensors first, then the frozen ones
        for index, (numel, owner) in enumerate(zip(numels, owners, strict=True)):
            if active[index] == first:
                local_offsets[index] = loads[owner]
                loads[owner] += numel
    region_size = max(max(loads), 1)
    offsets = tuple(owners[i] * region_size + local_offsets[i] for i in range(len(numels)))
    return FlatLayout(
        numels=tuple(numels),
        owners=tuple(owners),
        offsets=offsets,
        region_size=region_size,
        world_size=world_size,
        active=active,
    )


def balance_report(layout: FlatLayout, element_size: int) -> dict:
    """How evenly the parameters are spread (bytes of parameters each rank owns, and the padding).

    Args:
        layout: the flat layout.
        element_size: bytes per element (4 for fp32, 2 for bf16/fp16).

    Returns:
        {"bytes_per_rank": [...], "max_bytes", "min_bytes", "max_over_mean", "padding_bytes",
        "tensors_per_rank": [...]} ; max_over_mean is 1.0 for a perfect balance.
    """
    loads = layout.loads()
    mean = sum(loads) / layout.world_size
    tensors = [0] * layout.world_size
    for owner in layout.owners:
        tensors[owner] += 1
    return dict(
        bytes_per_rank=[load * element_size for load in loads],
        max_bytes=max(loads) * element_size,
        min_bytes=min(loads) * element_size,
        max_over_mean=(max(loads) / mean) if mean else 1.0,
        padding_bytes=layout.padding() * element_size,
        tensors_per_rank=tensors,
    )


@dataclass(frozen=True, slots=True)
class Bucket:
    """Tensors whose gradients ZeRO-2 reduces to their owners together, laid out by owner in one flat piece.

    Region r of the piece (`starts[r]`, `lengths[r]`) holds the tensors rank r owns, so one ring delivers
    to every owner the sum of exactly its tensors.
    """

    indices: tuple[int, ...]
    """Tensor indices (into the layout), in the order they sit in the piece."""
    offsets: tuple[int, ...]
    """Start of each of them in the piece."""
    starts: tuple[int, ...]
    """Start of each rank's region in the piece."""
    lengths: tuple[int, ...]
    """Elements of each rank's region."""
    direct: bool
    """A single tensor at least as large as the bucket: reduced in its own gradient, not copied."""

    @property
    def size(self) -> int:
        """Elements in the piece."""
        return sum(self.lengths)


def gradient_buckets(layout: FlatLayout, bucket_elements: int) -> list[Bucket]:
    """The trainable tensors in buckets of at most `bucket_elements`, in backward order (last tensor first).

    Backward produces gradients roughly in reverse parameter order, so buckets of consecutive tensors
    taken from the end fill one after the other. A tensor of `bucket_elements` or more is a bucket alone
    (`direct`). Frozen tensors (layout.active False) are in no bucket.

    Args:
        layout: the owner-ordered layout (its owners and active flags).
        bucket_elements: the DeepSpeed config's zero_optimization.reduce_bucket_size.

    Returns:
        The buckets, in the order every rank reduces them.
    """
    assert bucket_elements >= 1
    groups: list[list[int]] = []
    current: list[int] = []
    for index in reversed(range(len(layout.numels))):
        numel = layout.numels[index]
        if not layout.active[index]:
            continue
        if numel >= bucket_elements:
            groups.append([index])
            continue
        if current and sum(layout.numels[i] for i in current) + numel > bucket_elements:
            groups.append(current)
            current = []
        current.append(index)
    if current:
        groups.append(current)
    return [_bucket(layout, group, bucket_elements) for group in groups]


def _bucket(layout: FlatLayout, group: list[int], bucket_elements: int) -> Bucket:
    """Lay one bucket's tensors out by owner (each rank's tensors contiguous, in backward order)."""
    ordered = sorted(group, key=lambda i: layout.owners[i])  # stable: backward order within an owner
    lengths = [0] * layout.world_size
    for index in ordered:
        lengths[layout.owners[index]] += layout.numels[index]
    starts = [sum(lengths[:rank]) for rank in range(layout.world_size)]
    offsets, filled = [], list(starts)
    for index in ordered:
        owner = layout.owners[index]
        offsets.append(filled[owner])
        filled[owner] += layout.numels[index]
    direct = len(group) == 1 and layout.numels[group[0]] >= bucket_elements
    return Bucket(
        indices=tuple(ordered),
        offsets=tuple(offsets),
        starts=tuple(starts),
        lengths=tuple(lengths),
        direct=direct,
    )

"""Which rank owns which elements of a flat buffer, and where each tensor sits in it (pure arithmetic).

The tensors lie end to end in one flat buffer, padded to N P elements and cut into N equal slices of
P = ceil(Psi / N); rank r owns [r P, (r + 1) P), and a tensor crossing a cut is split into pieces (ZeRO paper,
P_os). Gradients travel in buckets of whole tensors, in backward order. Picture and reasons: docs/sharding.md.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Piece:
    """The part of one tensor that lies in one rank's slice."""

    index: int
    """The tensor (its position in the partition's `numels`)."""
    tensor_offset: int
    """First element of the piece in the flattened tensor."""
    length: int
    flat_offset: int
    """Where the piece starts in the flat buffer."""
    whole: bool
    """The piece is the entire tensor (it was not split)."""

    def within(self, start: int) -> slice:
        """Its elements in a buffer that begins at flat element `start` (a rank's slice: rank_range(rank)[0])."""
        return slice(self.flat_offset - start, self.flat_offset - start + self.length)


@dataclass(frozen=True, slots=True)
class FlatPartition:
    """Tensors laid end to end in a flat buffer of `world_size` equal slices (build with `flat_partition`)."""

    numels: tuple[int, ...]
    """Element count of each tensor, in buffer order."""
    world_size: int
    offsets: tuple[int, ...]
    """Start of each tensor in the flat buffer."""
    partition_size: int
    """P = ceil(sum(numels) / N) elements per slice (at least 1, so that no collective is empty)."""

    @property
    def num_elements(self) -> int:
        """Elements of the tensors (without padding)."""
        return sum(self.numels)

    @property
    def total_size(self) -> int:
        """Elements in the flat buffer, padding included: N * P."""
        return self.partition_size * self.world_size

    def rank_range(self, rank: int) -> tuple[int, int]:
        """[start, stop) of `rank`'s slice in the flat buffer."""
        return rank * self.partition_size, (rank + 1) * self.partition_size

    def loads(self) -> list[int]:
        """Elements of data (without padding) each rank owns."""
        data, size = self.num_elements, self.partition_size  # a sum over the tensors: once, not once per rank
        return [min(size, max(0, data - rank * size)) for rank in range(self.world_size)]

    def pieces(self, rank: int) -> tuple[Piece, ...]:
        """The pieces of tensors inside `rank`'s slice, in buffer order."""
        start, stop = self.rank_range(rank)
        first = max(0, bisect.bisect_right(self.offsets, start) - 1)
        pieces = []
        for index in range(first, len(self.numels)):
            offset, numel = self.offsets[index], self.numels[index]
            if offset >= stop:
                break
            low, high = max(start, offset), min(stop, offset + numel)
            if high > low:
                pieces.append(Piece(index, low - offset, high - low, low, whole=high - low == numel))
        return tuple(pieces)


def flat_partition(numels: Sequence[int], world_size: int) -> FlatPartition:
    """The tensors of these sizes end to end, cut into `world_size` equal slices (padding at the end)."""
    assert world_size >= 1
    offsets = tuple(itertools.accumulate(numels, initial=0))[:-1]
    partition_size = max(1, -(-sum(numels) // world_size))
    return FlatPartition(
        numels=tuple(numels), world_size=world_size, offsets=offsets, partition_size=partition_size
    )


@dataclass(frozen=True, slots=True)
class Bucket:
    """Consecutive whole tensors whose gradients are reduced together: the flat range [start, stop); rank r's
    part (`starts[r]`, `lengths[r]`, relative to `start`) is where it overlaps rank r's slice."""

    indices: tuple[int, ...]
    """Tensors in the bucket, in buffer order."""
    start: int
    stop: int
    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    direct: bool
    """A single tensor at least as large as the bucket size: ZeRO-2 reduces it in its own gradient."""

    @property
    def size(self) -> int:
        """Elements in the bucket."""
        return self.stop - self.start


def gradient_buckets(
    partition: FlatPartition, bucket_elements: int | None, active: Sequence[bool] | None = None
) -> list[Bucket]:
    """The trainable tensors in buckets of at most `bucket_elements` (None: no limit), in backward order.

    A frozen tensor (`active` False) ends a bucket and travels in none; a tensor of `bucket_elements` or more
    is a bucket alone (`direct`).
    """
    bucket_elements = partition.num_elements + 1 if bucket_elements is None else bucket_elements
    return [
        _bucket(partition, group, bucket_elements)
        for group in bucket_groups(partition.numels, bucket_elements, active)
    ]


def bucket_groups(
    numels: Sequence[int], bucket_elements: int, active: Sequence[bool] | None = None
) -> list[list[int]]:
    """The tensors (indices, ascending) of each of `gradient_buckets`' buckets, in the same order: the grouping
    alone, which depends on the tensor sizes and not on the ranks (the memory model reads it at any N)."""
    assert bucket_elements >= 1
    active = tuple(active) if active is not None else (True,) * len(numels)
    groups: list[list[int]] = []
    current: list[int] = []
    for index in reversed(range(len(numels))):
        numel = numels[index]
        if not active[index] or numel >= bucket_elements:
            if current:
                groups.append(current)
            current = []
            if active[index] and numel:
                groups.append([index])
            continue
        if current and sum(numels[i] for i in current) + numel > bucket_elements:
            groups.append(current)
            current = []
        current.append(index)
    if current:
        groups.append(current)
    return [sorted(group) for group in groups if sum(numels[i] for i in group)]


def _bucket(partition: FlatPartition, indices: list[int], bucket_elements: int) -> Bucket:
    start = partition.offsets[indices[0]]
    stop = partition.offsets[indices[-1]] + partition.numels[indices[-1]]
    starts, lengths = [], []
    for rank in range(partition.world_size):
        low, high = partition.rank_range(rank)
        low, high = max(low, start), min(high, stop)
        starts.append(low - start if high > low else 0)
        lengths.append(max(0, high - low))
    direct = len(indices) == 1 and partition.numels[indices[0]] >= bucket_elements
    return Bucket(
        indices=tuple(indices),
        start=start,
        stop=stop,
        starts=tuple(starts),
        lengths=tuple(lengths),
        direct=direct,
    )

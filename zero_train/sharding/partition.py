"""Which rank owns which elements of a flat buffer, and where each tensor sits in it (pure arithmetic).

The tensors lie end to end in one flat buffer, padded to N P elements and cut into N equal slices of
P = ceil(Psi / N); rank r owns [r P, (r + 1) P), and a tensor crossing a cut is split into pieces (ZeRO paper,
P_os). Picture and reasons: docs/sharding.md; the buckets gradients travel in: comm/buckets.py.
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

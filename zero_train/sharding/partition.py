"""Which rank owns which elements of the flat buffers, and where each tensor sits in them (pure arithmetic).

ZeRO-1 (the ZeRO paper's P_os, arXiv:1910.02054 section 5.1) gives each of the N data-parallel ranks
the optimizer state of 1/N of the parameters. As DeepSpeed does, we lay the tensors end to end in ONE
flat buffer (parameter order), pad it to a multiple of N (padding < N elements) and cut it into N equal
slices of P = ceil(Psi / N) elements; rank r owns the slice [r P, (r + 1) P). A tensor that crosses a
cut is split: each owner updates its own piece.

    tensors  |- t0 -|------------------ t1 (embedding) ------------------|-- t2 --|- t3 -|pad|
    ranks    |<--------- rank 0 --------->|<--------- rank 1 --------->|<--------- rank 2 ---->|
    pieces   t0, t1[0:a]                   t1[a:a+P]                    t1[a+P:], t2, t3

    pieces(1) == (Piece(index=1, tensor_offset=a, length=P, flat_offset=P),)

Equal slices keep every rank's share of optimizer state, fp32 masters and (ZeRO-2) gradients at Psi/N
whatever the tensor sizes (whole tensors per rank could not split a large embedding), and one
reduce-scatter or all-gather over equal chunks moves exactly the slices. Splitting is exact for an
elementwise optimizer (SGD, Adam, AdamW: an element's update depends only on its own parameter, gradient
and state), the only kind the sharders accept (sharded.py); the global gradient norm adds every piece's
partial sum of squares (norms.py).

Gradients travel in buckets (ZeRO-2 during every backward, ZeRO-1 during the last one): contiguous runs
of whole tensors taken from the end of the buffer, since backward produces gradients roughly in reverse
parameter order. Inside a bucket, rank r's part is the bucket's overlap with its slice.

A FlatPartition is one flat buffer; the sharders keep one per group of tensors that became trainable
together (normally one for the whole model), and a ZeRO-3 can keep one per transformer block.
Nothing here talks to other processes; `tests/sharding/test_partition.py` checks it without spawning any.
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
    """Elements in the piece."""
    flat_offset: int
    """Where the piece starts in the flat buffer."""
    whole: bool
    """The piece is the entire tensor (it was not split)."""

    @property
    def in_tensor(self) -> slice:
        """Its elements in the flattened tensor."""
        return slice(self.tensor_offset, self.tensor_offset + self.length)

    def within(self, start: int) -> slice:
        """Its elements in a buffer that begins at flat element `start` (a rank's slice: rank_range(rank)[0])."""
        return slice(self.flat_offset - start, self.flat_offset - start + self.length)


@dataclass(frozen=True, slots=True)
class FlatPartition:
    """Tensors laid end to end in a flat buffer of `world_size` equal slices (build with `flat_partition`)."""

    numels: tuple[int, ...]
    """Element count of each tensor, in buffer order."""
    world_size: int
    """N, the number of slices."""
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

    def padding(self) -> int:
        """Padding elements at the end of the buffer (fewer than N when there is any data)."""
        return self.total_size - self.num_elements

    def rank_range(self, rank: int) -> tuple[int, int]:
        """[start, stop) of `rank`'s slice in the flat buffer."""
        return rank * self.partition_size, (rank + 1) * self.partition_size

    def loads(self) -> list[int]:
        """Elements of data (without padding) each rank owns."""
        data = self.num_elements  # a sum over the tensors: once, not once per rank
        return [max(0, min(stop, data) - start) for start, stop in map(self.rank_range, self.ranks)]

    @property
    def ranks(self) -> range:
        """range(N)."""
        return range(self.world_size)

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

    def pieces_of(self, index: int) -> tuple[tuple[int, Piece], ...]:
        """(rank, piece) for every rank holding part of tensor `index`, in rank order."""
        offset, numel = self.offsets[index], self.numels[index]
        if numel == 0:
            return ()
        first, last = offset // self.partition_size, (offset + numel - 1) // self.partition_size
        return tuple(
            (rank, piece)
            for rank in range(first, last + 1)
            for piece in self.pieces(rank)
            if piece.index == index
        )


def flat_partition(numels: Sequence[int], world_size: int) -> FlatPartition:
    """Lay the tensors end to end (in the given order) and cut the buffer into `world_size` equal slices.

    Args:
        numels: element count of each tensor.
        world_size: number of ranks sharing the buffer.

    Returns:
        The partition; padding (fewer than `world_size` elements) sits at the end.
    """
    assert world_size >= 1
    offsets = tuple(itertools.accumulate(numels, initial=0))[:-1]
    partition_size = max(1, -(-sum(numels) // world_size))
    return FlatPartition(
        numels=tuple(numels), world_size=world_size, offsets=offsets, partition_size=partition_size
    )


@dataclass(frozen=True, slots=True)
class Bucket:
    """Consecutive whole tensors whose gradients are reduced together: the flat range [start, stop).

    Rank r's part of the bucket (`starts[r]`, `lengths[r]`, relative to `start`) is where the bucket
    overlaps its slice, so one reduction delivers to every rank the sum of exactly the elements it owns.
    """

    indices: tuple[int, ...]
    """Tensors in the bucket, in buffer order."""
    start: int
    """First element of the bucket in the flat buffer."""
    stop: int
    """One past its last element."""
    starts: tuple[int, ...]
    """Start of each rank's part, relative to `start` (0 where the part is empty)."""
    lengths: tuple[int, ...]
    """Elements of each rank's part."""
    direct: bool
    """A single tensor at least as large as the bucket size: ZeRO-2 reduces it in its own gradient."""

    @property
    def size(self) -> int:
        """Elements in the bucket."""
        return self.stop - self.start


def gradient_buckets(
    partition: FlatPartition, bucket_elements: int | None, active: Sequence[bool] | None = None
) -> list[Bucket]:
    """The trainable tensors in buckets of at most `bucket_elements`, in backward order (last tensor first).

    A bucket is a contiguous run of trainable tensors: a frozen tensor (active False) ends it and travels
    in none. A tensor of `bucket_elements` or more is a bucket alone (`direct`).

    Args:
        partition: the flat partition.
        bucket_elements: the DeepSpeed config's zero_optimization.reduce_bucket_size; None: no limit (one
            bucket per run of trainable tensors).
        active: whether each tensor is trainable now (default: all).

    Returns:
        The buckets, in the order every rank reduces them.
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
    for rank in partition.ranks:
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

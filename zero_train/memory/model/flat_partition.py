"""DeepSpeed's flat partition, rank by rank, at any world size: one rank's slice, and the ranks that differ.

DeepSpeed ZeRO-1/2/3 flatten the parameters (in `model.parameters()` order) into one buffer and give rank r the
slice [r P, (r + 1) P), P = ceil(Psi / N), tensors split where the slices fall (padding < N elements). A rank's
memory depends on its slice only through `Partition`'s fields, so ranks whose fields are equal hold the same:
with T tensors at most 2 T + 6 ranks need looking at, whatever N is (`distinct_partitions`), each found by
bisection on the tensors' offsets (`partition_of`). tests/memory/test_rank_scaling.py checks both against every rank's
slice computed the plain way (pieces of every tensor) at small N.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from dataclasses import dataclass

from zero_train.memory.model.theory import ModelShape


@dataclass(kw_only=True, slots=True, frozen=True)
class Partition:
    """One rank's slice of DeepSpeed's flat parameter buffer (ZeRO-1/2: even slices, tensors split)."""

    rank: int
    """The rank."""
    elements: int
    """P = ceil(Psi / N), the slice's length."""
    touched: int
    """Elements of the WHOLE tensors that overlap the slice: ZeRO-1/2 size the gradients a rank keeps by the
    tensors in its partition (stage_1_and_2.py `grads_in_partition`), whole; measured on `tiny`, whose
    embedding is 82% of the model: 2.10 MB (rank 0) and 2.56 MB (rank 1) for 1.28 MB slices."""
    largest_piece: int
    """Elements of the largest part of one tensor inside the slice: DeepSpeed takes every gradient's norm in
    fp64 (zero/utils.py get_norm_dtype), one piece at a time, an 8-byte copy each (measured: +2.56 MB on
    `tiny`'s 320,384-element piece of its embedding)."""

    @property
    def key(self) -> tuple[int, int, int]:
        """What the memory of the rank depends on (ranks with equal keys hold the same)."""
        return self.elements, self.touched, self.largest_piece


def slice_elements(shape: ModelShape, world_size: int) -> int:
    """P = ceil(Psi / N), Psi the trained parameters (LoRA: the adapters; DeepSpeed and ours flatten only those)."""
    return -(-shape.trainable_params // world_size)


@functools.lru_cache(maxsize=16)
def _offsets(numels: tuple[int, ...]) -> list[int]:
    """Start of every tensor in the flat buffer, and the end of the last: T + 1 offsets."""
    return [0, *itertools.accumulate(numels)]


def partition_of(shape: ModelShape, world_size: int, rank: int) -> Partition:
    """Rank `rank`'s slice (without tensor sizes: one even slice whose largest piece is the largest known tensor).

    Args:
        shape: the model (its trained_numels, in parameter order).
        world_size: N.
        rank: 0 <= rank < N.
    """
    size, psi, numels = slice_elements(shape, world_size), shape.trainable_params, shape.trained_numels
    if not numels:
        largest = max(shape.trained_numels, default=shape.largest_layer_params)
        return Partition(rank=rank, elements=size, touched=size, largest_piece=min(largest, size))
    low, high = rank * size, min((rank + 1) * size, psi)
    if high <= low:  # past the end of the model: an empty slice
        return Partition(rank=rank, elements=size, touched=0, largest_piece=0)
    offsets = _offsets(numels)
    first = bisect.bisect_right(offsets, low, 0, len(numels)) - 1  # the last tensor starting at or before low
    if offsets[first + 1] <= low:  # it ends before `low`: the slice lies past the last tensor
        return Partition(rank=rank, elements=size, touched=0, largest_piece=0)
    stop = bisect.bisect_left(offsets, high, 0, len(numels))  # tensors from here on start at or after `high`
    pieces = [min(offsets[first + 1], high) - max(offsets[first], low)]
    if stop - 1 > first:
        pieces.append(min(offsets[stop], high) - max(offsets[stop - 1], low))
        pieces.extend(numels[first + 1 : stop - 1])  # the tensors wholly inside the slice
    return Partition(
        rank=rank, elements=size, touched=offsets[stop] - offsets[first], largest_piece=max(max(pieces), 0)
    )


@functools.lru_cache(maxsize=16)
def distinct_partitions(shape: ModelShape, world_size: int) -> tuple[Partition, ...]:
    """The lowest rank of every distinct partition (equal `key`), in rank order (cached: `zero-train plan` asks
    for the same model and world size with every set-up it tries).

    Every other rank equals one of these: a rank whose slice lies inside one tensor equals the first such rank
    of that tensor (its partition is known at once: the tensor, one full piece), unless it is the last, shorter
    slice; any other slice holds the start of a tensor or the end of the last one, or lies past it. So the
    ranks looked at are, per tensor, the one holding its start and the first one inside it, plus the first and
    last ranks and those around the end of the model: at most 2 T + 6, whatever N is.
    """
    size, psi, numels = slice_elements(shape, world_size), shape.trainable_params, shape.trained_numels
    if not numels:
        return (partition_of(shape, world_size, 0),)
    offsets = _offsets(numels)
    filled = -(-psi // size)  # ranks whose slice is not empty
    found: dict[int, Partition] = {}
    for index, numel in enumerate(numels):  # the first rank inside each tensor, when one lies inside it
        inside = -(-offsets[index] // size)
        if inside < world_size and (inside + 1) * size <= min(offsets[index + 1], psi):
            found.setdefault(inside, Partition(rank=inside, elements=size, touched=numel, largest_piece=size))
    past = -(-offsets[-1] // size)  # the first rank past the last tensor
    marks = {0, world_size - 1, filled - 1, filled, past, *(offset // size for offset in offsets)}
    for rank in marks - found.keys():
        if 0 <= rank < world_size:
            found[rank] = partition_of(shape, world_size, rank)
    distinct: dict[tuple[int, int, int], Partition] = {}
    for rank in sorted(found):
        distinct.setdefault(found[rank].key, found[rank])
    return tuple(distinct.values())

"""Which gradients travel together and in which order: buckets of whole tensors, launched in one order by all ranks.

A bucket is a run of consecutive whole tensors of one flat buffer (backward order, at most `bucket_elements`);
its reduction sums it over the ranks and leaves each rank the part that overlaps its slice (`starts`, `lengths`:
the reduce-scatter's arguments). BucketSchedule launches the buckets of every segment in one order, whatever order
backward delivered their gradients in, so the collectives of all ranks pair up. Buckets exist for the
communication alone (a single bucket gives the same result, with no overlap): DDP's Reducer and DeepSpeed's
reduce_bucket_size play the same part. Why and how large: docs/zero1.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zero_train.sharding.partition import FlatPartition


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


class BucketSchedule:
    """Every segment's buckets in one order, the newest segment's first: a bucket is launched once it and every
    bucket before it are complete, so all ranks reduce in the same order whatever order backward took."""

    def __init__(self, stores: Sequence, queue):
        """`stores`: a gradient store per segment, oldest first, each with `.buckets` and `.launch(k)`
        (zero12/backward.py's GradientStore); `queue`: waits for what they launch (overlap.ReductionQueue)."""
        self.queue = queue
        self.order = [(store, k) for store in reversed(stores) for k in range(len(store.buckets))]
        self._place = {
            (id(store), index): i
            for i, (store, k) in enumerate(self.order)
            for index in store.buckets[k].indices
        }  # (store, tensor index) -> its bucket's place; a frozen tensor is in none
        self._arrived = [0] * len(self.order)
        self._launched = 0

    def arrive(self, store, index: int) -> None:
        """The gradient of tensor `index` of `store`'s segment is complete; launch every bucket now due, in order."""
        place = self._place.get((id(store), index))
        if place is None:  # frozen: travels in no bucket
            return
        self._arrived[place] += 1
        while self._launched < len(self.order):
            store, k = self.order[self._launched]
            if self._arrived[self._launched] < len(store.buckets[k].indices):
                break
            store.launch(k)
            self._launched += 1

    def flush(self) -> None:
        """Launch every bucket not launched yet (missing gradients count as zeros), then wait for all."""
        while self._launched < len(self.order):
            store, k = self.order[self._launched]
            store.launch(k)
            self._launched += 1
        self.queue.wait_all()
        self._arrived = [0] * len(self.order)
        self._launched = 0

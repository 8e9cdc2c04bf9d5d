"""BucketSchedule: every segment's buckets reduced in one order on every rank, as soon as they are complete.

ZeRO-1 (in its boundary backward) and ZeRO-2 (in every backward) launch each bucket's reduction into the
ReductionQueue (comm/overlap.py) from the gradient hooks; this is the order they launch in. The stores it
launches, one per segment, share one interface (GradientStore): ZeRO-1's flat_grads.FlatGradients keeps every
gradient in one flat buffer, ZeRO-2's grad_buckets.GradientBuckets only the owned ones.
"""

from __future__ import annotations

import torch

from zero_train.sharding.comm.overlap import ReductionQueue
from zero_train.sharding.partition import Bucket, gradient_buckets
from zero_train.sharding.zero12.segments import Segment


class GradientStore:
    """One segment's gradients on their way to their owners: the interface of ZeRO-1's FlatGradients and
    ZeRO-2's GradientBuckets, and the buckets they share."""

    segment: Segment
    """The segment (its parameters, partition, this rank's slice, active flags)."""
    bucket_elements: int | None
    """The largest bucket, in elements (None: one bucket per run of trainable tensors)."""
    buckets: list[Bucket]
    """The segment's buckets of trainable tensors, in backward order (partition.gradient_buckets)."""
    bucket_of: dict[int, int]
    """Tensor index in the segment -> its bucket."""
    world_size: int
    """N, the divisor of the average."""
    queue: ReductionQueue
    """Where the bucket reductions are launched."""

    def __init__(
        self, segment: Segment, *, world_size: int, bucket_elements: int | None, queue: ReductionQueue
    ):
        self.segment, self.world_size, self.queue = segment, world_size, queue
        self.bucket_elements = bucket_elements

    def set_active(self, active: tuple[bool, ...]) -> None:
        """(Re)cut the buckets for the tensors trainable now (a frozen one travels in none)."""
        self.buckets = gradient_buckets(self.segment.partition, self.bucket_elements, active)
        self.bucket_of = {index: k for k, bucket in enumerate(self.buckets) for index in bucket.indices}

    def accept(self, param: torch.Tensor, *, boundary: bool) -> None:
        """`param`'s gradient of this backward is complete (`boundary`: its bucket will be reduced now)."""
        raise NotImplementedError

    def has_grad(self, param: torch.Tensor) -> bool:
        """This rank brought a gradient of `param` to this step."""
        raise NotImplementedError

    def launch(self, k: int) -> None:
        """Start reducing bucket `k` to its owners (missing gradients count as zeros)."""
        raise NotImplementedError

    def owned(self) -> torch.Tensor:
        """This rank's slice of the averaged gradients (after every bucket's reduction was waited for)."""
        raise NotImplementedError

    def new_step(self) -> None:
        """Forget this step's gradients (after the step or zero_grad)."""
        raise NotImplementedError


class BucketSchedule:
    """Every segment's buckets in one order, the same on every rank: a bucket is launched once it and every
    bucket before it are complete, so all ranks issue their reductions in the same order even when their
    backward passes produce gradients in different orders (a branch only some ranks take).

    The newest segment's buckets come first (parameters added or unfrozen later sit nearer the output, in
    the usual progressive-unfreezing or layer-by-layer add_param_group), each segment's in backward order.

    Args:
        stores: the gradient stores, one per segment; each has `.buckets` and `.launch(k)`.
        queue: the ReductionQueue the stores launch into.
    """

    def __init__(self, stores: list[GradientStore], queue: ReductionQueue):
        self.queue = queue
        self.order = [(store, k) for store in reversed(stores) for k in range(len(store.buckets))]
        self._place = {(id(store), k): i for i, (store, k) in enumerate(self.order)}
        self._arrived = [0] * len(self.order)
        self._launched = 0

    def arrive(self, store, bucket: int) -> None:
        """One gradient of `bucket` is complete; launch every bucket that is now due, in order."""
        self._arrived[self._place[id(store), bucket]] += 1
        while self._launched < len(self.order):
            store, k = self.order[self._launched]
            if self._arrived[self._launched] < len(store.buckets[k].indices):
                break
            store.launch(k)
            self._launched += 1

    def flush(self) -> None:
        """Launch every bucket not launched yet (their missing gradients count as zeros), then wait for all."""
        while self._launched < len(self.order):
            store, k = self.order[self._launched]
            store.launch(k)
            self._launched += 1
        self.queue.wait_all()
        self._arrived = [0] * len(self.order)
        self._launched = 0

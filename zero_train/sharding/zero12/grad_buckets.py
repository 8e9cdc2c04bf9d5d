"""ZeRO-2's gradient store: buckets reduced to their owners during backward, non-owned gradients released.

The trainable tensors of a segment are cut into buckets of at most zero_optimization.reduce_bucket_size
elements, in backward order (`comm/buckets.gradient_buckets`). As soon as the next bucket in the schedule
(comm/buckets.BucketSchedule: every rank reduces them in the same order) has all its gradients, they are
copied into a bucket buffer divided by N (as DDP's allreduce_hook does), released, and the buffer is
reduced to its owners without waiting (overlap.ReductionQueue: on gloo our ring, the same summation order
as ZeRO-1). When a reduction is waited for, the owner adds its part into its accumulator of the
gradients it owns (Psi/N elements). Two bucket buffers take turns: a third bucket waits for the oldest
reduction. At the end of each backward the buckets still waiting, e.g. for a gradient no rank produced
this time, are reduced with zeros for what is missing (DDP's rule), and everything is waited for once.

Accumulation follows DeepSpeed's stage 2 (stage_1_and_2.py reduces every micro-batch's buckets during its
backward; its engine refuses no_sync under gradient partitioning): each micro-step is reduced, and the
owner accumulates the averages, (g1_avg + g2_avg), in the order the micro-steps came. So no rank ever
holds a whole gradient beyond two buckets, at the price of one reduction per micro-step (docs/zero2.md).
"""

from __future__ import annotations

import torch

from zero_train.sharding.comm.buckets import Bucket
from zero_train.sharding.comm.overlap import ReductionQueue
from zero_train.sharding.zero12.backward import GradientStore
from zero_train.sharding.zero12.flat_grads import dense_grad
from zero_train.sharding.zero12.segments import Segment


class BucketBuffers:
    """The two bucket buffers the segments' copied buckets take turns in.

    Args:
        queue: the ReductionQueue (a buffer frees when the reduction using it is waited for).
    """

    def __init__(self, queue: ReductionQueue):
        self.queue = queue
        self.free: list[torch.Tensor] = []
        self.size = 0

    def resize(self, elements: int, *, dtype, device) -> None:
        """Two buffers of `elements` (call only when no reduction is in flight)."""
        self.size = elements
        self.free = [torch.empty(elements, dtype=dtype, device=device) for _ in range(2)] if elements else []

    def acquire(self) -> torch.Tensor:
        """A free buffer, waiting for the oldest reductions in flight until one is released."""
        while not self.free:
            self.queue.wait_oldest()
        return self.free.pop(0)

    def release(self, buffer: torch.Tensor) -> None:
        self.free.append(buffer)


class GradientBuckets(GradientStore):
    """One segment's buckets and this rank's accumulator of the averaged gradients of its slice.

    Args: GradientStore's (segment, bucket_elements, queue), and
        buffers: the shared bucket buffers (in the reduction dtype).
        dtype: the accumulator's dtype (None: the parameters').
        reduce_dtype: the dtype buckets travel in (None: the parameters'); a bucket of one tensor of the
            bucket size or more travels in its own gradient only in the parameters' dtype.
    """

    def __init__(
        self,
        segment: Segment,
        *,
        buffers: BucketBuffers,
        dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
        **store,
    ):
        super().__init__(segment, **store)
        self.buffers = buffers
        param = segment.params[0]
        # a direct bucket travels in its own gradient when that is in the reduction dtype
        self.reduce_dtype = reduce_dtype or param.dtype
        self.in_place = self.reduce_dtype == param.dtype
        # the accumulated average of the gradients this rank owns (its slice)
        self.owned = torch.zeros(
            segment.stop - segment.start, dtype=dtype or param.dtype, device=param.device
        )
        self.seen: set[int] = set()  # parameters whose gradient this rank brought to this step
        self.set_active(segment.active)

    def copied_elements(self) -> int:
        """The largest bucket that is copied into a bucket buffer (a direct one is reduced in its gradient)."""
        return max((b.size for b in self.buckets if not (b.direct and self.in_place)), default=0)

    def accept(self, param: torch.Tensor, *, boundary: bool = True) -> None:
        """A gradient of this backward is complete (refused if sparse); every backward is a boundary here."""
        dense_grad(param)
        self.seen.add(id(param))

    def has_grad(self, param: torch.Tensor) -> bool:
        """This rank brought a gradient of `param` to this step."""
        return id(param) in self.seen

    def launch(self, k: int) -> None:
        """Divide bucket `k`'s gradients by N into a buffer (a direct bucket: in place), release them, and
        start reducing it to the owners; the owner adds its part when the reduction is waited for."""
        bucket = self.buckets[k]
        params = [self.segment.params[i] for i in bucket.indices]
        for param in params:
            if param.grad is not None:
                dense_grad(param)
                self.seen.add(id(param))
        if bucket.direct and self.in_place:
            param = params[0]
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            flat = grad.reshape(-1).div_(self.world_size)

            def done() -> None:
                self._add_owned(bucket, flat)
                param.grad = None  # released: the owner keeps the average in its accumulator

            self.queue.launch(flat, bucket.starts, bucket.lengths, on_done=done)
            return
        buffer = self.buffers.acquire()
        flat = buffer[: bucket.size]
        for index, param in zip(bucket.indices, params, strict=True):
            offset = self.segment.partition.offsets[index] - bucket.start
            slot = flat[offset : offset + param.numel()].view_as(param)
            if param.grad is None:
                slot.zero_()  # no gradient here: zero in the average (DDP's rule)
            elif param.grad.dtype == slot.dtype:
                torch.div(param.grad, self.world_size, out=slot)
            else:  # divided in the bucket's dtype, as the sum that follows
                slot.copy_(param.grad).div_(self.world_size)
            param.grad = None  # released: only the bucket travels

        def done() -> None:
            self._add_owned(bucket, flat)
            self.buffers.release(buffer)

        self.queue.launch(flat, bucket.starts, bucket.lengths, on_done=done)

    def _add_owned(self, bucket: Bucket, flat: torch.Tensor) -> None:
        """Add this rank's part of a reduced bucket into the accumulator."""
        rank = self.queue.rank
        length = bucket.lengths[rank]
        if length:
            start = bucket.start + bucket.starts[rank] - self.segment.start
            self.owned[start : start + length].add_(flat[bucket.starts[rank] : bucket.starts[rank] + length])

    def new_step(self) -> None:
        """Forget this step's gradients (after the step or zero_grad)."""
        self.seen.clear()
        self.owned.zero_()

"""ZeRO-2's gradient path: buckets reduced to their owners during backward, non-owned gradients released.

The trainable tensors are cut into buckets of at most zero_optimization.reduce_bucket_size elements, in
backward order (`partition.gradient_buckets`). A post-accumulate-grad hook per parameter marks its
gradient as arrived; as soon as the next bucket (every rank reduces them in the same order) has all its
gradients, they are copied into one bucket buffer, divided by N (as DDP's allreduce_hook does), reduced
to their owners (`collectives.reduce_to_owners_`: on gloo our ring, the same summation order as ZeRO-1),
and released. The owner adds its region into its accumulator of owned gradients (Psi/N elements). At the
end of each backward (an autograd callback) the buckets still waiting, e.g. for a gradient no rank
produced this time, are reduced in order with zeros for what is missing (DDP's rule).

Accumulation follows DeepSpeed's stage 2 (stage_1_and_2.py reduces every micro-batch's buckets during its
backward; its engine refuses no_sync under gradient partitioning): each micro-step is reduced, and the
owner accumulates the averages, (g1_avg + g2_avg), in the order the micro-steps came. So no rank ever
holds a whole gradient beyond one bucket, at the price of one reduction per micro-step (docs/zero2.md).
"""

from __future__ import annotations

import weakref

import torch

from zero_train.sharding import collectives
from zero_train.sharding.flat_grads import dense_grad
from zero_train.sharding.partition import Bucket, FlatLayout, gradient_buckets


class GradientBuckets:
    """The bucket buffer, the hooks, and this rank's accumulator of the gradients it owns.

    Args:
        params: the parameters in layout order (the frozen ones get no hook and no bucket).
        layout: the owner-ordered layout (owners, active flags, offsets).
        rank, world_size: this rank and N.
        bucket_elements: the largest bucket, in elements.
        receive_elements: size of the ring's receive buffer (0: torch's collectives, nothing to receive in).
        process_group: the data-parallel group.
        on_backward_end: called at the end of every backward that reached a hook (the optimizer
            refreshes its trainable set there, then calls `flush`).
        carry: (accumulator values by param id, ids seen, ids written) of the buckets this one replaces.
    """

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        layout: FlatLayout,
        *,
        rank: int,
        world_size: int,
        bucket_elements: int,
        receive_elements: int,
        process_group=None,
        on_backward_end,
        carry: tuple[dict[int, torch.Tensor], set[int], set[int]] | None = None,
    ):
        self.params, self.layout, self.rank, self.world_size = params, layout, rank, world_size
        self.process_group = process_group
        self.on_backward_end = on_backward_end
        self.buckets: list[Bucket] = gradient_buckets(layout, bucket_elements)
        dtype, device = params[0].dtype, params[0].device
        copied = [b.size for b in self.buckets if not b.direct]
        self.buffer = torch.empty(max(copied, default=0), dtype=dtype, device=device)
        self.recv_buffer = (
            torch.empty(receive_elements, dtype=dtype, device=device) if receive_elements else None
        )
        self.owned = torch.zeros(layout.loads()[rank], dtype=dtype, device=device)  # Psi/N, no padding
        region_start = layout.region(rank)[0]
        self.owned_slots = {
            id(p): self.owned[offset - region_start : offset - region_start + p.numel()].view_as(p)
            for p, offset, owner in zip(params, layout.offsets, layout.owners, strict=True)
            if owner == rank
        }
        self.bucket_of = {index: k for k, bucket in enumerate(self.buckets) for index in bucket.indices}
        values, self.seen, self.written = carry or ({}, set(), set())
        for key, value in values.items():
            if key in self.owned_slots:
                self.owned_slots[key].copy_(value)
        self._arrived = [0] * len(self.buckets)
        self._next = 0  # the next bucket to reduce in this backward
        self._callback_queued = False
        self._handles = [
            p.register_post_accumulate_grad_hook(self._hook(i))
            for i, p in enumerate(params)
            if p.requires_grad
        ]

    def _hook(self, index: int):
        buckets_ref = weakref.ref(self)  # a parameter must not keep the buffers of a dropped optimizer alive

        def arrived(param: torch.Tensor) -> None:
            buckets = buckets_ref()
            if buckets is not None and param.grad is not None:
                buckets._arrive(index, param)

        return arrived

    def _arrive(self, index: int, param: torch.Tensor) -> None:
        """A gradient is complete: count it in its bucket and reduce every bucket that is due, in order."""
        dense_grad(param)
        if not self._callback_queued:  # the end of this backward reduces what is still waiting
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._callback_queued = True
        bucket = self.bucket_of.get(index)
        if bucket is None:
            return  # unfrozen since the buckets were built: the end of backward rebuilds them
        self._arrived[bucket] += 1
        while self._next < len(self.buckets) and self._arrived[self._next] == len(
            self.buckets[self._next].indices
        ):
            self._reduce(self.buckets[self._next])
            self._next += 1

    def _end_of_backward(self) -> None:
        self._callback_queued = False
        self.on_backward_end()

    def flush(self) -> None:
        """Reduce every bucket not reduced in this backward, in order. Collective."""
        while self._next < len(self.buckets):
            self._reduce(self.buckets[self._next])
            self._next += 1
        self._arrived = [0] * len(self.buckets)
        self._next = 0

    def _reduce(self, bucket: Bucket) -> None:
        """Divide by N into the bucket, reduce to the owners, add the owned region to the accumulator."""
        params = [self.params[i] for i in bucket.indices]
        if bucket.direct:
            grad = params[0].grad
            if grad is not None:
                self.seen.add(id(params[0]))
            flat = (grad if grad is not None else torch.zeros_like(params[0])).reshape(-1)
            flat.div_(self.world_size)
        else:
            flat = self.buffer[: bucket.size]
            for param, offset in zip(params, bucket.offsets, strict=True):
                slot = flat[offset : offset + param.numel()].view_as(param)
                if param.grad is None:
                    slot.zero_()  # no gradient here: zero in the average (DDP's rule)
                else:
                    torch.div(param.grad, self.world_size, out=slot)
                    self.seen.add(id(param))
        collectives.reduce_to_owners_(
            flat,
            self.recv_buffer,
            self.process_group,
            starts=list(bucket.starts),
            lengths=list(bucket.lengths),
        )
        for index, param, offset in zip(bucket.indices, params, bucket.offsets, strict=True):
            param.grad = None  # released: the owner keeps the average in its accumulator
            if self.layout.owners[index] != self.rank:
                continue
            averaged = flat[offset : offset + param.numel()].view_as(param)
            if id(param) in self.written:
                self.owned_slots[id(param)].add_(averaged)
            else:
                self.owned_slots[id(param)].copy_(averaged)
                self.written.add(id(param))

    def carry(self) -> tuple[dict[int, torch.Tensor], set[int], set[int]]:
        """What a rebuilt GradientBuckets must keep: the accumulated owned gradients, seen and written ids."""
        values = {key: slot.clone() for key, slot in self.owned_slots.items() if key in self.written}
        return values, set(self.seen), set(self.written)

    def owned_grads(self) -> torch.Tensor:
        """The accumulated averaged gradients this rank owns (zero where nothing was reduced this step)."""
        for key, slot in self.owned_slots.items():
            if key not in self.written:
                slot.zero_()
        return self.owned

    def new_step(self) -> None:
        """Forget this step's gradients (after the step or zero_grad)."""
        self.seen.clear()
        self.written.clear()

    def remove_hooks(self) -> None:
        """Detach the hooks (the optimizer rebuilds its buffers when the trainable parameters change)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

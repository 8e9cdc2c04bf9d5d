"""Zero1Optimizer's gradient store: one segment's flat gradient buffer, filled by hooks, reduced by bucket.

Every trainable parameter has a slot (a view) in a flat buffer laid out as the segment's partition, so
the averaged gradients of rank r's slice end up in one contiguous range. The optimizer's post-accumulate-
grad hook hands each freshly computed gradient here (`accept`); what is written depends on whether this
backward completes the step's gradients:

    naive (any micro-step)            slot <- grad         and at the boundary, slot /= N
    inside boundary_backward()        slot <- grad / N     one pass over the gradient instead of two

Both divide before summing, as DDP's allreduce_hook does, with the same elementwise division, so the
averaged gradients are the same bits; the fused form only does it while writing the slot, and lets the
bucket of a complete run of gradients start its reduction while backward goes on (overlap.py). One pass
instead of a copy and a divide (timings: docs/zero1.md, "Gradients into their slots").

A gradient that autograd accumulated in place (the slot is already `p.grad`: earlier micro-steps, or
`zero_grad(set_to_none=False)`) is divided in place. Later micro-steps must not follow a boundary backward
before the step (the slot would mix averaged and raw gradients): that raises.

A buffer in another dtype than the parameters (fp32 for a bf16/fp16 model: the default of our engines,
ds_config.parse.gradient_dtypes) cannot hold their `.grad`: each gradient is then added into its slot as
the hook sees it (copied by the first micro-step) and released, so micro-batches add up in the buffer's
dtype and autograd never accumulates in 16 bit.

ZeRO-2's store (grad_buckets.GradientBuckets) shares the buckets and the interface (schedule.GradientStore)
but not the buffer, by the definition of the stages: here every gradient keeps its slot for the whole step
(micro-steps accumulate without communication) and is reduced once, in place; there each bucket is copied
out, reduced every micro-step and released, and the owner accumulates the averages.
"""

from __future__ import annotations

import torch

from zero_train.sharding.zero12.schedule import GradientStore
from zero_train.sharding.zero12.segments import Segment


class FlatGradients(GradientStore):
    """One segment's gradients in a flat buffer, and the reduction of its buckets to their owners.

    Args: GradientStore's (segment, world_size, bucket_elements, queue), and dtype: the buffer's (None: the
    parameters').
    """

    def __init__(self, segment: Segment, *, dtype: torch.dtype | None = None, **store):
        super().__init__(segment, **store)
        params, partition = segment.params, segment.partition
        dtype = dtype or params[0].dtype
        self.views = dtype == params[0].dtype  # `.grad` is a view of its slot (else added into it, released)
        self.buffer = torch.zeros(partition.total_size, dtype=dtype, device=params[0].device)
        self.slots: dict[int, torch.Tensor] = {}
        self.averaged: set[int] = set()  # parameters whose slot holds grad / N this step
        self.written: set[int] = set()  # parameters whose slot holds this step's gradient (views False)
        for param, offset in zip(params, partition.offsets, strict=True):
            slot = self.buffer[offset : offset + param.numel()].view_as(param)
            self.slots[id(param)] = slot
            if param.grad is not None:  # computed before the optimizer existed, or before it was unfrozen
                self._take(param)
        self.set_active(segment.active)

    def _take(self, param: torch.Tensor) -> None:
        """Put `param.grad` into its slot: as a view of it, or (another dtype) added to it and released."""
        slot, key = self.slots[id(param)], id(param)
        if self.views:
            if dense_grad(param).data_ptr() != slot.data_ptr():
                slot.copy_(param.grad)
            param.grad = slot
            return
        if key in self.written:
            slot.add_(dense_grad(param))
        else:
            slot.copy_(dense_grad(param))
            self.written.add(key)
        param.grad = None

    def has_grad(self, param: torch.Tensor) -> bool:
        """This rank brought a gradient of `param` to this step."""
        return param.grad is not None or id(param) in self.written

    def accept(self, param: torch.Tensor, *, boundary: bool) -> None:
        """Move `param.grad` into its slot (divided by N in the boundary backward)."""
        key = id(param)
        if key in self.averaged:
            raise RuntimeError(
                "a backward after boundary_backward() in the same step: its gradients were already averaged; "
                "call step() or zero_grad() first"
            )
        slot = self.slots[key]
        if not self.views:
            self._take(param)
            if boundary:
                slot.div_(self.world_size)
                self.averaged.add(key)
            return
        fresh = dense_grad(param).data_ptr() != slot.data_ptr()
        if boundary:
            if fresh:
                torch.div(param.grad, self.world_size, out=slot)
            else:
                slot.div_(self.world_size)
            self.averaged.add(key)
        elif fresh:  # first micro-step; later ones accumulate in place
            slot.copy_(param.grad)
        param.grad = slot

    def _average(self, param: torch.Tensor) -> None:
        """Make the slot hold grad / N (zero without a gradient: DDP's rule), unless a hook already did."""
        key = id(param)
        if key in self.averaged:
            return
        slot = self.slots[key]
        if not self.views:
            if param.grad is not None:  # a gradient no hook saw
                self._take(param)
            if key in self.written:
                slot.div_(self.world_size)
            else:
                slot.zero_()
        elif param.grad is None:
            slot.zero_()
        elif param.grad.data_ptr() != slot.data_ptr():
            torch.div(dense_grad(param), self.world_size, out=slot)
        else:
            slot.div_(self.world_size)
        self.averaged.add(key)

    def launch(self, k: int) -> None:
        """Average what the hooks did not, then start reducing bucket `k` to its owners, in place."""
        bucket = self.buckets[k]
        for index in bucket.indices:
            self._average(self.segment.params[index])
        flat = self.buffer[bucket.start : bucket.stop]
        self.queue.launch(flat, bucket.starts, bucket.lengths)

    def owned(self) -> torch.Tensor:
        """This rank's slice of the buffer: after the reduction, the averaged gradients it owns."""
        return self.buffer[self.segment.start : self.segment.stop]

    def new_step(self) -> None:
        """Forget which slots were averaged and written (after the step or zero_grad)."""
        self.averaged.clear()
        self.written.clear()


def dense_grad(param: torch.Tensor) -> torch.Tensor:
    """`param.grad`, refused with a ValueError if sparse (a sharder averages dense flat buffers)."""
    if param.grad.is_sparse:
        raise ValueError(
            f"a sparse gradient ({tuple(param.shape)} parameter) cannot be sharded; build the layer with "
            "sparse=False (e.g. nn.Embedding(..., sparse=False)) to train it with our ZeRO"
        )
    return param.grad

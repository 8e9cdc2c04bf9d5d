"""Zero1Optimizer's gradient store: one segment's flat gradient buffer, filled by hooks, reduced by bucket.

Every trainable parameter has a slot (a view) in a flat buffer laid out as the segment, so the averaged
gradients of rank r's slice end up in one contiguous range. Each gradient is divided by N before the sum, as
DDP's allreduce_hook does (the same bits): at the boundary, or inside boundary_backward() while it is written
into its slot, which lets a complete bucket start its reduction while backward goes on. A buffer in another dtype
than the parameters (fp32 for a bf16 model) takes each gradient in and releases it, so micro-batches add up in
fp32. How and why: docs/zero1.md, "Gradients into their slots".
"""

from __future__ import annotations

import torch

from zero_train.sharding.zero12.backward import GradientStore
from zero_train.sharding.zero12.segments import Segment


class FlatGradients(GradientStore):
    """A segment's gradients in a flat buffer of `dtype` (None: the parameters'), reduced to their owners in place."""

    views: bool
    """`.grad` is a view of its slot (else, in another dtype, added into it and released)."""
    buffer: torch.Tensor
    slots: dict[int, torch.Tensor]
    """id(param) -> its view of the buffer."""
    averaged: set[int]
    """Parameters whose slot holds grad / N this step."""
    written: set[int]
    """Parameters whose slot holds this step's gradient (views False)."""

    def __init__(self, segment: Segment, *, dtype: torch.dtype | None = None, **store):
        super().__init__(segment, **store)
        params, partition = segment.params, segment.partition
        dtype = dtype or params[0].dtype
        self.views = dtype == params[0].dtype
        self.buffer = torch.zeros(partition.total_size, dtype=dtype, device=params[0].device)
        self.reduce_dtype = dtype  # reduced in place: rank r's slice ends up holding the averages it owns
        self.owned = self.buffer[segment.start : segment.stop]
        self.slots, self.averaged, self.written = {}, set(), set()
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
        return param.grad is not None or id(param) in self.written

    def accept(self, param: torch.Tensor, *, boundary: bool) -> None:
        """Move `param.grad` into its slot (divided by N in the boundary backward)."""
        if id(param) in self.averaged:
            raise RuntimeError(
                "a backward after boundary_backward() in the same step: its gradients were already averaged; "
                "call step() or zero_grad() first"
            )
        if boundary:
            self._average(param)
        else:
            self._take(param)

    def _average(self, param: torch.Tensor) -> None:
        """Make the slot hold grad / N (zero without a gradient: DDP's rule), unless it already does."""
        key, slot = id(param), self.slots[id(param)]
        if key in self.averaged:
            return
        if self.views and param.grad is not None and dense_grad(param).data_ptr() != slot.data_ptr():
            torch.div(param.grad, self.world_size, out=slot)  # written and divided in one pass
            param.grad = slot
        else:
            if param.grad is not None:
                self._take(param)
            if self.has_grad(param):
                slot.div_(self.world_size)
            else:
                slot.zero_()
        self.averaged.add(key)

    def launch(self, k: int) -> None:
        """Average what the hooks did not, then start reducing bucket `k` to its owners, in place."""
        bucket = self.buckets[k]
        for index in bucket.indices:
            self._average(self.segment.params[index])
        flat = self.buffer[bucket.start : bucket.stop]
        self.queue.launch(flat, bucket.starts, bucket.lengths)

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

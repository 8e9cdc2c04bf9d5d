"""What ZeRO-1/2 see of backward: a call per complete gradient and one at the end, into a gradient store.

A post-accumulate-grad hook on every trainable parameter calls the optimizer's `on_grad(param)` (a tied weight:
after both uses); the first one of a backward also calls `refresh_trainable()` and queues `on_backward_end()` with
autograd. The stores, one per segment, share one interface (GradientStore): ZeRO-1's FlatGradients keeps every
gradient, ZeRO-2's GradientBuckets only the owned ones; their buckets travel as comm/buckets.py orders.
"""

from __future__ import annotations

import weakref

import torch

from zero_train.sharding.comm.buckets import Bucket, gradient_buckets
from zero_train.sharding.comm.overlap import ReductionQueue
from zero_train.sharding.zero12.segments import Segment


class GradientStore:
    """One segment's gradients on their way to their owners, cut into buckets (the stores' one interface)."""

    segment: Segment
    bucket_elements: int | None
    """The largest bucket, in elements (None: one bucket per run of trainable tensors)."""
    buckets: list[Bucket]
    """The segment's buckets of trainable tensors, in backward order (comm/buckets.py)."""
    world_size: int
    queue: ReductionQueue
    reduce_dtype: torch.dtype
    """The dtype its buckets are summed over the ranks in (set by the store)."""
    owned: torch.Tensor
    """This rank's slice of the averaged gradients, complete once every reduction is waited for (the store's)."""

    def __init__(self, segment: Segment, *, bucket_elements: int | None, queue: ReductionQueue):
        self.segment, self.bucket_elements, self.queue = segment, bucket_elements, queue
        self.world_size = segment.partition.world_size

    def set_active(self, active: tuple[bool, ...]) -> None:
        """(Re)cut the buckets for the tensors trainable now (a frozen one travels in none)."""
        self.buckets = gradient_buckets(self.segment.partition, self.bucket_elements, active)

    def accept(self, param: torch.Tensor, *, boundary: bool) -> None:
        """`param`'s gradient of this backward is complete (`boundary`: its bucket will be reduced now)."""
        raise NotImplementedError

    def has_grad(self, param: torch.Tensor) -> bool:
        """This rank brought a gradient of `param` to this step."""
        raise NotImplementedError

    def launch(self, k: int) -> None:
        """Start reducing bucket `k` to its owners (missing gradients count as zeros)."""
        raise NotImplementedError

    def new_step(self) -> None:
        """Forget this step's gradients (after the step or zero_grad)."""
        raise NotImplementedError


class BackwardHooks:
    """Hooks on `params` calling `owner`'s refresh_trainable / on_grad / on_backward_end; the backward in flight is
    `owner._in_backward`, so hooks rebuilt mid-backward do not start a second one. The hooks hold the owner
    weakly: a parameter must not keep a dropped optimizer alive."""

    def __init__(self, owner, params: list[torch.nn.Parameter]):
        owner_ref = weakref.ref(owner)

        def ended() -> None:
            owner = owner_ref()
            if owner is not None:
                owner._in_backward = False
                owner.on_backward_end()

        def arrived(param: torch.Tensor) -> None:
            owner = owner_ref()
            if owner is None or param.grad is None:
                return
            if not owner._in_backward:
                owner._in_backward = True
                torch.autograd.Variable._execution_engine.queue_callback(ended)
                owner.refresh_trainable()
            owner.on_grad(param)

        self._handles = [param.register_post_accumulate_grad_hook(arrived) for param in params]

    def remove(self) -> None:
        """Detach the hooks (the optimizer re-hooks when the trainable parameters change)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

"""Zero2Optimizer: ZeRO stage 2 (optimizer-state and gradient sharding, the ZeRO paper's P_os+g).

ZeRO-1 (zero1.py) with one change: no rank keeps the whole gradient. During backward, as each bucket
of gradients is complete, it is reduced to the tensors' owners and released (grad_buckets.py), so a rank
holds the averaged gradients it owns (Psi/N) plus one bucket. Everything after the reduction is the
shared step (sharded.py): exact global-norm clipping, the inner optimizer on the owned (fp32 master)
shard, one all-gather of the flat parameter buffer. One training step:

    backward            hooks reduce each complete bucket to its owners (on gloo our ring, the same
                        summation order as ZeRO-1's reduce-scatter), the owner accumulates its part,
                        the gradient is released; the end of backward reduces what is still waiting
    reduce_gradients()  nothing left to send: hands the owned gradients to the step
    clip_grad_norm_()   per-tensor norms on the owners, one all-reduce (as ZeRO-1)
    step()              update the owned shard, all-gather the parameters (as ZeRO-1)

    optimizer = Zero2Optimizer(model.parameters(), torch.optim.AdamW, bucket_elements=5e7, lr=3e-4)
    for micro_batch in micro_batches:          # every micro-batch's gradients are reduced in its backward
        optimizer.scale_loss(model(micro_batch).loss / len(micro_batches)).backward()
    grad_norm = optimizer.clip_grad_norm_(1.0)
    optimizer.step()
    optimizer.zero_grad()
"""

from __future__ import annotations

import weakref

import torch

from zero_train.sharding import accounting
from zero_train.sharding.grad_buckets import GradientBuckets
from zero_train.sharding.partition import Bucket
from zero_train.sharding.sharded import ShardedOptimizer


class Zero2Optimizer(ShardedOptimizer):
    """ZeRO-2: gradients reduced to their owners bucket by bucket during backward; owned gradients only.

    Args:
        params, optimizer_class: as for ShardedOptimizer.
        bucket_elements: the largest bucket in elements (the DeepSpeed config's reduce_bucket_size; the engine
            passes DeepSpeed's default when the config has none).
        **kwargs: process_group, master_dtype, loss_scaler and the inner optimizer's defaults, as for
            ShardedOptimizer.

    Raises:
        ValueError: bucket_elements below 1.
    """

    _buckets: GradientBuckets | None = None

    def __init__(self, params, optimizer_class, *, bucket_elements: int, **kwargs):
        if int(bucket_elements) < 1:
            raise ValueError(f"bucket_elements must be at least 1, got {bucket_elements}")
        self.bucket_elements = int(bucket_elements)
        super().__init__(params, optimizer_class, **kwargs)

    def _build_grads(self) -> None:
        """The buckets and their hooks, keeping what this step has accumulated when rebuilt."""
        carry = None
        if self._buckets is not None:
            self._buckets.remove_hooks()
            carry = self._buckets.carry()
        element_size = self._param_buffer.element_size()
        self.buffers = accounting.zero2_buffers(self.layout, element_size, self.backend, self.bucket_elements)
        optimizer_ref = weakref.ref(self)  # the hooks must not keep a dropped optimizer alive

        def on_backward_end() -> None:
            optimizer = optimizer_ref()
            if optimizer is not None:
                optimizer._end_of_backward()

        self._buckets = GradientBuckets(
            self._params,
            self.layout,
            rank=self.rank,
            world_size=self.world_size,
            bucket_elements=self.bucket_elements,
            receive_elements=self.buffers.receive_elements,
            process_group=self.process_group,
            on_backward_end=on_backward_end,
            carry=carry,
        )

    def _end_of_backward(self) -> None:
        """Take in parameters unfrozen or frozen since the last step, then reduce the buckets still waiting."""
        self._refresh_trainable()
        self._buckets.flush()

    def reduce_gradients(self) -> None:
        """Hand the owned averaged gradients to the step (backward already reduced every bucket).

        Gradients computed outside a backward that reached a hook (e.g. before the optimizer existed) are
        reduced here. Afterwards each owned parameter's .grad is a view of its accumulated average, the
        others' are None. Idempotent until step() or zero_grad(). Collective.
        """
        if self._reduced:
            return
        self._refresh_trainable()
        if any(p.requires_grad and p.grad is not None for p in self._params):
            self._buckets.flush()  # gradients no hook saw (computed before this optimizer existed)
        seen = self._buckets.seen
        flags = [1.0 if p.requires_grad and id(p) in seen else 0.0 for p in self._params]
        self._local_flags = torch.tensor(flags, device=self._param_buffer.device)
        owned = self._buckets.owned_grads()
        for param, owner in zip(self._params, self._owners, strict=True):
            mine = owner == self.rank and param.requires_grad
            param.grad = self._buckets.owned_slots[id(param)] if mine else None
        self._set_master_grads(owned)
        self._reduced = True

    def _end_step(self) -> None:
        super()._end_step()
        self._buckets.new_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients. set_to_none=False makes every trainable gradient a zero, as in torch: the
        next step then updates every trainable parameter (weight decay included), used or not."""
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None and not set_to_none and not param.requires_grad:
                    param.grad.zero_()
                else:
                    param.grad = None
        self._end_step()
        if not set_to_none:
            self._buckets.owned.zero_()
            active = {id(p) for p in self._params if p.requires_grad}
            self._buckets.seen.update(active)
            self._buckets.written.update(active)

    @property
    def buckets(self) -> list[Bucket]:
        """The buckets every rank reduces, in order (partition.gradient_buckets of this layout)."""
        return self._buckets.buckets

    def buffer_bytes(self) -> accounting.BufferBytes:
        """Padding of the parameter buffer, the bucket and the receive buffer (accounting.zero2_buffers)."""
        return self.buffers

    def _grad_bytes(self) -> int:
        """The owned accumulator (Psi/N) plus any gradient backward holds before its bucket is reduced."""
        owned = {slot.data_ptr() for slot in self._buckets.owned_slots.values()}
        loose = sum(
            p.grad.numel() * p.grad.element_size()
            for p in {id(p): p for g in self.param_groups for p in g["params"]}.values()
            if p.grad is not None and p.grad.data_ptr() not in owned
        )
        return self._buckets.owned.numel() * self._buckets.owned.element_size() + loose

    def comm_bytes_per_step(self, micro_steps: int = 1) -> dict[str, int]:
        """Bytes this rank sends per step with clipping (accounting.zero2_comm_bytes_per_step)."""
        return accounting.zero2_comm_bytes_per_step(
            self.layout, self.rank, self._param_buffer.element_size(), self.backend, micro_steps=micro_steps
        )

"""Zero2Optimizer: ZeRO stage 2 (optimizer-state and gradient sharding, the ZeRO paper's P_os+g).

ZeRO-1 (zero1.py) with one change: no rank keeps the whole gradient. During backward, as each bucket
of gradients is complete, it is reduced to its owners and released (grad_buckets.py), so a rank holds
the averaged gradients of its slice (Psi/N) plus two buckets. Everything after the reduction is the
shared step (sharded.py): exact global-norm clipping, the inner optimizer on this rank's (fp32 master)
pieces, one all-gather of the flat parameter buffer. One training step:

    backward            hooks start reducing each complete bucket to its owners without waiting (on
                        gloo our ring, the same summation order as ZeRO-1), release the gradients; the
                        end of backward reduces what is still waiting, then waits once, and each owner
                        adds its part into its accumulator
    reduce_gradients()  nothing left to send: hands the owned gradients to the step
    clip_grad_norm_()   partial sums of squares on the owners, one all-reduce (as ZeRO-1)
    step()              update this rank's pieces, all-gather the parameters (as ZeRO-1)

    optimizer = Zero2Optimizer(model.parameters(), torch.optim.AdamW, bucket_elements=5e7, lr=3e-4)
    for micro_batch in micro_batches:          # every micro-batch's gradients are reduced in its backward
        optimizer.scale_loss(model(micro_batch).loss / len(micro_batches)).backward()
    grad_norm = optimizer.clip_grad_norm_(1.0)
    optimizer.step()
    optimizer.zero_grad()
"""

from __future__ import annotations

import torch

from zero_train.sharding.zero12.grad_buckets import BucketBuffers, GradientBuckets
from zero_train.sharding.zero12.sharded import ShardedOptimizer


class Zero2Optimizer(ShardedOptimizer):
    """ZeRO-2: gradients reduced to their owners bucket by bucket during backward; owned gradients only.

    Arguments as ShardedOptimizer (params, optimizer_class, process_group, master_dtype, loss_scaler,
    grad_dtype, **defaults), except `bucket_elements`, required here: ZeRO-2 reduces during every backward and
    keeps two bucket buffers of it (the engine passes the config's reduce_bucket_size, DeepSpeed's default if
    absent); and reduce_dtype: the dtype the bucket copies are summed over the ranks in (None: grad_dtype's).
    """

    _buffers: BucketBuffers | None = None
    _boundary = True  # every backward reduces its buckets (DeepSpeed's stage 2)
    reduce_dtype: torch.dtype | None

    def __init__(self, params, optimizer_class, *, bucket_elements: int, reduce_dtype=None, **kwargs):
        self.reduce_dtype = reduce_dtype
        super().__init__(params, optimizer_class, bucket_elements=bucket_elements, **kwargs)

    def _build_grads(self, segment) -> GradientBuckets:
        """The segment's buckets and its accumulator of owned gradients."""
        if self._buffers is None:
            self._buffers = BucketBuffers(self._queue)
        grad_dtype = self.grad_dtype or segment.params[0].dtype
        return GradientBuckets(
            segment,
            bucket_elements=self.bucket_elements,
            queue=self._queue,
            buffers=self._buffers,
            dtype=grad_dtype,
            reduce_dtype=self.reduce_dtype or grad_dtype,
        )

    def _relayout(self) -> None:
        """Rehook and reschedule (ShardedOptimizer), and size the two bucket buffers for the largest bucket."""
        super()._relayout()
        param = self._params[0]
        largest = max(store.copied_elements() for store in self._stores)
        if largest != self._buffers.size:
            self._buffers.resize(largest, dtype=self._stores[0].reduce_dtype, device=param.device)

    def reduce_gradients(self) -> None:
        """Hand the owned averaged gradients to the step (backward already reduced every bucket).

        Gradients computed outside a backward that reached a hook (e.g. before the optimizer existed) are
        reduced here. Afterwards a parameter's .grad is a view of its accumulated average if this rank owns
        all of it, else None. Idempotent until step() or zero_grad(). Collective.
        """
        if self._reduced:
            return
        self.refresh_trainable()
        if any(p.requires_grad and p.grad is not None for p in self._params):
            self._schedule.flush()  # gradients no hook saw (computed before this optimizer existed)
        self._local_has_grad = self._has_grads()
        for segment, store in zip(self.segments, self._stores, strict=True):
            for param in segment.params:
                param.grad = None
            for piece in segment.pieces:
                param = segment.params[piece.index]
                if piece.whole and param.requires_grad and store.owned.dtype == param.dtype:
                    param.grad = segment.view_of(store.owned, piece)
        self._set_master_grads()
        self._reduced = True

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
            for store in self._stores:
                store.seen.update(id(p) for p in store.segment.params if p.requires_grad)

"""Zero1Optimizer: ZeRO stage 1 (optimizer-state sharding, the ZeRO paper's P_os) in plain torch.distributed.

Every rank keeps the whole model and every gradient, in a flat buffer laid out as the parameters (no
communication before the boundary, so accumulation is free); at the boundary each bucket is reduced to its
owners, who step their pieces, and one all-gather brings every rank the new weights. The step in detail:
docs/zero1.md.

    optimizer = Zero1Optimizer(model.parameters(), torch.optim.AdamW, lr=3e-4, weight_decay=0.1)
    for micro_batch in micro_batches[:-1]:     # gradient accumulation: no communication here
        optimizer.scale_loss(model(micro_batch).loss / len(micro_batches)).backward()
    with optimizer.boundary_backward():         # optional, for the last one: reduces during backward
        optimizer.scale_loss(model(micro_batches[-1]).loss / len(micro_batches)).backward()
    optimizer.reduce_gradients()               # at the boundary only
    grad_norm = optimizer.clip_grad_norm_(1.0)
    optimizer.step()
    optimizer.zero_grad()
"""

from __future__ import annotations

import contextlib

from zero_train.sharding.zero12.flat_grads import FlatGradients
from zero_train.sharding.zero12.sharded import ShardedOptimizer


class Zero1Optimizer(ShardedOptimizer):
    """ZeRO-1, as the module's docstring says; arguments as ShardedOptimizer."""

    _boundary = False

    def _build_grads(self, segment) -> FlatGradients:
        """The segment's flat gradient buffer (gradients become views into it, in the parameters' dtype)."""
        return FlatGradients(
            segment, bucket_elements=self.bucket_elements, queue=self._queue, dtype=self.grad_dtype
        )

    @contextlib.contextmanager
    def boundary_backward(self):
        """Context for the backward of the LAST micro-batch of a step (optional; the result is identical): its
        hooks write grad / N into the flat buffer and each complete bucket starts its reduction at once."""
        self._boundary = True
        try:
            yield
        finally:
            self._boundary = False

    def reduce_gradients(self) -> None:
        """Average the gradients over the ranks, each rank receiving its slice's (collective; once per step, at the
        boundary; idempotent until step() or zero_grad()). Then a parameter's .grad is its average if this rank
        owns all of it, else None; a gradient missing on some rank counts as zeros there (DDP's rule), one
        missing on every rank is skipped by step()."""
        if self._reduced:
            return
        if not self._flushed:
            self.refresh_trainable()
            self._local_has_grad = self._has_grads()
            self._schedule.flush()
        for store in self._stores:  # .grad: the averaged slot of a tensor this rank owns whole, else None
            whole = {piece.index for piece in store.segment.pieces if piece.whole and store.views}
            for index, param in enumerate(store.segment.params):
                param.grad = store.slots[id(param)] if index in whole and param.requires_grad else None
        self._set_master_grads()
        self._reduced = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (set_to_none) or zero them in place as views of the flat buffer."""
        self._end_step()
        super().zero_grad(set_to_none)  # torch's: every .grad to None, or zeroed in place
        if not set_to_none:  # zeros count as this step's gradient, as in torch
            for store in self._stores:
                store.buffer.zero_()
                store.written.update(() if store.views else store.slots)
                if store.views:  # a trainable parameter's .grad is its slot again
                    for param in store.segment.params:
                        if param.requires_grad:
                            param.grad = store.slots[id(param)]

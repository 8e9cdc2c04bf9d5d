"""Zero1Optimizer: ZeRO stage 1 (optimizer-state sharding, the ZeRO paper's P_os) in plain torch.distributed.

Every rank keeps the whole model and computes whole gradients; the optimizer state (and, for a
bf16/fp16 model, the fp32 master weights) of each parameter lives on ONE rank, its owner
(sharded.py: what ZeRO-1 and ZeRO-2 share). One training step:

    backward            gradients land in a flat buffer laid out by owner (a hook per parameter; no
                        communication, so gradient accumulation over micro-steps is free); inside
                        boundary_backward() the hooks also divide by N (flat_grads.py)
    reduce_gradients()  one reduce-scatter of the flat gradient buffer: each rank receives the
                        average of exactly the region it owns
    clip_grad_norm_()   per-tensor norms on the owners, one all-reduce of a vector of P floats
    step()              the inner optimizer updates only the owned (fp32 master) parameters; one
                        all-gather of the flat parameter buffer brings every rank the new weights

The model's parameters are views into the flat parameter buffer and their gradients views into the
flat gradient buffer, so the collectives read and write them in place (no copies in fp32).

    optimizer = Zero1Optimizer(model.parameters(), torch.optim.AdamW, lr=3e-4, weight_decay=0.1)
    for micro_batch in micro_batches[:-1]:     # gradient accumulation: no communication here
        optimizer.scale_loss(model(micro_batch).loss / len(micro_batches)).backward()
    with optimizer.boundary_backward():         # optional, for the last one: the hooks also divide by N
        optimizer.scale_loss(model(micro_batches[-1]).loss / len(micro_batches)).backward()
    optimizer.reduce_gradients()               # at the boundary only
    grad_norm = optimizer.clip_grad_norm_(1.0)
    optimizer.step()
    optimizer.zero_grad()
"""

from __future__ import annotations

import torch

from zero_train.sharding import accounting, collectives
from zero_train.sharding.flat_grads import FlatGradients
from zero_train.sharding.sharded import ShardedOptimizer


class Zero1Optimizer(ShardedOptimizer):
    """ZeRO-1: every rank holds every gradient in one flat buffer; one reduce-scatter at the boundary.

    Arguments as ShardedOptimizer (params, optimizer_class, process_group, master_dtype, loss_scaler,
    **defaults).
    """

    _grads: FlatGradients | None = None

    def _build_grads(self) -> None:
        """The flat gradient buffer (gradients become views into it) and, on gloo, the ring's receive buffer."""
        averaged = set()
        if self._grads is not None:  # a rebuild: keep which gradients the hooks already divided by N
            self._grads.remove_hooks()
            averaged = self._grads.averaged
        dtype, device = self._param_buffer.dtype, self._param_buffer.device
        self._grads = FlatGradients(
            self._params,
            self.layout,
            world_size=self.world_size,
            dtype=dtype,
            device=device,
            averaged=averaged,
        )
        self._grad_buffer, self._grad_slots = self._grads.buffer, self._grads.slots
        self.buffers = accounting.zero1_buffers(self.layout, self._param_buffer.element_size(), self.backend)
        receive = self.buffers.receive_elements
        self._recv_buffer = torch.empty(receive, dtype=dtype, device=device) if receive else None

    def boundary_backward(self):
        """Context for the backward of the LAST micro-batch of a step (optional; the result is identical).

        Its gradient hooks write grad / N straight into the flat buffer, so reduce_gradients() skips one
        pass over the gradients (flat_grads.py). Another backward before step()/zero_grad() raises.
        """
        return self._grads.boundary_backward()

    def reduce_gradients(self) -> None:
        """Average the gradients over the ranks: each rank receives the average of the region it owns.

        Call it ONCE per optimizer step, at the gradient-accumulation boundary (after the last
        micro-batch's backward): backward itself never communicates, so micro-steps before the
        boundary cost no traffic. Idempotent until step() or zero_grad(). Afterwards the gradients of
        parameters owned by other ranks are set to None (they hold partial sums: ZeRO's gradient
        partitioning); a parameter without a gradient on some rank counts as a zero gradient there
        (DDP's rule), one without a gradient on every rank is skipped by step(). A parameter unfrozen
        since the last step gets an owner here. Collective: every rank of the group must call it.
        """
        if self._reduced:
            return
        self._refresh_trainable()
        flags = [1.0 if self._has_local_grad(p) else 0.0 for p in self._params]
        self._local_flags = torch.tensor(flags, device=self._param_buffer.device)
        self._grads.average(self._params)  # divide first, as DDP's allreduce_hook does
        collectives.reduce_scatter_(
            self._grad_buffer, self._recv_buffer, self.process_group, lengths=self._region_lengths
        )
        for param, owner in zip(self._params, self._owners, strict=True):
            param.grad = self._grad_slots[id(param)] if owner == self.rank and param.requires_grad else None
        start, stop = self.layout.region(self.rank)
        self._set_master_grads(self._grad_buffer[start:stop])
        self._reduced = True

    def _end_step(self) -> None:
        super()._end_step()
        self._grads.new_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (set_to_none) or zero them in place as views of the flat buffer."""
        trainable = {id(p) for p in self._params if p.requires_grad}
        if not set_to_none:
            self._grad_buffer.zero_()
        for group in self.param_groups:
            for param in group["params"]:
                if id(param) in trainable:
                    param.grad = None if set_to_none else self._grad_slots[id(param)]
                elif param.grad is not None:
                    param.grad = None if set_to_none else param.grad.zero_()
        self._end_step()

    def buffer_bytes(self) -> accounting.BufferBytes:
        """Padding of the two flat buffers and the gloo ring's receive buffer (accounting.zero1_buffers)."""
        return self.buffers

    def _grad_bytes(self) -> int:
        """The flat gradient buffer without its padding, plus any gradient not yet moved into it."""
        slots = self._grad_slots
        loose = sum(
            p.grad.numel() * p.grad.element_size()
            for p in {id(p): p for g in self.param_groups for p in g["params"]}.values()
            if p.grad is not None and (id(p) not in slots or p.grad.data_ptr() != slots[id(p)].data_ptr())
        )
        element_size = self._grad_buffer.element_size()
        return (self._grad_buffer.numel() - self.layout.padding()) * element_size + loose

"""ZeRO-3's gradient path: each unit's gradients reduce-scattered to their owners as soon as backward has them.

A post-accumulate-grad hook on every trainable parameter counts the unit's complete gradients. When a unit has
them all (a tied weight: after its last use), and every unit before it in the reduction order has been
launched (so every rank issues the same collectives in the same order, whatever order its backward produced
gradients in), its gradients are divided by N into one flat buffer of N P elements and released, and the
reduce-scatter starts (comm/collectives.py). One reduction is in flight at a time: launching the next waits for the
previous one and adds its result into that unit's `grad` slice (P elements: the accumulated average of this
rank's elements). When backward ends, the units not launched yet (a parameter without a gradient counts as
zeros, DDP's rule) are launched and everything is waited for. Gradient accumulation is the same every
micro-batch: each backward adds its averages into the slices, as DeepSpeed's stage 3 and FSDP2 do.

The order is the reverse of the units' first use in the last forward (before any forward: reverse module order),
which is the order backward completes them in.
"""

from __future__ import annotations

import torch

from zero_train.sharding.comm.collectives import Pending, reduce_scatter_slices
from zero_train.sharding.zero3.units import Unit


class GradientReducer:
    """Launches the units' reduce-scatters in one order on every rank, one in flight at a time.

    Args:
        units: every unit (the ones without trainable parameters never reduce).
        process_group: the data-parallel group.
        world_size: N.
        reduce_dtype: the dtype gradients travel in (None: the model's).
        grad_dtype: the dtype each unit's gradient slice accumulates the micro-batches in (None: reduce_dtype).
    """

    def __init__(
        self,
        units: list[Unit],
        process_group,
        world_size: int,
        reduce_dtype: torch.dtype | None = None,
        grad_dtype: torch.dtype | None = None,
    ):
        self.units, self.process_group, self.world_size = units, process_group, world_size
        self.reduce_dtype, self.grad_dtype = reduce_dtype, grad_dtype
        self.order: list[Unit] = list(reversed(units))
        # ids of parameters that brought a gradient this step (any micro-batch)
        self.had_grad: set[int] = set()
        self._arrived: dict[int, set[int]] = {}
        self._launched = 0
        self._in_flight: tuple[Unit, torch.Tensor, Pending] | None = None

    def set_order(self, first_use: list[Unit]) -> None:
        """Reduce in the reverse of the units' first use in forward (then any unit it did not use)."""
        used = list(dict.fromkeys(first_use))
        self.order = list(reversed(used)) + [u for u in reversed(self.units) if u not in used]

    def arrived(self, unit: Unit, param: torch.Tensor) -> None:
        """A parameter's gradient of this backward is complete; launch every unit that is now due, in order."""
        self._arrived.setdefault(id(unit), set()).add(id(param))
        while self._launched < len(self.order):
            unit = self.order[self._launched]
            trainable = {id(p) for p in unit.params if p.requires_grad}
            if trainable and not trainable <= self._arrived.get(id(unit), set()):
                break
            if trainable:
                self._launch(unit)
            self._launched += 1

    def finish(self) -> None:
        """At the end of backward: launch what is left (missing gradients are zeros), wait for all of it."""
        for unit in self.order[self._launched :]:
            if any(p.requires_grad for p in unit.params):
                self._launch(unit)
        for unit in self.order:  # a gradient that came after its unit was launched (a second backward graph)
            if any(p.requires_grad and p.grad is not None for p in unit.params):
                self._launch(unit)
        self._wait()
        self._arrived.clear()
        self._launched = 0

    def _launch(self, unit: Unit) -> None:
        """Average the unit's gradients into a flat buffer, release them, start the reduce-scatter."""
        self._wait()
        dtype = self.reduce_dtype or unit.shard.dtype
        flat = torch.empty(unit.partition.total_size, dtype=dtype, device=unit.shard.device)
        for param, offset in zip(unit.params, unit.partition.offsets, strict=True):
            slot = flat[offset : offset + param.numel()].view(param.shape)
            if param.requires_grad and param.grad is not None and param.grad.dtype == dtype:
                torch.div(param.grad, self.world_size, out=slot)  # divide first, as DDP's allreduce_hook does
                self.had_grad.add(id(param))
                param.grad = None
            elif param.requires_grad and param.grad is not None:  # divided in the dtype it is summed in
                slot.copy_(param.grad).div_(self.world_size)
                self.had_grad.add(id(param))
                param.grad = None
            else:
                slot.zero_()  # no gradient here: zero in the average (DDP's rule)
        flat[unit.partition.num_elements :].zero_()
        pending = reduce_scatter_slices(
            flat, self.process_group, tag=2 * unit.index + 1
        )  # gathers: even tags
        self._in_flight = (unit, flat, pending)

    def _wait(self) -> None:
        """Finish the reduction in flight and add this rank's slice into its unit's gradient."""
        if self._in_flight is None:
            return
        unit, flat, pending = self._in_flight
        self._in_flight = None
        pending.wait()
        mine = flat[unit.start : unit.stop]
        if unit.grad is None:
            unit.grad = mine.to(self.grad_dtype or mine.dtype, copy=True)
        else:
            unit.grad.add_(mine)

    def in_flight_bytes(self) -> int:
        """Bytes of the reduction buffer in flight now (0 between backward passes)."""
        if self._in_flight is None:
            return 0
        flat = self._in_flight[1]
        return flat.numel() * flat.element_size()

    def zero_grad(self) -> None:
        """Forget this step's gradients (after the optimizer step)."""
        for unit in self.units:
            unit.grad = None
        self.had_grad.clear()

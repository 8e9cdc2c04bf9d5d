"""Zero3Optimizer: the shared step (step.py) over the slices a Zero3Model keeps on this rank.

Each unit's slice of P elements holds pieces of its parameters (partition.py: a tensor cut by a slice boundary is
split, each rank updating its own piece). The inner optimizer (AdamW, Adam, SGD, ...) runs on those pieces,
as views of the fp32 master slice: the slice itself for an fp32 model, an fp32 copy of it for bf16/fp16 (then
the updated masters are rounded back into the slice). Nothing is gathered after the step: the next forward
gathers the new slices. The gradients are reduce-scattered into each unit's `grad` slice during backward
(grads.py); the agreement, clipping and the skip on fp16 overflow are the step every stage shares.
"""

from __future__ import annotations

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding.partition import Piece
from zero_train.sharding.step import OwnedPiece, PieceOptimizer
from zero_train.sharding.zero3.model import Zero3Model
from zero_train.sharding.zero3.units import Unit


class Zero3Optimizer(PieceOptimizer):
    """Steps this rank's slices of a Zero3Model with an elementwise torch optimizer.

    Args:
        sharded: the Zero3Model.
        optimizer_class: the inner optimizer (torch.optim.AdamW, Adam, SGD, ...): elementwise.
        params: parameters or param-group dicts over the model's parameters (default: all of them).
        master_dtype: dtype of the master slices (a bf16/fp16 model gets fp32 copies of its slices only).
        loss_scaler: fp16 dynamic loss scaler; overflowing steps are skipped (`last_step_skipped`).
        **defaults: the inner optimizer's keyword arguments (lr, betas, weight_decay, ...).
    """

    sharded: Zero3Model
    """The sharded model whose slices the optimizer steps."""
    masters: dict[int, torch.Tensor]
    """id(unit) -> its master slice, for units that held a trainable parameter."""
    has_master_copies: bool
    """The model's dtype is not the master dtype: trainable units get master copies of their slices."""
    _views: dict[tuple[int, Piece], torch.Tensor]
    """(id(unit), piece) -> its master view (the same object every call: the inner optimizer's key)."""
    _trainable: tuple[bool, ...]
    """requires_grad of every parameter when the inner optimizer was built (rebuilt when it changes)."""
    _prepared: bool
    """This step's master gradients are taken."""

    def __init__(
        self,
        sharded: Zero3Model,
        optimizer_class: type[torch.optim.Optimizer],
        *,
        params=None,
        master_dtype: torch.dtype = torch.float32,
        loss_scaler=None,
        **defaults,
    ):
        self.sharded = sharded
        super().__init__(
            list(sharded.parameters()) if params is None else params,
            optimizer_class,
            defaults,
            process_group=sharded.process_group,
            master_dtype=master_dtype,
            loss_scaler=loss_scaler,
        )
        self.has_master_copies = sharded.dtype != master_dtype
        self.masters, self._views, self._trainable = {}, {}, ()
        self._end_step()
        self._build()

    def _device(self) -> torch.device:
        return self.sharded.device

    def _master_view(self, unit: Unit, piece: Piece) -> torch.Tensor:
        """`piece` of the unit's master slice, shaped as its parameter if whole (the same object every call)."""
        key = (id(unit), piece)
        if key not in self._views:
            view = self.masters[id(unit)][piece.within(unit.start)]
            self._views[key] = view.view(unit.params[piece.index].shape) if piece.whole else view
        return self._views[key]

    def _master_slice(self, unit: Unit) -> torch.Tensor:
        """The unit's master slice: the slice itself at the master dtype, else an fp32 copy made on first use."""
        if not self.has_master_copies:
            return unit.shard
        if id(unit) not in self.masters:
            self.masters[id(unit)] = unit.shard.to(self.master_dtype, copy=True)
        return self.masters[id(unit)]

    def _build(self) -> None:
        """The inner optimizer over the pieces of the parameters trainable now (states carry over).

        Only units holding a trainable parameter get masters: a frozen base (LoRA) stays in the model's dtype."""
        self._trainable = tuple(p.requires_grad for g in self.param_groups for p in g["params"])
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        for unit in self.sharded.units:
            if unit.trainable():
                self.masters[id(unit)] = self._master_slice(unit)
        self._build_inner(
            (unit, piece, self._master_view(unit, piece))
            for unit in self.sharded.units
            for piece in unit.partition.pieces(self.rank)
            if unit.params[piece.index].requires_grad
        )

    # ------------------------------------------------------------ the step
    def reduce_gradients(self) -> None:
        """Nothing left to send (backward reduced every unit): master gradients of every owned piece from its
        unit's averaged gradient slice (once per step)."""
        if self._prepared:
            return
        if tuple(p.requires_grad for g in self.param_groups for p in g["params"]) != self._trainable:
            self._build()
        had = self.sharded.reducer.had_grad
        self._local_has_grad = [id(p) in had for p in self._params]

        def grad_of(owned: OwnedPiece) -> torch.Tensor | None:
            unit = owned.holder
            return (
                None if unit.grad is None else unit.grad[owned.piece.within(unit.start)].view_as(owned.master)
            )

        self._take_grads(grad_of)
        self._prepared = True

    def _publish(self) -> None:
        """Round the updated masters into the slices (mixed precision; fp32 updated the slices in place)."""
        if self.has_master_copies:
            for unit in self.sharded.units:
                if id(unit) in self.masters:
                    unit.shard.copy_(self.masters[id(unit)])

    def _end_step(self) -> None:
        super()._end_step()
        self.sharded.reducer.zero_grad()
        self._prepared = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop this step's gradients (the slices; the whole gradients were released during backward)."""
        if not set_to_none:
            raise UsageError(
                "Zero3Optimizer.zero_grad keeps no zero gradients; call it with set_to_none=True"
            )
        self._end_step()

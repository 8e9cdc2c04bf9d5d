"""Zero3Optimizer: an elementwise torch optimizer over the slices a Zero3Model keeps on this rank.

Each unit's slice of P elements holds pieces of its parameters (partition.py: a tensor cut by a slice boundary
is split, each rank updating its own piece). The inner optimizer (AdamW, Adam, SGD, ...) runs on those pieces,
as views of the fp32 master slice: the slice itself for an fp32 model, an fp32 copy of it for bf16/fp16 (then
the updated masters are rounded back into the slice). Nothing is gathered after the step: the next forward
gathers the new slices. The update of an element reads only its own parameter, gradient and state, so the
pieces update bit for bit as the whole tensors would (tests/sharding/test_partition.py).

Clipping and "which parameters had a gradient" take one all-reduce: the float64 partial sums of |g|^p of this
rank's pieces (norms.py: the same bits however the tensors are cut) and one flag per trainable parameter. A
parameter no rank had a gradient for is skipped, as torch's optimizers skip a .grad of None; where only some
ranks had one it counted as zeros (DDP's rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding import norms
from zero_train.sharding.comm import collectives
from zero_train.sharding.partition import Piece
from zero_train.sharding.state_dict import hyperparameters
from zero_train.sharding.zero3.model import Zero3Model
from zero_train.sharding.zero3.state import Zero3StateDict
from zero_train.sharding.zero3.units import Unit


@dataclass(frozen=True, slots=True, eq=False)
class OwnedPiece:
    """A piece of a trainable parameter in this rank's slice, as the inner optimizer sees it."""

    param: torch.nn.Parameter
    unit: Unit
    piece: Piece
    master: torch.Tensor
    """Its master weights (a view of the unit's master slice), the inner optimizer's parameter."""


class Zero3Optimizer(Zero3StateDict, torch.optim.Optimizer):
    """Steps this rank's slices of a Zero3Model with an elementwise torch optimizer.

    Args:
        sharded: the Zero3Model.
        optimizer_class: the inner optimizer (torch.optim.AdamW, Adam, SGD, ...): elementwise.
        params: parameters or param-group dicts over the model's parameters (default: all of them).
        master_dtype: dtype of the master slices (a bf16/fp16 model gets fp32 copies of its slices only).
        loss_scaler: fp16 dynamic loss scaler; overflowing steps are skipped (`last_step_skipped`).
        **defaults: the inner optimizer's keyword arguments (lr, betas, weight_decay, ...).
    """

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
        self.sharded, self.optimizer_class = sharded, optimizer_class
        self.process_group, self.rank, self.world_size = (
            sharded.process_group,
            sharded.rank,
            sharded.world_size,
        )
        self.loss_scaler, self.master_dtype = loss_scaler, master_dtype
        self.last_step_skipped = False
        super().__init__(list(sharded.parameters()) if params is None else params, defaults)
        self.has_master_copies = sharded.dtype != master_dtype
        self.masters: dict[int, torch.Tensor] = {}  # id(unit) -> master slice, for trainable units only
        self._views: dict[tuple[int, Piece], torch.Tensor] = {}
        self._inner: torch.optim.Optimizer | None = None
        self._pieces: list[OwnedPiece] = []
        self._trainable: tuple = ()
        self._flags: tuple[tuple[float, ...], torch.Tensor] | None = None  # the last pattern, on the device
        self._end_step()
        self._build_inner()

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

    def _build_inner(self) -> None:
        """The inner optimizer over the pieces of the parameters trainable now (states carry over).

        Only units holding a trainable parameter get masters: a frozen base (LoRA) stays in the model's dtype."""
        self._trainable = tuple(p.requires_grad for g in self.param_groups for p in g["params"])
        for unit in self.sharded.units:
            if unit.trainable():
                self.masters[id(unit)] = self._master_slice(unit)
        pieces = {}
        for unit in self.sharded.units:
            for piece in unit.partition.pieces(self.rank):
                pieces.setdefault(id(unit.params[piece.index]), []).append((unit, piece))
        self._pieces, inner_groups = [], []
        for group in self.param_groups:
            masters = []
            for param in (p for p in group["params"] if p.requires_grad):
                for unit, piece in pieces.get(id(param), []):
                    owned = OwnedPiece(param, unit, piece, self._master_view(unit, piece))
                    self._pieces.append(owned)
                    masters.append(owned.master)
            inner_groups.append({**hyperparameters(group), "params": masters})
        previous = self._inner.state if self._inner is not None else {}
        self._inner = self.optimizer_class(inner_groups, **self.defaults)
        for owned in self._pieces:
            if owned.master in previous:
                self._inner.state[owned.master] = previous[owned.master]
        for group, inner_group in zip(self.param_groups, self._inner.param_groups, strict=True):
            for key, value in hyperparameters(inner_group).items():
                group.setdefault(key, value)  # so LR schedulers see "lr" even if it was a default

    def _trainable_params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.param_groups for p in g["params"] if p.requires_grad]

    # ------------------------------------------------------------ the step
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the fp16 loss scale (identity without a loss scaler); call backward on the result."""
        return loss if self.loss_scaler is None else loss * self.loss_scaler.loss_scale

    def _prepare(self) -> None:
        """Master gradients of every owned piece from its unit's averaged gradient slice (once per step)."""
        if self._prepared:
            return
        if tuple(p.requires_grad for g in self.param_groups for p in g["params"]) != self._trainable:
            self._build_inner()
        inv_scale = None if self.loss_scaler is None else 1.0 / self.loss_scaler.loss_scale
        for owned in self._pieces:
            if owned.unit.grad is None:
                owned.master.grad = None
                continue
            grad = owned.unit.grad[owned.piece.within(owned.unit.start)].view_as(owned.master)
            grad = grad.to(self.master_dtype) if grad.dtype != self.master_dtype else grad
            owned.master.grad = grad if inv_scale is None else grad.mul_(inv_scale)
        self._prepared = True

    def _agree(self, powers: torch.Tensor | None = None) -> None:
        """One all-reduce: [a flag per trainable parameter: this rank had its gradient] + [sum |g|^p] + [overflow].

        Pieces of parameters no rank had a gradient for get no gradient (skipped). Collective.
        """
        if self._agreed:
            return
        params = self._trainable_params()
        had = self.sharded.reducer.had_grad
        local = [float(id(p) in had) for p in params]
        device = self.sharded.device
        overflow = torch.zeros(1, dtype=torch.float64, device=device)
        if self.loss_scaler is not None and powers is None:
            overflow = (
                (~torch.isfinite(norms.sum_of_powers(self._master_grads(), device=device)))
                .double()
                .reshape(1)
            )
        carried = (
            powers.reshape(1) if powers is not None else torch.zeros(1, dtype=torch.float64, device=device)
        )
        vector = torch.cat([self._local_flags(local, device), carried, overflow])
        collectives.all_reduce_(vector, self.process_group)
        if powers is not None:
            powers.copy_(vector[-2])
        self._overflow = vector[-1]
        if not all(local):  # only then may some parameter have had no gradient anywhere: read the flags back
            anywhere = dict(zip(map(id, params), (vector[: len(params)] > 0).tolist(), strict=True))
            for owned in self._pieces:
                if not anywhere[id(owned.param)]:
                    owned.master.grad = None
        self._agreed = True

    def _local_flags(self, local: list[float], device) -> torch.Tensor:
        """The flags on the device, rebuilt only when their pattern changes: a host-to-device copy from a Python
        list is a host sync on CUDA, so a step whose pattern is the last one's makes none."""
        key = tuple(local)
        if self._flags is None or self._flags[0] != key:
            self._flags = key, torch.tensor(local, dtype=torch.float64, device=device)
        return self._flags[1]

    def _master_grads(self) -> list[torch.Tensor]:
        return [owned.master.grad for owned in self._pieces if owned.master.grad is not None]

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged gradients by their global norm, as torch.nn.utils.clip_grad_norm_ would (collective).

        Returns:
            The total norm before clipping, a float32 tensor (inf/nan on fp16 overflow: nothing is clipped).
        """
        self._prepare()
        device = self.sharded.device
        powers = norms.sum_of_powers(self._master_grads(), norm_type, device=device)
        if math.isinf(norm_type):  # the largest |g| of any rank: a MAX, not a sum
            collectives.all_reduce_(powers, self.process_group, op=torch.distributed.ReduceOp.MAX)
            self._agree()
        else:
            self._agree(powers)
        total = norms.total_norm(powers, norm_type)
        self._grad_norm = total
        grads = self._master_grads()
        if grads and not math.isinf(max_norm):
            torch._foreach_mul_(grads, norms.clip_coefficient(total, max_norm))
        return total

    def step(self, closure=None, **kwargs):
        """Update this rank's pieces with the inner optimizer; round the masters into the slices (mixed precision).

        Collective (the agreement's all-reduce). With a loss scaler, an overflowing step is skipped.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._prepare()
        self._agree()
        self.last_step_skipped = False
        if self.loss_scaler is not None:
            norm = self._grad_norm
            overflow = not bool(torch.isfinite(norm)) if norm is not None else bool(self._overflow > 0)
            self.loss_scaler.update_scale(overflow)
            self.last_step_skipped = overflow
        if not self.last_step_skipped:
            for group, inner_group in zip(self.param_groups, self._inner.param_groups, strict=True):
                inner_group.update(hyperparameters(group))  # lr set by schedulers reaches the pieces
            self._inner.step(**kwargs)
            if self.has_master_copies:
                for unit in self.sharded.units:
                    if id(unit) in self.masters:
                        unit.shard.copy_(self.masters[id(unit)])
        self._end_step()
        return loss

    def _end_step(self) -> None:
        for owned in self._pieces:
            owned.master.grad = None
        self.sharded.reducer.zero_grad()
        self._prepared = self._agreed = False
        self._grad_norm = self._overflow = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop this step's gradients (the slices; the whole gradients were released during backward)."""
        if not set_to_none:
            raise UsageError(
                "Zero3Optimizer.zero_grad keeps no zero gradients; call it with set_to_none=True"
            )
        self._end_step()

    # ---------------------------------------------------------- accounting
    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds by category: params (slices + gathered buffers alive), grads (gradient slices,
        fp32 master gradients, whole gradients not reduced yet), master_params (fp32 slices, mixed precision),
        optimizer_states (the inner optimizer's), comm_buffers (the reduction in flight)."""
        sharded = self.sharded
        loose = sum(_nbytes(p.grad) for p in sharded.parameters())
        grads = sum(_nbytes(u.grad) for u in sharded.units) + loose
        if self.has_master_copies:
            grads += sum(_nbytes(g) for g in self._master_grads())
        states = sum(_nbytes(v) for s in self._inner.state.values() for v in s.values() if torch.is_tensor(v))
        return dict(
            params=sum(_nbytes(u.shard) for u in sharded.units) + sharded.gathered_bytes(),
            grads=grads,
            master_params=sum(_nbytes(m) for m in self.masters.values()) if self.has_master_copies else 0,
            optimizer_states=states,
            comm_buffers=sharded.reducer.in_flight_bytes(),
        )


def _nbytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()

"""PieceOptimizer: the step every stage shares, an elementwise torch optimizer over the pieces this rank owns.

The stages differ only in how the averaged gradients of a slice reach its owner; from there on it is here:
master gradients (`_take_grads`), one all-reduce that agrees on the step (`_agree`), global-norm clipping
(`clip_grad_norm_`), and `step()`: skipped on an fp16 overflow, else the inner optimizer and the stage's
`_publish`. How and why, step by step: docs/sharding.md, "The shared step".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding import norms
from zero_train.sharding.comm import collectives
from zero_train.sharding.comm.groups import group_rank_and_size
from zero_train.sharding.partition import Piece

ELEMENTWISE_OPTIMIZERS = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.Adamax,
    torch.optim.NAdam, torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Rprop, torch.optim.ASGD,
)  # fmt: skip
"""Optimizers whose update of an element reads only that element, so a split tensor updates bit for bit as
whole (and their subclasses); any other (LBFGS, Adafactor, ...) reads whole tensors and is refused."""


def hyperparameters(group: dict) -> dict:
    """A param group's settings (lr, betas, ...) without its parameters: what outer and inner groups share."""
    return {k: v for k, v in group.items() if k != "params"}


@dataclass(frozen=True, slots=True, eq=False)
class OwnedPiece:
    """A piece of a trainable parameter in this rank's slice, as the inner optimizer sees it."""

    param: torch.nn.Parameter
    position: int
    """Its index in the stage's `_params` (the place of its has-gradient flag)."""
    holder: object
    """The flat buffer it lies in: a Segment (ZeRO-1/2) or a Unit (ZeRO-3)."""
    piece: Piece
    master: torch.Tensor
    """Its master weights (a view of the holder's master slice): the inner optimizer's parameter."""


class PieceOptimizer(torch.optim.Optimizer):
    """The shared step of Zero1Optimizer, Zero2Optimizer and Zero3Optimizer (the stages subclass it).

    A stage sets `_params` and `_local_has_grad`, calls `_build_inner`, and implements `reduce_gradients()`
    and `_publish()`.

    Args:
        params: tensors or param-group dicts, as for any torch optimizer.
        optimizer_class: the inner optimizer: elementwise (ELEMENTWISE_OPTIMIZERS or a subclass), else UsageError.
        defaults: the inner optimizer's keyword arguments (lr, betas, weight_decay, ...).
        process_group: the data-parallel group (None: the default group).
        master_dtype: dtype of the master weights (a bf16/fp16 model gets fp32 masters of its slice only).
        loss_scaler: fp16 loss scaler (`.loss_scale`, `.update_scale(overflow)`: loss_scale.py); overflowing
            steps are skipped (`last_step_skipped`).
    """

    optimizer_class: type[torch.optim.Optimizer]
    process_group: object
    rank: int
    world_size: int
    master_dtype: torch.dtype
    loss_scaler: object | None
    last_step_skipped: bool
    _params: list[torch.nn.Parameter]
    """The parameters with a has-gradient flag, in flag order (set by the stage)."""
    _local_has_grad: list[bool]
    """Per entry of `_params`: this rank brought a gradient to this step (set by the stage)."""
    pieces: list[OwnedPiece]
    """This rank's pieces, in param_groups order."""
    inner: torch.optim.Optimizer | None
    """The inner optimizer over the masters of `pieces`, one inner group per outer group."""
    _flags: tuple[tuple[bool, ...], torch.Tensor] | None
    """The last pattern of `_local_has_grad` and its tensor on the device."""
    _agreement: torch.Tensor | None
    """This step's all-reduced [flags, |g|^p] (None before the agreement)."""

    def __init__(
        self,
        params,
        optimizer_class: type[torch.optim.Optimizer],
        defaults: dict,
        *,
        process_group=None,
        master_dtype: torch.dtype = torch.float32,
        loss_scaler=None,
    ):
        if not issubclass(optimizer_class, ELEMENTWISE_OPTIMIZERS):
            raise UsageError(
                f"{type(self).__name__} splits tensors across ranks, which is exact only for an elementwise "
                f"optimizer (SGD, Adam, AdamW, ...), not {optimizer_class.__name__}; use one of those or --engine ddp"
            )
        self.optimizer_class, self.process_group = optimizer_class, process_group
        self.rank, self.world_size = group_rank_and_size(process_group)
        self.master_dtype, self.loss_scaler = master_dtype, loss_scaler
        self.last_step_skipped = False
        super().__init__(params, defaults)
        self._params, self._local_has_grad, self.pieces = [], [], []
        self.inner, self._flags, self._agreement = None, None, None

    def reduce_gradients(self) -> None:
        """Finish averaging the gradients over the ranks; set this step's master gradients (`_take_grads`) and
        `_local_has_grad`. Idempotent until the step ends; step() and clip_grad_norm_() call it."""
        raise NotImplementedError

    def _publish(self) -> None:
        """Bring the updated masters to the model (after the inner optimizer's step)."""
        raise NotImplementedError

    def state_dict(self):
        """Refused: a shard is written by the stage's state module (zero12/state.py, zero3/state.py)."""
        raise NotImplementedError("use zero_train.sharding.zero12.state's or zero3.state's state_dict()")

    def load_state_dict(self, state_dict):
        """Refused, as state_dict()."""
        raise NotImplementedError("use zero_train.sharding.zero12.state or zero3.state's load_state_dict")

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the fp16 loss scale (identity without a loss scaler); call backward on the result."""
        return loss if self.loss_scaler is None else loss * self.loss_scaler.loss_scale

    def _build_inner(self, owned: Iterable[tuple]) -> None:
        """The inner optimizer over the masters of `owned`: (holder, piece, master) of each piece this rank owns,
        the piece's tensor being `holder.params[piece.index]` (states carry over)."""
        position = {id(p): i for i, p in enumerate(self._params)}
        pieces_of: dict[int, list] = {}
        for holder, piece, master in owned:
            pieces_of.setdefault(id(holder.params[piece.index]), []).append((holder, piece, master))
        self.pieces, inner_groups = [], []
        for group in self.param_groups:
            masters = []
            for param in group["params"]:
                for holder, piece, master in pieces_of.get(id(param), ()):
                    self.pieces.append(OwnedPiece(param, position[id(param)], holder, piece, master))
                    masters.append(master)
            inner_groups.append({**hyperparameters(group), "params": masters})
        previous = self.inner.state if self.inner is not None else {}
        self.inner = self.optimizer_class(inner_groups, **self.defaults)
        for owned in self.pieces:
            if owned.master in previous:
                self.inner.state[owned.master] = previous[owned.master]
        for group, inner_group in zip(self.param_groups, self.inner.param_groups, strict=True):
            for key, value in hyperparameters(inner_group).items():
                group.setdefault(key, value)  # so LR schedulers see "lr" even if it was a default

    def _take_grads(self, grad_of: Callable[[OwnedPiece], torch.Tensor | None]) -> None:
        """Each owned piece's averaged gradient (`grad_of`: shaped as its master, or None) -> master.grad, in the
        master dtype and unscaled; one conversion per piece, so no slice-sized temporary (docs/bench.md)."""
        inv_scale = None if self.loss_scaler is None else 1.0 / self.loss_scaler.loss_scale
        for owned in self.pieces:
            grad = grad_of(owned)
            if grad is not None and grad.dtype != self.master_dtype:
                grad = grad.to(self.master_dtype)
            if grad is not None and inv_scale is not None:
                grad.mul_(inv_scale)
            owned.master.grad = grad

    def _master_grads(self) -> list[torch.Tensor]:
        return [owned.master.grad for owned in self.pieces if owned.master.grad is not None]

    def _agree(self, powers: torch.Tensor | None = None, op=torch.distributed.ReduceOp.SUM) -> None:
        """One all-reduce (`op`) of [has-gradient flag per parameter] + [this rank's |g|^p sum or max, `powers`; by
        default the sum of squares]: drops the gradients no rank had (one only some ranks had counts as zeros
        there: DDP's rule); `powers` becomes the total, not finite after an fp16 overflow. Collective."""
        if self._agreement is not None:
            return
        device, key = self._params[0].device, tuple(self._local_has_grad)
        if self._flags is None or self._flags[0] != key:  # a host-to-device copy only on a new pattern
            self._flags = key, torch.tensor(key, dtype=torch.float64, device=device)
        if powers is None:
            powers = norms.sum_of_powers(self._master_grads() if self.loss_scaler else [], device=device)
        vector = torch.cat([self._flags[1], powers.reshape(1)])
        collectives.all_reduce_(vector, self.process_group, op=op)
        powers.copy_(vector[-1])
        self._agreement = vector
        active = [p.requires_grad for p in self._params]
        has_grad = active
        if not all(local or not act for local, act in zip(key, active, strict=True)):  # read back: host sync
            has_grad = [n > 0 and act for n, act in zip(vector[: len(active)].tolist(), active, strict=True)]
        for owned in self.pieces:
            if not has_grad[owned.position]:
                owned.master.grad = None

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged gradients by their global norm, as torch.nn.utils.clip_grad_norm_ would; partial
        sums of |g|^p in float64 (norms.py), added over the ranks by the agreement. Collective.

        Args:
            max_norm: clip to this norm (math.inf: only compute the norm).
            norm_type: the p of the p-norm (math.inf: the largest |g|).

        Returns:
            The norm before clipping, a float32 tensor on the device (inf/nan on fp16 overflow).
        """
        self.reduce_gradients()
        powers = norms.sum_of_powers(self._master_grads(), norm_type, device=self._params[0].device)
        max_of_ranks = math.isinf(norm_type)  # the largest |g| of any rank: a MAX, not a sum (flags alike)
        if max_of_ranks:  # gloo's MAX drops a NaN on one side (std::max): an overflow must reach every rank
            powers = torch.nan_to_num(powers, nan=math.inf)
        self._agree(
            powers, torch.distributed.ReduceOp.MAX if max_of_ranks else torch.distributed.ReduceOp.SUM
        )
        grad_norm = norms.total_norm(powers, norm_type)
        grads = self._master_grads()
        if grads and not math.isinf(max_norm):
            torch._foreach_mul_(grads, norms.clip_coefficient(grad_norm, max_norm))
        return grad_norm

    def step(self, closure=None, **kwargs):
        """Update this rank's pieces with the inner optimizer, then publish them; skip on an fp16 overflow.

        Args:
            closure: re-evaluates the model and returns the loss (run before the gradients are taken).
            **kwargs: passed to the inner optimizer's step().

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        self._agree()
        self.last_step_skipped = False
        if self.loss_scaler is not None:  # the agreed |g|^p: not finite if any rank's gradients overflowed
            self.last_step_skipped = not bool(torch.isfinite(self._agreement[-1]))
            self.loss_scaler.update_scale(self.last_step_skipped)
        if not self.last_step_skipped:
            for group, inner_group in zip(self.param_groups, self.inner.param_groups, strict=True):
                inner_group.update(hyperparameters(group))  # lr set by schedulers reaches the pieces
            self.inner.step(**kwargs)
            for group, inner_group in zip(self.param_groups, self.inner.param_groups, strict=True):
                group.update(hyperparameters(inner_group))  # what the inner optimizer changed or added
            self._publish()
        self._end_step()
        return loss

    def _end_step(self) -> None:
        """Forget this step's gradients and agreement (after the step or zero_grad)."""
        for owned in self.pieces:
            owned.master.grad = None
        self._agreement = None

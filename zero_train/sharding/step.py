"""PieceOptimizer: the step every stage shares, an elementwise torch optimizer over the pieces this rank owns.

Each stage keeps, on rank r, the r-th slice of its flat buffers (ZeRO-1/2: a segment of the whole model,
ZeRO-3: a unit), and a slice holds pieces of parameters (partition.py: a tensor cut by a slice boundary is
split, each owner updating its own piece). The stages differ in how the averaged gradients of a slice reach
its owner; from there on everything is here:

    _take_grads(grad_of)  each owned piece's averaged gradient -> its master's .grad (fp32, unscaled for fp16)
    clip_grad_norm_()     float64 partial sums of |g|^p of the pieces (norms.py), added over the ranks in the
                          same all-reduce as the agreement, and torch's clamped factor applied on the device
    step()                skipped on an fp16 overflow; else the inner optimizer updates the masters and the
                          stage publishes them (ZeRO-1/2: an all-gather; ZeRO-3: rounded into the slices)

The inner optimizer (AdamW, Adam, SGD, ...) runs on the masters: views of the fp32 master slice, the slice
itself for an fp32 model. The update of an element reads only its own parameter, gradient and state, so the
pieces update bit for bit as the whole tensors would (tests/sharding/test_partition.py checks each optimizer).

The agreement is ONE all-reduce of [a has-gradient flag per trainable parameter] + [sum |g|^p] + [fp16
overflow]. A parameter no rank had a gradient for is skipped, as torch's optimizers skip a .grad of None;
where only some ranks had one it counted as zeros (DDP's rule). Nothing is read back to the host in a step of
an fp32/bf16 model unless this rank lacked some trainable parameter's gradient (then the flags are), and the
fp16 overflow is read back every step (it decides whether the step happens).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding import norms
from zero_train.sharding.comm import collectives
from zero_train.sharding.comm.groups import group_rank_and_size
from zero_train.sharding.loss_scale import DynamicLossScaler
from zero_train.sharding.partition import Piece
from zero_train.sharding.state_dict import hyperparameters, shard_of

ELEMENTWISE_OPTIMIZERS = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.Adamax,
    torch.optim.NAdam, torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Rprop, torch.optim.ASGD,
)  # fmt: skip
"""Optimizers whose update of an element reads only that element, so a tensor split in two pieces updates
bit for bit as whole (tests/sharding/test_partition.py checks each); their subclasses are accepted too. Any other
(LBFGS, Adafactor, ...) is refused: its update reads whole tensors."""


@dataclass(frozen=True, slots=True, eq=False)
class OwnedPiece:
    """A piece of a trainable parameter in this rank's slice, as the inner optimizer sees it."""

    param: torch.nn.Parameter
    """The model's parameter."""
    position: int
    """Its index in the stage's `_params` (the place of its has-gradient flag)."""
    holder: object
    """The flat buffer it lies in: a Segment (ZeRO-1/2, zero12/segments.py) or a Unit (ZeRO-3, zero3/units.py)."""
    piece: Piece
    """Where the piece lies in the parameter and in the flat buffer."""
    master: torch.Tensor
    """Its master weights (a view of the holder's master slice): the inner optimizer's parameter."""


PiecesOf = Callable[[torch.nn.Parameter], list[tuple[object, Piece, torch.Tensor]]]
"""parameter -> (holder, piece, master) of each of its pieces this rank owns (none: [])."""


class PieceOptimizer(torch.optim.Optimizer):
    """The shared step of Zero1Optimizer, Zero2Optimizer and Zero3Optimizer (the stages subclass it).

    A stage sets `_params` and `_local_has_grad` and implements the three steps of its own:
    `_gradients_ready()` (this step's master gradients are set: `_take_grads`), `_publish()` (after the inner
    optimizer's update) and `_device()`; `_end_step()` forgets the step (a stage extends it).

    Args:
        params: tensors or param-group dicts, as for any torch optimizer.
        optimizer_class: the inner optimizer: elementwise (ELEMENTWISE_OPTIMIZERS or a subclass), since a
            tensor may be split across ranks.
        defaults: the inner optimizer's keyword arguments (lr, betas, weight_decay, ...).
        process_group: the data-parallel group (None: the default group).
        master_dtype: dtype of the master weights (a bf16/fp16 model gets fp32 masters of its slice only).
        loss_scaler: fp16 dynamic loss scaler; overflowing steps are skipped (`last_step_skipped`).

    Raises:
        UsageError: an optimizer that is not elementwise.
    """

    optimizer_class: type[torch.optim.Optimizer]
    process_group: object
    """The data-parallel group (None: the default group)."""
    rank: int
    world_size: int
    master_dtype: torch.dtype
    loss_scaler: DynamicLossScaler | None
    last_step_skipped: bool
    """The last step() was skipped: an fp16 overflow on some rank."""
    _params: list[torch.nn.Parameter]
    """The parameters with a has-gradient flag, in flag order (set by the stage)."""
    _local_has_grad: list[bool]
    """Per entry of `_params`: this rank brought a gradient to this step (set by the stage)."""
    _pieces: list[OwnedPiece]
    """This rank's pieces, in param_groups order: the inner optimizer's parameters."""
    _inner: torch.optim.Optimizer | None
    """The inner optimizer over the masters of `_pieces`, one inner group per outer group."""
    _flags: tuple[tuple[bool, ...], torch.Tensor] | None
    """The last pattern of `_local_has_grad` and its float64 tensor on the device."""
    _agreed: bool
    """The agreement's all-reduce of this step is done."""
    _agreement: torch.Tensor | None
    """Its result: summed flags, the sum of |g|^p (if clipping carried it), the overflow count."""
    _grad_norm: torch.Tensor | None
    """The norm clip_grad_norm_ found this step (None before)."""

    def __init__(
        self,
        params,
        optimizer_class: type[torch.optim.Optimizer],
        defaults: dict,
        *,
        process_group=None,
        master_dtype: torch.dtype = torch.float32,
        loss_scaler: DynamicLossScaler | None = None,
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
        self._params, self._local_has_grad, self._pieces = [], [], []
        self._inner, self._flags = None, None
        self._agreed, self._agreement, self._grad_norm = False, None, None

    # ----------------------------------------------------------- the stage's part
    def _gradients_ready(self) -> None:
        """Make this step's master gradients (`_take_grads`) and `_local_has_grad`; idempotent until the step ends."""
        raise NotImplementedError

    def _publish(self) -> None:
        """Bring the updated masters to the model (after the inner optimizer's step)."""
        raise NotImplementedError

    def _device(self) -> torch.device:
        """Where the gradients, masters and flags live."""
        raise NotImplementedError

    # ------------------------------------------------------------ the pieces
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the fp16 loss scale (identity without a loss scaler); call backward on the result."""
        return loss if self.loss_scaler is None else loss * self.loss_scaler.loss_scale

    def _build_inner(self, pieces_of: PiecesOf) -> None:
        """The inner optimizer over this rank's pieces, one inner group per outer group (states carry over)."""
        position = {id(p): i for i, p in enumerate(self._params)}
        self._pieces, inner_groups = [], []
        for group in self.param_groups:
            masters = []
            for param in group["params"]:
                for holder, piece, master in pieces_of(param):
                    self._pieces.append(OwnedPiece(param, position[id(param)], holder, piece, master))
                    masters.append(master)
            inner_groups.append({**hyperparameters(group), "params": masters})
        previous = self._inner.state if self._inner is not None else {}
        self._inner = self.optimizer_class(inner_groups, **self.defaults)
        for owned in self._pieces:
            if owned.master in previous:
                self._inner.state[owned.master] = previous[owned.master]
        for group, inner_group in zip(self.param_groups, self._inner.param_groups, strict=True):
            for key, value in hyperparameters(inner_group).items():
                group.setdefault(key, value)  # so LR schedulers see "lr" even if it was a default

    def _take_grads(self, grad_of: Callable[[OwnedPiece], torch.Tensor | None]) -> None:
        """Each owned piece's averaged gradient (`grad_of`, shaped as its master; None: none) -> master.grad,
        in the master dtype and unscaled for fp16.

        One conversion per piece, not one of the whole slice: a fresh buffer above glibc's mmap threshold
        (32 MB at most) is page-faulted in again every step (docs/bench.md).
        """
        inv_scale = None if self.loss_scaler is None else 1.0 / self.loss_scaler.loss_scale
        for owned in self._pieces:
            grad = grad_of(owned)
            if grad is not None and grad.dtype != self.master_dtype:
                grad = grad.to(self.master_dtype)
            if grad is not None and inv_scale is not None:
                grad.mul_(inv_scale)
            owned.master.grad = grad

    def _master_grads(self) -> list[torch.Tensor]:
        return [owned.master.grad for owned in self._pieces if owned.master.grad is not None]

    # --------------------------------------------------------- the agreement
    def _local_flags(self) -> torch.Tensor:
        """The has-gradient flags on the device, rebuilt only when their pattern changes: a host-to-device copy
        from a Python list is a host sync on CUDA, so a step whose pattern is the last one's makes none."""
        key = tuple(self._local_has_grad)
        if self._flags is None or self._flags[0] != key:
            flags = torch.tensor([float(f) for f in key], dtype=torch.float64, device=self._device())
            self._flags = key, flags
        return self._flags[1]

    def _agree(self, powers: torch.Tensor | None = None) -> None:
        """One all-reduce of [has-gradient flags per parameter] + [sum of |g|^p] + [fp16 overflows].

        Idempotent until the step ends; fills `powers` (this rank's sum of |g|^p) in place. Collective.
        """
        if self._agreed:
            return
        device = self._device()
        overflow = torch.zeros(1, dtype=torch.float64, device=device)
        if self.loss_scaler is not None and powers is None:
            local = norms.sum_of_powers(self._master_grads(), device=device)
            overflow = (~torch.isfinite(local)).to(torch.float64).reshape(1)
        carried = (
            powers.reshape(1) if powers is not None else torch.zeros(1, dtype=torch.float64, device=device)
        )
        vector = torch.cat([self._local_flags(), carried, overflow])
        collectives.all_reduce_(vector, self.process_group)
        if powers is not None:
            powers.copy_(vector[-2])
        self._agreement = vector
        has_grad = self._has_grad_anywhere(vector[: len(self._params)])
        for owned in self._pieces:
            if not has_grad[owned.position]:
                owned.master.grad = None
        self._agreed = True

    def _has_grad_anywhere(self, counts: torch.Tensor) -> list[bool]:
        """Whether any rank had each parameter's gradient: known without reading `counts` back when this rank
        had every trainable one itself (the usual case), read back (a host sync) otherwise."""
        active = [p.requires_grad for p in self._params]
        if all(local or not act for local, act in zip(self._local_has_grad, active, strict=True)):
            return active
        anywhere = (counts > 0).tolist()
        return [a and act for a, act in zip(anywhere, active, strict=True)]

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged gradients by their global norm, as torch.nn.utils.clip_grad_norm_ would.

        Each rank adds the partial sums of |g|^p of its pieces in float64 (norms.py), the agreement's
        all-reduce adds the ranks', and the gradients are multiplied by torch's clamped factor without
        reading the norm back. Collective.

        Args:
            max_norm: clip to this norm (math.inf: only compute the norm).
            norm_type: the p of the p-norm (math.inf: the largest |g|).

        Returns:
            The total norm before clipping, a float32 tensor on the device (inf/nan on fp16 overflow).
        """
        self._gradients_ready()
        powers = norms.sum_of_powers(self._master_grads(), norm_type, device=self._device())
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

    def _masters_in_shard(self) -> bool:
        """Whether this stage's shard carries the masters (ZeRO-1/2 in mixed precision; ZeRO-3's weights travel
        apart)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """This rank's shard: the state (and, where the stage keeps them there, the masters) of its pieces, in
        the format every stage shares (state_dict.shard_of)."""
        return shard_of(
            self._pieces,
            self._inner,
            self.param_groups,
            rank=self.rank,
            world_size=self.world_size,
            loss_scaler=self.loss_scaler,
            masters=self._masters_in_shard(),
        )

    # -------------------------------------------------------------- the step
    def _overflow(self) -> bool:
        """True if any rank's averaged gradients hold inf/nan (fp16 loss scaling; reads one number back)."""
        if self._grad_norm is not None:
            return not bool(torch.isfinite(self._grad_norm))
        return bool(self._agreement[-1] > 0)

    def step(self, closure=None, **kwargs):
        """Update this rank's pieces with the inner optimizer, then publish them (the stage's `_publish`).

        Makes the gradients ready first if nothing did. With a loss scaler, an overflowing step is skipped
        (`last_step_skipped`) and the scale updated. Collective.

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
        self._gradients_ready()
        self._agree()
        self.last_step_skipped = False
        if self.loss_scaler is not None:
            overflow = self._overflow()
            self.loss_scaler.update_scale(overflow)
            self.last_step_skipped = overflow
        if not self.last_step_skipped:
            for group, inner_group in zip(self.param_groups, self._inner.param_groups, strict=True):
                inner_group.update(hyperparameters(group))  # lr set by schedulers reaches the pieces
            self._inner.step(**kwargs)
            for group, inner_group in zip(self.param_groups, self._inner.param_groups, strict=True):
                group.update(hyperparameters(inner_group))  # what the inner optimizer changed or added
            self._publish()
        self._end_step()
        return loss

    def _end_step(self) -> None:
        """Forget this step's gradients and agreement (after the step or zero_grad)."""
        for owned in self._pieces:
            owned.master.grad = None
        self._agreed = False
        self._grad_norm = self._agreement = None

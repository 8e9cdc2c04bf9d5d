"""ShardedOptimizer: what our ZeRO-1 and ZeRO-2 share (segments, masters, clipping, the step, param_groups).

Every rank keeps the whole model; the optimizer state (and, for a bf16/fp16 model, the fp32 master
weights) of each element lives on ONE rank: the trainable tensors sit end to end in a flat buffer cut into
N equal slices, one per rank (partition.py, segments.py). What the stages differ in is only where the
gradients go before the step:

    Zero1Optimizer (zero1.py)   a flat buffer of ALL gradients, reduced to the owners bucket by bucket
    Zero2Optimizer (zero2.py)   buckets reduced to their owners during backward; a rank keeps only the
                                gradients it owns

A subclass keeps one gradient store per segment (`_build_grads`) and, in `reduce_gradients()`, hands the
averaged gradients of each slice to `_set_master_grads`. The rest is here: exact global-norm clipping,
the inner optimizer's step on this rank's pieces, the all-gather, param_groups and add_param_group, the
accounting; state dicts are in state_dict.py.

No host synchronisation in a step of an fp32/bf16 model: the agreement on which parameters had a
gradient, the norm and the clipping factor stay on the device. The flags are read back only when this
rank itself lacked the gradient of a trainable parameter (then some parameter may have to be skipped),
and the fp16 overflow decision is read back every step (it decides whether the step happens).
"""

from __future__ import annotations

import math

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding import norms
from zero_train.sharding.comm import collectives
from zero_train.sharding.comm.groups import backend_name, group_rank_and_size
from zero_train.sharding.comm.overlap import ReductionQueue
from zero_train.sharding.state_dict import ShardedStateDict, hyperparameters
from zero_train.sharding.zero12.hooks import BackwardHooks
from zero_train.sharding.zero12.layout import OwnedPiece, ShardedLayout
from zero_train.sharding.zero12.report import ShardedReport
from zero_train.sharding.zero12.segments import Segment

ELEMENTWISE_OPTIMIZERS = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.Adamax,
    torch.optim.NAdam, torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Rprop, torch.optim.ASGD,
)  # fmt: skip
"""Optimizers whose update of an element reads only that element, so a tensor split in two pieces updates
bit for bit as whole (tests/sharding/test_partition.py checks each); their subclasses are accepted too. Any other
(LBFGS, Adafactor, ...) is refused: its update reads whole tensors."""


class ShardedOptimizer(ShardedLayout, ShardedStateDict, ShardedReport, torch.optim.Optimizer):
    """Shards the state of an elementwise torch optimizer over the data-parallel ranks, element by element.

    Args:
        params: tensors or param-group dicts, as for any torch optimizer. A parameter with
            requires_grad=False gets no slice, state or communication until it is unfrozen (then the
            next reduce_gradients() adds it in a new segment); one frozen later keeps its slice and state
            but stops travelling.
        optimizer_class: the inner optimizer, run on this rank's pieces: elementwise (ELEMENTWISE_OPTIMIZERS
            or a subclass), since a tensor may be split across ranks.
        process_group: the data-parallel group (None: the default group).
        master_dtype: dtype of the master weights; a model in another dtype (bf16/fp16) gets fp32 masters
            of this rank's slice only.
        loss_scaler: fp16 dynamic loss scaler (`.loss_scale`, `.update_scale(overflow)`); overflowing
            steps are skipped (`last_step_skipped`).
        bucket_elements: the largest gradient bucket, in elements (zero_optimization.reduce_bucket_size);
            None: one bucket per run of trainable tensors (everything reduced at once).
        grad_dtype: the dtype gradients accumulate in over the micro-batches (None: the parameters'; our
            engines pass fp32 for a 16-bit model: ds_config.parse.gradient_dtypes).
        reduce_dtype: the dtype gradients are summed over the ranks in (None: grad_dtype).
        **defaults: the inner optimizer's keyword arguments (lr, betas, weight_decay, ...).

    Raises:
        ValueError: empty parameter list (torch's message), bucket_elements below 1; TypeError: non-tensor
        entries. UsageError: an optimizer that is not elementwise, trainable parameters of different dtypes
        or devices.
    """

    def __init__(
        self,
        params,
        optimizer_class: type[torch.optim.Optimizer],
        *,
        process_group=None,
        master_dtype: torch.dtype = torch.float32,
        loss_scaler=None,
        bucket_elements: int | None = None,
        grad_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
        **defaults,
    ):
        if not issubclass(optimizer_class, ELEMENTWISE_OPTIMIZERS):
            raise UsageError(
                f"{type(self).__name__} splits tensors across ranks, which is exact only for an elementwise "
                f"optimizer (SGD, Adam, AdamW, ...), not {optimizer_class.__name__}; use one of those or --engine ddp"
            )
        if bucket_elements is not None and int(bucket_elements) < 1:
            raise ValueError(f"bucket_elements must be at least 1, got {bucket_elements}")
        self._ready = False
        self.optimizer_class = optimizer_class
        self.bucket_elements = int(bucket_elements) if bucket_elements is not None else None
        self.process_group, self.master_dtype, self.loss_scaler = process_group, master_dtype, loss_scaler
        self.grad_dtype, self.reduce_dtype = grad_dtype, reduce_dtype
        self.rank, self.world_size = group_rank_and_size(process_group)
        self.backend = backend_name(process_group)
        self.last_step_skipped = False
        super().__init__(params, defaults)
        # every parameter that has been trainable, in segment order
        self._params: list[torch.nn.Parameter] = []
        self._segments: list[Segment] = []
        self._stores: list = []  # the subclass's gradient store of each segment
        self._pieces: list[OwnedPiece] = []
        self._inner: torch.optim.Optimizer | None = None
        self._queue = ReductionQueue(process_group, None)
        self._hooks: BackwardHooks | None = None
        self._in_backward = self._flushed = False
        self._reduced = self._agreed = False
        self._grad_norm: torch.Tensor | None = None
        self._local_has_grad: list[bool] = []
        # the last pattern of local has-gradient flags and its tensor on the device
        self._flags: tuple[tuple[bool, ...], torch.Tensor] | None = None
        self._agreement: torch.Tensor | None = None
        self._add_trainable([p for g in self.param_groups for p in g["params"]])
        self._ready = True

    def _gradient_dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        """(accumulation, reduction) dtype of the gradients, the parameters' where not given."""
        grad_dtype = self.grad_dtype or self._params[0].dtype
        return grad_dtype, self.reduce_dtype or grad_dtype

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the fp16 loss scale (identity without a loss scaler); call backward on the result."""
        return loss if self.loss_scaler is None else loss * self.loss_scaler.loss_scale

    def reduce_gradients(self) -> None:
        """Average the gradients over the ranks; each rank ends with the average of its slice.

        A subclass sets `_local_has_grad` (per entry of `_params`: did this rank bring a gradient) and
        calls `_set_master_grads` with each segment's averaged slice.
        """
        raise NotImplementedError

    def _set_master_grads(self, owned_grads: list[torch.Tensor]) -> None:
        """Each segment's averaged slice -> the master gradients of its pieces (fp32, unscaled for fp16).

        One conversion per piece, not one of the whole slice: a fresh buffer above glibc's mmap threshold
        (32 MB at most) is page-faulted in again every step (docs/bench.md).
        """
        by_segment = {id(s): g for s, g in zip(self._segments, owned_grads, strict=True)}
        for owned in self._pieces:
            if not owned.param.requires_grad:  # frozen: not reduced, its slot holds nothing of this step
                owned.master.grad = None
                continue
            grad = owned.segment.owned_view(by_segment[id(owned.segment)], owned.piece)
            if grad.dtype != self.master_dtype:
                grad = grad.to(self.master_dtype)
            if self.loss_scaler is not None:
                grad.mul_(1.0 / self.loss_scaler.loss_scale)
            owned.master.grad = grad

    def _local_flags(self) -> torch.Tensor:
        """1.0 per trainable parameter this rank brought a gradient for (float64, on the device), rebuilt
        only when the pattern changes: a host-to-device copy in the steps where it does."""
        key = tuple(self._local_has_grad)
        if self._flags is None or self._flags[0] != key:
            device = self._params[0].device
            self._flags = key, torch.tensor([float(f) for f in key], dtype=torch.float64, device=device)
        return self._flags[1]

    def _agree(self, powers: torch.Tensor | None = None) -> None:
        """One all-reduce of [has-gradient flags per parameter] + [sum of |g|^p] + [fp16 overflows].

        A parameter no rank had a gradient for is skipped exactly as the inner optimizer skips one whose
        .grad is None (no state change, no update). Where only some ranks had one, it counted as zero on
        the others (DDP's rule). Idempotent until the step ends; fills `powers` in place. Collective.
        """
        if self._agreed:
            return
        device = self._params[0].device
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

    def _master_grads(self) -> list[torch.Tensor]:
        return [owned.master.grad for owned in self._pieces if owned.master.grad is not None]

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged gradients by their global norm, as torch.nn.utils.clip_grad_norm_ would.

        Each rank adds the partial sums of |g|^p of its pieces in float64 (norms.py), one all-reduce adds
        the ranks' (with the has-gradient flags, `_agree`), and the gradients are multiplied by torch's
        clamped factor without reading the norm back. Collective.

        Args:
            max_norm: clip to this norm (math.inf: only compute the norm).
            norm_type: the p of the p-norm (math.inf: the largest |g|).

        Returns:
            The total norm before clipping, a float32 tensor on the device (inf/nan on fp16 overflow).
        """
        self.reduce_gradients()
        device = self._params[0].device
        powers = norms.sum_of_powers(self._master_grads(), norm_type, device=device)
        if math.isinf(norm_type):
            collectives.all_reduce_(powers, self.process_group, op=torch.distributed.ReduceOp.MAX)
            self._agree()
        else:
            self._agree(powers)
        total = norms.total_norm(powers, norm_type)
        self._grad_norm = total
        if not math.isinf(max_norm):
            grads = self._master_grads()
            if grads:
                torch._foreach_mul_(grads, norms.clip_coefficient(total, max_norm))
        return total

    def _overflow(self) -> bool:
        """True if any rank's averaged gradients hold inf/nan (fp16 loss scaling; reads one number back)."""
        if self._grad_norm is not None:
            return not bool(torch.isfinite(self._grad_norm))
        return bool(self._agreement[-1] > 0)

    def step(self, closure=None, **kwargs):
        """Update this rank's pieces with the inner optimizer, then all-gather every segment.

        Reduces the gradients first if reduce_gradients() was not called. With a loss scaler, an
        overflowing step is skipped (`last_step_skipped`) and the scale updated. Collective.

        Args:
            closure: re-evaluates the model and returns the loss (run before reducing).
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
            for segment in self._segments:
                segment.publish(self.process_group)
        self._end_step()
        return loss

    def _end_step(self) -> None:
        for owned in self._pieces:
            owned.master.grad = None
        for store in self._stores:
            store.new_step()
        self._reduced = self._agreed = self._flushed = False
        self._grad_norm = self._agreement = None

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (collective after construction): its tensors go into a new segment, split over the ranks."""
        super().add_param_group(param_group)
        if self._ready:
            self._add_trainable(list(self.param_groups[-1]["params"]))

"""ShardedOptimizer: what our ZeRO-1 and ZeRO-2 share: segments, their gradient stores, the hooks.

Every rank keeps the whole model; the optimizer state (and, for a bf16/fp16 model, the fp32 master
weights) of each element lives on ONE rank: the trainable tensors sit end to end in a flat buffer cut into
N equal slices, one per rank (partition.py, segments.py). What the stages differ in is only where the
gradients go before the step:

    Zero1Optimizer (zero1.py)   a flat buffer of ALL gradients, reduced to the owners bucket by bucket
    Zero2Optimizer (zero2.py)   buckets reduced to their owners during backward; a rank keeps only the
                                gradients it owns

A subclass builds one gradient store per segment (`_build_grads`: flat_grads.FlatGradients or
grad_buckets.GradientBuckets, one interface) and, in `reduce_gradients()`, hands the averaged gradients of
each slice to the shared step (step.py: the inner optimizer over this rank's pieces, the agreement, exact
global-norm clipping, skip on fp16 overflow); `_publish` all-gathers the updated slices.

The trainable parameters live in segments: one for the parameters trainable at construction, one more for
each group added later or unfrozen after construction, so that no slice ever moves and no optimizer state
ever changes rank. The hooks (hooks.py) report each gradient of backward to the stage, which reduces its
buckets in one order for all segments (schedule.BucketSchedule). State dicts (state.py) and bytes held and
sent (report.py) are functions of the optimizer, apart.
"""

from __future__ import annotations

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding.comm import collectives, gloo
from zero_train.sharding.comm.groups import backend_name
from zero_train.sharding.comm.overlap import ReductionQueue
from zero_train.sharding.step import OwnedPiece, PieceOptimizer
from zero_train.sharding.zero12.hooks import BackwardHooks
from zero_train.sharding.zero12.schedule import BucketSchedule, GradientStore
from zero_train.sharding.zero12.segments import Segment


class ShardedOptimizer(PieceOptimizer):
    """Shards the state of an elementwise torch optimizer over the data-parallel ranks, element by element.

    Args:
        params: tensors or param-group dicts, as for any torch optimizer. A parameter with
            requires_grad=False gets no slice, state or communication until it is unfrozen (then the
            next reduce_gradients() adds it in a new segment); one frozen later keeps its slice and state
            but stops travelling.
        optimizer_class: the inner optimizer, run on this rank's pieces: elementwise
            (step.ELEMENTWISE_OPTIMIZERS or a subclass), since a tensor may be split across ranks.
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

    bucket_elements: int | None
    backend: str
    """The group's backend ("gloo", "nccl", ...)."""
    grad_dtype: torch.dtype | None
    reduce_dtype: torch.dtype | None
    _ready: bool
    """Construction is over (add_param_group is then collective and makes a segment)."""
    segments: list[Segment]
    """Every segment, oldest first; `_params` is their parameters, in segment order."""
    _queue: ReductionQueue
    """The bucket reductions in flight (and the gloo rings' receive buffer)."""
    _stores: list[GradientStore]
    """The gradient store of each segment (the subclass's kind)."""
    _where: dict[int, tuple[GradientStore, int]]
    """id(param) -> (its segment's store, its index in the segment)."""
    _schedule: BucketSchedule
    """Every segment's buckets in the one order all ranks reduce them in."""
    _hooks: BackwardHooks | None
    _in_backward: bool
    """A backward is running (its first gradient arrived, its end has not)."""
    _flushed: bool
    """Every bucket of this step's last backward is reduced."""
    _reduced: bool
    """reduce_gradients() is done for this step."""

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
        if bucket_elements is not None and int(bucket_elements) < 1:
            raise ValueError(f"bucket_elements must be at least 1, got {bucket_elements}")
        self._ready = False
        self.bucket_elements = int(bucket_elements) if bucket_elements is not None else None
        self.grad_dtype, self.reduce_dtype = grad_dtype, reduce_dtype
        self.backend = backend_name(process_group)
        super().__init__(
            params,
            optimizer_class,
            defaults,
            process_group=process_group,
            master_dtype=master_dtype,
            loss_scaler=loss_scaler,
        )
        self.segments, self._stores, self._where = [], [], {}
        self._queue = ReductionQueue(process_group, None)
        self._hooks = None
        self._in_backward = self._flushed = self._reduced = False
        self._add_trainable([p for g in self.param_groups for p in g["params"]])
        self._ready = True

    def _gradient_dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        """(accumulation, reduction) dtype of the gradients, the parameters' where not given."""
        grad_dtype = self.grad_dtype or self._params[0].dtype
        return grad_dtype, self.reduce_dtype or grad_dtype

    def _device(self) -> torch.device:
        return self._params[0].device

    # ------------------------------------------------------------- the stage's part
    def _build_grads(self, segment: Segment) -> GradientStore:
        """This stage's gradient store for a new segment (its buffers)."""
        raise NotImplementedError

    def on_grad(self, param: torch.Tensor) -> None:
        """A gradient of this backward is complete (called by the hooks)."""
        raise NotImplementedError

    def on_backward_end(self) -> None:
        """The backward that called on_grad has ended."""
        raise NotImplementedError

    def reduce_gradients(self) -> None:
        """Average the gradients over the ranks; each rank ends with the average of its slice.

        A subclass sets `_local_has_grad` (per entry of `_params`: did this rank bring a gradient) and
        calls `_set_master_grads` with each segment's averaged slice.
        """
        raise NotImplementedError

    def _gradients_ready(self) -> None:
        self.reduce_gradients()

    def _has_grads(self) -> list[bool]:
        """Per entry of `_params`: trainable, and this rank brought its gradient to this step."""
        return [p.requires_grad and self._where[id(p)][0].has_grad(p) for p in self._params]

    def _set_master_grads(self, owned_grads: list[torch.Tensor]) -> None:
        """Each segment's averaged slice -> the master gradients of its pieces (step.PieceOptimizer._take_grads)."""
        by_segment = {id(s): g for s, g in zip(self.segments, owned_grads, strict=True)}

        def grad_of(owned: OwnedPiece) -> torch.Tensor | None:
            if not owned.param.requires_grad:  # frozen: not reduced, its slot holds nothing of this step
                return None
            return owned.holder.owned_view(by_segment[id(owned.holder)], owned.piece)

        self._take_grads(grad_of)

    def _publish(self) -> None:
        for segment in self.segments:
            segment.publish(self.process_group)

    def _end_step(self) -> None:
        super()._end_step()
        for store in self._stores:
            store.new_step()
        self._reduced = self._flushed = False

    # ---------------------------------------------------------------- the layout
    def _add_trainable(self, params: list[torch.Tensor]) -> None:
        """Put the parameters that have never been trainable and now are into a new segment; rebuild the inner
        optimizer over this rank's pieces (the state of the existing pieces carries over)."""
        known = {id(p) for p in self._params}
        new = list({id(p): p for p in params if p.requires_grad and id(p) not in known}.values())
        if not self._params and not new:
            raise UsageError(
                f"{type(self).__name__} got no trainable parameters (all have requires_grad=False)"
            )
        self._check_uniform(self._params + new)
        if new:
            segment = Segment(new, rank=self.rank, world_size=self.world_size, master_dtype=self.master_dtype)
            self.segments.append(segment)
            self._params += new
            self._stores.append(self._build_grads(segment))
            self._queue.recv_buffer = self._receive_buffer()
            self._relayout()
        owned: dict[int, list] = {}
        for segment in self.segments:
            for piece in segment.pieces:
                owned.setdefault(id(segment.params[piece.index]), []).append(
                    (segment, piece, segment.master_view(piece))
                )
        self._build_inner(lambda param: owned.get(id(param), []))

    def _check_uniform(self, params: list[torch.Tensor]) -> None:
        if len({p.dtype for p in params}) > 1 or len({p.device for p in params}) > 1:
            found = sorted({f"{p.dtype} on {p.device}" for p in params})
            raise UsageError(
                f"{type(self).__name__} needs all trainable parameters in one dtype on one device, got "
                f"{found}; cast the model with model.to(dtype) first"
            )

    def _relayout(self) -> None:
        """Hook the parameters trainable now and put every segment's buckets in one schedule."""
        if self._hooks is not None:
            self._hooks.remove()
        self._where = {
            id(p): (st, i)
            for sg, st in zip(self.segments, self._stores, strict=True)
            for i, p in enumerate(sg.params)
        }
        self._hooks = BackwardHooks(
            self, [p for s in self.segments for p, a in zip(s.params, s.active, strict=True) if a]
        )
        self._schedule = BucketSchedule(self._stores, self._queue)

    def on_first_grad(self) -> None:
        """The first gradient of a backward: take in parameters frozen or unfrozen since the last one."""
        self._refresh_trainable()

    def _receive_buffer(self) -> torch.Tensor | None:
        """The gloo rings' receive buffer, for the largest bucket of any segment (None elsewhere)."""
        if not (self.world_size > 1 and collectives.uses_p2p_rings(self.process_group)):
            return None
        buckets = [bucket for store in self._stores for bucket in store.buckets]
        elements = max((gloo.ring_receive_elements(list(b.lengths)) for b in buckets), default=1)
        return torch.empty(elements, dtype=self._gradient_dtypes()[1], device=self._device())

    def _refresh_trainable(self) -> None:
        """Take in parameters unfrozen since the last call (a new segment) and frozen ones (their buckets).

        Every rank must change requires_grad alike (as they run the same code). Cost: one pass over the
        parameters per step.
        """
        all_params = [p for g in self.param_groups for p in g["params"]]
        known = {id(p) for p in self._params}
        if any(p.requires_grad and id(p) not in known for p in all_params):
            self._add_trainable(all_params)
        changed = False
        for segment, store in zip(self.segments, self._stores, strict=True):
            active = tuple(p.requires_grad for p in segment.params)
            if active != segment.active:
                segment.active = active
                store.set_active(active)
                changed = True
        if changed:
            self._relayout()

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (collective after construction): its tensors go into a new segment, split over the ranks."""
        super().add_param_group(param_group)
        if self._ready:
            self._add_trainable(list(self.param_groups[-1]["params"]))

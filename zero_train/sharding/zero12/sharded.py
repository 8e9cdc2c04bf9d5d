"""ShardedOptimizer: what our ZeRO-1 and ZeRO-2 share: segments (segments.py), their gradient stores, the hooks.

The stages differ only in where the gradients go before the shared step (../step.py): Zero1Optimizer keeps them
all in a flat buffer reduced bucket by bucket (flat_grads.py), Zero2Optimizer reduces each bucket during backward
and keeps the owned part (grad_buckets.py).
"""

from __future__ import annotations

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding.comm.buckets import BucketSchedule
from zero_train.sharding.comm.overlap import ReductionQueue
from zero_train.sharding.step import OwnedPiece, PieceOptimizer
from zero_train.sharding.zero12.backward import BackwardHooks, GradientStore
from zero_train.sharding.zero12.segments import Segment


class ShardedOptimizer(PieceOptimizer):
    """Shards the state of an elementwise torch optimizer over the data-parallel ranks, element by element.

    Args: PieceOptimizer's (params, optimizer_class, process_group, master_dtype, loss_scaler, **defaults), and
        bucket_elements: the largest gradient bucket (reduce_bucket_size; None: one bucket per run of tensors).
        grad_dtype: the dtype gradients accumulate in over the micro-batches (None: the parameters').

    A parameter with requires_grad=False gets no slice, state or communication until it is unfrozen (then a new
    segment); one frozen later keeps its slice and state but stops travelling.

    Raises:
        ValueError: bucket_elements below 1. UsageError: trainable parameters of different dtypes or devices.
    """

    bucket_elements: int | None
    grad_dtype: torch.dtype | None
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
    _boundary: bool
    """This backward reduces each bucket once complete (ZeRO-2: every backward; ZeRO-1: boundary_backward())."""
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
        **defaults,
    ):
        if bucket_elements is not None and int(bucket_elements) < 1:
            raise ValueError(f"bucket_elements must be at least 1, got {bucket_elements}")
        self._ready = False
        self.bucket_elements = int(bucket_elements) if bucket_elements is not None else None
        self.grad_dtype = grad_dtype
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

    # ------------------------------------------------------------- the stage's part
    def _build_grads(self, segment: Segment) -> GradientStore:
        """This stage's gradient store for a new segment (its buffers)."""
        raise NotImplementedError

    def on_grad(self, param: torch.Tensor) -> None:
        """A gradient of this backward is complete (the hooks): into its store; in a reducing backward, onwards."""
        store, index = self._where[id(param)]
        store.accept(param, boundary=self._boundary)
        if self._boundary:
            self._schedule.arrive(store, index)

    def on_backward_end(self) -> None:
        """The backward has ended: a reducing one launches what is left and waits for every reduction."""
        if self._boundary:
            self._local_has_grad = self._has_grads()
            self._schedule.flush()
            self._flushed = True

    def _has_grads(self) -> list[bool]:
        """Per entry of `_params`: trainable, and this rank brought its gradient to this step."""
        return [p.requires_grad and self._where[id(p)][0].has_grad(p) for p in self._params]

    def _set_master_grads(self) -> None:
        """Each store's averaged slice -> the master gradients of its pieces (step.PieceOptimizer._take_grads)."""
        by_segment = {id(store.segment): store.owned for store in self._stores}

        def grad_of(owned: OwnedPiece) -> torch.Tensor | None:
            if not owned.param.requires_grad:  # frozen: not reduced, its slot holds nothing of this step
                return None
            return owned.holder.view_of(by_segment[id(owned.holder)], owned.piece)

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
        found = sorted({f"{p.dtype} on {p.device}" for p in self._params + new})
        if len(found) > 1:
            raise UsageError(
                f"{type(self).__name__} needs all trainable parameters in one dtype on one device, got "
                f"{found}; cast the model with model.to(dtype) first"
            )
        if new:
            segment = Segment(new, rank=self.rank, world_size=self.world_size, master_dtype=self.master_dtype)
            self.segments.append(segment)
            self._params += new
            self._stores.append(self._build_grads(segment))
            lengths = [list(bucket.lengths) for store in self._stores for bucket in store.buckets]
            self._queue.fit_receive_buffer(lengths, dtype=self._stores[-1].reduce_dtype, device=new[0].device)
            self._relayout()
        self._build_inner((s, piece, s.master_views[piece]) for s in self.segments for piece in s.pieces)

    def _relayout(self) -> None:
        """Hook the parameters trainable now and put every segment's buckets in one schedule."""
        if self._hooks is not None:
            self._hooks.remove()
        self._where = {
            id(p): (store, i) for store in self._stores for i, p in enumerate(store.segment.params)
        }
        self._hooks = BackwardHooks(
            self, [p for s in self.segments for p, a in zip(s.params, s.active, strict=True) if a]
        )
        self._schedule = BucketSchedule(self._stores, self._queue)

    def refresh_trainable(self) -> None:
        """Take in parameters unfrozen (a new segment) or frozen (their buckets) since the last call (the hooks
        call it at a backward's first gradient); every rank must change requires_grad alike."""
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

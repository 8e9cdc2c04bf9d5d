"""How a sharder lays out its parameters: segments, this rank's pieces, the inner optimizer, the hooks.

ShardedOptimizer mixes these methods in. The trainable parameters live in segments (segments.py): one
for the parameters trainable at construction, one more for each group added later or unfrozen after
construction, so that no slice ever moves and no optimizer state ever changes rank. The inner optimizer
runs on this rank's pieces of every segment (`OwnedPiece`), one inner param group per outer group; the
hooks (hooks.py) report each gradient of backward to the stage, which reduces its buckets in one order
for all segments (overlap.BucketSchedule).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding.comm import collectives, gloo
from zero_train.sharding.partition import Piece
from zero_train.sharding.state_dict import hyperparameters
from zero_train.sharding.zero12.hooks import BackwardHooks
from zero_train.sharding.zero12.schedule import BucketSchedule
from zero_train.sharding.zero12.segments import Segment


@dataclass(frozen=True, slots=True)
class OwnedPiece:
    """A piece of a parameter in this rank's slice, as the inner optimizer sees it."""

    param: torch.nn.Parameter
    """The model's parameter."""
    position: int
    """Its index in the optimizer's trainable list."""
    segment: Segment
    """The segment it lives in."""
    piece: Piece
    """Where the piece lies in the parameter and in the segment."""
    master: torch.Tensor
    """Its master weights (a view of the segment's master slice): the inner optimizer's parameter."""


class ShardedLayout:
    """Segments, pieces, inner optimizer and hooks of a ShardedOptimizer (which sets the attributes used here)."""

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
            self._segments.append(segment)
            self._params += new
            self._stores.append(self._build_grads(segment))
            self._queue.recv_buffer = self._receive_buffer()
            self._relayout()
        self._build_inner()

    def _check_uniform(self, params: list[torch.Tensor]) -> None:
        if len({p.dtype for p in params}) > 1 or len({p.device for p in params}) > 1:
            found = sorted({f"{p.dtype} on {p.device}" for p in params})
            raise UsageError(
                f"{type(self).__name__} needs all trainable parameters in one dtype on one device, got "
                f"{found}; cast the model with model.to(dtype) first"
            )

    def _build_grads(self, segment: Segment):
        """This stage's gradient store for a new segment (its buffers and hooks)."""
        raise NotImplementedError

    def _relayout(self) -> None:
        """Hook the parameters trainable now and put every segment's buckets in one schedule."""
        if self._hooks is not None:
            self._hooks.remove()
        self._where = {
            id(p): (st, i)
            for sg, st in zip(self._segments, self._stores, strict=True)
            for i, p in enumerate(sg.params)
        }
        self._hooks = BackwardHooks(
            self, [p for s in self._segments for p, a in zip(s.params, s.active, strict=True) if a]
        )
        self._schedule = BucketSchedule(self._stores, self._queue)

    def on_first_grad(self) -> None:
        """The first gradient of a backward: take in parameters frozen or unfrozen since the last one."""
        self._refresh_trainable()

    def on_grad(self, param: torch.Tensor) -> None:
        """A gradient of this backward is complete (called by the hooks)."""
        raise NotImplementedError

    def on_backward_end(self) -> None:
        """The backward that called on_grad has ended."""
        raise NotImplementedError

    def _receive_buffer(self) -> torch.Tensor | None:
        """The gloo rings' receive buffer, for the largest bucket of any segment (None elsewhere)."""
        if not (self.world_size > 1 and collectives.uses_p2p_rings(self.process_group)):
            return None
        buckets = [bucket for store in self._stores for bucket in store.buckets]
        elements = max((gloo.ring_receive_elements(list(b.lengths)) for b in buckets), default=1)
        param = self._params[0]
        return torch.empty(elements, dtype=self._gradient_dtypes()[1], device=param.device)

    def _build_inner(self) -> None:
        """The inner optimizer over this rank's pieces, one inner group per outer group."""
        owned: dict[int, list[tuple[Segment, Piece]]] = {}
        for segment in self._segments:
            for piece in segment.pieces:
                owned.setdefault(id(segment.params[piece.index]), []).append((segment, piece))
        position = {id(p): i for i, p in enumerate(self._params)}
        self._pieces, inner_groups = [], []
        for group in self.param_groups:
            masters = []
            for param in group["params"]:
                for segment, piece in owned.get(id(param), []):
                    master = segment.master_view(piece)
                    self._pieces.append(OwnedPiece(param, position[id(param)], segment, piece, master))
                    masters.append(master)
            inner_groups.append({**hyperparameters(group), "params": masters})
        previous = self._inner.state if self._inner is not None else {}
        self._inner = self.optimizer_class(inner_groups, **self.defaults)
        for owned_piece in self._pieces:
            if owned_piece.master in previous:
                self._inner.state[owned_piece.master] = previous[owned_piece.master]
        for group, inner_group in zip(self.param_groups, self._inner.param_groups, strict=True):
            for key, value in hyperparameters(inner_group).items():
                group.setdefault(key, value)  # so LR schedulers see "lr" even if it was a default

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
        for segment, store in zip(self._segments, self._stores, strict=True):
            active = tuple(p.requires_grad for p in segment.params)
            if active != segment.active:
                segment.active = active
                store.set_active(active)
                changed = True
        if changed:
            self._relayout()

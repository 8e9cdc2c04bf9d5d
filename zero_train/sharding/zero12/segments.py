"""A Segment: tensors that became trainable together, in one flat parameter buffer cut into N slices.

The model's parameters become views into the segment's flat buffer (so one all-gather delivers every
rank's updated slice straight into the model), and this rank's slice has its master weights: the slice
itself for an fp32 model, an fp32 copy of it for a bf16/fp16 one. The optimizer builds one segment at
construction and one more for each group of parameters added later (add_param_group, or parameters
unfrozen after construction): existing slices never move, so no optimizer state ever changes rank.

    segment.partition                   where every tensor sits (partition.FlatPartition)
    segment.pieces                      the pieces in this rank's slice, in buffer order
    segment.master_view(piece)          its master weights: the tensor's shape if whole, 1-D if split
"""

from __future__ import annotations

import torch

from zero_train.sharding.comm import collectives
from zero_train.sharding.partition import FlatPartition, Piece, flat_partition


class Segment:
    """One flat parameter buffer and this rank's master slice of it.

    Args:
        params: the parameters, in buffer order (one dtype, one device).
        rank: this rank.
        world_size: N.
        master_dtype: dtype of the master weights (float32).
    """

    def __init__(self, params: list[torch.nn.Parameter], *, rank: int, world_size: int, master_dtype):
        self.params = params
        self.partition: FlatPartition = flat_partition([p.numel() for p in params], world_size)
        dtype, device = params[0].dtype, params[0].device
        self.param_buffer = torch.zeros(self.partition.total_size, dtype=dtype, device=device)
        for param, offset in zip(params, self.partition.offsets, strict=True):
            slot = self.param_buffer[offset : offset + param.numel()].view_as(param)
            slot.copy_(param.detach())
            param.data = slot
        self.start, self.stop = self.partition.rank_range(rank)
        self.has_master_copies = dtype != master_dtype
        own = self.param_buffer[self.start : self.stop]
        self.master = own.to(master_dtype, copy=True) if self.has_master_copies else own
        self.pieces: tuple[Piece, ...] = self.partition.pieces(rank)
        self._views = {piece: self._slice(self.master, piece) for piece in self.pieces}
        self.active: tuple[bool, ...] = tuple(p.requires_grad for p in params)

    def _slice(self, owned: torch.Tensor, piece: Piece) -> torch.Tensor:
        """`piece` of a tensor laid out as this rank's slice: shaped as its parameter if whole, else 1-D."""
        view = owned[piece.within(self.start)]
        return view.view_as(self.params[piece.index]) if piece.whole else view

    def master_view(self, piece: Piece) -> torch.Tensor:
        """The master weights of `piece` (the same tensor object every call: the inner optimizer's key)."""
        return self._views[piece]

    def model_view(self, piece: Piece) -> torch.Tensor:
        """`piece` of the model's parameter (in the model's dtype), shaped as its master."""
        return self._slice(self.param_buffer[self.start : self.stop], piece)

    def owned_view(self, owned: torch.Tensor, piece: Piece) -> torch.Tensor:
        """`piece` of `owned`, a tensor of this rank's slice (e.g. its reduced gradients), shaped as its master."""
        return self._slice(owned, piece)

    def publish(self, process_group) -> None:
        """Round the updated masters into this rank's slice (mixed precision) and all-gather every slice."""
        if self.has_master_copies:
            self.param_buffer[self.start : self.stop].copy_(self.master)
        collectives.all_gather_(self.param_buffer, process_group, lengths=self.partition.loads())

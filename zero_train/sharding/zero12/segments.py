"""A Segment: tensors that became trainable together, in one flat parameter buffer cut into N slices.

The parameters become views into the buffer, so one all-gather delivers every rank's updated slice straight into
the model; this rank's slice has its masters (the slice itself in fp32, an fp32 copy for bf16/fp16). A segment
per group of parameters added or unfrozen later: existing slices never move, so no state ever changes rank.
"""

from __future__ import annotations

import torch

from zero_train.sharding.comm import collectives
from zero_train.sharding.partition import FlatPartition, Piece, flat_partition


class Segment:
    """One flat buffer of `params` (one dtype, one device) and this rank's master slice of it."""

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
        # each piece's master weights, the same tensor object every time: the inner optimizer's key
        self.master_views = {piece: self.view_of(self.master, piece) for piece in self.pieces}
        self.active: tuple[bool, ...] = tuple(p.requires_grad for p in params)

    def view_of(self, owned: torch.Tensor, piece: Piece) -> torch.Tensor:
        """`piece` of a tensor laid out as this rank's slice (its masters, its reduced gradients): shaped as its
        parameter if whole, else 1-D."""
        view = owned[piece.within(self.start)]
        return view.view_as(self.params[piece.index]) if piece.whole else view

    def publish(self, process_group) -> None:
        """Round the updated masters into this rank's slice (mixed precision) and all-gather every slice."""
        if self.has_master_copies:
            self.param_buffer[self.start : self.stop].copy_(self.master)
        collectives.all_gather_(self.param_buffer, process_group, lengths=self.partition.loads())

"""Zero3Optimizer's checkpoints and weights (functions of the optimizer, which does not import them): the shared shard format (state_dict.py), re-cut at any world size.

A shard holds the inner-optimizer state of each piece this rank owns (state_dict.shard_of, without masters).
Loading is state_dict.py's one rule at any world size: every piece this rank owns now takes, from the saved
pieces of the same parameter, the elements it overlaps (`load_shards`). At the same world size they
coincide; from N to M ranks each rank reads the saved shards (memory-mapped: only what it cuts out is read)
and keeps its own 1/M. The weights travel separately, as whole tensors (`gathered_param` to write them,
`load_weights` to read this rank's pieces back).
"""

from __future__ import annotations

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding import state_dict as shards
from zero_train.sharding.comm.gather import gather_tensor
from zero_train.sharding.zero3.optim import Zero3Optimizer


def state_dict(optimizer: Zero3Optimizer) -> dict:
    """This rank's shard of optimizer state (the weights travel apart, as whole tensors: `gathered_param`)."""
    return shards.shard_of(optimizer, masters=False)


def load_state_dict(optimizer: Zero3Optimizer, state_dict: dict) -> None:
    """Load this rank's own shard (same world size); for another world size use `load_shards`."""
    if (state_dict.get("world_size"), state_dict.get("rank")) != (optimizer.world_size, optimizer.rank):
        raise UsageError(
            f"this shard was saved by rank {state_dict.get('rank')} of {state_dict.get('world_size')}, this is "
            f"rank {optimizer.rank} of {optimizer.world_size}; pass every rank's shard to load_shards([...])"
        )
    load_shards(optimizer, [state_dict])


def load_shards(optimizer: Zero3Optimizer, saved: list[dict]) -> None:
    """Take this rank's pieces of optimizer state from saved shards (all of one save, or just the own one).

    Raises:
        UsageError: not shards of this format, other param groups, or a piece they cover only in part.
    """
    if not saved or any(s.get("format") != shards.SHARD_FORMAT for s in saved):
        raise UsageError(f"not {shards.SHARD_FORMAT} optimizer shards (saved by another engine or version?)")
    shards.load_pieces(optimizer, shards.saved_pieces(saved), saved[0])


def gathered_param(
    optimizer: Zero3Optimizer, param: torch.nn.Parameter, *, to: int = 0
) -> torch.Tensor | None:
    """One parameter's full master values (fp32 masters, or the slices of an fp32 model) on rank `to`, in
    CPU memory; None elsewhere. Collective: its pieces travel one at a time from their owners."""
    unit = optimizer.sharded.owner[id(param)]
    position = next(i for i, p in enumerate(unit.params) if p is param)
    master = optimizer.masters.get(id(unit), unit.shard)  # a frozen unit: its slice, in the model's dtype
    parts = []
    for rank, piece in shards.pieces_of(unit.partition, position):
        mine = master[piece.within(unit.start)] if rank == optimizer.rank else None
        parts.append(
            gather_tensor(
                mine,
                owner=rank,
                to=to,
                shape=(piece.length,),
                dtype=master.dtype,
                process_group=optimizer.process_group,
            )
        )
    return torch.cat(parts).view(param.shape) if optimizer.rank == to else None


def load_weights(optimizer: Zero3Optimizer, values_of, *, params=None) -> None:
    """Fill the slices (and masters) from `values_of(param, first element, length)` -> those elements, 1-D.

    Args:
        params: only these parameters (default: all; LoRA loads its adapters, the base is the --model's).
    """
    wanted = None if params is None else {id(p) for p in params}
    for unit in optimizer.sharded.units:
        target = optimizer.masters.get(id(unit), unit.shard)
        for piece in unit.partition.pieces(optimizer.rank):
            param = unit.params[piece.index]
            if wanted is None or id(param) in wanted:
                target[piece.within(unit.start)].copy_(values_of(param, piece.tensor_offset, piece.length))
        if target is not unit.shard:
            unit.shard.copy_(target)

"""ZeRO-1/2's checkpoints: the shared shard format (../state_dict.py) with the fp32 masters in it, and full masters.

Functions of a Zero1Optimizer or Zero2Optimizer, which does not import them: the engines, the tests and the tools
call them. Loading takes this rank's own shard, or a consolidated (plain torch) state dict at any world size, of
which each rank cuts out the pieces it owns now. The full masters come to one rank one piece at a time
(`gathered_master_params`, for checkpoints and exports) or to every rank at once (`full_master_params`).
"""

from __future__ import annotations

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding import state_dict as shards
from zero_train.sharding.comm import collectives
from zero_train.sharding.comm.gather import cpu_copy, gather_tensor
from zero_train.sharding.zero12.sharded import ShardedOptimizer


def _mixed(optimizer: ShardedOptimizer) -> bool:
    return any(segment.has_master_copies for segment in optimizer.segments)


def state_dict(optimizer: ShardedOptimizer) -> dict:
    """This rank's shard: the optimizer state and (mixed precision) the fp32 masters of its pieces."""
    return shards.shard_of(optimizer, masters=_mixed(optimizer))


def load_state_dict(optimizer: ShardedOptimizer, state_dict: dict) -> None:
    """Load this rank's shard, or a consolidated (plain torch) state dict at any world size.

    A consolidated dict (`consolidated_state_dict`, `consolidate_shards`, or a plain inner optimizer's
    `state_dict()`) re-shards: each rank cuts out the pieces it owns now.

    Raises:
        UsageError: a shard of another rank, world size or of the whole-tensor layout; param groups that
            don't match.
    """
    shards.check_groups_match(state_dict["param_groups"], optimizer.param_groups)
    fmt, saved_at = state_dict.get("format"), (state_dict.get("world_size"), state_dict.get("rank"))
    fix = "merge all shards with zero_train.sharding.consolidate_shards([...]) and load the result"
    if fmt == shards.WHOLE_TENSOR_FORMAT:
        raise UsageError(f"this optimizer shard was written by the whole-tensor layout ({fmt}); {fix}")
    if fmt == shards.SHARD_FORMAT and saved_at != (optimizer.world_size, optimizer.rank):
        raise UsageError(
            f"this optimizer shard was saved by rank {saved_at[1]} of {saved_at[0]}, "
            f"but this is rank {optimizer.rank} of {optimizer.world_size}; {fix} to re-shard"
        )
    if fmt == shards.SHARD_FORMAT:
        states = shards.saved_pieces([state_dict])
        masters = shards.saved_pieces([state_dict], "master_params")
    else:  # consolidated: one whole piece per parameter
        states = shards.whole_pieces(state_dict["state"], optimizer.param_groups)
        masters = shards.whole_pieces(state_dict.get("master_params") or {}, optimizer.param_groups)
    shards.load_pieces(optimizer, states, state_dict)
    index = shards.global_indices(optimizer.param_groups)
    for owned in optimizer.pieces:
        found = masters.get(index[id(owned.param)])
        if found:
            place = owned.piece.tensor_offset, owned.piece.length
            owned.master.detach().copy_(shards.cut(found, *place, owned.master.shape))
        elif owned.holder.has_master_copies:  # masters from the loaded model weights
            segment = owned.holder
            owned.master.detach().copy_(
                segment.view_of(segment.param_buffer[segment.start : segment.stop], owned.piece)
            )


def consolidated_state_dict(optimizer: ShardedOptimizer, to: int = 0) -> dict | None:
    """The full optimizer state on rank `to` (None elsewhere), loadable into the plain inner optimizer.

    Collective (a gather of every rank's shard). The result also carries "master_params" and "loss_scaler",
    which torch's load_state_dict ignores.
    """
    shard = state_dict(optimizer)
    gathered = shards.gather_shards(shard, to=to, process_group=optimizer.process_group)
    return None if gathered is None else shards.consolidate_shards(gathered)


def gathered_master_params(optimizer: ShardedOptimizer, to: int = 0) -> list[torch.Tensor] | None:
    """The full master weight of every parameter on rank `to`, in CPU memory, in param_groups order.

    Collective, one piece at a time from its owner (comm/gather.py): the other ranks never hold more than one
    extra piece, unlike `full_master_params`. None on the other ranks. Without master copies (fp32 model)
    rank `to` copies its own parameters; nothing travels.
    """
    all_params = [p for g in optimizer.param_groups for p in g["params"]]
    rank = optimizer.rank
    if not _mixed(optimizer):
        return [cpu_copy(p) for p in all_params] if rank == to else None
    where = {id(p): (s, i) for s in optimizer.segments for i, p in enumerate(s.params)}
    gathered = []
    for param in all_params:
        if id(param) not in where:  # never trainable: every rank has it, in the model's dtype
            gathered.append(cpu_copy(param).to(optimizer.master_dtype) if rank == to else None)
            continue
        segment, position = where[id(param)]
        parts = [
            gather_tensor(
                segment.master_views[piece].reshape(-1) if owner == rank else None,
                owner=owner,
                to=to,
                shape=(piece.length,),
                dtype=optimizer.master_dtype,
                process_group=optimizer.process_group,
            )
            for owner, piece in shards.pieces_of(segment.partition, position)
        ]
        gathered.append(torch.cat(parts).view(param.shape) if rank == to else None)
    return gathered if rank == to else None


def full_master_params(optimizer: ShardedOptimizer) -> list[torch.Tensor]:
    """The full master weight of every parameter on EVERY rank, in param_groups order (an all-gather).

    Costs every rank the whole fp32 model (4 Psi bytes); to write or export, use `gathered_master_params`.
    Without master copies (fp32 model) these are the parameters themselves.
    """
    all_params = [p for g in optimizer.param_groups for p in g["params"]]
    if not _mixed(optimizer):
        return [p.detach() for p in all_params]
    full = {}
    for segment in optimizer.segments:
        flat = torch.empty(
            segment.partition.total_size, dtype=segment.master.dtype, device=segment.master.device
        )
        flat[segment.start : segment.stop].copy_(segment.master)
        collectives.all_gather_(flat, optimizer.process_group, lengths=segment.partition.loads())
        for param, offset in zip(segment.params, segment.partition.offsets, strict=True):
            full[id(param)] = flat[offset : offset + param.numel()].view_as(param)
    return [full[id(p)] if id(p) in full else p.detach().to(optimizer.master_dtype) for p in all_params]

"""The shard format every stage writes, its consolidation, and the saved pieces cut for the pieces owned now.

A shard holds the inner-optimizer state of the pieces one rank owns (partition.py), keyed by the
parameter's index in torch's own numbering (all parameters of all param groups, in order) and the piece's
first element and length (`shard_of`):

    shard["state"][index] = [[first element, length, {"exp_avg": 1-D piece, "step": tensor(3.), ...}], ...]

A piece that is a whole tensor keeps the tensor's shape; a split one is 1-D. ZeRO-1/2 keep the fp32 masters
of a mixed-precision model in the shard too ("master_params", the same layout; zero12/state.py); ZeRO-3's
weights travel apart (zero3/state.py). Pieces are a property of the data, not of one rank's layout, so
loading is one rule at any world size (`load_states`, `cut`): every piece this rank owns now takes, from the
saved pieces of its parameter, the elements it overlaps. Merging the shards of every rank
(`consolidate_shards`) gives `torch.optim.Optimizer.state_dict()`'s format, whole tensors: one saved piece
per parameter. Shards written by the whole-tensor layout (format WHOLE_TENSOR_FORMAT, before partitions
split tensors) merge too: theirs were whole tensors already.
"""

from __future__ import annotations

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding.comm.gather import gather_objects_to
from zero_train.sharding.partition import FlatPartition, Piece
from zero_train.sharding.step import PieceOptimizer, hyperparameters

SHARD_FORMAT = "zero_train.flat_shard/2"
WHOLE_TENSOR_FORMAT = "zero_train.zero1_shard/1"


def global_indices(param_groups: list[dict]) -> dict[int, int]:
    """id(param) -> its index in torch's state_dict numbering (all params of all groups, in order)."""
    return {id(p): i for i, p in enumerate(p for g in param_groups for p in g["params"])}


def pieces_of(partition: FlatPartition, index: int) -> tuple[tuple[int, Piece], ...]:
    """(rank, piece) for every rank holding part of tensor `index` of `partition`, in rank order: where a
    parameter's saved state comes from, whichever rank gathers it."""
    offset, numel = partition.offsets[index], partition.numels[index]
    if numel == 0:
        return ()
    size = partition.partition_size
    owners = range(offset // size, (offset + numel - 1) // size + 1)
    return tuple((rank, piece) for rank in owners for piece in partition.pieces(rank) if piece.index == index)


def check_groups_match(saved_groups: list[dict], groups: list[dict]) -> None:
    """UsageError unless the saved param groups have the same number of groups and parameters per group."""
    saved = [len(g["params"]) for g in saved_groups]
    current = [len(g["params"]) for g in groups]
    if saved != current:
        raise UsageError(
            f"optimizer state has param groups of sizes {saved} but this optimizer has {current}; "
            "build the optimizer over the same parameters and groups as the one that was saved"
        )


def consolidate_shards(shards: list[dict]) -> dict:
    """Merge every rank's `state_dict()` into one torch-format optimizer state dict.

    Pure (no collectives): use it to re-shard a checkpoint saved at another world size.

    Args:
        shards: the shards of ALL ranks of one save, in any order (this layout's or the whole-tensor one's).

    Returns:
        {"state", "param_groups"} as `torch.optim.Optimizer.state_dict()` returns them, plus
        "master_params" (fp32 masters by index, empty for fp32 models) and "loss_scaler".

    Raises:
        UsageError: not shards, or not exactly one shard per rank of the same save.
    """
    formats = {s.get("format") for s in shards}
    if not shards or not formats <= {SHARD_FORMAT, WHOLE_TENSOR_FORMAT} or len(formats) > 1:
        raise UsageError(
            "consolidate_shards needs zero12.state.state_dict(optimizer) of every rank of one save"
        )
    world_size = shards[0]["world_size"]
    ranks = sorted(s["rank"] for s in shards)
    if ranks != list(range(world_size)) or any(s["world_size"] != world_size for s in shards):
        raise UsageError(f"need one shard per rank 0..{world_size - 1}, got ranks {ranks}")
    states, masters = {}, {}
    if formats == {WHOLE_TENSOR_FORMAT}:
        for shard in shards:
            states.update({int(k): v for k, v in shard["state"].items()})
            masters.update({int(k): v for k, v in (shard.get("master_params") or {}).items()})
    else:
        shapes = {int(k): v for s in shards for k, v in s["shapes"].items()}
        for key, into in (("state", states), ("master_params", masters)):
            collected = saved_pieces(shards, key)
            into.update({i: cut(pieces, 0, _numel(shapes[i]), shapes[i]) for i, pieces in collected.items()})
    return {
        "state": dict(sorted(states.items())),
        "param_groups": shards[0]["param_groups"],
        "master_params": dict(sorted(masters.items())),
        "loss_scaler": shards[0]["loss_scaler"],
    }


def gather_shards(shard: dict, *, to: int, process_group=None) -> list[dict] | None:
    """Every rank's shard on group rank `to`, its tensors in CPU memory (None on the others).

    Collective. One tensor travels at a time (zero_train.sharding.comm.gather): no rank holds other ranks'
    shards except `to`, and no rank unpickles another rank's device tensors.
    """
    return gather_objects_to(shard, to=to, process_group=process_group)


def shard_of(optimizer: PieceOptimizer, *, masters: bool) -> dict:
    """This rank's shard: the inner optimizer's state (and, with `masters`, the master weights) of its pieces.

    Returns:
        {"format", "world_size", "rank", "state": {index: [[first element, length, state], ...]},
        "master_params": {index: [[first element, length, tensor], ...]}, "shapes": {index: shape},
        "param_groups", "loss_scaler"}.
    """
    index = global_indices(optimizer.param_groups)
    states, master_values, shapes = {}, {}, {}
    for owned in optimizer.pieces:
        key, place = index[id(owned.param)], [owned.piece.tensor_offset, owned.piece.length]
        shapes[key] = list(owned.param.shape)
        if optimizer.inner.state.get(owned.master):
            states.setdefault(key, []).append([*place, dict(optimizer.inner.state[owned.master])])
        if masters:
            master_values.setdefault(key, []).append([*place, owned.master.detach().clone()])
    groups = [
        {**hyperparameters(g), "params": [index[id(p)] for p in g["params"]]} for g in optimizer.param_groups
    ]
    scaler = optimizer.loss_scaler
    return {
        "format": SHARD_FORMAT,
        "world_size": optimizer.world_size,
        "rank": optimizer.rank,
        "state": states,
        "param_groups": groups,
        "master_params": master_values,
        "shapes": shapes,
        "loss_scaler": None if scaler is None else scaler.state_dict(),
    }


def saved_pieces(shards: list[dict], key: str = "state") -> dict[int, list]:
    """{index: [[first element, length, value], ...]} of the shards' `key` ("state" or "master_params")."""
    saved: dict[int, list] = {}
    for shard in shards:
        for index, pieces in (shard.get(key) or {}).items():
            saved.setdefault(int(index), []).extend(pieces)
    return saved


def whole_pieces(values: dict, param_groups: list[dict]) -> dict[int, list]:
    """A consolidated dict's {index: whole value} as saved pieces: one piece per parameter, all of it."""
    params = [p for g in param_groups for p in g["params"]]
    return {int(k): [[0, params[int(k)].numel(), v]] for k, v in values.items()}


def cut(saved: list, offset: int, length: int, shape, device=None):
    """Elements [offset, offset + length) of a parameter from its saved pieces (any cutting), in `shape`.

    A piece's value is a state dict ({"exp_avg": ..., "step": ...}: per-element tensors are cut, a per-tensor
    value such as Adam's step is taken as it is) or a tensor (a master).

    Raises:
        UsageError: the saved pieces do not cover the elements (a rank's shard is missing).
    """
    if torch.is_tensor(saved[0][2]):
        pieces = [[first, count, {"": value}] for first, count, value in saved]
        return cut(pieces, offset, length, shape, device)[""]
    stop, covered, state = offset + length, 0, {}
    for first, count, values in sorted(saved, key=lambda piece: piece[0]):
        low, high = max(offset, first), min(stop, first + count)
        if high <= low:
            continue
        covered += high - low
        for key, value in values.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.numel() == count:
                if key not in state:
                    state[key] = torch.empty(length, dtype=value.dtype, device=value.device)
                state[key][low - offset : high - offset] = value.reshape(-1)[low - first : high - first]
            elif key not in state:
                state[key] = value.clone() if torch.is_tensor(value) else value  # per tensor: Adam's step
    if covered != length:
        raise UsageError(
            f"the saved shards cover {covered} of {length} elements of a piece: a rank's shard is missing; "
            "load every rank's shard of the save"
        )
    return {
        k: v.view(shape).to(device or v.device) if torch.is_tensor(v) and v.dim() > 0 else v
        for k, v in state.items()
    }


def _numel(shape) -> int:
    return int(torch.Size(shape).numel())


def load_pieces(optimizer: PieceOptimizer, saved: dict[int, list], state_dict: dict) -> None:
    """Give every owned piece its state, cut from the `saved` pieces of its parameter; take the settings of
    `state_dict`'s param groups (which must match the optimizer's) and its loss scaler."""
    check_groups_match(state_dict["param_groups"], optimizer.param_groups)
    for group, saved_group in zip(optimizer.param_groups, state_dict["param_groups"], strict=True):
        group.update(hyperparameters(saved_group))
    index = global_indices(optimizer.param_groups)
    state = optimizer.inner.state_dict()
    state["state"] = {}
    for position, owned in enumerate(optimizer.pieces):
        found = saved.get(index[id(owned.param)])
        if found:
            place = owned.piece.tensor_offset, owned.piece.length
            state["state"][position] = cut(found, *place, owned.master.shape, owned.master.device)
    optimizer.inner.load_state_dict(state)
    if optimizer.loss_scaler is not None and state_dict.get("loss_scaler"):
        optimizer.loss_scaler.load_state_dict(state_dict["loss_scaler"])

"""Zero3Optimizer's state dicts and weights: per-rank shards of pieces, re-cut at any world size.

A shard has the format of our ZeRO-1/2 shards (state_dict.py's "zero_train.flat_shard/2"): the inner-optimizer
state of each piece this rank owns, keyed by the parameter's index in torch's numbering (all parameters of all
param groups, in order) and the piece's first element and length:

    shard["state"][index] = [[first element, length, {"exp_avg": 1-D piece, "step": tensor(3.), ...}], ...]

Pieces are a property of the data, not of the unit layout, so loading is one rule at any world size: every
piece this rank owns now takes, from the saved pieces of the same parameter, the elements it overlaps
(`load_shards`). At the same world size they coincide; from N to M ranks each rank reads the saved shards
(memory-mapped: only what it cuts out is read) and keeps its own 1/M. The weights travel separately, as whole
tensors (`gathered_param` to write them, `load_weights` to read this rank's pieces back).
"""

from __future__ import annotations

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding.comm.gather import gather_tensor
from zero_train.sharding.state_dict import SHARD_FORMAT, check_groups_match, hyperparameters


class Zero3StateDict:
    """state_dict / load_state_dict / load_shards / gathered_param / load_weights of Zero3Optimizer."""

    def _global_indices(self) -> dict[int, int]:
        """id(param) -> its index in torch's state_dict numbering (all params of all groups, in order)."""
        return {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def state_dict(self) -> dict:
        """This rank's shard: the inner-optimizer state of its pieces (the weights are not in it).

        Returns:
            {"format", "world_size", "rank", "state": {index: [[first element, length, state], ...]},
            "master_params": {}, "shapes": {index: shape}, "param_groups", "loss_scaler"}.
        """
        index = self._global_indices()
        states, shapes = {}, {}
        for owned in self._pieces:
            key = index[id(owned.param)]
            shapes[key] = list(owned.param.shape)
            if self._inner.state.get(owned.master):
                place = [owned.piece.tensor_offset, owned.piece.length]
                states.setdefault(key, []).append([*place, dict(self._inner.state[owned.master])])
        groups = [
            {**hyperparameters(g), "params": [index[id(p)] for p in g["params"]]} for g in self.param_groups
        ]
        return {
            "format": SHARD_FORMAT,
            "world_size": self.world_size,
            "rank": self.rank,
            "state": states,
            "param_groups": groups,
            "master_params": {},
            "shapes": shapes,
            "loss_scaler": None if self.loss_scaler is None else self.loss_scaler.state_dict(),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Load this rank's own shard (same world size); for another world size use `load_shards`."""
        if (state_dict.get("world_size"), state_dict.get("rank")) != (self.world_size, self.rank):
            raise UsageError(
                f"this shard was saved by rank {state_dict.get('rank')} of {state_dict.get('world_size')}, "
                f"this is rank {self.rank} of {self.world_size}; pass every rank's shard to load_shards([...])"
            )
        self.load_shards([state_dict])

    def load_shards(self, shards: list[dict]) -> None:
        """Take this rank's pieces of optimizer state from saved shards (all of one save, or just the own one).

        Raises:
            UsageError: not shards of this format, other param groups, or a piece they cover only in part.
        """
        if not shards or any(s.get("format") != SHARD_FORMAT for s in shards):
            raise UsageError(f"not {SHARD_FORMAT} optimizer shards (saved by another engine or version?)")
        check_groups_match(shards[0]["param_groups"], self.param_groups)
        for group, saved in zip(self.param_groups, shards[0]["param_groups"], strict=True):
            group.update(hyperparameters(saved))
        index = self._global_indices()
        saved: dict[int, list] = {}
        for shard in shards:
            for key, pieces in shard["state"].items():
                saved.setdefault(int(key), []).extend(pieces)
        inner = self._inner.state_dict()
        inner["state"] = {}
        for position, owned in enumerate(self._pieces):
            found = saved.get(index[id(owned.param)])
            if found:
                inner["state"][position] = _cut(
                    found, owned.piece.tensor_offset, owned.piece.length, owned.master
                )
        self._inner.load_state_dict(inner)
        if self.loss_scaler is not None and shards[0].get("loss_scaler"):
            self.loss_scaler.load_state_dict(shards[0]["loss_scaler"])

    # -------------------------------------------------------------- weights
    def gathered_param(self, param: torch.nn.Parameter, *, to: int = 0) -> torch.Tensor | None:
        """One parameter's full master values (fp32 masters, or the slices of an fp32 model) on rank `to`, in
        CPU memory; None elsewhere. Collective: its pieces travel one at a time from their owners."""
        unit = self.sharded.owner[id(param)]
        position = next(i for i, p in enumerate(unit.params) if p is param)
        master = self.masters.get(id(unit), unit.shard)  # a frozen unit: its slice, in the model's dtype
        parts = []
        for rank, piece in unit.partition.pieces_of(position):
            mine = master[piece.within(unit.start)] if rank == self.rank else None
            parts.append(
                gather_tensor(
                    mine,
                    owner=rank,
                    to=to,
                    shape=(piece.length,),
                    dtype=master.dtype,
                    process_group=self.process_group,
                )
            )
        return torch.cat(parts).view(param.shape) if self.rank == to else None

    def load_weights(self, values_of, *, params=None) -> None:
        """Fill the slices (and masters) from `values_of(param, first element, length)` -> those elements, 1-D.

        Args:
            params: only these parameters (default: all; LoRA loads its adapters, the base is the --model's).
        """
        wanted = None if params is None else {id(p) for p in params}
        for unit in self.sharded.units:
            target = self.masters.get(id(unit), unit.shard)
            for piece in unit.partition.pieces(self.rank):
                param = unit.params[piece.index]
                if wanted is None or id(param) in wanted:
                    target[piece.within(unit.start)].copy_(
                        values_of(param, piece.tensor_offset, piece.length)
                    )
            if target is not unit.shard:
                unit.shard.copy_(target)


def _cut(saved: list, offset: int, length: int, like: torch.Tensor) -> dict:
    """The state of elements [offset, offset + length) of a parameter, from its saved pieces (any cutting)."""
    stop, covered, state = offset + length, 0, {}
    for first, count, values in sorted(saved, key=lambda piece: piece[0]):
        low, high = max(offset, first), min(stop, first + count)
        if high <= low:
            continue
        covered += high - low
        for key, value in values.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.numel() == count:
                if key not in state:
                    state[key] = torch.empty(length, dtype=value.dtype)
                state[key][low - offset : high - offset] = value.reshape(-1)[low - first : high - first]
            elif key not in state:
                state[key] = value.clone() if torch.is_tensor(value) else value  # per tensor: Adam's step
    if covered != length:
        raise UsageError(
            f"the saved shards cover {covered} of {length} elements of a piece: a rank's shard is missing"
        )
    return {
        k: v.view(like.shape).to(like.device) if torch.is_tensor(v) and v.dim() > 0 else v
        for k, v in state.items()
    }

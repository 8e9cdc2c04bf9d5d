"""Our sharders' state dicts: per-rank shards of pieces, and the consolidated form plain torch optimizers load.

A shard holds the inner-optimizer state of the pieces one rank owns (partition.py), keyed by the
parameter's index in torch's own numbering (all parameters of all param groups, in order) and the piece's
first element. Merging the shards of every rank (`consolidate_shards`) concatenates each parameter's
pieces into `torch.optim.Optimizer.state_dict()`'s format, which loads at any world size: each rank then
cuts out the pieces it owns (re-sharding).

    shard["state"][index] = [[first element, length, {"exp_avg": 1-D piece, "step": tensor(3.), ...}], ...]

A piece that is a whole tensor keeps the tensor's shape; a split one is 1-D. Shards written by the
whole-tensor layout (format WHOLE_TENSOR_FORMAT, before partitions split tensors) merge too: theirs were
whole tensors already.
"""

from __future__ import annotations

import itertools

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding.comm.gather import cpu_copy, gather_objects_to, gather_tensor

SHARD_FORMAT = "zero_train.flat_shard/2"
WHOLE_TENSOR_FORMAT = "zero_train.zero1_shard/1"


def hyperparameters(group: dict) -> dict:
    """A param group's settings (lr, betas, weight_decay, ...) without its parameters: what the outer and the
    inner optimizer's groups share, and what a shard saves of each group. Every stage uses this one."""
    return {k: v for k, v in group.items() if k != "params"}


def check_groups_match(saved_groups: list[dict], groups: list[dict]) -> None:
    """UsageError unless the saved param groups have the same number of groups and parameters per group."""
    saved = [len(g["params"]) for g in saved_groups]
    current = [len(g["params"]) for g in groups]
    if saved != current:
        raise UsageError(
            f"optimizer state has param groups of sizes {saved} but this optimizer has {current}; "
            "build the optimizer over the same parameters and groups as the one that was saved"
        )


def _join(pieces: list, shape) -> dict | torch.Tensor:
    """One parameter's pieces (first element, length, value) -> its whole state dict or master tensor."""
    pieces = sorted(pieces, key=lambda piece: piece[0])
    numel = int(torch.Size(shape).numel())
    covered = [(offset, offset + length) for offset, length, _ in pieces]
    if (
        covered[0][0] != 0
        or covered[-1][1] != numel
        or any(a[1] != b[0] for a, b in itertools.pairwise(covered))
    ):
        raise UsageError(
            f"the shards hold elements {covered} of a {numel}-element tensor: some rank's shard is missing"
        )
    values = [value for _, _, value in pieces]
    if len(values) == 1:
        return values[0]
    if torch.is_tensor(values[0]):
        return torch.cat([v.reshape(-1) for v in values]).view(shape)
    return {  # per-element tensors are 1-D pieces; a 0-dim tensor or a number (Adam's step) is per tensor
        key: torch.cat([v[key].reshape(-1) for v in values]).view(shape)
        if torch.is_tensor(value) and value.dim() > 0
        else value
        for key, value in values[0].items()
    }


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
        raise UsageError("consolidate_shards needs the Zero1Optimizer.state_dict() of every rank of one save")
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
            collected: dict[int, list] = {}
            for shard in shards:
                for index, pieces in shard[key].items():
                    collected.setdefault(int(index), []).extend(pieces)
            into.update({index: _join(pieces, shapes[index]) for index, pieces in collected.items()})
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


def _cut(value, piece, shape) -> object:
    """`piece` of a whole-tensor state value: per-element tensors are sliced, the rest copied."""
    if not torch.is_tensor(value):
        return value
    if piece.whole or value.dim() == 0 or value.shape != shape:
        return value.clone()
    return value.reshape(-1)[piece.in_tensor].clone()


class ShardedStateDict:
    """State-dict methods of the sharders (ShardedOptimizer mixes them in; they use its pieces and segments)."""

    def _global_indices(self) -> dict[int, int]:
        """id(param) -> its index in torch's state_dict numbering (all params of all groups, in order)."""
        return {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def state_dict(self) -> dict:
        """This rank's shard: the state (and, mixed precision, fp32 masters) of its pieces.

        Returns:
            {"format", "world_size", "rank", "state": {index: [[first element, length, state], ...]},
            "master_params": {index: [[first element, length, fp32 tensor], ...]}, "shapes": {index: shape},
            "param_groups", "loss_scaler"}.
        """
        index = self._global_indices()
        states, masters, shapes = {}, {}, {}
        mixed = any(s.has_master_copies for s in self._segments)
        for owned in self._pieces:
            key, place = index[id(owned.param)], [owned.piece.tensor_offset, owned.piece.length]
            shapes[key] = list(owned.param.shape)
            if self._inner.state.get(owned.master):
                states.setdefault(key, []).append([*place, dict(self._inner.state[owned.master])])
            if mixed:
                masters.setdefault(key, []).append([*place, owned.master.detach().clone()])
        groups = [
            {**hyperparameters(g), "params": [index[id(p)] for p in g["params"]]} for g in self.param_groups
        ]
        return {
            "format": SHARD_FORMAT,
            "world_size": self.world_size,
            "rank": self.rank,
            "state": states,
            "param_groups": groups,
            "master_params": masters,
            "shapes": shapes,
            "loss_scaler": None if self.loss_scaler is None else self.loss_scaler.state_dict(),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Load this rank's shard, or a consolidated (plain torch) state dict at any world size.

        A consolidated dict (`consolidated_state_dict`, `consolidate_shards`, or a plain inner optimizer's
        `state_dict()`) re-shards: each rank cuts out the pieces it owns now.

        Raises:
            UsageError: a shard of another rank, world size, layout, or of the whole-tensor layout; param
                groups that don't match.
        """
        check_groups_match(state_dict["param_groups"], self.param_groups)
        states, masters = self._pieces_from(state_dict)
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update(hyperparameters(saved))
        inner = self._inner.state_dict()
        inner["state"] = {}
        for position, owned in enumerate(self._pieces):
            if owned.master in states:
                inner["state"][position] = states[owned.master]
            if owned.master in masters:
                owned.master.detach().copy_(masters[owned.master])
            elif owned.holder.has_master_copies:  # masters from the loaded model weights
                owned.master.detach().copy_(owned.holder.model_view(owned.piece))
        self._inner.load_state_dict(inner)
        if self.loss_scaler is not None and state_dict.get("loss_scaler"):
            self.loss_scaler.load_state_dict(state_dict["loss_scaler"])

    def _pieces_from(self, state_dict: dict) -> tuple[dict, dict]:
        """(state, master) of every owned piece, keyed by its master tensor, from a shard or a whole dict."""
        fmt, saved_at = state_dict.get("format"), (state_dict.get("world_size"), state_dict.get("rank"))
        fix = "merge all shards with zero_train.sharding.consolidate_shards([...]) and load the result"
        if fmt == WHOLE_TENSOR_FORMAT:
            raise UsageError(f"this optimizer shard was written by the whole-tensor layout ({fmt}); {fix}")
        if fmt == SHARD_FORMAT and saved_at != (self.world_size, self.rank):
            raise UsageError(
                f"this optimizer shard was saved by rank {saved_at[1]} of {saved_at[0]}, "
                f"but this is rank {self.rank} of {self.world_size}; {fix} to re-shard"
            )
        index = self._global_indices()
        if fmt == SHARD_FORMAT:
            return self._match_shard(state_dict, index, fix)
        states = {int(k): v for k, v in state_dict["state"].items()}
        masters = {int(k): v for k, v in (state_dict.get("master_params") or {}).items()}
        cut_states, cut_masters = {}, {}
        for owned in self._pieces:
            key, shape = index[id(owned.param)], owned.param.shape
            if key in states:
                cut_states[owned.master] = {k: _cut(v, owned.piece, shape) for k, v in states[key].items()}
            if key in masters:
                cut_masters[owned.master] = _cut(masters[key], owned.piece, shape).view_as(owned.master)
        return cut_states, cut_masters

    def _match_shard(self, shard: dict, index: dict[int, int], fix: str) -> tuple[dict, dict]:
        """A shard of this rank: its pieces must be exactly the ones this rank owns now."""
        place = {(index[id(o.param)], o.piece.tensor_offset, o.piece.length): o.master for o in self._pieces}
        found = []
        for key in ("state", "master_params"):
            found.append({})
            for param_index, pieces in shard[key].items():
                for offset, length, value in pieces:
                    master = place.get((int(param_index), offset, length))
                    if master is None:
                        raise UsageError(
                            "this optimizer shard was saved with another partition of the parameters "
                            f"(parameter {param_index}, elements {offset}..{offset + length}); {fix}"
                        )
                    found[-1][master] = value
        return found[0], found[1]

    def consolidated_state_dict(self, to: int = 0) -> dict | None:
        """The full optimizer state on rank `to` (None elsewhere), loadable into the plain inner optimizer.

        Collective (a gather of every rank's shard). The result also carries "master_params" and
        "loss_scaler", which torch's load_state_dict ignores.
        """
        shards = gather_shards(self.state_dict(), to=to, process_group=self.process_group)
        return None if shards is None else consolidate_shards(shards)

    def gathered_master_params(self, to: int = 0) -> list[torch.Tensor] | None:
        """The full master weight of every parameter on rank `to`, in CPU memory, in param_groups order.

        Collective, one piece at a time from its owner (zero_train.sharding.comm.gather): the other ranks never
        hold more than one extra piece, unlike `full_master_params`. None on the other ranks. Without
        master copies (fp32 model) rank `to` copies its own parameters; nothing travels.
        """
        all_params = [p for g in self.param_groups for p in g["params"]]
        mixed = any(s.has_master_copies for s in self._segments)
        if not mixed:
            return [cpu_copy(p) for p in all_params] if self.rank == to else None
        where = {id(p): (s, i) for s in self._segments for i, p in enumerate(s.params)}
        gathered = []
        for param in all_params:
            if id(param) not in where:  # never trainable: every rank has it, in the model's dtype
                gathered.append(cpu_copy(param).to(self.master_dtype) if self.rank == to else None)
                continue
            segment, position = where[id(param)]
            parts = [
                gather_tensor(
                    segment.master_view(piece).reshape(-1) if rank == self.rank else None,
                    owner=rank,
                    to=to,
                    shape=(piece.length,),
                    dtype=self.master_dtype,
                    process_group=self.process_group,
                )
                for rank, piece in segment.partition.pieces_of(position)
            ]
            gathered.append(torch.cat(parts).view(param.shape) if self.rank == to else None)
        return gathered if self.rank == to else None

    def full_master_params(self) -> list[torch.Tensor]:
        """The full master weight of every parameter on EVERY rank, in param_groups order (an all-gather).

        Costs every rank the whole fp32 model (4 Psi bytes); to write or export, use
        `gathered_master_params`. Without master copies (fp32 model) these are the parameters themselves.
        """
        all_params = [p for g in self.param_groups for p in g["params"]]
        if not any(s.has_master_copies for s in self._segments):
            return [p.detach() for p in all_params]
        full = {}
        for segment in self._segments:
            flat = segment.gathered_masters(self.process_group)
            for param, offset in zip(segment.params, segment.partition.offsets, strict=True):
                full[id(param)] = flat[offset : offset + param.numel()].view_as(param)
        return [full[id(p)] if id(p) in full else p.detach().to(self.master_dtype) for p in all_params]

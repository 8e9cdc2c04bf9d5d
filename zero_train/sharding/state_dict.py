"""Our sharders' state dicts: per-rank shards, and the consolidated form plain torch optimizers load.

A shard holds the inner-optimizer state of the parameters one rank owns, keyed by the parameter's
index in torch's own numbering (all parameters of all param groups, in order), so merging shards is
a union of dicts and the union is exactly `torch.optim.Optimizer.state_dict()`'s format. A
consolidated dict loads at any world size: each rank takes the parameters it owns then (re-sharding).
"""

from __future__ import annotations

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding import collectives
from zero_train.sharding.gather import cpu_copy, gather_objects_to, gather_tensor

SHARD_FORMAT = "zero_train.zero1_shard/1"


def check_groups_match(saved_groups: list[dict], groups: list[dict]) -> None:
    """UsageError unless the saved param groups have the same number of groups and parameters per group."""
    saved = [len(g["params"]) for g in saved_groups]
    current = [len(g["params"]) for g in groups]
    if saved != current:
        raise UsageError(
            f"optimizer state has param groups of sizes {saved} but this optimizer has {current}; "
            "build the optimizer over the same parameters and groups as the one that was saved"
        )


def owned_states(state_dict: dict) -> tuple[dict[int, dict], dict[int, torch.Tensor]]:
    """(per-parameter state, fp32 masters) of a shard or consolidated dict, keyed by global index."""
    states = {int(k): v for k, v in state_dict["state"].items()}
    masters = {int(k): v for k, v in (state_dict.get("master_params") or {}).items()}
    return states, masters


def consolidate_shards(shards: list[dict]) -> dict:
    """Merge every rank's `Zero1Optimizer.state_dict()` into one torch-format optimizer state dict.

    Pure (no collectives): use it to re-shard a checkpoint saved at another world size.

    Args:
        shards: the shards of ALL ranks of one save, in any order.

    Returns:
        {"state", "param_groups"} as `torch.optim.Optimizer.state_dict()` returns them, plus
        "master_params" (fp32 masters by index, empty for fp32 models) and "loss_scaler".

    Raises:
        UsageError: not shards, or not exactly one shard per rank of the same save.
    """
    if not shards or any(s.get("format") != SHARD_FORMAT for s in shards):
        raise UsageError("consolidate_shards needs the Zero1Optimizer.state_dict() of every rank")
    world_size = shards[0]["world_size"]
    ranks = sorted(s["rank"] for s in shards)
    if ranks != list(range(world_size)) or any(s["world_size"] != world_size for s in shards):
        raise UsageError(f"need one shard per rank 0..{world_size - 1}, got ranks {ranks}")
    states, masters = {}, {}
    for shard in sorted(shards, key=lambda s: s["rank"]):
        shard_states, shard_masters = owned_states(shard)
        states.update(shard_states)
        masters.update(shard_masters)
    return {
        "state": dict(sorted(states.items())),
        "param_groups": shards[0]["param_groups"],
        "master_params": dict(sorted(masters.items())),
        "loss_scaler": shards[0]["loss_scaler"],
    }


def gather_shards(shard: dict, *, to: int, process_group=None) -> list[dict] | None:
    """Every rank's shard on group rank `to`, its tensors in CPU memory (None on the others).

    Collective. One tensor travels at a time (zero_train.sharding.gather): no rank holds other ranks'
    shards except `to`, and no rank unpickles another rank's device tensors.
    """
    return gather_objects_to(shard, to=to, process_group=process_group)


class ShardedStateDict:
    """State-dict methods of the sharders (ShardedOptimizer mixes them in; they use its layout and inner optimizer).

    Keys are torch's own parameter numbering (all parameters of all param groups, in order), so a shard is
    a slice of `torch.optim.Optimizer.state_dict()` and shards merge by union (`consolidate_shards`).
    """

    def _global_indices(self) -> dict[int, int]:
        """id(param) -> its index in torch's state_dict numbering (all params of all groups, in order)."""
        return {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def _owned_records(self) -> tuple[dict[int, dict], dict[int, torch.Tensor]]:
        """(state, fp32 master) of each owned parameter, keyed by global index."""
        index = self._global_indices()
        states = {
            index[id(p)]: dict(self._inner.state[m])
            for p, m in zip(self._owned_params, self._masters, strict=True)
            if self._inner.state.get(m)
        }
        masters = {}
        if self.has_master_copies:
            masters = {
                index[id(p)]: m.detach().clone()
                for p, m in zip(self._owned_params, self._masters, strict=True)
            }
        return states, masters

    def _load_owned(self, states: dict[int, dict], masters: dict[int, torch.Tensor]) -> None:
        """Load the inner optimizer's state (and masters) for the owned parameters from global-index maps."""
        index = self._global_indices()
        inner = self._inner.state_dict()
        inner["state"] = {}
        for position, (param, master) in enumerate(zip(self._owned_params, self._masters, strict=True)):
            key = index[id(param)]
            if key in states:
                inner["state"][position] = {
                    k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in states[key].items()
                }
            if key in masters:
                master.detach().copy_(masters[key])
        self._inner.load_state_dict(inner)

    def state_dict(self) -> dict:
        """This rank's shard: the state of the parameters it owns, keyed like torch's state_dict.

        Returns:
            {"format", "world_size", "rank", "state": {global index: state}, "param_groups",
            "master_params": {global index: fp32 tensor} (bf16/fp16 models), "loss_scaler"}.
        """
        states, masters = self._owned_records()
        index = self._global_indices()
        groups = [
            {**self._hyperparameters(g), "params": [index[id(p)] for p in g["params"]]}
            for g in self.param_groups
        ]
        return {
            "format": SHARD_FORMAT,
            "world_size": self.world_size,
            "rank": self.rank,
            "state": states,
            "param_groups": groups,
            "master_params": masters,
            "loss_scaler": None if self.loss_scaler is None else self.loss_scaler.state_dict(),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Load this rank's shard, or a consolidated (plain torch) state dict at any world size.

        A consolidated dict (`consolidated_state_dict`, `consolidate_shards`, or a plain inner
        optimizer's `state_dict()`) re-shards: each rank takes the parameters it owns now.

        Raises:
            UsageError: a shard saved by another rank or world size, or param groups that don't match.
        """
        check_groups_match(state_dict["param_groups"], self.param_groups)
        saved_at = (state_dict.get("world_size"), state_dict.get("rank"))
        if state_dict.get("format") == SHARD_FORMAT and saved_at != (self.world_size, self.rank):
            raise UsageError(
                f"this optimizer shard was saved by rank {saved_at[1]} of {saved_at[0]}, "
                f"but this is rank {self.rank} of {self.world_size}; merge all shards with "
                "zero_train.sharding.consolidate_shards([...]) and load the result to re-shard"
            )
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update(self._hyperparameters(saved))
        states, masters = owned_states(state_dict)
        if self.has_master_copies and not masters:
            start, stop = self.layout.region(self.rank)
            self._master_flat.copy_(self._param_buffer[start:stop])  # masters from the loaded model weights
        self._load_owned(states, masters)
        if self.loss_scaler is not None and state_dict.get("loss_scaler"):
            self.loss_scaler.load_state_dict(state_dict["loss_scaler"])

    def consolidated_state_dict(self, to: int = 0) -> dict | None:
        """The full optimizer state on rank `to` (None elsewhere), loadable into the plain inner optimizer.

        Collective (a gather of every rank's shard). The result also carries "master_params" and
        "loss_scaler", which torch's load_state_dict ignores.
        """
        shards = gather_shards(self.state_dict(), to=to, process_group=self.process_group)
        return None if shards is None else consolidate_shards(shards)

    def gathered_master_params(self, to: int = 0) -> list[torch.Tensor] | None:
        """The full master weight of every parameter on rank `to`, in CPU memory, in param_groups order.

        Collective, one tensor at a time from its owner (zero_train.sharding.gather): the other ranks
        never hold more than one extra tensor, unlike `full_master_params`. None on the other ranks.
        Without master copies (fp32 model) rank `to` copies its own parameters; nothing travels.
        """
        all_params = [p for g in self.param_groups for p in g["params"]]
        if not self.has_master_copies:
            return [cpu_copy(p) for p in all_params] if self.rank == to else None
        owned = {id(p): m for p, m in zip(self._owned_params, self._masters, strict=True)}
        owner = dict(zip(map(id, self._params), self._owners, strict=True))
        gathered = []
        for param in all_params:
            if id(param) not in owner:  # never trainable: every rank has it, in the model's dtype
                gathered.append(cpu_copy(param).to(self.master_dtype) if self.rank == to else None)
                continue
            gathered.append(
                gather_tensor(
                    owned.get(id(param)),
                    owner=owner[id(param)],
                    to=to,
                    shape=param.shape,
                    dtype=self.master_dtype,
                    process_group=self.process_group,
                )
            )
        return gathered if self.rank == to else None

    def full_master_params(self) -> list[torch.Tensor]:
        """The full master weight of every parameter on EVERY rank, in param_groups order (an all-gather).

        Costs every rank the whole fp32 model (4 Psi bytes); to write or export, use
        `gathered_master_params`. Without master copies (fp32 model) these are the parameters themselves.
        """
        all_params = [p for g in self.param_groups for p in g["params"]]
        if not self.has_master_copies:
            return [p.detach() for p in all_params]
        full = torch.empty(self.layout.total_size, dtype=self.master_dtype, device=self._master_flat.device)
        start, stop = self.layout.region(self.rank)
        full[start:stop].copy_(self._master_flat)
        collectives.all_gather_(full, self.process_group, lengths=self._region_lengths)
        offsets = {id(p): off for p, off in zip(self._params, self.layout.offsets, strict=True)}
        return [
            full[offsets[id(p)] : offsets[id(p)] + p.numel()].view_as(p)
            if id(p) in offsets
            else p.detach().to(self.master_dtype)
            for p in all_params
        ]

"""Zero1Optimizer's state dicts: per-rank shards, and the consolidated form plain torch optimizers load.

A shard holds the inner-optimizer state of the parameters one rank owns, keyed by the parameter's
index in torch's own numbering (all parameters of all param groups, in order), so merging shards is
a union of dicts and the union is exactly `torch.optim.Optimizer.state_dict()`'s format. A
consolidated dict loads at any world size: each rank takes the parameters it owns then (re-sharding).
"""

from __future__ import annotations

import torch

from zero_train.runtime.errors import UsageError

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
    from zero_train.sharding.gather import gather_objects_to

    return gather_objects_to(shard, to=to, process_group=process_group)

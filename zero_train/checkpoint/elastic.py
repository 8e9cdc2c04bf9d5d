"""Elastic resume: a checkpoint saved at one world size, loaded at another.

Our ZeRO-1/2 save one optimizer shard per rank (`optim/rank-XXXXX.pt`). At the same world size each rank
loads its own shard. At another world size every rank reads ALL shards, merges them into one plain
optimizer state dict (`zero_train.sharding.consolidate_shards`) and `Zero1Optimizer.load_state_dict`
re-shards it for the new ranks. Shards of the whole-tensor layout (before the sharders split tensors
between ranks) are merged and re-sharded the same way at any world size: a rank's new slice is not an old
shard. DeepSpeed checkpoints: see docs/reliability.md.
"""

from __future__ import annotations

import warnings
from typing import Any

from zero_train.checkpoint.files import load_rank_file
from zero_train.sharding import consolidate_shards
from zero_train.sharding.state_dict import WHOLE_TENSOR_FORMAT


def load_sharded_optimizer(path, *, rank: int, world_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's checkpoint payload and the optimizer state it should load, at any world size.

    Args:
        path: the checkpoint folder.
        rank: this rank in the NEW world.
        world_size: the new world size.

    Returns:
        (payload, optimizer_state): payload is the saved rank file whose client_state/counters this rank
        continues from (its own at the same world size, else rank `rank % saved_world_size`'s);
        optimizer_state is its own shard, or the consolidated state of all saved shards.
    """
    first = load_rank_file(path, 0)
    saved_world_size = int(first.get("world_size", world_size))
    whole_tensor = (first.get("optimizer") or {}).get("format") == WHOLE_TENSOR_FORMAT
    if saved_world_size == world_size and not whole_tensor:
        own = first if rank == 0 else load_rank_file(path, rank)
        return own, own["optimizer"]
    if rank == 0 and saved_world_size != world_size:
        warnings.warn(
            f"resuming a checkpoint saved at world size {saved_world_size} on {world_size} ranks: the "
            "optimizer state is re-sharded exactly; per-rank RNG states are reused modulo the old world size",
            stacklevel=2,
        )
    payloads = [first] + [load_rank_file(path, r) for r in range(1, saved_world_size)]
    merged = consolidate_shards([p["optimizer"] for p in payloads])
    return payloads[rank % saved_world_size], merged

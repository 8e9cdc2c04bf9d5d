"""The batches each rank reads from a packed split (a datasets.Dataset or zero_train.hf.blocks.PackedBlocks), in a
seeded shuffle per epoch; datasets-free, so that the offline default trains without it.

    for batch in rank_batches(packed["train"], rank=r, world_size=n, micro_batch_size=4, seed=0):
        batch["input_ids"]                                   # LongTensor [4, 128], this rank's rows only
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from zero_train.runtime.errors import UsageError


def steps_per_epoch(dataset, *, world_size: int, micro_batch_size: int) -> int:
    """Micro-steps in one pass: every rank takes micro_batch_size blocks per micro-step; the rest is dropped."""
    return len(dataset) // (micro_batch_size * world_size)


def rank_batches(
    dataset,
    *,
    rank: int,
    world_size: int,
    micro_batch_size: int,
    seed: int,
    epoch: int = 0,
    start_step: int = 0,
) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's micro-batches, endlessly, epoch after epoch, reshuffled per epoch.

    Each epoch is a permutation of all blocks drawn from torch.Generator seeded with (seed, epoch), the
    same on every rank; micro-step s of an epoch takes the global slice [s*G, (s+1)*G) of it with
    G = micro_batch_size * world_size, and rank r reads rows [s*G + r*m, s*G + (r+1)*m) of that slice
    (m = micro_batch_size). So ranks never share a block, the union over ranks is the single-process
    order, and resuming is arithmetic: pass the number of micro-steps already consumed.

    Args:
        dataset: a packed split (column "input_ids", maybe "labels"), e.g. pack_dataset(...)["train"].
        rank, world_size: this process's place in the data-parallel group.
        micro_batch_size: blocks per rank per micro-step.
        seed: shuffling seed.
        epoch: the epoch to start in.
        start_step: micro-steps of `epoch` already consumed (may exceed one epoch; it carries over).

    Yields:
        {"input_ids": LongTensor [micro_batch_size, block_size]} (+ "labels", the same shape).
    """
    if not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside world_size {world_size}")
    per_epoch = steps_per_epoch(dataset, world_size=world_size, micro_batch_size=micro_batch_size)
    if per_epoch == 0:
        raise UsageError(
            f"the dataset has {len(dataset)} blocks, fewer than one global micro-batch of "
            f"micro_batch_size {micro_batch_size} x world_size {world_size} = "
            f"{micro_batch_size * world_size}; use more data, a smaller --block-size or "
            "--micro-batch-size"
        )
    epoch, step = epoch + start_step // per_epoch, start_step % per_epoch
    rows = dataset.with_format("numpy")
    global_batch = micro_batch_size * world_size
    while True:
        order = epoch_order(len(dataset), seed=seed, epoch=epoch)
        for s in range(step, per_epoch):
            first = s * global_batch + rank * micro_batch_size
            picked = rows[order[first : first + micro_batch_size].tolist()]
            yield {column: torch.from_numpy(picked[column]).long() for column in dataset.column_names}
        epoch, step = epoch + 1, 0


def epoch_order(num_blocks: int, *, seed: int, epoch: int) -> torch.Tensor:
    """The shuffled block order of one epoch (identical on every rank and machine)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_blocks, generator=generator)

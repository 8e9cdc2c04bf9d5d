"""Held-out loss: the same blocks every time, split over ranks, averaged over every token scored (for
conversations, the assistant's tokens only)."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from zero_train.hf.chat import IGNORE_INDEX


def evaluate(engine, dataset, *, dist_info, micro_batch_size: int, max_batches: int) -> float | None:
    """Mean token loss of the model on the first blocks of `dataset` (collective when world_size > 1).

    Every rank evaluates the same number of micro-batches (ZeRO-3 gathers parameters collectively in
    each forward), rank r taking rows [k*G + r*m, k*G + (r+1)*m) of micro-batch k (G = m * world_size).

    Args:
        engine: the training engine (engine.model is called without gradients).
        dataset: the packed validation split (column "input_ids", and "labels" for conversations).
        dist_info: this process's DistInfo.
        micro_batch_size: m, blocks per rank per micro-batch.
        max_batches: micro-batches per rank at most.

    Returns:
        The mean loss over all ranks' blocks, or None (with a warning) if the split has too few blocks.
    """
    global_batch = micro_batch_size * dist_info.world_size
    num_batches = min(max_batches, len(dataset) // global_batch)
    if num_batches == 0:
        warnings.warn(
            f"evaluation skipped: the validation split has {len(dataset)} blocks, fewer than "
            f"{global_batch} (micro batch x ranks); use more data or a smaller --block-size",
            stacklevel=2,
        )
        return None
    rows = dataset.with_format("torch")
    model = engine.model
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for k in range(num_batches):
            first = k * global_batch + dist_info.rank * micro_batch_size
            picked = rows[first : first + micro_batch_size]
            batch = picked["input_ids"].long().to(dist_info.device)
            labels = picked["labels"].long().to(dist_info.device) if "labels" in picked else batch
            loss = model(input_ids=batch, labels=labels).loss
            scored = int((labels[:, 1:] != IGNORE_INDEX).sum())  # the tokens the shifted loss averages over
            total += torch.tensor([float(loss) * scored, scored], dtype=torch.float64)
    model.train(was_training)
    if dist_info.world_size > 1:
        total = total.to(dist_info.device)
        dist.all_reduce(total)
    return float(total[0] / total[1])

"""What explains a run that runs out of memory: its settings in each rank's record, and the one line.

`note_run` puts the run's settings, the memory limit that binds the rank and its use before the model exists into
the rank's record (zero_train.runtime.vitals), and with --output-dir keeps a copy in DIR/vitals/ for `zero-train
explain DIR`. `out_of_memory_line` turns a memory error raised in this rank (MemoryError, torch's
OutOfMemoryError, "DefaultCPUAllocator: can't allocate memory") into the line zero_train.memory.oom writes.
"""

from __future__ import annotations

import gc
import os
import pathlib
from typing import TYPE_CHECKING

from zero_train.runtime import memory_limit, vitals

if TYPE_CHECKING:
    from zero_train.train.config import RunConfig
    from zero_train.train.setup import RunPlan


def note_run(config: RunConfig, plan: RunPlan, dist_info) -> None:
    """Put the run's settings, the memory limit that binds this rank and its use now (before the model) in the
    rank's record (zero_train.runtime.vitals): what explains an out-of-memory end (zero_train.memory.oom); with
    --output-dir a copy is kept in DIR/vitals/ for `zero-train explain DIR`."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", dist_info.world_size))
    limit = memory_limit.rank_limit(local_ranks, dist_info.device.type)
    limit["start_used_bytes"] = memory_limit.used_bytes(limit["measure"])
    settings = plan.settings
    run = dict(
        model=config.model.model,
        vocab_size=None if plan.pretrained else plan.model_config.vocab_size,
        engine=plan.engine.name,
        world_size=dist_info.world_size,
        ds_config=plan.ds_config,
        precision=settings.precision,
        micro_batch_size=settings.micro_batch_size,
        grad_accum=settings.grad_accum,
        block_size=config.data.block_size,
        checkpointing=config.model.gradient_checkpointing,
        lora=config.lora.recorded(),
        device=dist_info.device.type,
        load_dtype=config.model.load_dtype,
    )
    vitals.ensure_heartbeat(dist_info.rank)
    if config.output.output_dir:
        vitals.keep_in(pathlib.Path(config.output.output_dir) / "vitals", dist_info.rank)
    vitals.note(run=run, limit=limit)


def out_of_memory_line(err: BaseException) -> str:
    """The rank's one line for a memory error: the explanation, or the error itself if none can be made.

    Call it after the failed run's objects are released (the explanation counts activations on fake tensors
    and needs a little memory of its own)."""
    gc.collect()
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    record = vitals.current_record()
    if not record or "run" not in record or "limit" not in record:
        return f"out of memory: {first}"
    # expensive: torch; train.main imports this module before its paused imports
    from zero_train.memory.oom import explain

    try:
        line = explain(record).line()
    except Exception as failure:  # noqa: BLE001 - the error must still be told, explained or not
        line = (
            f"rank {record['rank']} ran out of memory (no explanation: {type(failure).__name__}: {failure})"
        )
    vitals.note_outcome(line)
    return f"{line} ({first})"

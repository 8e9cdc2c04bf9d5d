"""One cell of a comparison matrix: an engine at a world size, its name and its generated DeepSpeed config.

Shared by `zero-train profile` (a cell per engine x world size), `zero-train bench` (a cell per engine x
precision, each run several times) and scripts/memory_matrix.py: each cell trains through zero_train.train with a
config from zero_train.ds_config's generator at the engine's ZeRO stage; its launch command comes from
zero_train.launch.command.
"""

from __future__ import annotations

from zero_train.ds_config.generate import ConfigRequest, generate_config
from zero_train.registry import engine_spec


def cell_name(
    engine: str, world_size: int, precision: str, *, grad_accum: int = 1, checkpointing: bool = False
) -> str:
    """The file stem of one cell, e.g. `ds2-w2-fp32`, `ds2-w2-fp32-ga4-ckpt` (accumulation, checkpointing)."""
    return (
        f"{engine}-w{world_size}-{precision}"
        + (f"-ga{grad_accum}" if grad_accum > 1 else "")
        + ("-ckpt" if checkpointing else "")
    )


def cell_config(
    engine: str,
    world_size: int,
    *,
    precision: str,
    micro_batch_size: int,
    grad_accum: int = 1,
    hidden_size: int | None = None,
) -> dict:
    """The DeepSpeed config of one cell, from zero_train.ds_config's generator at the engine's ZeRO stage."""
    request = ConfigRequest(
        stage=engine_spec(engine).stage,
        precision=precision,
        micro_batch_size=micro_batch_size,
        grad_accum=grad_accum,
        world_size=world_size,
        hidden_size=hidden_size,
    )
    return generate_config(request)


def last_error_line(log_text: str) -> str:
    """The line that best says why a run failed: the last `error:` line, else the last non-empty one."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "error:" in line.lower() or line.split(":")[0].endswith(("Error", "Exception")):
            return line
    return lines[-1] if lines else "no output"

"""Run one launcher command (deepspeed / torchrun + a training script) with its output in a log file.

Shared by `zero-train profile` and `zero-train bench`, whose cells are each one such run.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

from zero_train.runtime.errors import UsageError


def check_launcher(name: str) -> None:
    """Raise UsageError unless launcher `name` (deepspeed, torchrun) is next to this Python or on PATH."""
    if not (pathlib.Path(sys.executable).parent / name).exists() and shutil.which(name) is None:
        raise UsageError(
            f"launcher {name!r} not found next to {sys.executable}; install it or use --launcher"
        )


def launcher_path(name: str) -> str:
    """The launcher executable: the one next to this Python if present, else the one on PATH."""
    local = pathlib.Path(sys.executable).parent / name
    return str(local) if local.exists() else str(shutil.which(name) or name)


def model_meta(model: str, block_size: int) -> dict:
    """What every cell of a matrix shares about the model: name, num_params, hidden_size.

    Raises:
        UsageError: an unknown model, or a block size above its context (before any cell runs).
    """
    # here, not at the top: cli/profile and cli/bench import this module while building the CLI parser (--help stays light)
    from zero_train.hf.models import check_block_size, model_config
    from zero_train.memory.model.theory import model_shape

    config = model_config(model)
    check_block_size(config, block_size)
    shape = model_shape(config)
    return dict(model=model, num_params=shape.num_params, hidden_size=shape.hidden_size or None)


def run_logged(command: list[str], log_path: pathlib.Path, *, timeout: float) -> int | None:
    """Run `command`, its stdout and stderr into `log_path` (first line: the command itself).

    The children get OMP_NUM_THREADS (default 1: ranks sharing a machine must not fight for its cores)
    and unbuffered Python output, so that a killed run's log still ends where it stopped.

    Args:
        command: the full command line.
        log_path: the log file (overwritten).
        timeout: seconds before the run is killed.

    Returns:
        The exit code, or None if the run timed out.
    """
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1")
    with open(log_path, "w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        try:
            return subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            return None

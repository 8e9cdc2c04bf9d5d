"""Run one launcher command (deepspeed / torchrun + a training script) with its output in a log file.

Shared by `zero-train profile` and `zero-train bench`, whose cells are each one such run.
"""

from __future__ import annotations

import os
import pathlib
import subprocess


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

"""scripts/train.py's main in a spawned rank, its console captured: for tests of a run's exit code and lines
that need a rank of their own but not a fresh interpreter (each costs seconds of imports).

    code, stdout, stderr = run_ranks(train_py, 2, (argv,))[rank]
"""

from __future__ import annotations

import contextlib
import io
import logging

from zero_train.train.main import main


def train_py(rank: int, world_size: int, argv: list[str]) -> tuple[int, str, str]:
    """Run train.py's main (flags, run_cli: one `error:` line and the exit code) in this rank.

    Args:
        rank: this rank (its logger is rebound to the captured stdout).
        world_size: unused: the run reads the world from the process group run_ranks made.
        argv: train.py's flags.

    Returns:
        The exit code main ended with, and what the run wrote on stdout and on stderr.
    """
    del world_size
    logging.getLogger(f"zero_train.r{rank}").handlers.clear()  # the run's logger binds to the captured stdout
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            main(argv, prog="train.py")
    except SystemExit as exit_info:  # main always ends in one (run_cli)
        return exit_info.code, stdout.getvalue(), stderr.getvalue()
    raise AssertionError("train.py's main returned without exiting")

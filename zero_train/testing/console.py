"""scripts/train.py's main (or the bench worker's) in a spawned rank, its console captured: for tests of a run's
exit code and lines that need a rank of their own but not a fresh interpreter (each costs seconds of imports).

    code, stdout, stderr = run_ranks(train_py, 2, (argv,))[rank]
    code, stdout, stderr = run_ranks(bench_worker_py, 2, (["--plan", plan],))[rank]
    code = forked_launch(train_py, 2, argv, log_path, timeout_s=600)   # a launch's stand-in: first failing code
"""

from __future__ import annotations

import contextlib
import io
import logging
import pathlib
from collections.abc import Callable

from zero_train.bench import worker
from zero_train.testing import run_ranks
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
    return _captured(rank, lambda: main(argv, prog="train.py"))


def bench_worker_py(rank: int, world_size: int, argv: list[str]) -> tuple[int, str, str]:
    """Run `python -m zero_train.bench.worker`'s main (its --plan) in this rank, as train_py does train.py's:
    the worker trains in the process group run_ranks made."""
    del world_size
    return _captured(rank, lambda: worker.main(argv))


def _captured(rank: int, entry: Callable[[], object]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `entry`, a main that always ends in SystemExit (run_cli)."""
    logging.getLogger(f"zero_train.r{rank}").handlers.clear()  # the run's logger binds to the captured stdout
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            entry()
    except SystemExit as exit_info:  # main always ends in one (run_cli)
        return exit_info.code, stdout.getvalue(), stderr.getvalue()
    raise AssertionError("the main returned without exiting")


def forked_launch(
    rank_main: Callable, world_size: int, argv: list[str], log_path: pathlib.Path, *, timeout_s: float
) -> int:
    """A launcher's stand-in for tests of profile and bench (their launch seams): `rank_main` with `argv` in
    `world_size` fresh forked ranks, every rank's console in `log_path`; the first non-zero exit code, else 0."""
    results = run_ranks(rank_main, world_size, args=(argv,), timeout_s=timeout_s)
    log_path.write_text("".join(stdout + stderr for _, stdout, stderr in results))
    return next((code for code, _, _ in results if code != 0), 0)

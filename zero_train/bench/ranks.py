"""Where the bench starts ranks: a run's own launch (zero_train.bench.run) and the one launch of many runs
(zero_train.bench.one_launch) both call `ranks.launch`, through this module, so that one swap reaches both.

Why a seam: tests/bench/test_compare.py swaps it for ranks forked from its preloaded forkserver (the
same program, flags and files, without an interpreter start and its imports per rank, nor the launcher's);
the launchers themselves are tested by tests/bench/test_bench.py.
"""

from __future__ import annotations

import argparse
import pathlib

from zero_train.bench.cells import bench_launch
from zero_train.launch.command import TRAIN_MODULE, launch_command
from zero_train.launch.launcher import run_logged
from zero_train.runtime.ports import free_port


def launch(
    args: argparse.Namespace,
    argv: list[str],
    log_path: pathlib.Path,
    *,
    module: str = TRAIN_MODULE,
    script: str | None = None,
    done_files: list[pathlib.Path] | None = None,
) -> int | None:
    """Start --world-size ranks of `module` (or `script`) with `argv` under --launcher, their console in
    `log_path`.

    Args:
        args: the bench flags (world_size, launcher, timeout).
        argv: the program's flags.
        log_path: the launch's log (overwritten; its first line is the command).
        module, script: the program, as launch_command takes it.
        done_files: for a launch of many runs, the files its runs write when done: it is stopped when none
            appeared for --timeout s. None: one run, stopped after --timeout s.

    Returns:
        The exit code, or None if the launch was stopped.
    """
    command = launch_command(bench_launch(args, free_port()), argv, module=module, script=script)
    return run_logged(command, log_path, timeout=args.timeout, done_files=done_files)

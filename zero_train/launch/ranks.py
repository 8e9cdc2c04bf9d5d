"""Start the ranks of a run from this process: `zero-train train --nproc-per-node 2 ...` (zero_train.cli.train).

    code = launch_ranks(Launch(launcher="torchrun", nproc_per_node=2), run_argv(config))

torchrun runs here, as `torchrun` itself would (torch.distributed.run.run: one node picks a free port), with
what a rank already said left as said: a rank that fails prints its own one line (exit 2 for a usage error, 1
for a fault), and this process exits with that code, without torchrun's ~35-line ChildFailedError report
(which torchrun's agent raises for any failed rank, whatever its code) and its agent's log lines. A rank ended
by a signal prints nothing: a surviving rank names it (zero_train.runtime.vitals), else one line here does. DeepSpeed's launcher runs as a child process, its exit
code passed on.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from zero_train.launch.command import Launch, launch_command
from zero_train.runtime import lifeline
from zero_train.runtime.errors import SAID_ENV, error_line

TORCH_LAUNCH_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.distributed.run")
"""torchrun's agent logs a failed rank ("failed (exitcode: 2) local_rank: 1 ...", "Sending process ... closing
signal SIGTERM") at WARNING and ERROR: the rank's own line has said it."""


def launch_ranks(launch: Launch, argv: list[str]) -> int:
    """Run `python -m zero_train.train ARGV` on launch.nproc_per_node ranks; returns the exit code to exit with.

    Args:
        launch: torchrun or deepspeed, and the ranks (one node).
        argv: the run's flags (zero_train.train.args.run_argv), checked by the caller before any rank starts.
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for several ranks, without its banner
    # a line every rank finds is said once (errors.SAID_ENV)
    said = tempfile.mkdtemp(prefix="zero-train-said-")
    os.environ[SAID_ENV] = said
    try:
        return _launch(launch_command(launch, argv), launch.launcher)
    finally:
        os.environ.pop(SAID_ENV, None)
        shutil.rmtree(said, ignore_errors=True)


def _launch(command: list[str], launcher: str) -> int:
    if launcher == "torchrun":
        return _torchrun_here(command[1:])
    command.insert(1, "--quiet")  # DeepSpeed's launcher logs ~10 INFO lines per launch; its errors stay
    process = subprocess.Popen(
        command, env={**os.environ, **lifeline.owner_env()}, preexec_fn=lifeline.parent_death_hook()
    )
    try:
        return process.wait()
    except KeyboardInterrupt:  # the terminal's Ctrl-C reached the launcher too: it stops its ranks
        return process.wait()


def _torchrun_here(torchrun_argv: list[str]) -> int:
    """torchrun's own main without its report of a failed rank: the failed rank's exit code, 0 on success."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith(TORCH_LAUNCH_LOGGERS) and isinstance(logger, logging.Logger):
            logger.setLevel(logging.CRITICAL)
    try:
        torchrun.run(torchrun.parse_args(torchrun_argv))
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()  # torchrun's "root cause": the rank that failed first
        if failure.exitcode > 0:
            return failure.exitcode  # the rank printed its one line
        if not any(other.exitcode > 0 for other in err.failures.values()):  # no survivor named it either
            name = _signal_name(-failure.exitcode)
            error_line(f"rank {rank} was ended by {name} (killed from outside, or out of memory)")
        return 128 - failure.exitcode
    except SignalException as err:  # this process was told to stop: the agent has stopped the ranks
        error_line(f"stopped by {_signal_name(err.sigval)}: the ranks of this run were stopped")
        return 128 + int(err.sigval)
    return 0


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"

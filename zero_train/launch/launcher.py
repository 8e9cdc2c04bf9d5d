"""Run one launcher command (zero_train.launch.command) with its output in a log file.

Shared by `zero-train profile` and `zero-train bench`, whose cells are each one such run (run_logged), and by
the bench's one launch of many runs (run_logged with done files: stopped when no run finishes for a while).
It imports torch and transformers (the model's shape for model_meta, the memory model for a killed rank's
line): both commands read the model before their first launch; a missing launcher is found without them
(zero_train.launch.command.check_launcher).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator

import psutil

from zero_train.hf.models import check_block_size, model_config
from zero_train.launch.command import shell_text
from zero_train.memory.model.theory import model_shape
from zero_train.memory.oom import explain
from zero_train.runtime import lifeline
from zero_train.runtime.errors import Stopped
from zero_train.runtime.vitals import RUN_DIR_ENV, describe_ended, killed_ranks

KILL_GRACE_S = 5.0
"""After SIGTERM, SIGKILL: long enough for torchrun and DeepSpeed's launcher to stop their ranks and for each rank
to print its one line (runtime.faults waits up to 3 s for a dead peer), short enough that a stopped command
has nothing left within the 15 s a scheduler's next job may wait."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""What stops a command while its launch runs: a scheduler's or `timeout`'s SIGTERM, Ctrl-C, a closed terminal."""


def model_meta(model: str, block_size: int) -> dict:
    """What every cell of a matrix shares about the model: name, num_params, hidden_size, num_layers.

    Raises:
        UsageError: an unknown model, or a block size above its context (before any cell runs).
    """
    config = model_config(model)
    check_block_size(config, block_size)
    shape = model_shape(config)
    return dict(
        model=model,
        num_params=shape.num_params,
        hidden_size=shape.hidden_size or None,
        num_layers=shape.num_layers or None,
    )


def run_logged(
    command: list[str],
    log_path: pathlib.Path,
    *,
    timeout: float,
    done_files: list[pathlib.Path] | None = None,
    kill_grace_s: float = KILL_GRACE_S,
) -> int | None:
    """Run `command`, its stdout and stderr into `log_path` (first line: the command itself).

    The children get OMP_NUM_THREADS (default 1: ranks sharing a machine must not fight for its cores),
    unbuffered Python output, so that a killed run's log still ends where it stopped, and a run directory
    (ZT_RUN_DIR) for their heartbeats: after a failed run, a rank the kernel killed (which printed nothing) is
    named at the end of the log, "error: rank 1 was killed (SIGKILL), ...: it held 10.3 GB; ..."
    (zero_train.runtime.vitals). The launcher runs in a session of its own; on a timeout, an exception, or
    SIGTERM / SIGINT / SIGHUP to this process (raised here as runtime.errors.Stopped, saying what was stopped)
    its whole process tree is stopped, so no rank outlives it holding its GPU memory; if this process dies
    without that (SIGKILL), the launcher gets SIGTERM from the kernel and every rank stops by itself
    (zero_train.runtime.lifeline).

    Args:
        command: the full command line.
        log_path: the log file (overwritten).
        timeout: seconds before the run is stopped; with `done_files`, seconds without a new one.
        done_files: for a launch of many runs, the files its runs write when done: a slow launch goes on while
            its runs finish. None: one run.
        kill_grace_s: seconds between SIGTERM and SIGKILL.

    Returns:
        The exit code, or None if the run was stopped.
    """

    with tempfile.TemporaryDirectory(prefix="zero_train-run-") as run_dir, open(log_path, "w") as log:
        env = dict(
            os.environ,
            OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
            PYTHONUNBUFFERED="1",
            **{RUN_DIR_ENV: run_dir},
            **lifeline.owner_env(),
        )
        log.write(shell_text(command) + "\n")
        log.flush()
        with _stop_signals(_raise_stopped):
            proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=lifeline.parent_death_hook(),
            )
            try:
                ended = _wait(proc, timeout, done_files)
            except BaseException as err:  # Ctrl-C reaches only this process: the launcher has its own session
                with _stop_signals(signal.SIG_IGN):  # a second Ctrl-C does not cut the stopping short
                    left = stop_process_tree(proc, grace_s=kill_grace_s)
                if isinstance(err, Stopped):
                    err.what = _what_was_stopped(command, proc.pid, left)
                raise
        if not ended:
            stop_process_tree(proc, grace_s=kill_grace_s)  # the ranks too, not just the launcher's group
            return None
        if proc.returncode != 0:
            log.writelines(f"error: {line}\n" for line in killed_lines(pathlib.Path(run_dir)))
        return proc.returncode


def killed_lines(run_dir: pathlib.Path) -> list[str]:
    """One line per rank killed without a word (zero_train.runtime.vitals): how it ended, what it held and, when
    it was most likely out of memory, why and the cheapest change that fits (zero_train.memory.oom)."""

    lines = []
    for rank, record in killed_ranks(run_dir):
        line = describe_ended(rank, record)
        if (
            record.get("run")
            and record.get("limit")
            and not record.get("crash")
            and "not out of memory" not in line
        ):
            try:
                line += "; " + explain(record).detail()
            except Exception as failure:  # noqa: BLE001 - the death is told, explained or not
                line += f"; no explanation ({type(failure).__name__}: {failure})"
        lines.append(line)
    return lines


def _wait(proc: subprocess.Popen, timeout: float, done_files: list[pathlib.Path] | None) -> bool:
    """Whether `proc` ended within `timeout` s or, given done files, before `timeout` s passed without a new one."""
    if done_files is None:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    finished, last_progress = 0, time.monotonic()
    while proc.poll() is None:
        time.sleep(0.5)
        now_finished = sum(path.exists() for path in done_files)
        if now_finished > finished:
            finished, last_progress = now_finished, time.monotonic()
        elif time.monotonic() - last_progress > timeout:
            return False
    return True


@contextlib.contextmanager
def _stop_signals(handler) -> Iterator[None]:
    """STOP_SIGNALS go to `handler` inside, as before after. Main thread only (Python delivers signals there;
    elsewhere the launcher's parent-death signal is the lifeline)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


def _raise_stopped(signum, frame) -> None:
    raise Stopped(signum)


def _what_was_stopped(command: list[str], pid: int, left: list[int]) -> str:
    """ "stopped torchrun (pid 12) and every process it started", or which are left."""
    what = f"stopped {pathlib.Path(command[0]).name} (pid {pid}) and every process it started"
    return what if not left else f"{what}, except pid(s) {', '.join(map(str, left))} (still running)"


def stop_process_tree(proc: subprocess.Popen, *, grace_s: float) -> list[int]:
    """SIGTERM `proc`'s process group and every descendant, SIGKILL what is left after `grace_s`; reap `proc`.

    The group holds the launcher and the ranks it forked (deepspeed's); torchrun starts each rank in a
    session of its own, so descendants are signalled one by one too.

    Returns:
        The pids still running after SIGKILL and another `grace_s` (none, unless a process cannot die).
    """
    tree: dict[int, psutil.Process] = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        tree.update((p.pid, p) for p in _process_tree(proc.pid))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # start_new_session: the group id is the launcher's pid
        for process in tree.values():
            with contextlib.suppress(psutil.Error):
                process.send_signal(sig)  # psutil checks the pid still names the same process
        deadline = time.monotonic() + grace_s
        while (proc.poll() is None or _running(tree.values())) and time.monotonic() < deadline:
            time.sleep(0.05)
    proc.wait()
    return [process.pid for process in tree.values() if _running([process])]


def _process_tree(pid: int) -> list:
    """The process `pid` and all its descendants (empty if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _running(processes) -> bool:
    """Whether any of `processes` still runs (a zombie waiting for its parent does not)."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.status() != psutil.STATUS_ZOMBIE:
                return True
    return False

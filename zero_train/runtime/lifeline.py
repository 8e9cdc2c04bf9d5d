"""A launched rank never outlives what launched it.

A command that starts a launcher (`zero-train bench`, `profile`, `gpu-check`: zero_train.launch.launcher) can
be stopped in ways it cannot clean up after: SIGKILL, a scheduler's kill of its process alone. Its launcher and
ranks run in a session of their own (so that a terminal's Ctrl-C reaches the command, which then stops them in
order), so nothing else would end them, and on a GPU cluster each would keep its GPU memory and its NCCL
communicator. Two lifelines close that gap:

- the launcher is started with the kernel's parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGTERM)`): when the
  command dies, the kernel sends the launcher SIGTERM, and torchrun and DeepSpeed's launcher stop their ranks;
- every rank watches (`watch_launcher`, a daemon thread polling once a second) the command that launched it
  (ZT_OWNER: its pid and start time, so that a reused pid is not mistaken for it) and its own parent, the
  launcher: when either is gone, the rank SIGTERMs itself (the run's own one-line report,
  zero_train.runtime.faults) and, if it is still alive `EXIT_DEADLINE_S` later, exits. Under DeepSpeed's
  launcher it watches the `deepspeed` runner above its parent too: on one node the runner dies of SIGTERM
  without passing it on (deepspeed/launcher/runner.py forwards signals only to pdsh's multi-node launch), and
  its `deepspeed.launcher.launch` child and the ranks would train on.

Only a process that a launcher started (LOCAL_RANK set, as torchrun, DeepSpeed's and accelerate's launchers
set it) or that one of our commands started (ZT_OWNER) watches: a `nohup python -m zero_train.train` whose
shell has gone is left alone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

OWNER_ENV = "ZT_OWNER"
"""The pid and start time ("4242:1234567") of the command whose launch this process belongs to."""
POLL_S = 1.0
EXIT_DEADLINE_S = 8.0
"""After its own SIGTERM, how long a rank whose launcher has gone may take to report before it exits: with
POLL_S, within the 10 s a GPU's next job may wait for its memory."""
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_watching = threading.Event()
_gone: list[str] = []  # what of this rank's launch has gone, once the watch has seen it


def process_token(pid: int) -> str | None:
    """ "PID:STARTTIME" of a running process (its start time in clock ticks since boot, /proc/PID/stat field
    22), which names it even after its pid is reused; None if it is gone or /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):  # exited, not yet reaped
        return None
    return f"{pid}:{fields[19]}"  # fields[0] is field 3 (state): field 22 is fields[19]


def owner_env() -> dict[str, str]:
    """The environment entry that makes a launched process watch this one (empty where /proc is missing)."""
    token = process_token(os.getpid())
    return {OWNER_ENV: token} if token else {}


def parent_death_hook():
    """A subprocess.Popen preexec_fn: the child gets SIGTERM when the thread that started it dies.

    The thread, not the process: a launcher must be started from a thread that lives as long as the launch
    (run_logged waits in it). Linux only; elsewhere None (the ranks' own watch still ends them).
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: a forked child must not load libraries

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    return hook


def watch_launcher(*, poll_s: float = POLL_S) -> bool:
    """In a launched rank, start the daemon thread that stops this process when its launch is gone.

    Returns:
        Whether this process watches (a launched process, once per process).
    """
    owner = os.environ.get(OWNER_ENV)
    if (owner is None and "LOCAL_RANK" not in os.environ) or _watching.is_set():
        return False
    _watching.set()
    thread = threading.Thread(
        target=_watch, args=(owner, _launchers(), poll_s), name="zero_train-lifeline", daemon=True
    )
    thread.start()
    return True


def _launchers() -> list[str]:
    """The tokens of this process's parent and, if that is DeepSpeed's per-node launch, the runner above it."""
    parent = os.getppid()
    chain = [process_token(parent)]
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as handle:
            under_deepspeed = b"deepspeed.launcher.launch" in handle.read()
    except OSError:
        under_deepspeed = False
    if under_deepspeed:
        with open(f"/proc/{parent}/stat") as handle:
            chain.append(process_token(int(handle.read().rsplit(")", 1)[1].split()[1])))
    return [token for token in chain if token is not None]


def gone() -> str | None:
    """What of this rank's launch is gone ("its launcher (pid 12)"), once the watch has seen it; else None."""
    return _gone[0] if _gone else None


def _watch(owner: str | None, launchers: list[str], poll_s: float) -> None:
    while not _gone:
        time.sleep(poll_s)
        missing = _missing(owner, launchers)
        if missing is not None:
            _gone.append(missing)
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):  # no report of the run's own to make it
        rank = os.environ.get("RANK", "0")
        # straight to fd 2 in one write: the main thread may hold sys.stderr's lock
        os.write(2, f"error: rank {rank}: {_gone[0]} is gone, so this rank stopped\n".encode())
    os.kill(os.getpid(), signal.SIGTERM)  # the run's own one-line report and exit (runtime.faults)
    time.sleep(EXIT_DEADLINE_S)
    os._exit(128 + int(signal.SIGTERM))


def _missing(owner: str | None, launchers: list[str]) -> str | None:
    """What of this rank's launch has gone ("its launcher (pid 12)"), or None while all is there."""
    if owner is not None and process_token(int(owner.split(":")[0])) != owner:
        return f"the command that launched it (pid {owner.split(':')[0]})"
    for token in launchers:
        if process_token(int(token.split(":")[0])) != token:
            return f"its launcher (pid {token.split(':')[0]})"
    return None

"""Runtime faults of a multi-rank job, turned into one line that names the dead rank.

When a rank dies (SIGKILL, out of memory, a crash), the others notice in one of three ways: their next gloo
collective fails ("Connection closed by peer"), a collective times out (zero_train.runtime.dist sets the timeout to
ZT_COLLECTIVE_TIMEOUT_S, 60 s by default, not torch's 30 minutes), or the launcher terminates them
(DeepSpeed's launcher and torchrun send SIGTERM to the survivors). In each case `describe_fault` says which
rank died, when it can tell: at start-up every rank learns every peer's host and pid (`record_peers`), so a
survivor on the same host can see which peer process is gone.

The peer table lives in this process's environment (ZT_PEERS, JSON) because `errors.run_cli` has no DistInfo.

The launcher's SIGTERM must produce that line even when the main thread cannot take it: Python runs a
signal handler only between bytecodes of the main thread, and a main thread blocked in C++ (e.g. the
TCPStore rendezvous of a new gloo group, waiting for a peer that is dead) would otherwise sit out the
SIGTERM until the launcher SIGKILLs it 30 s later, saying nothing. See `install_sigterm_report`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time

from zero_train.runtime import lifeline, vitals

PEERS_ENV = "ZT_PEERS"
SIGTERM_GRACE_S = 10.0  # launchers SIGKILL 30 s after their SIGTERM (DeepSpeed's launcher, torchrun)
PEER_EXIT_WAIT_S = 3.0
"""How long a survivor waits for the dead peer's process to show as exited: a killed process closes its
sockets before it becomes a zombie, so a survivor that looks at once may name no rank
(docs/reliability.md#faults-a-rank-dies). A peer that hangs instead costs its report these seconds."""
# process-wide, like the signal it guards: set once the main thread has started its one-line report
_reporting = threading.Event()
DIST_ERROR_HINTS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "timed out",
    "timeout",
    "gloo",
    "nccl",
    "socket",
)


_checkpoints: dict = dict(save_dir=None, last=None, saving=None, on_disk=None)
"""What this rank's run has saved, for the line a stopped run ends with (note_checkpoints, note_saving, ...)."""


class TerminatedByLauncher(RuntimeError):
    """The launcher sent SIGTERM (it does so to every survivor when one rank exits non-zero)."""


def record_peers(world_size: int) -> list[tuple[str, int]] | None:
    """Collective: learn every rank's (host, pid) and keep it in ZT_PEERS; install the SIGTERM handler.

    Args:
        world_size: the number of ranks (nothing is exchanged for a world of one).

    Returns:
        Every rank's (host, pid), None for a world of one.
    """
    if world_size <= 1:
        return None
    import torch.distributed as dist  # expensive: torch; every usage error imports this module (runtime.errors)

    peers: list = [None] * world_size
    dist.all_gather_object(peers, [socket.gethostname(), os.getpid()])
    os.environ[PEERS_ENV] = json.dumps(peers)
    install_sigterm_report()
    return [tuple(peer) for peer in peers]


def note_checkpoints(save_dir: str | None, *, last: str | None = None, on_disk=None) -> None:
    """The run saves into `save_dir` (None: it does not), its last complete checkpoint so far `last`.

    `on_disk()`, when given, returns the complete checkpoints in `save_dir` now (oldest first): a rank
    stopped while it waits for rank 0 to publish a save has not yet heard that the save is complete, so the
    line it ends with reads the disk rather than what it last heard.
    """
    _checkpoints.update(save_dir=save_dir, last=last, saving=None, on_disk=on_disk)


def note_saving(step: int) -> None:
    """A save of `step` has begun (it ends with note_saved)."""
    _checkpoints["saving"] = step


def note_saved(folder: str) -> None:
    """The save in flight is complete, published as `folder`."""
    _checkpoints.update(last=folder, saving=None)


def _resume_hint() -> str:
    """What a stopped rank says of its checkpoints: the last complete one (named), a save cut short."""
    if _checkpoints["save_dir"] is None:
        return "resume from the last complete checkpoint with --resume auto"
    cut, last = _checkpoints["saving"], _checkpoints["last"]
    if _checkpoints["on_disk"] is not None:
        with contextlib.suppress(OSError):
            complete = _checkpoints["on_disk"]()
            if complete:
                last = str(complete[-1].resolve())
                cut = None if cut is not None and complete[-1].name == f"step-{cut:08d}" else cut
    hint = f"the save of step {cut} was cut short and is not a checkpoint; " if cut is not None else ""
    if last is None:
        return hint + f"no checkpoint in {_checkpoints['save_dir']} is complete yet"
    return hint + f"the last complete checkpoint is {last}: resume from it with --resume auto"


def install_sigterm_report() -> None:
    """SIGTERM raises TerminatedByLauncher in the main thread, or is reported by a watcher if it cannot.

    The C-level handler writes the signal number to a wakeup pipe the moment SIGTERM arrives, whatever the
    main thread is doing; a daemon thread reads it and, if the main thread has not begun its report
    (`mark_reporting`) within SIGTERM_GRACE_S, prints the same one line (describe_fault) and ends the
    process with exit code 1. Nothing of a checkpoint is lost: saves are staged and published by rename.
    Idempotent; outside the main thread it does nothing (the default SIGTERM just ends the process).
    """
    if signal.getsignal(signal.SIGTERM) is _raise_terminated:
        return
    try:
        signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch_sigterm, args=(read_fd,), name="zero_train-sigterm", daemon=True).start()


def mark_reporting() -> None:
    """The main thread is printing its report and will exit: a later SIGTERM is ignored, not raised inside
    the report (it may reach any thread; a per-thread mask cannot hold it), and the watcher stays silent."""
    _reporting.set()
    is_rank = signal.getsignal(signal.SIGTERM) is _raise_terminated  # a plain CLI keeps the default SIGTERM
    if is_rank and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _raise_terminated(signum, frame) -> None:
    raise TerminatedByLauncher("terminated by the launcher (SIGTERM)")


def _watch_sigterm(read_fd: int) -> None:
    while signal.SIGTERM not in os.read(read_fd, 64):  # one byte per signal that has a Python handler
        pass
    if _reporting.wait(SIGTERM_GRACE_S):
        return
    stuck = TerminatedByLauncher(
        f"terminated by the launcher (SIGTERM) while blocked for {SIGTERM_GRACE_S:g} s in a call Python "
        "cannot interrupt"
    )
    # straight to fd 2 in one write (errors.error_line's form): the blocked main thread may hold sys.stderr's
    # lock, and this module may not import errors (errors imports it)
    os.write(2, f"error: {describe_fault(stuck)}\n".encode())
    vitals.stop_heartbeat()  # os._exit skips atexit: this rank ended through Python, say so
    os._exit(1)  # errors.EXIT_FAULT: a runtime fault


def dead_peers() -> list[int]:
    """Ranks on this host whose process has exited (from ZT_PEERS); [] if unknown."""
    return [rank for rank, _ in _dead_peer_pids()]


def _dead_peer_pids() -> list[tuple[int, int]]:
    try:
        peers = json.loads(os.environ.get(PEERS_ENV, "[]"))
    except json.JSONDecodeError:
        return []
    host = socket.gethostname()
    return [
        (rank, pid) for rank, (peer_host, pid) in enumerate(peers) if peer_host == host and not _alive(pid)
    ]


def _how_it_ended(rank: int, pid: int) -> str:
    """ "rank 1 died (its process exited)", or, if it ended without Python's exit (its heartbeat file is left,
    zero_train.runtime.vitals), "rank 1 was killed (SIGKILL) ...: it held 10.3 GB ..."."""
    run_dir = vitals.run_dir()
    record = vitals.killed_record(run_dir, rank, alive=_alive) if run_dir else None
    if record is None or record["pid"] != pid:
        return f"rank {rank} died (its process exited)"
    return vitals.describe_ended(rank, record, vitals.exit_status(pid))


def _alive(pid: int) -> bool:
    """False once the process is gone or a zombie (exited, not yet reaped by the launcher)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state not in ("Z", "X")


def is_distributed_fault(err: BaseException) -> bool:
    """True for torch.distributed errors and gloo/NCCL transport failures (a peer died or hung)."""
    if isinstance(err, TerminatedByLauncher):
        return True
    dist_module = sys.modules.get("torch.distributed")
    dist_error = getattr(dist_module, "DistError", None)
    if dist_error is not None and isinstance(err, dist_error):
        return True
    if not isinstance(err, RuntimeError):
        return False
    text = str(err).lower()
    return any(hint in text for hint in DIST_ERROR_HINTS)


def describe_fault(err: BaseException) -> str:
    """One line: this rank, what failed, which rank died (if visible), what to do."""
    rank = os.environ.get("RANK", "0")
    dead = _dead_peer_pids()
    deadline = time.monotonic() + PEER_EXIT_WAIT_S
    while not dead and os.environ.get(PEERS_ENV) and time.monotonic() < deadline:
        time.sleep(0.05)  # a peer whose socket closed may still be exiting
        dead = _dead_peer_pids()
    gone = lifeline.gone()
    if dead:
        cause = "; ".join(_how_it_ended(rank, pid) for rank, pid in dead)
    elif gone is not None:
        return f"rank {rank}: {gone} is gone, so this rank stopped; {_resume_hint()}"
    elif isinstance(err, TerminatedByLauncher):
        cause = (
            "stopped by SIGTERM (from the launcher, after a rank on another host failed, or from a scheduler: "
            "the job was cancelled or reached its time limit)"
        )
        return f"rank {rank}: {cause}; {_resume_hint()}"
    else:
        cause = "another rank died or stopped responding (see the launcher's output for which)"
    return f"rank {rank}: {cause}; {_first_line(err)}; {_resume_hint()}"


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."

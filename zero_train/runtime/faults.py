"""Runtime faults of a multi-rank job, turned into one line that names the dead rank.

When a rank dies (SIGKILL, out of memory, a crash), the others notice in one of three ways: their next gloo
collective fails ("Connection closed by peer"), a collective times out (zero_train.runtime.dist sets the timeout to
ZT_COLLECTIVE_TIMEOUT_S, 60 s by default, not torch's 30 minutes), or the launcher terminates them
(DeepSpeed's launcher and torchrun send SIGTERM to the survivors). In each case `describe_fault` says which
rank died, when it can tell: at start-up every rank learns every peer's host and pid (`record_peers`), so a
survivor on the same host can see which peer process is gone.

The peer table lives in this process's environment (ZT_PEERS, JSON) because `errors.run_cli` has no DistInfo.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

PEERS_ENV = "ZT_PEERS"
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


class TerminatedByLauncher(RuntimeError):
    """The launcher sent SIGTERM (it does so to every survivor when one rank exits non-zero)."""


def record_peers(world_size: int) -> None:
    """Collective: learn every rank's (host, pid) and keep it in ZT_PEERS; install the SIGTERM handler.

    Args:
        world_size: the number of ranks (nothing is exchanged for a world of one).
    """
    if world_size <= 1:
        return
    import torch.distributed as dist  # here: the CLI imports this module (via errors) and must not load torch

    peers: list = [None] * world_size
    dist.all_gather_object(peers, [socket.gethostname(), os.getpid()])
    os.environ[PEERS_ENV] = json.dumps(peers)
    try:
        signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: keep the default (the process just ends)
        pass


def _raise_terminated(signum, frame) -> None:
    raise TerminatedByLauncher("terminated by the launcher (SIGTERM)")


def dead_peers() -> list[int]:
    """Ranks on this host whose process has exited (from ZT_PEERS); [] if unknown."""
    try:
        peers = json.loads(os.environ.get(PEERS_ENV, "[]"))
    except json.JSONDecodeError:
        return []
    host = socket.gethostname()
    return [rank for rank, (peer_host, pid) in enumerate(peers) if peer_host == host and not _alive(pid)]


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
    dead = dead_peers()
    if dead:
        who = ", ".join(f"rank {r}" for r in dead)
        cause = f"{who} died (its process exited)"
    else:
        cause = "another rank died or stopped responding (see the launcher's output for which)"
    detail = _first_line(err)
    return f"rank {rank}: {cause}; {detail}; resume from the last complete checkpoint with --resume auto"


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."

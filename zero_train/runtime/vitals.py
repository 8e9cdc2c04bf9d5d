"""Each rank's last resident memory, and whether it ended through Python: how a SIGKILLed rank is named.

A rank the kernel kills (the out-of-memory killer sends SIGKILL) runs no Python: no error line, no exit
handler, and its peers only see a closed connection. So every rank of a job keeps a small JSON file in the
job's run directory, rewritten every HEARTBEAT_S with its resident memory (VmRSS), and removes it when its
Python exits, whatever the reason (success, an error, the launcher's SIGTERM). A file whose process is gone
means the rank ended without Python's exit: SIGKILL, or a native crash, which faulthandler writes beside it
(`rank-N.crash`). Its peers read it (zero_train.runtime.faults.describe_fault), and so does a launcher that
gave the ranks a ZT_RUN_DIR (zero_train.launch.launcher.run_logged).

    ZT_RUN_DIR=DIR    the run directory (a launcher sets it); unset: <tmp>/zero_train-<uid>/<host>-<rank 0's pid>
                      in a job of several ranks, none for a single process nobody watches

Out of memory or not: /proc/vmstat's oom_kill counts this host's out-of-memory kills (cgroup limits
included); a count that rose since the rank started says the OOM killer killed (most likely) it.

The record also says what the rank was doing and had: the phase of training (`note_phase`), the run's
settings (`note_run`: what an estimate of it needs), the limit that binds it and its use then and at most
(zero_train.runtime.memory_limit), so that an out-of-memory death is explained by zero_train.memory.oom. With
--output-dir a copy is kept (`keep_in`, DIR/vitals/rank-N.json): rewritten with each heartbeat, finished at
Python's exit with how the rank ended ("finished", or its one error line); a copy never finished is a rank
that ended without Python's exit. `zero-train explain DIR` reads them.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import pathlib
import signal
import socket
import tempfile
import threading
import time

from zero_train.runtime import memory_limit

RUN_DIR_ENV = "ZT_RUN_DIR"
ESTIMATE_ENV = "ZT_ESTIMATE"
"""The `zero-train estimate` command that answers for this run (set by the training entry point)."""
HEARTBEAT_S = 0.5
GB = 1e9


class Heartbeat:
    """This rank's file in the run directory: written now and every HEARTBEAT_S, removed at Python's exit."""

    def __init__(self, run_dir: pathlib.Path | None, rank: int) -> None:
        self.path = run_dir / f"rank-{rank}.json" if run_dir else None
        self.crash_path = run_dir / f"rank-{rank}.crash" if run_dir else None
        self.keep_path: pathlib.Path | None = None
        """The kept copy (keep_in), finished at Python's exit."""
        self.rank = rank
        self.oom_kills = oom_kills()
        self.facts: dict = {}
        """phase, run, limit, ...: what note_* said, written with every beat."""
        self.outcome: str | None = None
        """How the rank ended, for the kept copy ("finished" or its error line)."""
        self.peak_used = 0
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._crash_file = None

    def start(self) -> None:
        """First write, the writer thread, faulthandler into the crash file (if nobody enabled it), atexit."""
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.write()
        if self.crash_path is not None and not faulthandler.is_enabled():
            self._crash_file = open(self.crash_path, "w")  # noqa: SIM115 (open while the process lives)
            faulthandler.enable(file=self._crash_file)
        threading.Thread(target=self._beat, name="zero_train-heartbeat", daemon=True).start()
        atexit.register(self.stop)

    def record(self) -> dict:
        """This rank's current memory, what it does and has."""
        limit = self.facts.get("limit")
        used = memory_limit.used_bytes(limit["measure"]) if limit else 0
        self.peak_used = max(self.peak_used, used)
        status = memory_limit.proc_status()
        return dict(
            rank=self.rank,
            pid=os.getpid(),
            host=socket.gethostname(),
            rss_bytes=resident_bytes(),
            peak_rss_bytes=status.get("VmHWM", 0),
            used_bytes=used,
            peak_used_bytes=self.peak_used,
            oom_kills=self.oom_kills,
            estimate=os.environ.get(ESTIMATE_ENV),
            time=time.time(),
            **self.facts,
        )

    def write(self) -> None:
        """Replace the files with this rank's current record (atomically: a reader never sees half of one)."""
        record = self.record()
        with self._lock:
            if self._stopped.is_set():
                return
            for path in (self.path, self.keep_path):
                if path is not None:
                    _replace(path, record)

    def stop(self) -> None:
        """Python is exiting: remove the files (a file left behind then means the process was killed); the
        kept copy says how the rank ended."""
        final = (
            dict(self.record(), ended="exit", outcome=self.outcome or "exited") if self.keep_path else None
        )
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
            if self._crash_file is not None:
                faulthandler.disable()
                self._crash_file.close()
            if final is not None:
                _replace(self.keep_path, final)
            if self.path is None:
                return
            for path in (self.path, self.crash_path, self.path.with_suffix(".tmp")):
                path.unlink(missing_ok=True)
        try:
            self.path.parent.rmdir()  # the last rank out removes the directory
        except OSError:
            pass

    def _beat(self) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            try:
                self.write()
            except OSError:
                return  # the directory went away (a finished job's cleanup): nothing left to report to


_heartbeat: Heartbeat | None = None  # process-wide, like the exit handler it registers


def _replace(path: pathlib.Path, record: dict) -> None:
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(record))
    os.replace(staging, path)


def start_heartbeat(rank: int, rank0: tuple[str, int] | None) -> None:
    """Start this rank's heartbeat in ZT_RUN_DIR, else (several ranks) the job's default directory.

    Args:
        rank0: (host, pid) of rank 0 in a job of several ranks (zero_train.runtime.faults.record_peers), which
            names the default directory; None for a single process.
    """
    global _heartbeat
    directory = default_run_dir(*rank0) if rank0 else None
    directory = pathlib.Path(os.environ[RUN_DIR_ENV]) if os.environ.get(RUN_DIR_ENV) else directory
    if _heartbeat is not None or directory is None:
        return
    _heartbeat = Heartbeat(directory, rank)
    _heartbeat.start()


def run_dir() -> pathlib.Path | None:
    """Where this job's heartbeats are (this rank's among them), None if this rank keeps none."""
    return _heartbeat.path.parent if _heartbeat is not None and _heartbeat.path is not None else None


def ensure_heartbeat(rank: int) -> None:
    """A heartbeat for this rank even when nobody watches it (no run directory): its record, in memory, is what
    explains an out-of-memory error raised in this process."""
    global _heartbeat
    if _heartbeat is None:
        _heartbeat = Heartbeat(None, rank)
        _heartbeat.start()


def keep_in(directory: pathlib.Path, rank: int) -> None:
    """Keep a copy of this rank's record in `directory`/rank-N.json (a heartbeat starts if none runs)."""
    global _heartbeat
    directory.mkdir(parents=True, exist_ok=True)
    if _heartbeat is None:
        _heartbeat = Heartbeat(None, rank)
        _heartbeat.keep_path = directory / f"rank-{rank}.json"
        _heartbeat.start()
        return
    _heartbeat.keep_path = directory / f"rank-{rank}.json"
    _heartbeat.write()


def note(**facts) -> None:
    """Add facts to this rank's record (phase, run, limit, ...), written at once (a rank may die next)."""
    if _heartbeat is None:
        return
    _heartbeat.facts.update(facts)
    try:
        _heartbeat.write()
    except OSError:
        pass  # the run directory went away: nothing to report to


def note_phase(phase: str, **where) -> None:
    """What this rank does now ("forward", "step", ...; `where`: step, micro_batch), for an explanation."""
    if _heartbeat is not None and _heartbeat.facts.get("phase") != dict(name=phase, **where):
        note(phase=dict(name=phase, **where))


def note_outcome(outcome: str) -> None:
    """How this rank ends ("finished", or its error line), written into the kept copy at Python's exit."""
    if _heartbeat is not None:
        _heartbeat.outcome = outcome


def current_record() -> dict | None:
    """This rank's record now (None without a heartbeat)."""
    return _heartbeat.record() if _heartbeat is not None else None


def stop_heartbeat() -> None:
    """Remove this rank's files now (before an os._exit, which skips atexit)."""
    if _heartbeat is not None:
        _heartbeat.stop()


def default_run_dir(rank0_host: str, rank0_pid: int) -> pathlib.Path:
    """<tmp>/zero_train-<uid>/<rank 0's host>-<rank 0's pid>: the same on every rank of a job."""
    return pathlib.Path(tempfile.gettempdir()) / f"zero_train-{os.getuid()}" / f"{rank0_host}-{rank0_pid}"


def resident_bytes() -> int:
    """This process's resident memory (VmRSS), from /proc/self/statm; 0 where there is none."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def oom_kills() -> int | None:
    """This host's out-of-memory kills since boot (/proc/vmstat oom_kill), None where unreadable."""
    try:
        with open("/proc/vmstat") as vmstat:
            for line in vmstat:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def exit_status(pid: int) -> int | None:
    """How `pid` ended, while it is a zombie not yet reaped by its launcher: a wait status (/proc/PID/stat's
    exit_code, field 52: the signal in the low 7 bits, else the exit code << 8); None otherwise."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[49]) if fields[0] == "Z" and len(fields) >= 50 else None


def killed_record(run_dir: pathlib.Path, rank: int, *, alive) -> dict | None:
    """Rank `rank`'s last heartbeat if its process ended without Python's exit (its file is left), else None.

    Args:
        alive: pid -> bool, whether that process still runs (not a zombie).
    """
    try:
        record = json.loads((run_dir / f"rank-{rank}.json").read_text())
    except (OSError, ValueError):
        return None
    if alive(record["pid"]):
        return None
    crash = run_dir / f"rank-{rank}.crash"
    record["crash"] = crash.read_text(errors="replace").strip() if crash.is_file() else ""
    return record


def describe_ended(rank: int, record: dict, status: int | None = None) -> str:
    """How a rank that ended without Python's exit ended, e.g. "rank 1 was killed (SIGKILL), most likely out of
    host memory: it held 10.3 GB; what this run needs per rank: zero-train estimate ...".

    Args:
        record: its last heartbeat (killed_record).
        status: its wait status if it was seen as a zombie (exit_status), else None: no exit handler ran
            and no crash was recorded, which leaves SIGKILL.
    """
    held = amount(record["rss_bytes"])
    if record.get("crash"):
        first = record["crash"].splitlines()[0].removeprefix("Fatal Python error: ")
        return f"rank {rank} crashed ({first}) holding {held}"
    if status is not None and not status & 0x7F:
        return f"rank {rank} exited with code {status >> 8} without Python's exit (os._exit?) holding {held}"
    name = signal.Signals(status & 0x7F).name if status is not None else "SIGKILL"
    before, now = record.get("oom_kills"), oom_kills()
    if before is not None and now is not None and now == before:
        return f"rank {rank} was killed ({name}) by a user or a scheduler, not out of memory: it held {held}"
    known = before is not None and now is not None
    why = "by the kernel's out-of-memory killer" if known else "most likely out of host memory"
    text = f"rank {rank} was killed ({name}), {why}: it held {held}"
    if record.get("estimate"):
        text += f"; what this run needs per rank: {record['estimate']}"
    return text


def amount(num_bytes: int) -> str:
    """10.3 GB, or 612 MB below 1 GB."""
    return f"{num_bytes / GB:.1f} GB" if num_bytes >= GB else f"{num_bytes / 1e6:.0f} MB"


def killed_ranks(run_dir: pathlib.Path) -> list[tuple[int, dict]]:
    """(rank, last record) of every rank of `run_dir` that ended without Python's exit, once all are gone."""
    if not run_dir.is_dir():
        return []
    killed = []
    for path in sorted(run_dir.glob("rank-*.json")):
        rank = int(path.stem.removeprefix("rank-"))
        record = killed_record(run_dir, rank, alive=lambda pid: False)  # the launcher has reaped them all
        if record is not None:
            killed.append((rank, record))
    return killed


def launcher_report(run_dir: pathlib.Path) -> list[str]:
    """What a launcher that set ZT_RUN_DIR says after its ranks are gone: one line per rank that was killed."""
    return [describe_ended(rank, record) for rank, record in killed_ranks(run_dir)]


def note_estimate(
    *,
    model: str,
    world_size: int,
    config: str | None,
    precision: str,
    micro_batch_size: int,
    grad_accum: int,
    block_size: int,
    gradient_checkpointing: bool,
    device: str,
) -> str:
    """Keep (in ZT_ESTIMATE, which the heartbeat writes) and return the `zero-train estimate` command that
    answers for this run: the per-rank memory of every ZeRO stage at its model, world, batch and block."""
    words = ["zero-train estimate", f"--model {model}", f"--world-size {world_size}"]
    words.append(f"--config {config}" if config else f"--precision {precision}")
    words += [
        f"--micro-batch-size {micro_batch_size}",
        f"--grad-accum {grad_accum}",
        f"--block-size {block_size}",
    ]
    if gradient_checkpointing:
        words.append("--gradient-checkpointing")
    words.append(f"--device {device}")
    os.environ[ESTIMATE_ENV] = " ".join(words)
    if _heartbeat is not None:
        _heartbeat.write()  # at once: a rank killed in its first steps must say it too
    return os.environ[ESTIMATE_ENV]

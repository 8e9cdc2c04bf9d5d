"""DeepSpeed's JIT-built CPU ops in $TORCH_EXTENSIONS_DIR, and whether a given ninja would rebuild them.

torch.utils.cpp_extension.load runs `ninja -v` (the first `ninja` on PATH) in the op's folder on every first
load in a process; ninja alone decides what to rebuild, from its `.ninja_log`. ninja 1.13 (the venv's, pip's)
writes log version 7 and ninja 1.11 (a system's) version 5; each discards the other's log ("build log version
is too old; starting over") and rebuilds everything: about 2 min of g++ on 2 cores. So the ops must be built
and loaded with one ninja: the venv's (scripts/setup.sh builds with it; zero_train/__init__.py puts it first).

`would_rebuild` asks ninja itself (`ninja -n`, a dry run) in a scratch copy of the folder: a dry run is not
read-only (a newer ninja deletes an older log it cannot read), and the folder is shared by every process of
the venv.

A build holds the op folder's `lock` (torch's FileBaton: created with O_EXCL, its descriptor open until the
build ends, then removed); every other process that loads the op waits while the file exists, with no time
limit and no message. A build that was killed (Ctrl-C, a scheduler's time limit, out of memory) leaves the file,
and every later run that loads the op hangs ("Waiting for lock" in DeepSpeed's issues). `clear_stale_locks`
removes a lock that no process holds open, so the next load rebuilds what is missing instead.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

LOCK = "lock"
"""torch.utils.cpp_extension's build lock in an op's folder (a FileBaton)."""
MIN_STALE_AGE_S = 30.0
"""A lock younger than this is never called stale: its builder may be between creating it and opening it."""
NINJA_STATE = ("build.ninja", ".ninja_log", ".ninja_deps")
"""What ninja reads and may rewrite: copied into the scratch folder (every other file is linked)."""
_STEP = re.compile(r"^\[\d+/\d+\] ")


def extensions_dir() -> pathlib.Path:
    """$TORCH_EXTENSIONS_DIR (importing zero_train sets it to the venv's), else torch's default."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    if configured:
        return pathlib.Path(configured)
    return pathlib.Path.home() / ".cache" / "torch_extensions"


def built_ops(directory: pathlib.Path | None = None) -> dict[str, pathlib.Path]:
    """Op name -> its folder, for every op folder that holds a built library (`NAME.so`)."""
    root = directory or extensions_dir()
    if not root.is_dir():
        return {}
    return {
        folder.name: folder
        for folder in sorted(root.iterdir())
        if (folder / f"{folder.name}.so").is_file() and (folder / "build.ninja").is_file()
    }


def venv_ninja() -> pathlib.Path | None:
    """The ninja of this Python's environment (pip's `ninja`, a DeepSpeed dependency), if it has one."""
    candidate = pathlib.Path(sys.prefix) / "bin" / "ninja"
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


def ninja_on_path(path: str | None = None) -> pathlib.Path | None:
    """The `ninja` torch would run with this PATH (default: this process's)."""
    found = shutil.which("ninja", path=path if path is not None else os.environ.get("PATH", ""))
    return pathlib.Path(found).resolve() if found else None


def would_rebuild(op_folder: pathlib.Path, ninja: pathlib.Path) -> list[str]:
    """The build steps `ninja` would run in `op_folder` ([] if the op is up to date for it).

    Runs `ninja -n` in a scratch folder: ninja's state files are copied (with their times), the sources are
    named by absolute path in build.ninja, and the objects and the library are symlinks (ninja stats through
    them, so it sees their real times).
    """
    with tempfile.TemporaryDirectory(prefix="zero_train-ninja-") as scratch:
        for entry in op_folder.iterdir():
            target = pathlib.Path(scratch) / entry.name
            if entry.name in NINJA_STATE:
                shutil.copy2(entry, target)
            elif entry.is_file():
                target.symlink_to(entry.resolve())
        done = subprocess.run(
            [str(ninja), "-n", "-C", scratch], capture_output=True, text=True, timeout=60, check=False
        )
    if done.returncode != 0:
        return [f"ninja -n failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"]
    return [line for line in done.stdout.splitlines() if _STEP.match(line)]


def _holds_open(pid_dir: pathlib.Path, target: str) -> bool | None:
    """Whether process `pid_dir` (/proc/PID) has `target` open; None when its descriptors cannot be read."""
    try:
        fds = list((pid_dir / "fd").iterdir())
    except FileNotFoundError:
        return False  # ended meanwhile
    except OSError:
        return None  # another user's process
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd) == target:
                return True
    return False


def stale_locks(folder: str | os.PathLike | None = None, *, now: float | None = None) -> list[pathlib.Path]:
    """The op folders' build locks under `folder` (default: extensions_dir()) that no process holds open.

    A lock is stale when it is older than MIN_STALE_AGE_S and no process on this machine has it open (a live
    build's process keeps its descriptor until it removes the file). If some processes' descriptors cannot be
    read (another user's), only a lock older than an hour counts: no CPU op build takes that long.
    """
    root = pathlib.Path(folder) if folder is not None else extensions_dir()
    # an op's folder: ROOT/OP with TORCH_EXTENSIONS_DIR set, ROOT/py311_cpu/OP (torch's default root) without
    found = [*root.glob(f"*/{LOCK}"), *root.glob(f"*/*/{LOCK}")] if root.is_dir() else []
    locks = sorted(path for path in found if path.is_file())
    now = time.time() if now is None else now
    stale = []
    for lock in locks:
        with contextlib.suppress(FileNotFoundError):
            age = now - lock.stat().st_mtime
            if age < MIN_STALE_AGE_S:
                continue
            target = os.path.realpath(lock)
            held = [_holds_open(pid, target) for pid in pathlib.Path("/proc").glob("[0-9]*")]
            if not any(held) and (None not in held or age > 3600):
                stale.append(lock)
    return stale


def clear_stale_locks(folder: str | os.PathLike | None = None) -> list[pathlib.Path]:
    """Remove the stale build locks under `folder` (another rank may remove the same one: not an error) and say
    so on stderr, one line each; returns them."""
    removed = stale_locks(folder)
    for lock in removed:
        lock.unlink(missing_ok=True)
        sys.stderr.write(
            f"zero_train: removed {lock}, left by an interrupted build of that op (it builds again)\n"
        )
    return removed

"""DeepSpeed's JIT-built CPU ops in $TORCH_EXTENSIONS_DIR, and whether a given ninja would rebuild them.

torch.utils.cpp_extension.load runs `ninja -v` (the first `ninja` on PATH) in the op's folder on every first
load in a process; ninja alone decides what to rebuild, from its `.ninja_log`. ninja 1.13 (the venv's, pip's)
writes log version 7 and ninja 1.11 (a system's) version 5; each discards the other's log ("build log version
is too old; starting over") and rebuilds everything: about 2 min of g++ on 2 cores. So the ops must be built
and loaded with one ninja: the venv's (scripts/setup.sh builds with it; zero_train/__init__.py puts it first).

`would_rebuild` asks ninja itself (`ninja -n`, a dry run) in a scratch copy of the folder: a dry run is not
read-only (a newer ninja deletes an older log it cannot read), and the folder is shared by every process of
the venv.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

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

"""A real small file system for the storage tests: a tmpfs of a few MB (root can mount one; others skip)."""

from __future__ import annotations

import contextlib
import pathlib
import subprocess

import pytest


@contextlib.contextmanager
def tmpfs(path: pathlib.Path, size: str):
    """Mount a tmpfs of `size` (e.g. "4m") at `path` for the block; skips the test where that is not permitted."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)

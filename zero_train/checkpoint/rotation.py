"""--save-total-limit K: keep the last K complete checkpoints, delete older ones once a new one is complete.

Deleting happens on rank 0 right after `latest` moved to the new checkpoint (atomic.commit), so at every
instant at least K complete checkpoints, and always the one `latest` names, exist. Never deleted:

- the checkpoint `latest` names (even when it is not among the newest K, e.g. after a hand edit);
- a checkpoint being read: `--resume` and `zero-train export` hold a shared lock (flock) on its
  manifest.json while they read it (`reading`), and rotation skips any it cannot lock exclusively;
- anything that is not a complete checkpoint (no manifest.json): hand-made folders, staging folders.

A checkpoint is first renamed to `step-XXXXXXXX.tmp-deleted-<id>` (so nothing can resolve a half-deleted
folder; a crash mid-delete leaves a staging-like folder that the next save removes), then deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import re
import shutil
import uuid
from collections.abc import Iterator

from zero_train.checkpoint.manifest import MANIFEST_FILE
from zero_train.checkpoint.storage import latest_name

STEP_DIR = re.compile(r"^step-(\d{8,})$")


def complete_checkpoints(save_dir) -> list[pathlib.Path]:
    """The complete checkpoints in `save_dir` (step folders with a manifest), oldest step first."""
    found = []
    for child in pathlib.Path(save_dir).iterdir():
        match = STEP_DIR.match(child.name)
        if match and (child / MANIFEST_FILE).is_file():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def rotate(save_dir, keep_last: int) -> list[pathlib.Path]:
    """Delete complete checkpoints beyond the newest `keep_last` (rank 0, after a commit).

    Args:
        save_dir: the --save-dir.
        keep_last: how many complete checkpoints to keep (>= 1).

    Returns:
        The checkpoints deleted.
    """
    assert keep_last >= 1, keep_last
    protected = latest_name(save_dir)
    candidates = complete_checkpoints(save_dir)[:-keep_last]
    removed = []
    for ckpt in candidates:
        if ckpt.name == protected or not _remove_unless_read(ckpt):
            continue
        removed.append(ckpt)
    return removed


@contextlib.contextmanager
def reading(ckpt) -> Iterator[None]:
    """Hold a shared lock on `<ckpt>/manifest.json` while reading the checkpoint, so rotation keeps it.

    A checkpoint without a manifest (hand-made) or on storage without locks is read unprotected.
    """
    try:
        fd = os.open(pathlib.Path(ckpt) / MANIFEST_FILE, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def _remove_unless_read(ckpt: pathlib.Path) -> bool:
    """Rename `ckpt` out of the way and delete it, unless a reader holds its lock; True if deleted."""
    try:
        fd = os.open(ckpt / MANIFEST_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # someone is reading it
        doomed = ckpt.with_name(f"{ckpt.name}.tmp-deleted-{uuid.uuid4().hex[:12]}")
        os.replace(ckpt, doomed)
    except OSError:
        return False
    finally:
        os.close(fd)
    shutil.rmtree(doomed, ignore_errors=True)
    return True

"""Checkpoints on real storage: what a failed write means, free space, and the one line a failed save prints.

A save can fail for reasons no flag check can see in advance: the disk fills up (or a quota is reached)
halfway through, the folder becomes read-only or vanishes. Python reports these as OSError with an errno,
but torch.save on a full disk raises `RuntimeError: [enforce fail at inline_container.cc] unexpected pos`
(or `basic_ios::clear: iostream error`) and safetensors its own SafetensorError, so `describe_failure` also
looks at the free space (os.statvfs) when a write fails without an errno. Every rank then stops with

    rank R: saving checkpoint step-N failed: no space left on device on PATH (X MB free, this checkpoint
    needs about Y MB); the last complete checkpoint step-M is intact; free space and resume with --resume auto

(SaveFailed, exit 1; zero_train.checkpoint.save makes the ranks agree first, so none publishes).
"""

from __future__ import annotations

import errno
import os
import pathlib

from zero_train.checkpoint.manifest import MANIFEST_FILE, first_line, read_manifest
from zero_train.runtime.errors import Fault, UsageError

LATEST_FILE = "latest"
MB = 1_000_000
NEARLY_FULL_BYTES = 1 << 20  # a write failing with less than this free is a full disk, whatever it said
# what torch.save's C++ writer and safetensors say when a write comes up short (no errno reaches Python)
SHORT_WRITE_HINTS = ("unexpected pos", "basic_ios", "iostream error", "file write failed", "os error 28")
# errno -> (what happened, what to do before resuming)
ERRNO_CAUSES = {
    errno.ENOSPC: ("no space left on device", "free space"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota"),
    errno.EROFS: ("read-only file system", "make it writable (or pick another --save-dir)"),
    errno.EACCES: ("permission denied", "make it writable (or pick another --save-dir)"),
    errno.EPERM: ("operation not permitted", "make it writable (or pick another --save-dir)"),
    errno.ENOENT: ("the folder vanished", "restore it (or pick another --save-dir)"),
    errno.ENOTDIR: ("a file is in the way of the folder", "remove it (or pick another --save-dir)"),
}


class StorageError(Exception):
    """A write into the save dir failed; `what` and `fix` word it (internal: becomes SaveFailed)."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(what)
        self.what, self.fix = what, fix


class SaveFailed(Fault):
    """A checkpoint could not be saved (disk full, read-only, vanished): one line, exit 1, nothing published."""


def free_bytes(path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding `path` (or its nearest parent)."""
    target = pathlib.Path(path).absolute()
    while not target.exists() and target != target.parent:
        target = target.parent
    stats = os.statvfs(target)
    return stats.f_bavail * stats.f_frsize


def describe_failure(err: BaseException, where, *, needed_bytes: int | None) -> StorageError:
    """Word a failed write into the save dir.

    Args:
        err: what the write raised (OSError, torch's RuntimeError, safetensors' error).
        where: the save dir (named in the message; its free space is measured).
        needed_bytes: about how big the checkpoint is (None: unknown).

    Returns:
        The StorageError to share with the other ranks.
    """
    code = getattr(err, "errno", None)
    if code is None and _looks_like_short_write(err, where):
        code = errno.ENOSPC
    if code in (errno.ENOSPC, errno.EDQUOT):
        return no_space(where, needed_bytes, cause=ERRNO_CAUSES[code][0], fix=ERRNO_CAUSES[code][1])
    if code in ERRNO_CAUSES:
        what, fix = ERRNO_CAUSES[code]
        return StorageError(f"{what} on {where} ({first_line(err)})", fix)
    return StorageError(
        f"cannot write into {where}: {type(err).__name__}: {first_line(err)}", "fix the storage"
    )


def no_space(
    where, needed_bytes: int | None, *, cause: str = "no space left on device", fix: str = "free space"
):
    """The StorageError of a full disk, with the free space and (if known) what the checkpoint needs."""
    free = _free_or_none(where)
    measured = [] if free is None else [f"{free / MB:.1f} MB free"]
    if needed_bytes:
        measured.append(f"this checkpoint needs about {needed_bytes / MB:.1f} MB")
    detail = f" ({', '.join(measured)})" if measured else ""
    return StorageError(f"{cause} on {where}{detail}", fix)


def check_free_space(save_dir, needed_bytes: int | None) -> StorageError | None:
    """The full-disk StorageError if `save_dir` has less free space than `needed_bytes`, else None."""
    if not needed_bytes:
        return None
    free = _free_or_none(save_dir)
    if free is None or free >= needed_bytes:
        return None
    return no_space(save_dir, needed_bytes)


def failure_line(*, rank: int, step: int, error: StorageError, save_dir, culprit: int | None = None) -> str:
    """The one line every rank prints: which save failed, why, what is intact, what to do.

    Args:
        rank: this rank.
        step: the step being saved.
        error: what went wrong (on this rank or on `culprit`).
        save_dir: the --save-dir (its `latest` names the last complete checkpoint).
        culprit: the rank whose write failed, when it is not this one.
    """
    who = f"rank {culprit}: " if culprit is not None and culprit != rank else ""
    return (
        f"rank {rank}: saving checkpoint step-{step:08d} failed: {who}{error.what}; "
        f"{_intact(save_dir)}; {error.fix} and resume with --resume auto"
    )


def checkpoint_bytes(ckpt) -> int | None:
    """Total bytes of a complete checkpoint, from its manifest (None if it has none or it is unreadable)."""
    ckpt = pathlib.Path(ckpt)
    try:
        records = read_manifest(ckpt)
        return sum(r["bytes"] for r in records.values()) + (ckpt / MANIFEST_FILE).stat().st_size
    except (UsageError, OSError):
        return None


def latest_name(save_dir) -> str | None:
    """What `<save_dir>/latest` names (None if missing or unreadable)."""
    try:
        name = (pathlib.Path(save_dir) / LATEST_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name or None


def _intact(save_dir) -> str:
    name = latest_name(save_dir)
    if name is None:
        return "no complete checkpoint was saved before"
    return f"the last complete checkpoint {name} is intact"


def _looks_like_short_write(err: BaseException, where) -> bool:
    text = str(err).lower()
    if "no space left" in text or any(hint in text for hint in SHORT_WRITE_HINTS):
        return True
    free = _free_or_none(where)
    return free is not None and free < NEARLY_FULL_BYTES


def _free_or_none(path) -> int | None:
    try:
        return free_bytes(path)
    except OSError:
        return None

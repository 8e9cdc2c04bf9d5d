"""Checkpoints that never lie: staged writes, a checksum manifest, an atomic `latest`, safe loading.

Layout: `<save_dir>/step-XXXXXXXX/` holds every rank's files plus `manifest.json`
(bytes and sha256 of every file), and `<save_dir>/latest` names the newest complete checkpoint.

A save is three steps, so that a crash at any moment leaves the previous checkpoint and `latest` intact:

    staging = begin(save_dir, step, dist_info=info)   # rank 0 creates step-XXXXXXXX.tmp-<id>, all ranks agree
    ... every rank writes its files inside `staging` ...
    final = commit(save_dir, staging, dist_info=info) # every rank done -> manifest (last) -> rename -> latest

A crash before commit leaves only a `*.tmp-*` folder, which resolve() never returns and the next begin()
deletes. `latest` is rewritten through a temporary file + os.replace + fsync, after the rename, so it
always names a folder that has its manifest (zero_train.checkpoint.manifest). Loading verifies the manifest (a truncated or bit-flipped file
is a UsageError naming it) and reads torch files with weights_only=True (a pickle that would run code is
refused).
"""

from __future__ import annotations

import errno
import os
import pathlib
import pickle
import shutil
import uuid
import warnings
from typing import Any

import torch
import torch.distributed as dist

from zero_train.checkpoint.manifest import (
    MANIFEST_FILE,
    first_line,
    fsync_path,
    verify,
    write_durably,
    write_manifest,
)
from zero_train.checkpoint.rotation import rotate
from zero_train.checkpoint.storage import StorageError, describe_failure
from zero_train.runtime.errors import UsageError

LATEST_FILE = "latest"
STAGING_MARK = ".tmp"  # step-00000040.tmp-<id> (and the loop's older step-00000040.tmp)
CHECKPOINT_MARKERS = ("run.json", "model", "optim", "deepspeed")  # what a checkpoint folder contains


def step_dir_name(step: int) -> str:
    """`step-00000040` for step 40."""
    return f"step-{step:08d}"


def begin(save_dir, step: int, *, dist_info, process_group=None) -> pathlib.Path:
    """Start a save: rank 0 creates a fresh staging folder; every rank gets its path.

    Collective (every rank calls it). Staging folders left by crashed saves are deleted first. An error on
    rank 0 (e.g. a full or read-only save dir) reaches every rank as the same StorageError instead of a hang.

    Args:
        save_dir: the --save-dir (created if missing).
        step: optimizer steps done; names the checkpoint.
        dist_info: this process's DistInfo.
        process_group: the group whose ranks write this checkpoint (default: the world).

    Returns:
        `<save_dir>/step-XXXXXXXX.tmp-<id>`, where every rank writes its files.
    """
    name = on_rank0(
        lambda: _create_staging(pathlib.Path(save_dir), step),
        dist_info=dist_info,
        process_group=process_group,
    )
    return pathlib.Path(save_dir) / name


def commit(
    save_dir,
    staging: pathlib.Path,
    *,
    dist_info,
    process_group=None,
    written: dict[str, int] | None = None,
    keep_last: int | None = None,
) -> pathlib.Path:
    """Finish a save: wait for every rank, write the manifest last, rename, move `latest`, rotate.

    Collective. Nothing that resolve() would return changes until the final rename; `latest` moves after
    it, atomically. Old checkpoints are deleted only then (zero_train.checkpoint.rotation).

    Args:
        save_dir: the --save-dir.
        staging: what begin() returned (every rank has finished writing into it when it calls commit).
        dist_info: this process's DistInfo.
        process_group: as given to begin().
        written: relpath -> bytes of every file the ranks wrote; each must be there with that size
            before the manifest is written (a folder that vanished and reappeared is not published).
        keep_last: keep only this many complete checkpoints (--save-total-limit; None keeps all).

    Returns:
        The complete checkpoint folder `<save_dir>/step-XXXXXXXX`.

    Raises:
        StorageError: on every rank, when rank 0 could not finish (disk full, read-only, vanished).
    """
    _barrier(dist_info, process_group)  # every rank's files are closed
    name = on_rank0(
        lambda: _publish(pathlib.Path(save_dir), pathlib.Path(staging), written or {}, keep_last),
        dist_info=dist_info,
        process_group=process_group,
    )
    return pathlib.Path(save_dir) / name


def on_rank0(action, *, dist_info, process_group=None):
    """Run `action()` on rank 0 only; every rank returns its result, or raises the UsageError (or
    StorageError) it raised.

    Collective: the other ranks wait in a broadcast (so within the group's timeout) and never hang on an
    error of rank 0.

    Args:
        action: a function of no arguments returning something picklable.
        dist_info: this process's DistInfo.
        process_group: the group that waits (default: the world).

    Returns:
        What action() returned on rank 0.
    """
    outcome = _attempt(action) if dist_info.is_main else None
    return _share_outcome(outcome, dist_info, process_group)


def resolve(path_or_save_dir) -> pathlib.Path:
    """The checkpoint folder a user meant, verified against its manifest.

    Args:
        path_or_save_dir: a checkpoint folder (`.../step-XXXXXXXX`) or a save dir (its `latest` is followed).

    Returns:
        The checkpoint folder.

    Raises:
        UsageError: missing path, an unfinished save, a save dir without `latest`, or a file that does not
            match the manifest.
    """
    path = pathlib.Path(path_or_save_dir).expanduser()
    if not path.exists():
        raise UsageError(f"checkpoint {str(path)!r} does not exist; pass a checkpoint folder or a --save-dir")
    if not path.is_dir():
        raise UsageError(f"checkpoint {str(path)!r} is a file; pass a checkpoint folder or a --save-dir")
    if _is_staging(path):
        raise UsageError(
            f"{str(path)!r} is an unfinished save (a crash before commit); pass its save dir to use the "
            "last complete checkpoint"
        )
    if (path / LATEST_FILE).is_file() and not (path / MANIFEST_FILE).is_file():
        path = _follow_latest(path)
    if not (path / MANIFEST_FILE).is_file():
        _accept_unverified(path)
        return path
    verify(path)
    return path


def safe_torch_load(path, *, mmap: bool = False) -> Any:
    """torch.load with weights_only=True onto the CPU; a file that needs arbitrary code is refused.

    Args:
        path: a file written by torch.save.
        mmap: map the file instead of reading it: a tensor's bytes are read when used (re-sharding reads
            only the pieces it keeps).

    Returns:
        The loaded object (tensors, numbers, strings and containers of them).

    Raises:
        UsageError: missing, truncated or corrupt file, or a pickle that references other Python objects.
    """
    target = pathlib.Path(path)
    if not target.is_file():
        raise UsageError(f"checkpoint file {target} is missing")
    try:
        return torch.load(target, weights_only=True, map_location="cpu", mmap=mmap)
    except pickle.UnpicklingError as err:
        if "weights_only" not in str(err).lower() and "weights only" not in str(err).lower():
            raise UsageError(f"cannot read checkpoint file {target}: corrupt ({first_line(err)})") from err
        raise UsageError(
            f"refusing to load {target}: it is a pickle that references {_unsafe_globals(target)}, "
            "which could run arbitrary code; only tensors and plain containers are loaded (re-save it "
            "from a trusted source)"
        ) from err
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError) as err:
        raise UsageError(
            f"cannot read checkpoint file {target}: truncated or corrupt ({first_line(err)})"
        ) from err


def _create_staging(save_dir: pathlib.Path, step: int) -> str:
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(save_dir)
        name = f"{step_dir_name(step)}{STAGING_MARK}-{uuid.uuid4().hex[:12]}"
        (save_dir / name).mkdir()
    except OSError as err:
        raise describe_failure(err, save_dir, needed_bytes=None) from err
    return name


def remove_stale_staging(save_dir) -> list[pathlib.Path]:
    """Delete staging folders (and temporary `latest` files) that crashed saves left behind.

    Only call it while no save is in progress (begin() does, on rank 0).

    Returns:
        The paths removed.
    """
    removed = []
    for leftover in sorted(pathlib.Path(save_dir).glob(f"*{STAGING_MARK}*")):
        if leftover.is_dir() and _is_staging(leftover):
            shutil.rmtree(leftover, ignore_errors=True)
            removed.append(leftover)
        elif leftover.is_file() and leftover.name.startswith(f"{LATEST_FILE}{STAGING_MARK}"):
            leftover.unlink(missing_ok=True)
            removed.append(leftover)
    return removed


def _is_staging(path: pathlib.Path) -> bool:
    return path.name.startswith("step-") and STAGING_MARK in path.name


def _publish(save_dir: pathlib.Path, staging: pathlib.Path, written: dict[str, int], keep_last) -> str:
    final = save_dir / staging.name.split(STAGING_MARK)[0]
    try:
        _check_written(staging, written)
        write_manifest(staging)
        fsync_path(staging)
        if final.exists():  # the same step saved again (e.g. after a resume): replace it
            shutil.rmtree(final)
        os.replace(staging, final)
        fsync_path(save_dir)
        _write_latest(save_dir, final.name)
    except OSError as err:
        raise describe_failure(err, save_dir, needed_bytes=None) from err
    if keep_last:
        rotate(save_dir, keep_last)
    return final.name


def _check_written(staging: pathlib.Path, written: dict[str, int]) -> None:
    """OSError (ENOENT) unless every file a rank wrote is in the staging folder with its size."""
    for relpath, size in sorted(written.items()):
        target = staging / relpath
        if not target.is_file() or target.stat().st_size != size:
            raise FileNotFoundError(errno.ENOENT, "a file the ranks wrote is gone", str(target))


def _write_latest(save_dir: pathlib.Path, name: str) -> None:
    temporary = save_dir / f"{LATEST_FILE}{STAGING_MARK}-{uuid.uuid4().hex[:12]}"
    write_durably(temporary, name + "\n")
    os.replace(temporary, save_dir / LATEST_FILE)
    fsync_path(save_dir)


def _follow_latest(save_dir: pathlib.Path) -> pathlib.Path:
    try:
        name = (save_dir / LATEST_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read {save_dir / LATEST_FILE}: {err}") from err
    target = save_dir / name
    if not name or "/" in name or name in (".", "..") or not target.is_dir():
        raise UsageError(
            f"{save_dir / LATEST_FILE} names {name!r}, which is not a checkpoint folder in {save_dir}; "
            f"pass one of its step-XXXXXXXX folders"
        )
    if not (target / MANIFEST_FILE).is_file() and not _looks_like_checkpoint(target):
        raise UsageError(f"{target} (named by {save_dir / LATEST_FILE}) is empty or not a checkpoint")
    return target


def _accept_unverified(path: pathlib.Path) -> None:
    """A folder without manifest: refuse a save dir / random folder; warn for a hand-made checkpoint."""
    if _looks_like_checkpoint(path):
        warnings.warn(
            f"checkpoint {path} has no {MANIFEST_FILE} (not written by zero_train); its files are not verified",
            stacklevel=3,
        )
        return
    complete = sorted(p.name for p in path.glob("step-*") if (p / MANIFEST_FILE).is_file())
    if complete:
        raise UsageError(
            f"{str(path)!r} has no `{LATEST_FILE}` file; pass one of its checkpoints, e.g. {path / complete[-1]}"
        )
    raise UsageError(
        f"{str(path)!r} is not a checkpoint (no {MANIFEST_FILE}) nor a save dir (no `{LATEST_FILE}`); "
        "pass a step-XXXXXXXX folder or the --save-dir"
    )


def _looks_like_checkpoint(path: pathlib.Path) -> bool:
    return any((path / marker).exists() for marker in CHECKPOINT_MARKERS)


def _unsafe_globals(target: pathlib.Path) -> str:
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(target)
    except Exception:  # noqa: BLE001 - only used to word the refusal; the refusal stands either way
        names = []
    return ", ".join(names[:5]) if names else "non-tensor Python objects"


def _attempt(action) -> tuple[str, Any]:
    """Run rank 0's part; ("ok", value) or ("error", message) so other ranks can raise the same error."""
    try:
        return ("ok", action())
    except UsageError as err:
        return ("error", str(err))
    except StorageError as err:
        return ("storage", (err.what, err.fix))


def _share_outcome(outcome: tuple[str, Any] | None, dist_info, process_group) -> Any:
    """Broadcast rank 0's outcome; every rank returns its value or raises its UsageError / StorageError."""
    if dist_info.world_size > 1 and dist.is_initialized():
        box = [outcome]
        dist.broadcast_object_list(box, src=_group_src(process_group), group=process_group)
        outcome = box[0]
    status, value = outcome
    if status == "error":
        raise UsageError(value)
    if status == "storage":
        raise StorageError(*value)
    return value


def _group_src(process_group) -> int:
    return 0 if process_group is None else dist.get_global_rank(process_group, 0)


def _barrier(dist_info, process_group) -> None:
    if dist_info.world_size > 1 and dist.is_initialized():
        dist.barrier(group=process_group)

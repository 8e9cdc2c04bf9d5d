"""The checkpoint manifest: bytes and sha256 of every file in a checkpoint folder, written last and verified on load.

`<ckpt>/manifest.json` is `{"schema": MANIFEST_SCHEMA, "files": {relpath: {"bytes": n, "sha256": hex}}}`. The
manifest is written after every file is fsynced and before the staging folder is renamed (see
zero_train.checkpoint.atomic), so a folder with a manifest is a complete save; verify() then catches a file
truncated or changed afterwards. The durable-write helpers (fsync a file, a folder, write-then-fsync) live here
because the manifest and `latest` are the two files whose durability the atomic save depends on.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

from zero_train.runtime.errors import UsageError

MANIFEST_FILE = "manifest.json"
MANIFEST_SCHEMA = "zero_train.checkpoint_manifest/1"


def verify(ckpt_dir) -> None:
    """Check every file listed in the manifest: present, the recorded size, the recorded sha256.

    Args:
        ckpt_dir: a checkpoint folder with manifest.json.

    Raises:
        UsageError: naming the first missing, truncated or corrupt file (or an unreadable manifest).
    """
    ckpt = pathlib.Path(ckpt_dir)
    files = read_manifest(ckpt)
    for relpath, record in sorted(files.items()):
        target = ckpt / relpath
        if not target.is_file():
            raise UsageError(
                f"checkpoint file {target} is missing (listed in {MANIFEST_FILE}); the checkpoint is damaged"
            )
        size = target.stat().st_size
        if size != record["bytes"]:
            raise UsageError(
                f"checkpoint file {target} has {size} bytes, {MANIFEST_FILE} says {record['bytes']} "
                "(truncated or overwritten); resume from an earlier checkpoint"
            )
        if sha256_of(target) != record["sha256"]:
            raise UsageError(
                f"checkpoint file {target} is corrupt (sha256 differs from {MANIFEST_FILE}); resume from an "
                "earlier checkpoint"
            )


def write_manifest(folder) -> None:
    """Write `<folder>/manifest.json`: bytes and sha256 of every file below `folder` (each fsynced first).

    Args:
        folder: a finished staging folder; nothing may write into it afterwards.
    """
    folder = pathlib.Path(folder)
    files = {}
    for target in sorted(p for p in folder.rglob("*") if p.is_file()):
        fsync_path(target)
        relpath = target.relative_to(folder).as_posix()
        files[relpath] = {"bytes": target.stat().st_size, "sha256": sha256_of(target)}
    manifest = {"schema": MANIFEST_SCHEMA, "files": files}
    write_durably(folder / MANIFEST_FILE, json.dumps(manifest, indent=1, sort_keys=True))


def write_durably(target: pathlib.Path, text: str) -> None:
    """Write `text` to `target` and fsync it before returning (the file survives a power cut)."""
    with target.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def fsync_path(path: pathlib.Path) -> None:
    """fsync a file (its bytes) or a folder (a rename or a new entry in it), so that it survives a power cut.
    Opened read-only: a folder cannot be opened for writing, and fsync needs no write access."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(ckpt: pathlib.Path) -> dict[str, dict]:
    """The manifest's file records, `{relpath: {"bytes": n, "sha256": hex}}`.

    Raises:
        UsageError: no manifest, unreadable JSON, bad records, or a path leaving the folder.
    """
    target = ckpt / MANIFEST_FILE
    if not target.is_file():
        raise UsageError(f"checkpoint {ckpt} has no {MANIFEST_FILE} (an unfinished or foreign save)")
    try:
        files = json.loads(target.read_text())["files"]
        valid = isinstance(files, dict) and all(
            isinstance(r, dict) and isinstance(r.get("bytes"), int) and isinstance(r.get("sha256"), str)
            for r in files.values()
        )
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as err:
        raise UsageError(
            f"checkpoint manifest {target} is corrupt ({first_line(err)}); resume from an earlier checkpoint"
        ) from err
    if not valid or any(".." in pathlib.PurePosixPath(p).parts or p.startswith("/") for p in files):
        raise UsageError(
            f"checkpoint manifest {target} is corrupt (bad file records); resume from an earlier checkpoint"
        )
    return files


def sha256_of(path: pathlib.Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its class name if it has none), for one-line errors."""
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__

"""Output paths, checked before any work: a run must not train for an hour and then fail to write.

    check_output_dir("runs/ckpt", flag="--save-dir")              # an existing folder, or one we can create
    check_output_file("runs/metrics.jsonl", flag="--metrics-file")

"Can create" is probed, not guessed: the nearest existing ancestor must be a folder in which a temporary
folder can be made (and is removed at once). Permission bits are not enough: root ignores them, and
read-only or virtual file systems (/proc) refuse writes whatever the bits say. Nothing is left behind.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

from zero_train.runtime.errors import UsageError


def check_output_dir(path, *, flag: str) -> pathlib.Path:
    """UsageError unless `path` is a folder we can write into, or can be created as one.

    Args:
        path: the folder a command will write (created later, by the command itself).
        flag: the option that named it, for the message (e.g. "--save-dir").

    Returns:
        `path` as a Path (user-expanded).
    """
    target = pathlib.Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise UsageError(f"{flag} {str(target)!r} is a file; pass a folder")
    _check_creatable(target if target.is_dir() else _existing_ancestor(target, flag), target, flag)
    return target


def check_output_file(path, *, flag: str) -> pathlib.Path:
    """UsageError unless `path` is a file we can (re)write: not a folder, its folder writable or creatable.

    Args:
        path: the file a command will write.
        flag: the option that named it (e.g. "--metrics-file").

    Returns:
        `path` as a Path (user-expanded).
    """
    target = pathlib.Path(path).expanduser()
    if target.is_dir():
        raise UsageError(f"{flag} {str(target)!r} is a folder; pass a file name")
    parent = target.parent
    _check_creatable(parent if parent.is_dir() else _existing_ancestor(parent, flag), target, flag)
    return target


def _existing_ancestor(target: pathlib.Path, flag: str) -> pathlib.Path:
    """The nearest ancestor of `target` that exists; UsageError if it is a file (`file/sub` paths)."""
    for ancestor in target.absolute().parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise UsageError(
                    f"{flag} {str(target)!r} cannot be created: {str(ancestor)!r} is a file, not a folder"
                )
            return ancestor
    raise UsageError(f"{flag} {str(target)!r} has no existing parent folder")  # unreachable: "/" exists


def _check_creatable(folder: pathlib.Path, target: pathlib.Path, flag: str) -> None:
    """Create and remove a temporary folder in `folder`; UsageError naming `flag` if that fails."""
    try:
        probe = tempfile.mkdtemp(prefix=".zero-train-write-probe-", dir=folder)
    except OSError as err:
        raise UsageError(
            f"{flag} {str(target)!r} is not writable: cannot create anything in {str(folder)!r} "
            f"({err.strerror or err}); choose another location"
        ) from None
    os.rmdir(probe)

"""Reading and writing DeepSpeed JSON files, with one-line errors for every way a file can be bad."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile

from zero_train.runtime.errors import UsageError


def load_config(path: str | os.PathLike) -> dict:
    """Read a DeepSpeed JSON config.

    Args:
        path: the JSON file.

    Returns:
        The config as a dict (a fresh object the caller may modify).

    Raises:
        UsageError: the file is missing, unreadable, not JSON, or not a JSON object.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise UsageError(f"config file {str(path)!r} does not exist; check the path")
    if path.is_dir():
        raise UsageError(f"config path {str(path)!r} is a directory; pass the JSON file inside it")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(
            f"cannot read config file {str(path)!r} ({err.__class__.__name__}); check the file"
        ) from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(
            f"config file {str(path)!r} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
            "fix the JSON syntax"
        ) from None
    except RecursionError:
        raise UsageError(
            f"config file {str(path)!r} nests too deeply to be a DeepSpeed config; check the file"
        ) from None
    if not isinstance(cfg, dict):
        raise UsageError(
            f"config file {str(path)!r} holds a JSON {type(cfg).__name__}, not an object; "
            'a DeepSpeed config is an object like {"train_batch_size": 8, ...}'
        )
    return cfg


def config_text(cfg: dict) -> str:
    """The canonical text of a config: 2-space indented JSON, keys in insertion order, trailing newline."""
    return json.dumps(cfg, indent=2) + "\n"


def write_config(cfg: dict, path: str | os.PathLike) -> None:
    """Write `cfg` atomically (a temporary file renamed into place), so no half-written file is left.

    Args:
        cfg: the config.
        path: destination file; its directory must exist.
    """
    path = pathlib.Path(path)
    if not path.parent.is_dir():
        problem = "is a file" if path.parent.exists() else "does not exist; create it"
        raise UsageError(f"output directory {str(path.parent)!r} {problem} or choose another -o")
    if path.is_dir():
        raise UsageError(f"output path {str(path)!r} is a directory; give a file name with -o")
    try:
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise UsageError(
            f"cannot write {str(path)!r}: {err.strerror or err}; choose a writable location with -o"
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(config_text(cfg))
        os.replace(tmp_name, path)
    except BaseException:
        pathlib.Path(tmp_name).unlink(missing_ok=True)
        raise

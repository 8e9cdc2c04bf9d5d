"""Counts that cost seconds, kept on disk between runs: a model's shape (a build on the meta device) and its
activations (forward and backward on fake tensors), so the next estimate or plan of the same model skips both, and
the model's modeling code is not even imported.

A count is stored under a digest of everything it depends on: its inputs (the config's JSON, the batch shape, ...),
torch's, transformers' and peft's versions, and the source of the code that counts it (SOURCES); any change is a miss and
a new count. The store is $ZT_CACHE_DIR (default ~/.cache/zero_train/counts), one small JSON file per count,
written whole (a temporary file renamed into place); a store that cannot be read or written is skipped, never an
error: the count is then made as if it were the first.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import tempfile
from collections.abc import Callable
from importlib import metadata

SOURCES = (
    "memory/model/theory.py",
    "memory/model/activations.py",
    "memory/model/fake_model.py",
    "memory/model/watch.py",
    "hf/models.py",
    "hf/lora.py",
)
"""The modules (in zero_train) whose code makes the stored counts."""


def store_dir() -> pathlib.Path:
    """$ZT_CACHE_DIR, or ~/.cache/zero_train/counts."""
    root = os.environ.get("ZT_CACHE_DIR")
    return pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "zero_train" / "counts"


@functools.cache
def _versions() -> tuple[str, ...]:
    package = pathlib.Path(__file__).parents[2]
    code = hashlib.sha256(b"".join((package / name).read_bytes() for name in SOURCES)).hexdigest()
    return metadata.version("torch"), metadata.version("transformers"), metadata.version("peft"), code


def stored(kind: str, inputs: list, compute: Callable[[], dict]) -> dict:
    """The JSON fields `compute()` returns for these inputs: read from the store, or computed and written there.

    Args:
        kind: what is counted ("shape", "activations"): the file's prefix.
        inputs: everything the count depends on besides the versions and the code (JSON-serializable, or str()).
        compute: makes the count (JSON-ready fields) when the store has none.
    """
    key = json.dumps([kind, *_versions(), *inputs], sort_keys=True, default=str)
    path = store_dir() / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    fields = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
            json.dump(fields, handle)
        os.replace(handle.name, path)
    except OSError:
        pass
    return fields

"""What a --dataset names, told from the string and the file system alone (no datasets import), so that the
entry point refuses a path that does not exist before it imports the run (seconds per rank).

    check_local_path("./no-such-dir/")   # UsageError: dataset './no-such-dir/' does not exist; ...
    check_local_path("Salesforce/wikitext")   # a hub id: zero_train.hf.data loads it (or says why it cannot)
"""

from __future__ import annotations

import pathlib

from zero_train.runtime.errors import UsageError

DEFAULT_DATASET_NAME = "stdlib"  # the offline default corpus (zero_train.hf.offline)
# file suffix -> datasets' packaged builder
LOCAL_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def looks_like_path(spec: str) -> bool:
    """Hub ids are `name` or `owner/name`; a suffix, a leading ./ or / or ~, or deeper nesting means a path."""
    return (
        spec.startswith((".", "/", "~"))
        or spec.count("/") > 1
        or spec.endswith("/")
        or pathlib.Path(spec).suffix.lower() in LOCAL_BUILDERS
    )


def check_local_path(spec: str | None) -> None:
    """Raise UsageError if `spec` names a local path that does not exist; the default or a hub id passes."""
    if spec is None or spec == DEFAULT_DATASET_NAME or pathlib.Path(spec).expanduser().exists():
        return
    if looks_like_path(spec):
        raise UsageError(
            f"dataset {spec!r} does not exist; pass a file or folder of "
            f"{'/'.join(s[1:] for s in LOCAL_BUILDERS)}, a hub id, or {DEFAULT_DATASET_NAME!r}"
        )

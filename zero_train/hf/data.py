"""Datasets: load (offline default, local files, hub id) the documents or conversations to train on, hold out a
split, and prepare them once per run (rank 0 first).

    dsd = load_text_dataset("stdlib", seed=0)                     # DatasetDict: "train", "validation"; "text"
    dsd = load_text_dataset("chats.jsonl", chat=True)             # column "messages" (zero_train.hf.chat)
    dsd = load_text_dataset("Salesforce/wikitext", config_name="wikitext-2-raw-v1", column="text")
    packed = prepare_datasets("stdlib", tokenizer, block_size=128, seed=0)   # + zero_train.hf.packing

The column trained on keeps its name inside as "text" (documents) or "messages" (conversations, --sft); the
others are dropped. A streamed dataset (--streaming) is read by zero_train.hf.streaming through the same loaders.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import sys

import datasets

from zero_train.hf.chat import MESSAGES_COLUMN
from zero_train.hf.offline import DEFAULT_CORPUS_BYTES, stdlib_files
from zero_train.hf.packing import TEXT_COLUMN, pack_dataset
from zero_train.hf.rank0 import rank0_first
from zero_train.hf.sources import DEFAULT_DATASET_NAME, LOCAL_BUILDERS, check_local_path
from zero_train.runtime.errors import UsageError


def load_text_dataset(
    spec: str | None = None,
    *,
    seed: int = 0,
    eval_fraction: float = 0.05,
    column: str | None = None,
    config_name: str | None = None,
    chat: bool = False,
):
    """Load a text corpus (or conversations) with a held-out split.

    Args:
        spec: None or "stdlib" (the offline default, see zero_train.hf.offline); a local file or folder of
            .txt (one document per paragraph, i.e. blank-line separated), .json/.jsonl/.csv/.parquet (a
            column of text); or a hub id, optionally `id:config` (needs network or the local HF cache).
        seed: the held-out split is a seeded shuffle, identical on every rank and every run.
        eval_fraction: share of documents held out when the source has no "validation" split.
        column: the column to train on (default "text", or "messages" with `chat`).
        config_name: the hub dataset's configuration (the same as `id:config`); with a local folder, one its
            README.md declares (a clone of a hub dataset's repository).
        chat: rows are conversations (a list of {role, content}) for supervised fine-tuning.

    Returns:
        datasets.DatasetDict with "train" and "validation", each with the single column "text" (or "messages").
    """
    if not 0.0 < eval_fraction < 1.0:
        raise UsageError(f"eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction}")
    splits = load_splits(spec, config_name=config_name, streaming=False)
    splits = {name: one_column(ds, spec, column=column, chat=chat) for name, ds in splits.items()}
    if "validation" in splits:
        return datasets.DatasetDict(train=splits["train"], validation=splits["validation"])
    return _hold_out(splits["train"], spec, seed=seed, eval_fraction=eval_fraction)


def load_splits(spec: str | None, *, config_name: str | None, streaming: bool) -> dict:
    """The source's "train" (and "validation", if it has one) split, all columns; IterableDatasets when streaming."""
    if spec is None or spec == DEFAULT_DATASET_NAME:
        return {"train": _load_stdlib(streaming)}
    if pathlib.Path(spec).expanduser().exists():
        if config_name:  # a local copy of a hub dataset: its README.md declares the configurations
            return _load_hub(
                str(pathlib.Path(spec).expanduser()), config_name, spec=spec, streaming=streaming
            )
        return {"train": _load_local(pathlib.Path(spec).expanduser(), streaming)}
    check_local_path(spec)
    name, _, inline = spec.partition(":")
    if inline and config_name and inline != config_name:
        raise UsageError(
            f"--dataset {spec!r} names configuration {inline!r} but --dataset-config {config_name!r}"
        )
    return _load_hub(name, config_name or inline or None, spec=spec, streaming=streaming)


def _load_stdlib(streaming: bool):
    """The offline default: one document per stdlib .py file (~4 MB, deterministic order)."""
    files = [str(path) for path in stdlib_files(DEFAULT_CORPUS_BYTES)]
    return datasets.load_dataset(
        "text", data_files={"train": files}, sample_by="document", split="train", streaming=streaming
    )


def _local_files(path: pathlib.Path) -> tuple[str, list[str]]:
    """(builder, files) for a file or a folder of files of one supported kind."""
    if path.is_file():
        files = [path]
    else:
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix.lower() in LOCAL_BUILDERS
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
    kinds = sorted({LOCAL_BUILDERS.get(p.suffix.lower(), p.suffix or "no suffix") for p in files})
    if not files:
        raise UsageError(f"folder {str(path)!r} has no {'/'.join(s[1:] for s in LOCAL_BUILDERS)} files")
    if kinds[0] not in LOCAL_BUILDERS.values():
        raise UsageError(
            f"dataset {str(path)!r}: unsupported file type {kinds[0]}; use "
            f"{'/'.join(s[1:] for s in LOCAL_BUILDERS)}"
        )
    if len(kinds) > 1:
        raise UsageError(
            f"dataset {str(path)!r} mixes {' and '.join(kinds)} files; keep files of one kind per folder"
        )
    empty = [p for p in files if p.stat().st_size == 0]
    if len(empty) == len(files):
        raise UsageError(f"dataset {str(path)!r} is empty; give it some text")
    return kinds[0], [str(p) for p in files if p.stat().st_size > 0]


def _load_local(path: pathlib.Path, streaming: bool):
    builder, files = _local_files(path)
    kwargs = {"sample_by": "paragraph"} if builder == "text" else {}
    level = datasets.utils.logging.get_verbosity()
    datasets.utils.logging.set_verbosity(
        logging.CRITICAL
    )  # its JSON reader logs each failure: ours is the line
    try:
        return datasets.load_dataset(
            builder, data_files={"train": files}, split="train", streaming=streaming, **kwargs
        )
    except (datasets.exceptions.DatasetGenerationError, ValueError, OSError) as err:
        bad = first_bad_json_line(files) if builder == "json" else None
        raise UsageError(bad or read_error(path, builder, err)) from err
    finally:
        datasets.utils.logging.set_verbosity(level)


def read_error(path, builder: str, err: BaseException) -> str:
    """The one line for a local file datasets cannot read."""
    return f"cannot read dataset {str(path)!r} as {builder}: {_first_line(err.__cause__ or err)}"


def first_bad_json_line(files: list[str]) -> str | None:
    """The file and line of the first row that is not JSON (a .jsonl row per line; a .json document whole)."""
    for name in files:
        text = pathlib.Path(name).read_text(encoding="utf-8", errors="replace")
        rows = enumerate(text.splitlines(), 1) if name.lower().endswith(".jsonl") else [(0, text)]
        for number, row in rows:
            try:
                json.loads(row) if row.strip() else None
            except json.JSONDecodeError as err:
                line = number or err.lineno
                return (
                    f"dataset {name!r} line {line}: not JSON ({err.msg}, column {err.colno}); fix or remove "
                    "the line"
                )
    return None


def _load_hub(name: str, config_name: str | None, *, spec: str, streaming: bool) -> dict:
    """A hub dataset, `owner/name` with an optional configuration (e.g. `Salesforce/wikitext`,
    `wikitext-2-raw-v1`)."""
    try:
        loaded = datasets.load_dataset(name, config_name, streaming=streaming)
    except Exception as err:  # the hub raises many types (connection, not found, offline, bad config)
        offline = os.environ.get("HF_DATASETS_OFFLINE", "0") not in ("", "0") or os.environ.get(
            "HF_HUB_OFFLINE", "0"
        ) not in ("", "0")
        hint = " (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set and it is not cached)" if offline else ""
        raise UsageError(
            f"cannot load dataset {spec!r}{hint}: {_first_line(err)}; pass a local file or folder, "
            f"or {DEFAULT_DATASET_NAME!r} for the offline default"
        ) from err
    if "train" not in loaded:
        raise UsageError(f"dataset {spec!r} has no 'train' split (it has {', '.join(loaded)})")
    splits = {"train": loaded["train"]}
    if "validation" in loaded:
        splits["validation"] = loaded["validation"]
    return splits


def wanted_column(column: str | None, chat: bool) -> tuple[str, str]:
    """(the source's column, its name inside: "text" or "messages")."""
    inside = MESSAGES_COLUMN if chat else TEXT_COLUMN
    return column or inside, inside


def missing_column(spec: str | None, column: str, present, chat: bool) -> UsageError:
    """The one line for a dataset without the column to train on."""
    kind = "a list of {role, content} messages per row" if chat else "the text"
    return UsageError(
        f"dataset {spec!r} has no {column!r} column (it has {', '.join(present)}); name the column holding "
        f"{kind} with --text-column"
    )


def one_column(ds: datasets.Dataset, spec: str | None, *, column: str | None, chat: bool) -> datasets.Dataset:
    """Keep the column trained on (named "text" or "messages"), drop empty rows; UsageError if there is none or
    nothing is left."""
    source, inside = wanted_column(column, chat)
    if source not in ds.column_names:
        raise missing_column(spec, source, ds.column_names, chat)
    ds = ds.select_columns([source])
    if source != inside:
        ds = ds.rename_column(source, inside)
    ds = ds.filter(non_empty, batched=True, desc="dropping empty rows")
    if len(ds) == 0:
        raise UsageError(f"dataset {spec!r} is empty (no non-blank {source!r} values)")
    return ds


def non_empty(batch: dict) -> list[bool]:
    """Rows worth training on: non-blank text; conversations that are not empty (a wrong type fails later,
    with its own message)."""
    if MESSAGES_COLUMN in batch:
        return [value is not None and value != [] for value in batch[MESSAGES_COLUMN]]
    return [isinstance(text, str) and bool(text.strip()) for text in batch[TEXT_COLUMN]]


def _hold_out(train: datasets.Dataset, spec: str | None, *, seed: int, eval_fraction: float):
    if len(train) < 2:
        raise UsageError(
            f"dataset {spec!r} has {len(train)} document; a held-out split needs at least 2 "
            "(for .txt, separate documents with a blank line)"
        )
    split = train.train_test_split(test_size=eval_fraction, seed=seed, shuffle=True)
    return datasets.DatasetDict(train=split["train"], validation=split["test"])


def prepare_datasets(
    spec: str | None,
    tokenizer,
    *,
    block_size: int,
    seed: int,
    eval_fraction: float = 0.05,
    column: str | None = None,
    config_name: str | None = None,
    chat: bool = False,
    process_group=None,
):
    """load_text_dataset + pack_dataset, run by rank 0 first so the other ranks only read its cache.

    A UsageError on rank 0 is sent to every rank and raised there too (one clear line each, no hang).
    Without an initialized torch.distributed this is just load + pack. datasets' progress bars show only on
    rank 0 and only on a terminal (a log file or a failing run gets no bar noise on stderr).

    Args:
        spec, seed, eval_fraction, column, config_name, chat: as in load_text_dataset.
        tokenizer, block_size: as in zero_train.hf.packing.pack_dataset.
        process_group: the data-parallel group (None: WORLD).

    Returns:
        The packed DatasetDict ("train", "validation").
    """

    def build(is_first: bool):
        with _progress_bars(enabled=is_first and sys.stderr.isatty()):  # other ranks read rank 0's cache
            dsd = load_text_dataset(
                spec,
                seed=seed,
                eval_fraction=eval_fraction,
                column=column,
                config_name=config_name,
                chat=chat,
            )
            return pack_dataset(dsd, tokenizer, block_size=block_size)

    return rank0_first(build, process_group=process_group)


@contextlib.contextmanager
def _progress_bars(*, enabled: bool):
    """datasets' progress bars on or off inside the block; the previous setting is restored after."""
    was_enabled = datasets.is_progress_bar_enabled()
    if was_enabled and not enabled:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled and not enabled:
            datasets.enable_progress_bars()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

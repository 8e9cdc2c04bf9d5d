"""Text datasets: load (offline default, local files, hub id), tokenize + pack into blocks, shard per rank.

    dsd = load_text_dataset("stdlib", seed=0)             # DatasetDict: "train", "validation"; column "text"
    packed = pack_dataset(dsd, tokenizer, block_size=128)  # column "input_ids", block_size tokens each
    for batch in rank_batches(packed["train"], rank=r, world_size=n, micro_batch_size=4, seed=0):
        ...                                                # LongTensor [4, 128], this rank's rows only

Documents are tokenized without special tokens, an EOS is appended after each one, and the token stream
is cut into block_size blocks (the tail of each 1000-document map batch that does not fill a block is
dropped, as in transformers' run_clm.py). Both steps run through `datasets.map`, so they are cached on disk
by datasets' fingerprinting and a second run (or a second rank) only reads the Arrow cache.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import warnings
from collections.abc import Iterator

import datasets
import torch
import torch.distributed as dist

from zero_train.hf.offline import DEFAULT_CORPUS_BYTES, DEFAULT_DATASET_NAME, stdlib_files
from zero_train.runtime.errors import UsageError

TEXT_COLUMN = "text"
# file suffix -> datasets' packaged builder
LOCAL_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
_MAP_BATCH = 1000


def load_text_dataset(spec: str | None = None, *, seed: int = 0, eval_fraction: float = 0.05):
    """Load a text corpus with a held-out split.

    Args:
        spec: None or "stdlib" (the offline default, see zero_train.hf.offline); a local file or folder of
            .txt (one document per paragraph, i.e. blank-line separated), .json/.jsonl/.csv/.parquet (a
            "text" column); or a hub id, optionally `id:config` (needs network or the local HF cache).
        seed: the held-out split is a seeded shuffle, identical on every rank and every run.
        eval_fraction: share of documents held out when the source has no "validation" split.

    Returns:
        datasets.DatasetDict with "train" and "validation", each with the single column "text".
    """
    if not 0.0 < eval_fraction < 1.0:
        raise UsageError(f"eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction}")
    if spec is None or spec == DEFAULT_DATASET_NAME:
        splits = {"train": _load_stdlib()}
    elif pathlib.Path(spec).expanduser().exists():
        splits = {"train": _load_local(pathlib.Path(spec).expanduser())}
    elif _looks_like_path(spec):
        raise UsageError(
            f"dataset {spec!r} does not exist; pass a file or folder of "
            f"{'/'.join(s[1:] for s in LOCAL_BUILDERS)}, a hub id, or {DEFAULT_DATASET_NAME!r}"
        )
    else:
        splits = _load_hub(spec)
    splits = {name: _text_only(ds, spec) for name, ds in splits.items()}
    if "validation" in splits:
        return datasets.DatasetDict(train=splits["train"], validation=splits["validation"])
    return _hold_out(splits["train"], spec, seed=seed, eval_fraction=eval_fraction)


def _looks_like_path(spec: str) -> bool:
    """Hub ids are `name` or `owner/name`; a suffix, a leading ./ or / or ~, or deeper nesting means a path."""
    return (
        spec.startswith((".", "/", "~"))
        or spec.count("/") > 1
        or spec.endswith("/")
        or pathlib.Path(spec).suffix.lower() in LOCAL_BUILDERS
    )


def _load_stdlib() -> datasets.Dataset:
    """The offline default: one document per stdlib .py file (~4 MB, deterministic order)."""
    files = [str(path) for path in stdlib_files(DEFAULT_CORPUS_BYTES)]
    return datasets.load_dataset("text", data_files={"train": files}, sample_by="document", split="train")


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


def _load_local(path: pathlib.Path) -> datasets.Dataset:
    builder, files = _local_files(path)
    kwargs = {"sample_by": "paragraph"} if builder == "text" else {}
    try:
        return datasets.load_dataset(builder, data_files={"train": files}, split="train", **kwargs)
    except (datasets.exceptions.DatasetGenerationError, ValueError, OSError) as err:
        cause = err.__cause__ or err
        raise UsageError(f"cannot read dataset {str(path)!r} as {builder}: {_first_line(cause)}") from err


def _load_hub(spec: str) -> dict[str, datasets.Dataset]:
    """A hub dataset, `owner/name` or `owner/name:config` (e.g. `Salesforce/wikitext:wikitext-2-raw-v1`)."""
    name, _, config_name = spec.partition(":")
    try:
        loaded = datasets.load_dataset(name, config_name or None)
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


def _text_only(ds: datasets.Dataset, spec: str | None) -> datasets.Dataset:
    """Keep the "text" column, drop empty documents; UsageError if there is none or nothing is left."""
    if TEXT_COLUMN not in ds.column_names:
        raise UsageError(
            f"dataset {spec!r} has no {TEXT_COLUMN!r} column (it has {', '.join(ds.column_names)}); "
            f"rename the column holding the text to {TEXT_COLUMN!r}"
        )
    ds = ds.remove_columns([c for c in ds.column_names if c != TEXT_COLUMN])
    ds = ds.filter(_non_empty, batched=True, desc="dropping empty documents")
    if len(ds) == 0:
        raise UsageError(f"dataset {spec!r} is empty (no non-blank {TEXT_COLUMN!r} values)")
    return ds


def _non_empty(batch: dict) -> list[bool]:
    return [isinstance(text, str) and bool(text.strip()) for text in batch[TEXT_COLUMN]]


def _hold_out(train: datasets.Dataset, spec: str | None, *, seed: int, eval_fraction: float):
    if len(train) < 2:
        raise UsageError(
            f"dataset {spec!r} has {len(train)} document; a held-out split needs at least 2 "
            "(for .txt, separate documents with a blank line)"
        )
    split = train.train_test_split(test_size=eval_fraction, seed=seed, shuffle=True)
    return datasets.DatasetDict(train=split["train"], validation=split["test"])


def pack_dataset(dsd, tokenizer, *, block_size: int, num_proc: int = 1):
    """Tokenize every split, append EOS after each document, and cut the stream into blocks.

    Args:
        dsd: a DatasetDict with a "text" column (from load_text_dataset).
        tokenizer: a transformers tokenizer with an EOS token.
        block_size: tokens per block (check it against the model with hf.check_block_size).
        num_proc: worker processes for datasets.map.

    Returns:
        datasets.DatasetDict with the same splits and the single column "input_ids" (block_size int32
        token ids per row). UsageError if "train" has fewer tokens than one block.
    """
    if block_size < 2:
        raise UsageError(f"--block-size must be at least 2 tokens, got {block_size}")
    if tokenizer.eos_token_id is None:
        raise UsageError(
            "the tokenizer has no EOS token, needed between packed documents; use a tokenizer "
            "with an eos_token (or the offline default)"
        )
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    packed = {}
    for split, ds in dsd.items():
        tokens = ds.map(
            _tokenize,
            fn_kwargs={"tokenizer": tokenizer},
            batched=True,
            batch_size=_MAP_BATCH,
            remove_columns=ds.column_names,
            features=features,
            num_proc=num_proc,
            desc=f"tokenizing {split}",
        )
        packed[split] = tokens.map(
            _group_blocks,
            fn_kwargs={"block_size": block_size},
            batched=True,
            batch_size=_MAP_BATCH,
            features=features,
            num_proc=num_proc,
            desc=f"packing {split} into blocks of {block_size}",
        )
    if len(packed["train"]) == 0:
        raise UsageError(
            f"the training split has fewer than --block-size {block_size} tokens; "
            "use more text or a smaller --block-size"
        )
    for split, ds in packed.items():
        if split != "train" and len(ds) == 0:
            warnings.warn(
                f"the {split} split has fewer than {block_size} tokens, so evaluation is impossible; "
                "raise eval_fraction or lower --block-size",
                stacklevel=2,
            )
    return datasets.DatasetDict(packed)


def _tokenize(batch: dict, tokenizer) -> dict:
    eos = tokenizer.eos_token_id
    ids = tokenizer(batch[TEXT_COLUMN], add_special_tokens=False, verbose=False)["input_ids"]
    return {"input_ids": [doc + [eos] for doc in ids]}


def _group_blocks(batch: dict, block_size: int) -> dict:
    stream = [token for doc in batch["input_ids"] for token in doc]
    usable = len(stream) - len(stream) % block_size
    return {"input_ids": [stream[i : i + block_size] for i in range(0, usable, block_size)]}


def prepare_datasets(
    spec: str | None,
    tokenizer,
    *,
    block_size: int,
    seed: int,
    eval_fraction: float = 0.05,
    process_group=None,
):
    """load_text_dataset + pack_dataset, run by rank 0 first so the other ranks only read its cache.

    A UsageError on rank 0 is sent to every rank and raised there too (one clear line each, no hang).
    Without an initialized torch.distributed this is just load + pack. datasets' progress bars show only on
    rank 0 and only on a terminal (a log file or a failing run gets no bar noise on stderr).

    Args:
        spec, seed, eval_fraction: as in load_text_dataset.
        tokenizer, block_size: as in pack_dataset.
        process_group: the data-parallel group (None: WORLD).

    Returns:
        The packed DatasetDict ("train", "validation").
    """

    is_first = not dist.is_initialized() or dist.get_rank(process_group) == 0

    def build():
        with _progress_bars(enabled=is_first and sys.stderr.isatty()):  # other ranks read rank 0's cache
            dsd = load_text_dataset(spec, seed=seed, eval_fraction=eval_fraction)
            return pack_dataset(dsd, tokenizer, block_size=block_size)

    if not dist.is_initialized():
        return build()
    packed, error = None, [None]
    if is_first:
        try:
            packed = build()
        except UsageError as err:
            error = [str(err)]
    dist.broadcast_object_list(
        error, src=dist.get_global_rank(process_group, 0) if process_group else 0, group=process_group
    )
    if error[0] is not None:
        raise UsageError(error[0])
    return packed if is_first else build()


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


def num_tokens(packed: datasets.Dataset) -> int:
    """Tokens in a packed split (rows x block_size)."""
    return len(packed) * (len(packed[0]["input_ids"]) if len(packed) else 0)


def steps_per_epoch(dataset, *, world_size: int, micro_batch_size: int) -> int:
    """Micro-steps in one pass: every rank takes micro_batch_size blocks per micro-step; the rest is dropped."""
    return len(dataset) // (micro_batch_size * world_size)


def rank_batches(
    dataset,
    *,
    rank: int,
    world_size: int,
    micro_batch_size: int,
    seed: int,
    epoch: int = 0,
    start_step: int = 0,
) -> Iterator[torch.LongTensor]:
    """This rank's micro-batches, endlessly, epoch after epoch, reshuffled per epoch.

    Each epoch is a permutation of all blocks drawn from torch.Generator seeded with (seed, epoch), the
    same on every rank; micro-step s of an epoch takes the global slice [s*G, (s+1)*G) of it with
    G = micro_batch_size * world_size, and rank r reads rows [s*G + r*m, s*G + (r+1)*m) of that slice
    (m = micro_batch_size). So ranks never share a block, the union over ranks is the single-process
    order, and resuming is arithmetic: pass the number of micro-steps already consumed.

    Args:
        dataset: a packed split (column "input_ids"), e.g. pack_dataset(...)["train"].
        rank, world_size: this process's place in the data-parallel group.
        micro_batch_size: blocks per rank per micro-step.
        seed: shuffling seed.
        epoch: the epoch to start in.
        start_step: micro-steps of `epoch` already consumed (may exceed one epoch; it carries over).

    Yields:
        torch.LongTensor [micro_batch_size, block_size].
    """
    if not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside world_size {world_size}")
    per_epoch = steps_per_epoch(dataset, world_size=world_size, micro_batch_size=micro_batch_size)
    if per_epoch == 0:
        raise UsageError(
            f"the dataset has {len(dataset)} blocks, fewer than one global micro-batch of "
            f"micro_batch_size {micro_batch_size} x world_size {world_size} = "
            f"{micro_batch_size * world_size}; use more data, a smaller --block-size or "
            "--micro-batch-size"
        )
    epoch, step = epoch + start_step // per_epoch, start_step % per_epoch
    rows = dataset.with_format("numpy")
    global_batch = micro_batch_size * world_size
    while True:
        order = epoch_order(len(dataset), seed=seed, epoch=epoch)
        for s in range(step, per_epoch):
            first = s * global_batch + rank * micro_batch_size
            indices = order[first : first + micro_batch_size].tolist()
            yield torch.from_numpy(rows[indices]["input_ids"]).long()
        epoch, step = epoch + 1, 0


def epoch_order(num_blocks: int, *, seed: int, epoch: int) -> torch.Tensor:
    """The shuffled block order of one epoch (identical on every rank and machine)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_blocks, generator=generator)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

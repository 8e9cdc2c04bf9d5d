"""The offline default corpus packed without `datasets`: the same blocks, held-out split and order as
zero_train.hf.data + zero_train.hf.packing give it, from the standard library's files, numpy and the tokenizer.

    splits = stdlib_blocks(tokenizer, block_size=64, seed=0)    # {"train": PackedBlocks, "validation": ...}
    splits["train"].with_format("numpy")[[0, 5]]["input_ids"]  # int32 [2, 64]

Why: a machine with nothing but torch, transformers, peft and accelerate (a GPU image without network) must train
on the offline default, and `datasets` brings pyarrow (a 55 MB wheel). What datasets does here is replicated step
by step (tests/hf/test_blocks.py compares the blocks with datasets' own): one document per file, empty ones
dropped, datasets' train_test_split (numpy's default_rng(seed) permutation, ceil(fraction x n) held out first),
documents tokenized without special tokens + EOS, then cut into blocks per batch of 1000 documents (the tail
of each batch dropped, as datasets.map(batched=True) does). Packed once per tokenizer, block size, seed and
corpus, and kept as one .npz in the user's cache (XDG_CACHE_HOME or ~/.cache, zero_train/blocks/): rank 0 writes
it, the other ranks and later runs read it (datasets' Arrow cache does the same for the datasets path).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import tempfile

import numpy as np
import torch

from zero_train.hf.offline import DEFAULT_CORPUS_BYTES, stdlib_files
from zero_train.runtime.errors import UsageError

MAP_BATCH = 1000
"""Documents per packing batch: zero_train.hf.packing's datasets.map batch size."""
INPUT_IDS = "input_ids"
_PACKED: dict[pathlib.Path, dict] = {}
"""This process's packed splits by cache file (a bench worker trains many runs on the same blocks)."""


class PackedBlocks:
    """A packed split held in memory, read as zero_train's loops read a datasets.Dataset: len(), column_names,
    with_format("numpy" | "torch"), a row by index (lists, as an unformatted Dataset gives it) or rows by a list
    or slice (arrays [rows, block_size])."""

    def __init__(self, columns: dict[str, np.ndarray], row_format: str | None = None) -> None:
        self.columns, self.row_format = columns, row_format

    @property
    def column_names(self) -> list[str]:
        """The columns ("input_ids")."""
        return list(self.columns)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def with_format(self, row_format: str | None) -> PackedBlocks:
        """The same rows, returned as numpy arrays ("numpy"), torch tensors ("torch") or lists (None)."""
        return PackedBlocks(self.columns, row_format)

    def __getitem__(self, key):
        picked = {name: values[key] for name, values in self.columns.items()}
        if self.row_format == "torch":
            return {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in picked.items()}
        if self.row_format == "numpy":
            return picked
        return {name: value.tolist() for name, value in picked.items()}


def stdlib_documents() -> list[str]:
    """The offline default's documents (one per standard-library file), blank ones left out."""
    texts = [path.read_text(encoding="utf-8") for path in stdlib_files(DEFAULT_CORPUS_BYTES)]
    return [text for text in texts if text.strip()]


def hold_out(count: int, *, seed: int, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) document indices as datasets' train_test_split(test_size, seed, shuffle) picks them."""
    test = math.ceil(eval_fraction * count)
    permutation = np.random.default_rng(seed).permutation(count)
    return permutation[test:], permutation[:test]


def pack(documents: list[str], tokenizer, *, block_size: int) -> PackedBlocks:
    """Tokenize (no special tokens, EOS after each document) and cut into blocks per MAP_BATCH documents."""
    eos = tokenizer.eos_token_id
    blocks = []
    for first in range(0, len(documents), MAP_BATCH):
        ids = tokenizer(documents[first : first + MAP_BATCH], add_special_tokens=False, verbose=False)[
            INPUT_IDS
        ]
        stream = np.fromiter((token for doc in ids for token in (*doc, eos)), dtype=np.int32)
        usable = len(stream) - len(stream) % block_size
        blocks.append(stream[:usable].reshape(-1, block_size))
    return PackedBlocks(
        {INPUT_IDS: np.concatenate(blocks) if blocks else np.zeros((0, block_size), np.int32)}
    )


def cache_path(tokenizer, *, block_size: int, seed: int, eval_fraction: float) -> pathlib.Path:
    """The .npz of these blocks: named by a hash of the tokenizer's vocabulary and merges, the corpus files (path,
    size, modification time), block size, seed and held-out fraction."""
    files = [
        (str(path), path.stat().st_size, path.stat().st_mtime_ns)
        for path in stdlib_files(DEFAULT_CORPUS_BYTES)
    ]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocabulary = (
        backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    )
    key = json.dumps([vocabulary, tokenizer.eos_token_id, files, block_size, seed, eval_fraction, MAP_BATCH])
    root = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return root / "zero_train" / "blocks" / f"stdlib-{hashlib.sha256(key.encode()).hexdigest()[:24]}.npz"


def _load_or_pack(path: pathlib.Path, tokenizer, *, block_size: int, seed: int, eval_fraction: float) -> dict:
    if path.is_file():
        with np.load(path) as stored:
            return {split: PackedBlocks({INPUT_IDS: stored[split]}) for split in ("train", "validation")}
    documents = stdlib_documents()
    train, validation = hold_out(len(documents), seed=seed, eval_fraction=eval_fraction)
    splits = {
        "train": pack([documents[i] for i in train], tokenizer, block_size=block_size),
        "validation": pack([documents[i] for i in validation], tokenizer, block_size=block_size),
    }
    try:  # atomically: a rank reading it never sees half a file
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as handle:
            np.savez(handle, **{split: blocks.columns[INPUT_IDS] for split, blocks in splits.items()})
        os.replace(handle.name, path)
    except OSError:  # a read-only home: pack again next time
        pass
    return splits


def stdlib_blocks(
    tokenizer, *, block_size: int, seed: int, eval_fraction: float = 0.05
) -> dict[str, PackedBlocks]:
    """The offline default's "train" and "validation" splits, packed (or read from the cache).

    Args:
        tokenizer: a transformers tokenizer with an EOS token.
        block_size: tokens per block.
        seed, eval_fraction: the held-out split (load_text_dataset's).
    """
    if block_size < 2:
        raise UsageError(f"--block-size must be at least 2 tokens, got {block_size}")
    if tokenizer.eos_token_id is None:
        raise UsageError(
            "the tokenizer has no EOS token, needed between packed documents; use one with an eos_token"
        )
    key = cache_path(tokenizer, block_size=block_size, seed=seed, eval_fraction=eval_fraction)
    if key not in _PACKED:
        _PACKED[key] = _load_or_pack(
            key, tokenizer, block_size=block_size, seed=seed, eval_fraction=eval_fraction
        )
    if len(_PACKED[key]["train"]) == 0:
        raise UsageError(
            f"the training split has fewer than --block-size {block_size} tokens; use more text or a smaller --block-size"
        )
    return _PACKED[key]

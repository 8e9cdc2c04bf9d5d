"""The run's packed splits from its --dataset: the offline default without `datasets`, any other source with it.

    packed = prepare_text(None, tokenizer, block_size=64, seed=0)   # zero_train.hf.blocks (no datasets import)
    packed = prepare_text("notes/", tokenizer, block_size=64, seed=0)  # zero_train.hf.data (datasets)

`datasets` is imported only for a source that needs it: a machine without it (and without pyarrow, a 55 MB
wheel) trains on the offline default (docs/gpu.md#a-gpu-machine-without-network).
"""

from __future__ import annotations

from zero_train.hf.blocks import stdlib_blocks
from zero_train.hf.rank0 import rank0_first
from zero_train.hf.sources import DEFAULT_DATASET_NAME


def is_offline_default(spec: str | None, *, column: str | None, config_name: str | None, chat: bool) -> bool:
    """Whether --dataset is the offline default corpus as documents (what zero_train.hf.blocks packs)."""
    return spec in (None, DEFAULT_DATASET_NAME) and column is None and config_name is None and not chat


def prepare_text(
    spec: str | None,
    tokenizer,
    *,
    block_size: int,
    seed: int,
    column: str | None = None,
    config_name: str | None = None,
    chat: bool = False,
    process_group=None,
):
    """The packed "train" and "validation" splits, rank 0 first (arguments: zero_train.hf.data.prepare_datasets)."""
    if is_offline_default(spec, column=column, config_name=config_name, chat=chat):
        return rank0_first(
            lambda is_first: stdlib_blocks(tokenizer, block_size=block_size, seed=seed),
            process_group=process_group,
        )
    # expensive: datasets; the offline default trains without it
    from zero_train.hf.data import prepare_datasets

    return prepare_datasets(
        spec,
        tokenizer,
        block_size=block_size,
        seed=seed,
        column=column,
        config_name=config_name,
        chat=chat,
        process_group=process_group,
    )

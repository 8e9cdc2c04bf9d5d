"""Tokenize and pack into blocks with `datasets` (each rank's batches: zero_train.hf.batches).

    packed = pack_dataset(dsd, tokenizer, block_size=128)   # column "input_ids" (+ "labels" for conversations)

Documents are tokenized without special tokens, an EOS is appended after each one, and the token stream is cut
into block_size blocks (the tail of each 1000-document map batch that does not fill a block is dropped, as in
transformers' run_clm.py). Conversations (a "messages" column, zero_train.hf.chat) carry labels beside their
ids, -100 outside the assistant turns; a block without one supervised token is dropped (its loss would be 0/0).
Both steps run through `datasets.map`, so they are cached on disk by datasets' fingerprinting and a second run
(or a second rank) only reads the Arrow cache.
"""

from __future__ import annotations

import warnings

import datasets

from zero_train.hf.chat import IGNORE_INDEX, MESSAGES_COLUMN, encode_conversation
from zero_train.runtime.errors import UsageError

TEXT_COLUMN = "text"
_MAP_BATCH = 1000


def pack_dataset(dsd, tokenizer, *, block_size: int, num_proc: int = 1):
    """Tokenize every split, append EOS after each document, and cut the stream into blocks.

    Args:
        dsd: a DatasetDict with a "text" column, or a "messages" column of conversations (load_text_dataset).
        tokenizer: a transformers tokenizer with an EOS token.
        block_size: tokens per block (check it against the model with hf.check_block_size).
        num_proc: worker processes for datasets.map.

    Returns:
        datasets.DatasetDict with the same splits and the column "input_ids" (block_size int32 token ids per
        row), plus "labels" for conversations. UsageError if "train" has fewer tokens than one block.
    """
    if block_size < 2:
        raise UsageError(f"--block-size must be at least 2 tokens, got {block_size}")
    if tokenizer.eos_token_id is None:
        raise UsageError(
            "the tokenizer has no EOS token, needed between packed documents; use a tokenizer "
            "with an eos_token (or the offline default)"
        )
    chat = MESSAGES_COLUMN in dsd["train"].column_names
    columns = ("input_ids", "labels") if chat else ("input_ids",)
    features = datasets.Features({name: datasets.Sequence(datasets.Value("int32")) for name in columns})
    packed = {}
    for split, ds in dsd.items():
        tokens = ds.map(
            _encode_chats if chat else _tokenize,
            fn_kwargs={"tokenizer": tokenizer},
            batched=True,
            batch_size=_MAP_BATCH,
            remove_columns=ds.column_names,
            features=features,
            num_proc=num_proc,
            desc=f"tokenizing {split}",
        )
        packed[split] = tokens.map(
            group_blocks,
            fn_kwargs={"block_size": block_size},
            batched=True,
            batch_size=_MAP_BATCH,
            features=features,
            num_proc=num_proc,
            desc=f"packing {split} into blocks of {block_size}",
        )
    if len(packed["train"]) == 0:
        if chat:
            raise UsageError(
                f"the training split has no block of --block-size {block_size} tokens with an assistant token; "
                "use more conversations or a smaller --block-size"
            )
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


def encode_text(texts: list[str], tokenizer) -> list[list[int]]:
    """Each document's ids (no special tokens) followed by EOS."""
    eos = tokenizer.eos_token_id
    ids = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    return [doc + [eos] for doc in ids]


def _tokenize(batch: dict, tokenizer) -> dict:
    return {"input_ids": encode_text(batch[TEXT_COLUMN], tokenizer)}


def _encode_chats(batch: dict, tokenizer) -> dict:
    encoded = [encode_conversation(messages, tokenizer) for messages in batch[MESSAGES_COLUMN]]
    return {"input_ids": [ids for ids, _ in encoded], "labels": [labels for _, labels in encoded]}


def group_blocks(batch: dict, block_size: int) -> dict:
    """Cut the concatenated documents of a batch into blocks (the tail is dropped; so is a block of
    conversations without a supervised token after its first position, which the shifted loss never reads)."""
    blocks = {}
    for column, docs in batch.items():
        stream = [token for doc in docs for token in doc]
        usable = len(stream) - len(stream) % block_size
        blocks[column] = [stream[i : i + block_size] for i in range(0, usable, block_size)]
    if "labels" in blocks:
        keep = [any(label != IGNORE_INDEX for label in labels[1:]) for labels in blocks["labels"]]
        blocks = {
            column: [row for row, kept in zip(rows, keep, strict=True) if kept]
            for column, rows in blocks.items()
        }
    return blocks


def num_tokens(packed: datasets.Dataset) -> int:
    """Tokens in a packed split (rows x block_size)."""
    return len(packed) * (len(packed[0]["input_ids"]) if len(packed) else 0)

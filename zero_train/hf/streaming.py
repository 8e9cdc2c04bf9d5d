"""Streamed datasets (--streaming): read lazily through datasets' IterableDataset, tokenized and packed while
training, each rank reading its own share; the read position is a small dict that a checkpoint keeps.

    streams = prepare_streams("big.jsonl", tokenizer, block_size=1024, seed=0, rank=r, world_size=n,
                              eval_blocks=64)
    batch = streams.train.next_batch(4)     # {"input_ids": LongTensor [4, 1024]} (+ "labels" for --sft)
    position = streams.train.state()        # after the last batch: epoch, documents read, tokens left over
    RankStream(..., state=position)         # resumes with the same tokens in the same order
    streams.validation                      # the first eval_blocks held-out blocks, as a map-style Dataset

Order: the documents go through a seeded shuffle buffer (SHUFFLE_BUFFER rows, reshuffled per epoch), then every
rank keeps its share (datasets.distributed.split_dataset_by_node: whole files when their number divides by the
ranks, else every n-th row). Each rank packs its own documents into blocks (EOS after each document, no tail
dropped). Held out: the source's "validation" split, else the documents whose content hashes to 0 modulo
HELD_OUT_EVERY (the same documents at any world size, never trained on). Resuming re-reads, without tokenizing,
the documents of the current epoch already consumed: cheap for local files, a download for a hub dataset.
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass

import datasets
import torch
import torch.distributed as dist
from datasets.distributed import split_dataset_by_node

from zero_train.hf.chat import IGNORE_INDEX, encode_conversation
from zero_train.hf.data import load_splits, missing_column, non_empty, read_error, wanted_column
from zero_train.hf.packing import TEXT_COLUMN, encode_text
from zero_train.runtime.errors import UsageError

SHUFFLE_BUFFER = 1000
"""Rows in the shuffle buffer (datasets' IterableDataset.shuffle): a streamed dataset is never shuffled whole."""
HELD_OUT_EVERY = 20
"""Without a validation split, 1 document in 20 (by content hash) is held out, as eval_fraction 0.05 does."""


@dataclass
class Streams:
    """What prepare_streams returns."""

    train: RankStream
    """This rank's endless stream of training blocks."""
    validation: datasets.Dataset
    """The first held-out blocks (every rank the same), packed: columns "input_ids" (+ "labels")."""


def prepare_streams(
    spec,
    tokenizer,
    *,
    block_size: int,
    seed: int,
    rank: int,
    world_size: int,
    eval_blocks: int,
    column: str | None = None,
    config_name: str | None = None,
    chat: bool = False,
    state: dict | None = None,
    process_group=None,
) -> Streams:
    """Open the streams and read each one's first block, on every rank; a UsageError on any rank (a missing
    column, an unreadable file, a rank whose share has no block) is raised on every rank.

    Args:
        spec, column, config_name, chat: as zero_train.hf.data.load_text_dataset's.
        tokenizer, block_size: as zero_train.hf.packing.pack_dataset's.
        seed: the shuffle buffer's seed.
        rank, world_size: this rank's share.
        eval_blocks: held-out blocks to read (evaluation batches x micro batch x ranks).
        state: this rank's position from a checkpoint (RankStream.state), None for a fresh start.
        process_group: the group to agree on errors in (None: WORLD).
    """

    def build() -> Streams:
        splits = load_splits(spec, config_name=config_name, streaming=True)
        source, inside = wanted_column(column, chat)
        splits = {name: _one_column(ds, spec, source, inside, chat) for name, ds in splits.items()}
        train, held_out = splits["train"], splits.get("validation")
        if held_out is None:
            held_out = train.filter(lambda row: _held_out(row[inside]))
            train = train.filter(lambda row: not _held_out(row[inside]))
        train = split_dataset_by_node(train.shuffle(seed=seed, buffer_size=SHUFFLE_BUFFER), rank, world_size)
        encode = _encoder(tokenizer, inside)
        RankStream(
            train, encode, block_size=block_size, spec=spec
        ).next_block()  # this rank's share has a block
        evaluation = RankStream(held_out, encode, block_size=block_size, spec=spec, endless=False)
        return Streams(
            train=RankStream(train, encode, block_size=block_size, spec=spec, state=state),
            validation=evaluation.materialize(eval_blocks),
        )

    return _on_every_rank(build, process_group=process_group)


class RankStream:
    """Blocks packed from a stream of documents as they are read, with the position after the last block.

    Args:
        dataset: an IterableDataset of rows {column: document} (this rank's share).
        encode: row -> (ids, labels or None), EOS included.
        block_size: tokens per block.
        spec: the dataset, for messages.
        state: a position from state() to continue from (None: the start).
        endless: epoch after epoch (reshuffled: set_epoch); False: one pass, then StopIteration.
    """

    def __init__(
        self, dataset, encode, *, block_size: int, spec, state: dict | None = None, endless: bool = True
    ):
        self.dataset, self.encode, self.block_size, self.spec, self.endless = (
            dataset,
            encode,
            block_size,
            spec,
            endless,
        )
        state = state or dict(epoch=0, documents=0, ids=[], labels=None)
        self.epoch, self.documents = int(state["epoch"]), int(state["documents"])
        self.ids = list(state["ids"])
        self.labels = None if state["labels"] is None else list(state["labels"])
        self._rows = None

    def state(self) -> dict:
        """The position after the last block returned: epoch, documents of it read, tokens not yet in a block."""
        labels = None if self.labels is None else list(self.labels)
        return dict(epoch=self.epoch, documents=self.documents, ids=list(self.ids), labels=labels)

    def resumed(self, state: dict) -> RankStream:
        """The same stream, continuing from a position state() returned."""
        return RankStream(
            self.dataset,
            self.encode,
            block_size=self.block_size,
            spec=self.spec,
            state=state,
            endless=self.endless,
        )

    def next_batch(self, micro_batch_size: int) -> dict[str, torch.Tensor]:
        """The next micro_batch_size blocks as LongTensors [micro_batch_size, block_size]."""
        blocks = [self.next_block() for _ in range(micro_batch_size)]
        batch = {"input_ids": torch.tensor([ids for ids, _ in blocks], dtype=torch.long)}
        if blocks[0][1] is not None:
            batch["labels"] = torch.tensor([labels for _, labels in blocks], dtype=torch.long)
        return batch

    def next_block(self) -> tuple[list[int], list[int] | None]:
        """The next block (ids, labels or None); conversations' blocks without a supervised token are skipped."""
        size = self.block_size
        while True:
            while len(self.ids) >= size:
                ids, self.ids = self.ids[:size], self.ids[size:]
                labels = None
                if self.labels is not None:
                    labels, self.labels = self.labels[:size], self.labels[size:]
                    if all(label == IGNORE_INDEX for label in labels[1:]):
                        continue
                return ids, labels
            ids, labels = self.encode(self._next_row())
            self.ids += ids
            if labels is not None:
                self.labels = (self.labels or []) + labels

    def materialize(self, num_blocks: int) -> datasets.Dataset:
        """Up to num_blocks blocks of one pass, as a map-style Dataset (the held-out split)."""
        blocks = list(itertools.islice(_until_stop(self.next_block), num_blocks))
        columns = {"input_ids": [ids for ids, _ in blocks]}
        if blocks and blocks[0][1] is not None:
            columns["labels"] = [labels for _, labels in blocks]
        return datasets.Dataset.from_dict(columns)

    def _next_row(self) -> dict:
        while True:
            if self._rows is None:
                self.dataset.set_epoch(self.epoch)
                self._rows = iter(self.dataset)
                for _ in range(self.documents):  # resuming: read past what this epoch consumed, untokenized
                    next(self._rows)
            row = next(self._rows, None)
            if row is not None:
                self.documents += 1
                return row
            if self.documents == 0:
                raise UsageError(f"dataset {self.spec!r}: this rank's share of the stream has no document")
            if not self.endless:
                raise StopIteration
            self.epoch, self.documents, self._rows = self.epoch + 1, 0, None


def _until_stop(next_block):
    while True:
        try:
            yield next_block()
        except (StopIteration, UsageError):
            return


def _one_column(ds, spec, source: str, inside: str, chat: bool):
    """The stream of the column trained on, named `inside`; its first row read to check it is there."""
    try:
        first = next(iter(ds), None)
    except (datasets.exceptions.DatasetGenerationError, ValueError, OSError) as err:
        raise UsageError(read_error(spec, "a stream", err)) from err
    if first is None:
        raise UsageError(f"dataset {spec!r} is empty")
    if source not in first:
        raise missing_column(spec, source, list(first), chat)
    ds = ds.select_columns([source])
    ds = ds.rename_column(source, inside) if source != inside else ds
    return ds.filter(lambda row: non_empty({inside: [row[inside]]})[0])


def _held_out(document) -> bool:
    return zlib.crc32(repr(document).encode("utf-8")) % HELD_OUT_EVERY == 0


def _encoder(tokenizer, inside: str):
    if inside == TEXT_COLUMN:
        return lambda row: (encode_text([row[TEXT_COLUMN]], tokenizer)[0], None)
    return lambda row: encode_conversation(row[inside], tokenizer)


def _on_every_rank(build, *, process_group=None):
    """build() on every rank; the first rank's UsageError, if any rank has one, is raised on all of them."""
    error = None
    try:
        built = build()
    except UsageError as err:
        built, error = None, str(err)
    if dist.is_initialized() and dist.get_world_size(process_group) > 1:
        errors = [None] * dist.get_world_size(process_group)
        dist.all_gather_object(errors, error, group=process_group)
        error = next((e for e in errors if e is not None), None)
    if error is not None:
        raise UsageError(error)
    return built

"""The run's data (zero_train.train.data.RunData): an epoch's optimizer steps as the HF Trainer counts them, the
ranks' batches (disjoint, their union the one-process order, a resume by micro-steps), a stream's read position
and its world-size check, and the one line a split too small for one global micro-batch gets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zero_train.hf.blocks import PackedBlocks
from zero_train.runtime.dist import DistInfo
from zero_train.runtime.errors import UsageError
from zero_train.train.data import RunData

pytestmark = pytest.mark.tier("quick")


def _rank(rank: int, world_size: int) -> DistInfo:
    return DistInfo(
        rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"), backend="gloo"
    )


def _packed(blocks: int, block_size: int = 4) -> RunData:
    rows = np.arange(blocks * block_size).reshape(blocks, block_size)  # block i holds i*block_size ...
    return PackedBlocks({"input_ids": rows})


def _data(train, rank: int = 0, world_size: int = 1, micro_batch_size: int = 2, stream=None) -> RunData:
    return RunData(train=train, validation=None, stream=stream, dist_info=_rank(rank, world_size),
                   micro_batch_size=micro_batch_size, seed=7)  # fmt: skip


def test_an_epoch_is_counted_in_optimizer_steps_as_the_trainer_counts_them():
    data = _data(_packed(50), world_size=2, micro_batch_size=3)  # 50 // (3 x 2) = 8 micro-steps
    assert data.epoch_steps(grad_accum=1) == 8
    assert data.epoch_steps(grad_accum=3) == 2  # whole optimizer steps only
    assert data.epoch_steps(grad_accum=16) == 1  # at least one
    assert data.steps_for_epochs(1.5, grad_accum=3) == 3  # ceil(1.5 x 2)
    assert data.position() is None  # a packed split's position is its micro-steps alone


def test_the_ranks_read_disjoint_blocks_whose_union_is_the_one_process_order():
    train, steps = _packed(24), 3

    def first(data: RunData, n: int) -> list[torch.Tensor]:
        batches = data.batches(micro_steps=0, position=None)
        return [next(batches)["input_ids"] for _ in range(n)]

    one = first(_data(train, micro_batch_size=4), steps * 2)
    per_rank = [first(_data(train, r, 2, 4), steps) for r in range(2)]
    for step in range(steps):
        both = torch.cat([per_rank[0][step], per_rank[1][step]])
        assert torch.equal(both, torch.cat(one[2 * step : 2 * step + 2]))  # rank 0's rows, then rank 1's
        assert not set(per_rank[0][step][:, 0].tolist()) & set(per_rank[1][step][:, 0].tolist())
    # a resume after 2 micro-steps reads what an uninterrupted run reads third
    resumed = next(_data(train, 1, 2, 4).batches(micro_steps=2, position=None))["input_ids"]
    assert torch.equal(resumed, per_rank[1][2])


class _Stream:
    """A stream's interface as RunData uses it (zero_train.hf.streaming.RankStream)."""

    def __init__(self, read: int = 0) -> None:
        self.read = read

    def next_batch(self, micro_batch_size: int):
        self.read += micro_batch_size
        return {"input_ids": torch.full((micro_batch_size, 4), self.read)}

    def state(self) -> dict:
        return dict(read=self.read)

    def resumed(self, position: dict) -> _Stream:
        return _Stream(position["read"])


def test_a_stream_resumes_from_its_position_at_the_same_world_size_and_refuses_another():
    data = _data(None, rank=1, world_size=2, stream=_Stream())
    assert data.epoch_steps(grad_accum=1) is None  # a stream's size is unknown
    batches = data.batches(micro_steps=0, position=None)
    next(batches), next(batches)
    assert data.position() == dict(read=4, world_size=2)
    again = _data(None, rank=1, world_size=2, stream=_Stream())
    assert next(again.batches(micro_steps=0, position=data.position()))["input_ids"][0, 0] == 6
    other = _data(None, rank=0, world_size=4, stream=_Stream())
    with pytest.raises(UsageError, match=r"written by a --streaming run of 2 ranks.*resume it with 2 ranks"):
        other.batches(micro_steps=0, position=data.position())


def test_a_split_smaller_than_one_global_micro_batch_is_one_line(tmp_path):
    from zero_train.hf.models import load_tokenizer
    from zero_train.train.config import DataConfig

    text = tmp_path / "tiny.txt"
    text.write_text("\n\n".join(["a few words, not many"] * 4))  # 4 documents: a held-out split, few blocks
    config = DataConfig(dataset=str(text), block_size=16)
    with pytest.raises(
        UsageError, match=r"blocks of 16 tokens, fewer than one global micro-batch \(8 x 4 ranks\)"
    ):
        RunData.prepare(config, load_tokenizer(None), seed=0, dist_info=_rank(0, 4), micro_batch_size=8,
                        eval_blocks=4)  # fmt: skip

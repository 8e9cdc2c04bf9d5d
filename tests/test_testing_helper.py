"""The spawn helper itself: ranks really communicate, failures surface with the child's traceback."""

import pytest
import torch
import torch.distributed as dist

from zero_train.testing import run_ranks


def _sum_of_ranks(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()


def _raise_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("boom on rank 1")
    return rank


def test_all_reduce_across_spawned_ranks():
    assert run_ranks(_sum_of_ranks, world_size=3) == [6.0, 6.0, 6.0]


def test_child_error_is_reported():
    with pytest.raises(RuntimeError, match="boom on rank 1"):
        run_ranks(_raise_on_rank_one, world_size=2, timeout_s=60)

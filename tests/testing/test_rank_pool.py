"""The spawn helpers themselves: ranks really communicate, failures surface with the child's traceback, a pool
keeps its ranks across calls and closes after a failure."""

import pytest
import torch
import torch.distributed as dist

from zero_train.testing import RankPool, run_ranks

pytestmark = pytest.mark.tier("multiproc")


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


def _pid_and_sum(rank, world_size):
    import os

    return os.getpid(), _sum_of_ranks(rank, world_size)


def test_rank_pool_reuses_its_ranks_and_closes_after_a_failure():
    with RankPool(2) as pool:
        first, second = pool.run(_pid_and_sum), pool.run(_pid_and_sum)
        assert first == second and [s for _, s in first] == [3.0, 3.0]  # same processes, same group
        assert len({pid for pid, _ in first}) == 2
        with pytest.raises(RuntimeError, match="boom on rank 1"):
            pool.run(_raise_on_rank_one, timeout_s=60)
        assert pool.broken is not None
        with pytest.raises(RuntimeError, match="closed after an earlier failure"):
            pool.run(_pid_and_sum)


def _environment_and_deepspeed_comm(rank, world_size, initialize):
    """The probe variable as this rank sees it, whether deepspeed.comm was set up before, and the pid."""
    import os

    import deepspeed

    was_initialized = deepspeed.comm.is_initialized()
    if initialize:
        deepspeed.init_distributed(dist_backend="gloo")
    return os.environ.get("ZT_PROBE_VARIABLE"), was_initialized, os.getpid()


def test_run_ranks_children_see_the_callers_environment_and_start_fresh(monkeypatch):
    """Children come from a preloaded forkserver: they must see the environment of the call (not the
    server's at its start) and none of an earlier call's state (here DeepSpeed's comm backend)."""
    monkeypatch.setenv("ZT_PROBE_VARIABLE", "first")
    first = run_ranks(_environment_and_deepspeed_comm, 2, (True,))
    monkeypatch.setenv("ZT_PROBE_VARIABLE", "second")
    second = run_ranks(_environment_and_deepspeed_comm, 2, (False,))
    assert [variable for variable, _, _ in first] == ["first", "first"]
    assert [variable for variable, _, _ in second] == ["second", "second"]
    assert [was for _, was, _ in first + second] == [False] * 4  # the first call's init did not carry over
    assert len({pid for _, _, pid in first + second}) == 4

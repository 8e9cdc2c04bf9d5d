"""CPU ranks share the machine's cores when the launcher does not say how (DeepSpeed's launcher doesn't); a
training run releases the default process group it made (PyTorch asks it of a process before it exits)."""

from __future__ import annotations

import os

import pytest
import torch

from zero_train.runtime.dist import (
    collective_timeout_s,
    local_world_size,
    rank0_work_timeout_s,
    share_cpu_threads,
)
from zero_train.runtime.errors import UsageError

pytestmark = pytest.mark.tier("quick")


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_each_rank_gets_its_share_of_the_cores(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert share_cpu_threads(2) == max(1, cores // 2) == torch.get_num_threads()
    assert share_cpu_threads(4 * cores) == 1 == torch.get_num_threads()


def test_omp_num_threads_and_a_single_rank_are_left_alone(monkeypatch, restore_threads):
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert share_cpu_threads(2) is None and torch.get_num_threads() == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert share_cpu_threads(1) is None and torch.get_num_threads() == 1


def test_local_world_size_from_either_launcher(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_SIZE", raising=False)
    assert local_world_size(8) == 8  # no launcher variable: assume one machine
    monkeypatch.setenv("LOCAL_SIZE", "2")  # DeepSpeed's launcher
    assert local_world_size(8) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun
    assert local_world_size(8) == 4


def _train_in_a_given_group_then_in_its_own(rank: int, world_size: int, corpus: str, port: int) -> tuple:
    import torch.distributed as dist

    from zero_train.train.args import parse_args
    from zero_train.train.loop import run_training

    argv = ["--engine", "zero1", "--model", "tiny", "--dataset", corpus, "--block-size", "32", "--max-steps", "1",
            "--eval-batches", "1", "--no-progress"]  # fmt: skip
    given = run_training(parse_args(argv))  # in the group run_ranks made: it stays
    kept = dist.is_initialized()
    dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(port)  # a fresh rendezvous for the group run_training makes itself
    own = run_training(parse_args(argv))
    return kept, dist.is_initialized(), given["final_loss"], own["final_loss"]


@pytest.mark.parametrize(
    "read, name, default",
    [
        (collective_timeout_s, "ZT_COLLECTIVE_TIMEOUT_S", 60.0),
        (rank0_work_timeout_s, "ZT_RANK0_WORK_TIMEOUT_S", 3600.0),
    ],
)
def test_timeouts_from_the_environment_or_one_line_naming_the_variable(monkeypatch, read, name, default):
    monkeypatch.delenv(name, raising=False)
    assert read() == default
    monkeypatch.setenv(name, "2.5")
    assert read() == 2.5
    for bad in ("abc", "0", "-1", "nan"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(
            UsageError,
            match=f"^{name}='{bad}' is not a positive number of seconds; unset it or use e.g. {default:g}$",
        ):
            read()


@pytest.mark.tier("multiproc")
def test_run_training_destroys_the_default_group_it_made_and_keeps_a_given_one(tmp_path):
    from zero_train.hf.offline import stdlib_files
    from zero_train.testing import free_port, run_ranks

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(path.read_text(errors="replace") for path in stdlib_files(40_000)))
    results = run_ranks(_train_in_a_given_group_then_in_its_own, 2, (str(corpus), free_port()))
    for kept, still_initialized, given_loss, own_loss in results:
        assert kept is True and still_initialized is False
        assert own_loss == given_loss  # the same seeded run either way

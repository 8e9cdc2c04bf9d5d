"""CPU ranks share the machine's cores when the launcher does not say how (DeepSpeed's launcher doesn't)."""

from __future__ import annotations

import os

import pytest
import torch

from zero_train.runtime.dist import local_world_size, share_cpu_threads


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

"""The CUDA branches, exercised on a machine without a GPU by forcing them (issue 20; docs/gpu.md).

torch.cuda's functions are monkeypatched to act like a node with N GPUs, so the logic that chooses a
device, synchronises, saves RNG states and picks the communication device runs here; the hardware does not.
scripts/gpu_check.sh runs the real thing on a GPU machine.
"""

from __future__ import annotations

import datetime
import os
import random

import pytest
import torch
import torch.distributed as dist

from zero_train.runtime.device import requested_device
from zero_train.runtime.dist import choose_device
from zero_train.runtime.errors import UsageError
from zero_train.runtime.host_syncs import synchronize

pytestmark = pytest.mark.tier("quick")


def _choose(requested=None, local_rank=0, cuda_count=0, existing=None, ds_accelerator=None):
    return choose_device(
        requested=requested,
        local_rank=local_rank,
        cuda_count=cuda_count,
        existing_backend=existing,
        ds_accelerator=ds_accelerator,
    )


def test_device_and_backend_always_agree():
    assert _choose(cuda_count=0) == (torch.device("cpu"), "gloo")
    assert _choose(cuda_count=4, local_rank=3) == (torch.device("cuda:3"), "nccl")
    assert _choose("cpu", cuda_count=4) == (torch.device("cpu"), "gloo")  # ZT_DEVICE=cpu on a GPU node
    assert _choose("cuda", cuda_count=2, local_rank=1) == (torch.device("cuda:1"), "nccl")
    # an existing group decides: a test's gloo ranks stay on CPU on a GPU machine (was cuda + nccl)
    assert _choose(cuda_count=8, existing="gloo") == (torch.device("cpu"), "gloo")
    assert _choose(cuda_count=2, local_rank=1, existing="nccl") == (torch.device("cuda:1"), "nccl")
    mixed = "cpu:gloo,cuda:nccl"
    assert _choose("cpu", cuda_count=2, existing=mixed) == (torch.device("cpu"), mixed)
    assert _choose(cuda_count=2, existing=mixed) == (torch.device("cuda:0"), mixed)
    assert _choose("cpu", cuda_count=2, ds_accelerator="cpu") == (torch.device("cpu"), "gloo")


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(requested="cuda", cuda_count=0), "torch sees no CUDA device"),
        (dict(cuda_count=2, local_rank=2), "LOCAL_RANK=2 but this node has 2 visible CUDA device(s)"),
        (dict(requested="cuda", cuda_count=2, existing="gloo"), "initialised with gloo"),
        (dict(requested="cpu", cuda_count=2, existing="nccl"), "ZT_DEVICE=cpu, but the process group"),
        (dict(existing="nccl", cuda_count=0), "torch sees no CUDA device"),
        (dict(requested="cpu", ds_accelerator="cuda"), "DS_ACCELERATOR=cuda but this rank runs on cpu"),
        (dict(cuda_count=1, ds_accelerator="cpu"), "DS_ACCELERATOR=cpu but this rank runs on cuda"),
    ],
)
def test_device_mismatch_is_one_clear_error(kwargs, words):
    with pytest.raises(UsageError) as caught:
        _choose(**kwargs)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_zt_device_values(monkeypatch):
    monkeypatch.setenv("ZT_DEVICE", "cpu")
    assert requested_device() == "cpu"
    monkeypatch.setenv("ZT_DEVICE", "CUDA")
    assert requested_device() == "cuda" and requested_device(force_cpu=True) == "cpu"
    monkeypatch.setenv("ZT_DEVICE", "auto")
    assert requested_device() is None
    monkeypatch.setenv("ZT_DEVICE", "gpu0")
    with pytest.raises(UsageError, match="ZT_DEVICE='gpu0' is not a device"):
        requested_device()


def _fake_gpu_node(monkeypatch, count: int) -> list:
    """torch.cuda as on a node with `count` GPUs; returns the list of calls it records."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("synchronize", device)))
    return calls


def test_init_distributed_follows_an_existing_gloo_group_on_a_gpu_node(monkeypatch):
    from zero_train.runtime.dist import init_distributed
    from zero_train.testing import free_port

    calls = _fake_gpu_node(monkeypatch, 4)
    monkeypatch.delenv("ZT_DEVICE")
    monkeypatch.delenv("DS_ACCELERATOR")
    for name, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0").items():
        monkeypatch.setenv(name, value)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip
    try:
        info = init_distributed()
        assert (info.device, info.backend) == (torch.device("cpu"), "gloo")
        assert calls == []  # no torch.cuda.set_device for a CPU rank
        monkeypatch.setenv("ZT_DEVICE", "cuda")
        with pytest.raises(UsageError, match="initialised with gloo"):
            init_distributed()
    finally:
        dist.destroy_process_group()
    assert os.environ["DS_ACCELERATOR"] == "cpu"  # so DeepSpeed, too, stays on CPU on this GPU node
    monkeypatch.delenv("DS_ACCELERATOR")
    monkeypatch.setenv("ZT_DEVICE", "cuda")
    monkeypatch.setenv("LOCAL_RANK", "4")
    with pytest.raises(UsageError, match="LOCAL_RANK=4 but this node has 4"):
        init_distributed()  # checked before any process group exists


def test_synchronize_waits_on_cuda_only(monkeypatch):
    calls = _fake_gpu_node(monkeypatch, 2)
    synchronize("cpu")
    synchronize(torch.device("cuda:1"))
    assert calls == [("synchronize", torch.device("cuda:1"))]


def test_step_clock_times_cuda_steps_with_events_not_synchronize(monkeypatch):
    """On CUDA the step clock records two events and reads them after the loop's one read: no synchronize."""
    from zero_train.train.step_values import StepClock

    events: list = []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.index = len(events)
            events.append(self)

        def record(self):
            self.recorded = True

        def elapsed_time(self, other):
            return 1000.0 * (other.index - self.index) * 2.5  # milliseconds

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("the step clock synchronised"))
    clock = StepClock(torch.device("cuda:1"))
    timing = clock.stop(clock.start())
    assert len(events) == 2 and all(e.recorded for e in events)
    assert StepClock.seconds(timing) == 2.5


def test_batches_are_pinned_on_cuda_only(monkeypatch):
    """A CUDA run's micro-batches come in pinned memory (the engine's non_blocking copy then need not wait)."""
    import zero_train.train.loop as loop

    pinned: list = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned.append(self) or self)
    trainer = loop.Trainer.__new__(loop.Trainer)
    batch = {"input_ids": torch.zeros(1, 4), "labels": torch.ones(1, 4)}
    for device, expected in (("cpu", 0), ("cuda:0", 2)):
        trainer.dist_info = type("D", (), dict(device=torch.device(device)))()
        assert trainer._next_batch(iter([batch])).keys() == batch.keys()
        assert len(pinned) == expected


def test_rng_state_is_per_device_and_survives_another_device_count(monkeypatch):
    from zero_train.checkpoint.resume import capture_rng, restore_rng

    generators = {i: torch.tensor([i], dtype=torch.uint8) for i in range(8)}
    restored: list = []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: generators[torch.device(device).index])
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda state, device: restored.append((int(state), device))
    )
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("every GPU's state saved"))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: pytest.fail("every GPU's state set"))
    saved = [capture_rng(f"cuda:{rank}") for rank in range(4)]  # 4 ranks, one GPU each
    assert [int(s["cuda"]) for s in saved] == [0, 1, 2, 3]
    torch.manual_seed(123)
    random.seed(123)
    expected_torch, expected_python = torch.rand(3), random.random()
    torch.manual_seed(0)
    random.seed(0)
    # resumed on a node with 2 GPUs (elastic resume: new rank r continues saved rank r's state)
    for rank in range(2):
        restore_rng(dict(saved[rank], **_seeded_cpu_state()), torch.device(f"cuda:{rank}"))
    assert restored == [(0, torch.device("cuda:0")), (1, torch.device("cuda:1"))]
    assert torch.equal(torch.rand(3), expected_torch) and random.random() == expected_python
    restored.clear()
    restore_rng(saved[3], "cpu")  # a CUDA state on a CPU rank: ignored
    restore_rng(capture_rng("cpu"), "cuda:0")  # a CPU checkpoint on a GPU rank: the generator stays seeded
    old_format = dict(capture_rng("cpu"), cuda=[generators[i] for i in range(4)])  # get_rng_state_all()
    restore_rng(old_format, "cuda:1")
    restore_rng(old_format, "cuda:6")  # more GPUs now than saved: nothing to take for this one
    assert restored == [(1, torch.device("cuda:1"))]


def _seeded_cpu_state() -> dict:
    from zero_train.checkpoint.resume import capture_rng

    torch.manual_seed(123)
    random.seed(123)
    state = capture_rng("cpu")
    torch.manual_seed(0)
    random.seed(0)
    return dict(torch=state["torch"], python=state["python"])


def test_gather_travels_on_the_cuda_device_under_nccl(monkeypatch):
    from zero_train.sharding.comm import gather

    assert gather.comm_device() == torch.device("cpu")  # no group: CPU
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert gather.comm_device() == torch.device("cuda:3")
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert gather.comm_device() == torch.device("cpu")


def test_tensor_bytes_counts_the_asked_device_only():
    from zero_train.engines.base import tensor_bytes

    host, device = torch.zeros(1000), torch.zeros(3000, device="meta")
    seen: set = set()
    assert tensor_bytes([host, device, host[10:]], seen, device="meta") == 12000
    assert tensor_bytes([host, device], seen) == 0  # both already seen: a later category counts neither
    assert tensor_bytes([host, device, torch.zeros(5, device="meta")], device="cpu") == 4000
    assert tensor_bytes([host, device]) == 16000


class _OffloadEngine:
    """Plays a GPU run with optimizer offload: "meta" is the GPU, CPU tensors are the pinned host states."""

    def __init__(self):
        self.model = torch.nn.Linear(1, 1, device="meta")
        self.params = torch.zeros(2000, device="meta")  # 8000 B on the device
        self.states = torch.zeros(6000)  # 24000 B offloaded to the host

    def memory_categories(self, device=None):
        from zero_train.engines.base import tensor_bytes

        return dict(
            params=tensor_bytes([self.params], device=device),
            optimizer_states=tensor_bytes([self.states], device=device),
        )


def test_memory_probe_compares_the_device_level_with_device_bytes_only(monkeypatch):
    """ "other" = device level - device categories; offloaded bytes beside it (was: other = -24000 + 300)."""
    from zero_train.memory import measure
    from zero_train.memory.probe import MemoryProbe

    context = 300  # what the device holds that no category owns
    monkeypatch.setattr(measure, "allocated_bytes", lambda device: 8000 + context)
    monkeypatch.setattr(measure, "peak_bytes", lambda device: 9000 + context)
    monkeypatch.setattr(measure, "reset_peak", lambda device: None)
    monkeypatch.setattr(measure, "cuda_memory_info", lambda device: None)
    info = type("D", (), dict(device=torch.device("meta"), rank=0, world_size=1))()
    probe = MemoryProbe(info)
    probe.ledger.__exit__(None, None, None)
    probe.ledger = None
    probe.attach(_OffloadEngine())
    with probe.phase("step"):
        pass
    summary = probe.rank_summary(probe.engine)
    assert summary["categories"]["params"] == 8000 and summary["categories"]["optimizer_states"] == 0
    assert summary["categories"]["other"] == context and summary["other_between_steps"] == context
    assert summary["off_device_bytes"] == dict(params=0, optimizer_states=24000)
    assert sum(summary["categories"].values()) == summary["allocator_bytes"] == 8000 + context


def test_cuda_memory_info_names_what_live_tensors_leave_out(monkeypatch):
    from zero_train.memory import measure

    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (30 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 48 * gib)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 49 * gib)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 45 * gib)
    info = measure.cuda_memory_info("cuda:0")
    assert info == dict(
        max_allocated_bytes=45 * gib,
        max_reserved_bytes=49 * gib,
        reserved_bytes=48 * gib,
        free_bytes=30 * gib,
        total_bytes=80 * gib,
        outside_allocator_bytes=2 * gib,  # 80 - 30 used, 48 of it the allocator's: context, NCCL, others
    )
    assert measure.cuda_memory_info("cpu") is None


def test_profile_records_the_device_its_ranks_run_on(monkeypatch):
    """Error records of failed cells said device "cpu" on any machine; now the launched ranks' device."""
    import argparse

    from zero_train.cli import profile
    from zero_train.launch import launcher

    args = argparse.Namespace(
        model="tiny",
        block_size=32,
        precision="fp32",
        micro_batch_size=2,
        grad_accum=1,
        gradient_checkpointing=False,
    )
    monkeypatch.setattr(launcher, "model_meta", lambda model, block_size: {})  # builds the model: slow here
    assert profile._model_meta(args)["device"] == "cpu"  # ZT_DEVICE=cpu (conftest)
    _fake_gpu_node(monkeypatch, 2)
    monkeypatch.delenv("ZT_DEVICE")
    assert profile._model_meta(args)["device"] == "cuda"
    monkeypatch.setenv("ZT_DEVICE", "cpu")
    assert profile._model_meta(args)["device"] == "cpu"


def test_init_distributed_on_a_gpu_node_sets_the_device_and_asks_for_nccl(monkeypatch):
    from zero_train.runtime import dist as zt_dist

    calls = _fake_gpu_node(monkeypatch, 2)
    monkeypatch.delenv("ZT_DEVICE")
    monkeypatch.delenv("DS_ACCELERATOR")
    for name, value in dict(RANK="1", WORLD_SIZE="1", LOCAL_RANK="1", MASTER_PORT="29999").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(zt_dist.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(zt_dist.dist, "init_process_group", lambda **kwargs: calls.append(kwargs["backend"]))
    info = zt_dist.init_distributed()
    assert (info.device, info.backend) == (torch.device("cuda:1"), "nccl")
    assert calls == [("set_device", torch.device("cuda:1")), "nccl"]
    assert "DS_ACCELERATOR" not in os.environ  # only CPU ranks pin DeepSpeed to its CPU accelerator


def test_measure_reads_the_cuda_allocator_on_cuda(monkeypatch):
    from zero_train.memory import measure

    calls: list = []
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: calls.append("now") or 7)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: calls.append("peak") or 9)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append("reset"))
    measure.reset_peak("cuda:0")
    assert (measure.allocated_bytes("cuda:0"), measure.peak_bytes("cuda:0")) == (7, 9)
    assert calls == ["reset", "now", "peak"]


def test_zero1_engine_counts_host_step_counters_off_the_device():
    """On CUDA torch's Adam keeps "step" on the CPU: the engine's device split must say so."""
    from zero_train.engines.zero1 import Zero1Engine

    engine = Zero1Engine.__new__(Zero1Engine)
    engine.dist_info = type("D", (), dict(device=torch.device("meta")))()  # "meta" plays cuda:0
    moments = [torch.zeros(100, device="meta"), torch.zeros(100, device="meta")]
    inner = type(
        "Inner", (), dict(state={0: dict(step=torch.tensor(3.0), exp_avg=moments[0], exp_avg_sq=moments[1])})
    )
    totals = dict(params=1000, grads=1000, master_params=0, optimizer_states=804, comm_buffers=16)
    engine.optimizer = type("Opt", (), dict(inner=inner))()
    engine.sharder_bytes = lambda: dict(totals)  # the sharder's own account (sharding/zero12/report.py)
    assert engine.memory_categories() == totals
    assert engine.memory_categories("meta") == dict(totals, optimizer_states=800)
    assert engine.memory_categories("cpu") == dict(
        params=0, grads=0, master_params=0, optimizer_states=4, comm_buffers=0
    )


@pytest.mark.tier("slow")
def test_gpu_check_without_gpus_says_so_in_one_line_and_exits_2(repo_root, tmp_path):
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: scripts/gpu_check.sh would run for real")
    env = dict(os.environ, ZT_PYTHON=sys.executable, ZT_GPU_CHECK_OUT=str(tmp_path / "out"))
    proc = subprocess.run(
        ["bash", str(repo_root / "scripts" / "gpu_check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: gpu-check: torch sees no CUDA GPU here"), lines
    assert lines[0].endswith("or pass --cpu for the same checks on gloo ranks")
    assert not (tmp_path / "out").exists()

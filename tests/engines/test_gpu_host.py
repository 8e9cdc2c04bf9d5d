"""Defects that only a GPU host shows, each forced here on a CPU-only machine (issue 25, item 5).

torch.cuda and torch's default accelerator are monkeypatched to act like a GPU node, a launcher is a
small process tree, collectives are counted: the logic that was wrong on a GPU host runs here, the
hardware does not. tests/engines/test_gpu_paths.py covers the device choice itself; scripts/gpu_check.sh runs the
real thing on GPUs.
"""

from __future__ import annotations

import contextlib
import datetime
import os

import pytest
import torch
import torch.distributed as dist

from zero_train.launch.launcher import run_logged  # imports torch and transformers: outside the timed launch
from zero_train.testing import free_port

pytestmark = pytest.mark.tier("quick")


def _fake_gpu_node(monkeypatch, count: int = 2) -> None:
    """torch as on a node with `count` GPUs: CUDA available, and CUDA torch's default accelerator."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))


@contextlib.contextmanager
def _world_of_one():
    """A gloo default group of one rank in this process (a CPU run's group on the fake GPU node)."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_fsdp2_shards_on_the_runs_device_not_torchs_default_accelerator(monkeypatch):
    """ZT_DEVICE=cpu on a GPU host: the mesh is CPU over the gloo group (was: a CUDA mesh over gloo)."""
    from zero_train.ds_config import resolve_auto, train_settings
    from zero_train.engines import build_engine
    from zero_train.hf.models import build_model, model_config
    from zero_train.runtime.dist import DistInfo

    _fake_gpu_node(monkeypatch)
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}
    settings = train_settings(config, world_size=1)
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    with _world_of_one():
        engine = build_engine(
            "fsdp2",
            model_fn=lambda: build_model(model_config("tiny", vocab_size=64)),
            settings=settings,
            ds_config=resolve_auto(config, settings),
            dist_info=info,
        )
        meshes = {(p.device_mesh.device_type, p.device.type) for p in engine.model.parameters()}
        loss = engine.forward_backward(torch.randint(0, 64, (2, 8)))
        engine.step()
    assert meshes == {("cpu", "cpu")}
    assert torch.isfinite(loss)


FAKE_GPU_TRAIN = """
import runpy, sys
import torch
torch.cuda.is_available = lambda: True  # a GPU node, as DeepSpeed's accelerator detection sees it
torch.cuda.device_count = lambda: 2
import zero_train.train.loop as loop
assert "deepspeed" not in sys.modules, "imported before the entry point ran"
def report(args, *, plan=None):
    from deepspeed.accelerator import get_accelerator
    print("deepspeed accelerator:", get_accelerator().device_name())
loop.run_training = report
script = sys.argv[1]
sys.argv = [script, "--engine", "deepspeed", "--model", "tiny"]
runpy.run_path(script, run_name="__main__")
"""


@pytest.mark.tier("slow")
def test_train_py_pins_deepspeed_to_cpu_before_importing_it(repo_root):
    """ZT_DEVICE=cpu on a GPU node: DeepSpeed, imported by the entry point, caches CPU (was CUDA)."""
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}
    env["ZT_DEVICE"] = "cpu"
    script = repo_root / "scripts" / "train.py"
    proc = subprocess.run(
        [sys.executable, "-c", FAKE_GPU_TRAIN, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "deepspeed accelerator: cpu" in proc.stdout.splitlines(), proc.stdout


@pytest.mark.parametrize("script", ["train.py", "hf_trainer.py"])
@pytest.mark.parametrize(("zt_device", "expected"), [("cpu", "cpu"), ("auto", None)])
def test_entry_points_set_ds_accelerator_before_importing_the_run(
    repo_root, monkeypatch, script, zt_device, expected
):
    """Both entry points decide DS_ACCELERATOR before import_run_modules (which imports DeepSpeed):
    cpu for a CPU run on a GPU node, unset (DeepSpeed's own CUDA detection) for a GPU run."""
    import runpy
    import sys

    import zero_train.bench.hf_peer as hf_peer
    import zero_train.train.loop as loop
    import zero_train.train.setup as setup

    _fake_gpu_node(monkeypatch)
    monkeypatch.setenv("ZT_DEVICE", zt_device)
    monkeypatch.delenv("DS_ACCELERATOR")
    seen: list = []
    monkeypatch.setattr(
        setup, "import_run_modules", lambda args: seen.append(os.environ.get("DS_ACCELERATOR"))
    )
    monkeypatch.setattr(loop, "run_training", lambda args, *, plan=None: None)
    monkeypatch.setattr(hf_peer, "run_peer", lambda args: None)
    monkeypatch.setattr(sys, "argv", [script, "--engine", "deepspeed", "--model", "tiny"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(repo_root / "scripts" / script), run_name="__main__")
    assert exited.value.code in (0, None)
    assert seen == [expected]


def test_hf_trainer_peer_runs_on_the_ranks_device(monkeypatch, tmp_path):
    """The Trainer's use_cpu follows the rank's device: a CPU run on a GPU node trains on CPU (was: on
    cuda:0 wherever torch sees CUDA), a CUDA rank on CUDA."""
    import types

    from accelerate.state import PartialState

    from zero_train.bench.hf_peer import training_arguments
    from zero_train.ds_config import train_settings
    from zero_train.registry import engine_spec
    from zero_train.train.config import OutputConfig, RunConfig, TrainingConfig

    _fake_gpu_node(monkeypatch)
    set_devices: list = []
    monkeypatch.setattr(torch.cuda, "set_device", set_devices.append)
    args = RunConfig(training=TrainingConfig(max_steps=3), output=OutputConfig(progress=False))
    plan = types.SimpleNamespace(
        settings=train_settings({"train_micro_batch_size_per_gpu": 2}, world_size=1),
        engine=engine_spec("ddp"),
    )
    try:
        on_cpu = training_arguments(args, plan, str(tmp_path), torch.device("cpu"))
        assert (on_cpu.use_cpu, on_cpu.device, set_devices) == (True, torch.device("cpu"), [])
        on_cuda = training_arguments(args, plan, str(tmp_path), torch.device("cuda:0"))
        assert (on_cuda.use_cpu, on_cuda.device) == (False, torch.device("cuda:0"))
    finally:
        PartialState._reset_state()  # accelerate's process-wide state, made by TrainingArguments


class _FakeCudaAllocator:
    """torch.cuda's allocator counters: allocated and reserved bytes, their peaks since the last reset."""

    def __init__(self, monkeypatch) -> None:
        self.allocated = self.reserved = self.peak = self.peak_reserved = 0
        for name, value in dict(
            memory_allocated=lambda device=None: self.allocated,
            max_memory_allocated=lambda device=None: self.peak,
            memory_reserved=lambda device=None: self.reserved,
            max_memory_reserved=lambda device=None: self.peak_reserved,
            reset_peak_memory_stats=lambda device=None: self.reset(),
            mem_get_info=lambda device=None: (80 << 30, 96 << 30),
        ).items():
            monkeypatch.setattr(torch.cuda, name, value)

    def use(self, allocated: int, reserved: int) -> None:
        self.allocated, self.reserved = allocated, reserved
        self.peak, self.peak_reserved = max(self.peak, allocated), max(self.peak_reserved, reserved)

    def reset(self) -> None:
        self.peak, self.peak_reserved = self.allocated, self.reserved


class _NoStatesEngine:
    model = torch.nn.Linear(1, 1, device="meta")

    def memory_categories(self, device=None):
        return dict(params=0)


def test_memory_probe_cuda_maxima_cover_the_whole_run(monkeypatch):
    """Each phase resets CUDA's peak stats; the record's maxima are the run's (were: the last phase's),
    including what peaked between two phases."""
    from zero_train.memory.probe import MemoryProbe

    allocator = _FakeCudaAllocator(monkeypatch)
    allocator.use(100, 1024)
    info = type("D", (), dict(device=torch.device("cuda:0"), rank=0, world_size=1))()
    probe = MemoryProbe(info)
    try:
        allocator.use(1100, 2048)  # between phases: the highest allocation of the run
        allocator.use(100, 2048)
        with probe.phase("forward"):
            allocator.use(600, 4096)  # the highest reservation of the run, then emptied
            allocator.use(300, 1024)
        probe.attach(_NoStatesEngine())
        with probe.phase("step"):
            allocator.use(400, 1024)
        summary = probe.rank_summary(probe.engine)
    finally:
        probe.close()
    assert [phase["peak_bytes"] for phase in summary["phases"]] == [600, 400]
    assert summary["peak_bytes"] == 1100
    assert (summary["cuda"]["max_allocated_bytes"], summary["cuda"]["max_reserved_bytes"]) == (1100, 4096)


FAKE_LAUNCHER = """
import signal, subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"]
ranks = [
    subprocess.Popen(sleep),  # in the launcher's group, as the deepspeed launcher's ranks
    subprocess.Popen(sleep, start_new_session=True),  # in a session of its own, as torchrun's
    subprocess.Popen(stubborn),  # SIGTERM ignored: only SIGKILL stops it
]
print("rank pids:", *(rank.pid for rank in ranks), flush=True)
time.sleep(120)
"""


def _run_logged(command, log, timeout):
    return run_logged(command, log, timeout=timeout, kill_grace_s=1)


def _bench_launch(command, log, timeout):
    no_run_finishes = [log.with_suffix(".done.json")]
    return run_logged(command, log, timeout=timeout, done_files=no_run_finishes, kill_grace_s=1)


@pytest.mark.parametrize("launch", [_run_logged, _bench_launch], ids=["profile-cell", "bench-launch"])
def test_a_timed_out_launch_leaves_no_rank_behind(tmp_path, launch):
    """The timeout stops the launcher AND its ranks (were: the launcher only, or its group only, which
    torchrun's ranks are not in; the ranks kept their GPUs)."""
    import sys
    import time

    import psutil

    log = tmp_path / "launch.log"
    started = time.monotonic()
    code = launch([sys.executable, "-c", FAKE_LAUNCHER], log, 4)
    elapsed = time.monotonic() - started
    rank_line = [line for line in log.read_text().splitlines() if line.startswith("rank pids:")]
    assert code is None and rank_line, log.read_text()
    ranks = [int(pid) for pid in rank_line[0].split()[2:]]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_runs(pid, psutil) for pid in ranks):
        time.sleep(0.1)
    survivors = [pid for pid in ranks if _runs(pid, psutil)]
    for pid in survivors:  # leave nothing running on the machine either way
        psutil.Process(pid).kill()
    assert survivors == [] and elapsed < 11  # timeout 4 s + two 1-s graces: not the 10-s default grace


def _runs(pid: int, psutil) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gather_without_plain_p2p(rank: int, world_size: int) -> dict:
    """gather_tensor and gather_objects_to with dist.send/recv refused and batch_isend_irecv counted."""
    from zero_train.sharding.comm import gather

    batches: list = []
    real_batch = dist.batch_isend_irecv

    def counted(ops):
        batches.append([(op.op.__name__, op.group_peer, op.tensor.numel()) for op in ops])
        return real_batch(ops)

    def refuse(*args, **kwargs):
        raise AssertionError("plain send/recv: on NCCL a dedicated 2-rank communicator per pair")

    saved = dist.send, dist.recv, dist.batch_isend_irecv
    dist.send, dist.recv, dist.batch_isend_irecv = refuse, refuse, counted
    try:
        weight = torch.arange(6.0).reshape(2, 3) + 10 * rank
        one = gather.gather_tensor(
            weight if rank == 1 else None, owner=1, to=0, shape=(2, 3), dtype=torch.float32
        )
        everything = gather.gather_objects_to(dict(weight=weight, step=rank, moments=[weight * 2]), to=0)
    finally:
        dist.send, dist.recv, dist.batch_isend_irecv = saved
    return dict(one=one, everything=everything, batches=batches)


@pytest.mark.tier("multiproc")
def test_gather_travels_in_batched_p2p_on_the_groups_communicator(rank_pool):
    """No plain send/recv (each builds its own 2-rank NCCL communicator): batches of one isend or irecv,
    the same tensors, on CPU, only on the receiving rank."""
    receiver, sender = rank_pool(2).run(_gather_without_plain_p2p)
    weights = [torch.arange(6.0).reshape(2, 3) + 10 * rank for rank in range(2)]
    assert torch.equal(receiver["one"], weights[1]) and sender["one"] is None
    assert sender["everything"] is None
    for rank, gathered in enumerate(receiver["everything"]):
        assert gathered["step"] == rank and gathered["weight"].device.type == "cpu"
        assert torch.equal(gathered["weight"], weights[rank])
        assert torch.equal(gathered["moments"][0], 2 * weights[rank])
    assert receiver["batches"] == [[("irecv", 1, 6)]] * 3  # gather_tensor's, then rank 1's two tensors
    assert sender["batches"] == [[("isend", 0, 6)]] * 3

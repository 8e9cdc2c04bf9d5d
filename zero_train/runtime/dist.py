"""The distributed environment, read once and passed explicitly.

Launchers (deepspeed, torchrun, plain python) all export RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT; a plain `python script.py` has none of them and runs as a world of one.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from zero_train.runtime.device import DEVICE_ENV, read_env, requested_device
from zero_train.runtime.errors import UsageError
from zero_train.runtime.faults import record_peers
from zero_train.runtime.vitals import start_heartbeat

TIMEOUT_ENV = "ZT_COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0  # not torch's 30 minutes: a dead rank must be noticed quickly


def collective_timeout_s() -> float:
    """Seconds a collective may wait for a peer: $ZT_COLLECTIVE_TIMEOUT_S, else 60."""
    return _seconds_from_env(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)


def _seconds_from_env(name: str, default: float) -> float:
    """$name as a positive number of seconds, `default` when unset; anything else is a UsageError."""
    value = os.environ.get(name, "")
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise UsageError(
            f"{name}={value!r} is not a positive number of seconds; unset it or use e.g. {default:g}"
        )
    return seconds


@dataclass(frozen=True, slots=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int
    """Global rank, 0 .. world_size-1."""
    world_size: int
    """Number of data-parallel processes."""
    local_rank: int
    """Rank on this node; picks the CUDA device."""
    device: torch.device
    """`cuda:<local_rank>` with nccl, `cpu` with gloo (see choose_device)."""
    backend: str
    """`nccl` on CUDA, `gloo` on CPU (an existing default group's backend, if there is one)."""

    @property
    def is_main(self) -> bool:
        """True on rank 0, which logs and writes shared files."""
        return self.rank == 0


def choose_device(
    *,
    requested: str | None,
    local_rank: int,
    cuda_count: int,
    existing_backend: str | None,
    ds_accelerator: str | None = None,
) -> tuple[torch.device, str]:
    """(device, backend) for this rank; they always agree: cuda:LOCAL_RANK with nccl, cpu with gloo.

    Pure (the caller reads the environment), so every branch is tested without a GPU.

    Args:
        requested: "cpu", "cuda" or None (CUDA if the machine has it).
        local_rank: this rank's index on its node.
        cuda_count: CUDA devices this process sees (torch.cuda.device_count(), 0 without CUDA).
        existing_backend: the backend of an already initialised default group (a test's gloo ranks,
            DeepSpeed's launcher), None if there is none: the device must follow it.
        ds_accelerator: $DS_ACCELERATOR if set (DeepSpeed's own device choice): must match.

    Raises:
        UsageError: the request, the group and the machine disagree (one line naming the fix).
    """
    cpu_group = existing_backend is not None and "nccl" not in existing_backend  # gloo, mpi, ...
    nccl_group = existing_backend == "nccl"  # "cpu:gloo,cuda:nccl" serves both devices
    if cpu_group and requested == "cuda":
        raise UsageError(
            f"{DEVICE_ENV}=cuda, but the process group was initialised with {existing_backend}, which "
            "runs on CPU tensors; unset ZT_DEVICE or initialise the group with nccl"
        )
    if nccl_group and requested == "cpu":
        raise UsageError(
            f"{DEVICE_ENV}=cpu, but the process group was initialised with nccl, which needs CUDA tensors; "
            "unset ZT_DEVICE or initialise the group with gloo"
        )
    use_cuda = not cpu_group and (requested == "cuda" or nccl_group or (requested is None and cuda_count > 0))
    if ds_accelerator and ds_accelerator != ("cuda" if use_cuda else "cpu"):
        raise UsageError(
            f"DS_ACCELERATOR={ds_accelerator} but this rank runs on {'cuda' if use_cuda else 'cpu'}; "
            f"unset DS_ACCELERATOR or make it match {DEVICE_ENV}"
        )
    if not use_cuda:
        return torch.device("cpu"), existing_backend or "gloo"
    if cuda_count == 0:
        raise UsageError(
            f"CUDA was asked for ({DEVICE_ENV}=cuda or an nccl group) but torch sees no CUDA device; "
            f"set {DEVICE_ENV}=cpu or check CUDA_VISIBLE_DEVICES and the driver"
        )
    if local_rank >= cuda_count:
        raise UsageError(
            f"LOCAL_RANK={local_rank} but this node has {cuda_count} visible CUDA device(s); launch at most "
            f"{cuda_count} ranks per node (e.g. --num_gpus {cuda_count}) or fix CUDA_VISIBLE_DEVICES"
        )
    return torch.device(f"cuda:{local_rank}"), existing_backend or "nccl"


def share_cpu_threads(local_world_size: int) -> int | None:
    """On CPU ranks, give each rank an equal share of this machine's cores, unless OMP_NUM_THREADS says.

    torchrun exports OMP_NUM_THREADS=1 for several ranks per machine; DeepSpeed's launcher exports nothing
    (unless --bind_cores_to_rank), so every rank starts as many OpenMP threads as there are cores and the
    ranks spin on each other's cores (measured: docs/bench.md#threads-per-rank).

    Returns:
        The thread count set, or None when OMP_NUM_THREADS was given (or one rank per machine).
    """
    if os.environ.get("OMP_NUM_THREADS") or local_world_size <= 1:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // local_world_size)
    torch.set_num_threads(threads)
    return threads


def local_world_size(world_size: int) -> int:
    """Ranks on this machine: torchrun's LOCAL_WORLD_SIZE, DeepSpeed's LOCAL_SIZE, else the world size."""
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return world_size


RANK0_WORK_TIMEOUT_ENV = "ZT_RANK0_WORK_TIMEOUT_S"
DEFAULT_RANK0_WORK_TIMEOUT_S = 3600.0  # building a dataset, hashing or exporting a big model: minutes


def init_distributed(*, timeout_s: float | None = None, force_cpu: bool = False) -> DistInfo:
    """Initialise torch.distributed once (also for a world of one) and describe this process.

    The device and backend come from choose_device: $ZT_DEVICE (cpu / cuda; the tests set cpu), an
    existing default group (whose backend decides), else CUDA + NCCL where available, CPU + gloo elsewhere.

    Args:
        timeout_s: collective timeout (default: collective_timeout_s()); short so that a dead peer fails
            the job instead of hanging it.
        force_cpu: use CPU + gloo even where CUDA is available (as ZT_DEVICE=cpu).

    Returns:
        The frozen DistInfo every other module takes as an argument.

    Raises:
        UsageError: the device asked for, the existing group and the machine disagree.
    """
    rank, world_size, local_rank = read_env()
    requested = requested_device(force_cpu)
    existing = dist.get_backend() if dist.is_initialized() else None
    cuda_count = torch.cuda.device_count() if requested != "cpu" and torch.cuda.is_available() else 0
    device, backend = choose_device(
        requested=requested,
        local_rank=local_rank,
        cuda_count=cuda_count,
        existing_backend=existing,
        ds_accelerator=os.environ.get("DS_ACCELERATOR") or None,
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed would pick CUDA on a GPU machine
        share_cpu_threads(local_world_size(world_size))
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("WORLD_SIZE", str(world_size))
        os.environ.setdefault("LOCAL_RANK", str(local_rank))
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s or collective_timeout_s()),
        )
        peers = record_peers(
            world_size
        )  # lets a survivor name the rank that died (zero_train.runtime.faults)
        start_heartbeat(rank, peers[0] if peers else None)  # ... and how: killed, its memory (runtime.vitals)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=device, backend=backend)


def rank0_work_timeout_s() -> float:
    """Seconds the other ranks wait for work rank 0 does alone: $ZT_RANK0_WORK_TIMEOUT_S, else 3600."""
    return _seconds_from_env(RANK0_WORK_TIMEOUT_ENV, DEFAULT_RANK0_WORK_TIMEOUT_S)


@contextlib.contextmanager
def rank0_work_group(world_size: int):
    """A gloo group of all ranks with a long timeout, for waiting while rank 0 works alone.

    Building the dataset, hashing checkpoint files and exporting run on rank 0 only and can take minutes
    on a big model, far beyond the short collective timeout (60 s). The others wait in THIS group
    instead: gloo, so on an NCCL job the wait raises a Python exception when it does time out (NCCL's
    watchdog would kill the process silently) and holds no GPU memory. A rank that dies meanwhile still
    fails the wait at once (gloo sees the closed connection). Collective to create (every rank enters it).

    Args:
        world_size: the number of ranks (a world of one, or no process group, yields None).

    Yields:
        The group to pass as process_group, or None.
    """
    if world_size <= 1 or not dist.is_initialized():
        yield None
        return
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=rank0_work_timeout_s()))
    try:
        yield group
    finally:
        dist.destroy_process_group(group)

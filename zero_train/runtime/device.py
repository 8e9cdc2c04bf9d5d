"""Which device this rank computes on, chosen once; and the synchronisation a timing needs on it.

    ZT_DEVICE=cpu     CPU tensors + gloo, also on a GPU machine (the tests set it: bit-exact CPU references)
    ZT_DEVICE=cuda    cuda:LOCAL_RANK + nccl; an error if this node has no such device
    unset / auto      CUDA + NCCL where torch sees a GPU, else CPU + gloo

The device and the backend always agree; an existing default group (a test's gloo ranks, a launcher that
initialised one) decides, and a request that contradicts it is one clear UsageError.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from zero_train.runtime.errors import UsageError

if TYPE_CHECKING:
    import torch

DEVICE_ENV = "ZT_DEVICE"
DEVICE_CHOICES = ("cpu", "cuda")
DS_ACCELERATOR_ENV = "DS_ACCELERATOR"


def requested_device(force_cpu: bool = False) -> str | None:
    """ "cpu" or "cuda" as $ZT_DEVICE (or force_cpu) asks; None: CUDA where available, else CPU.

    Raises:
        UsageError: ZT_DEVICE is set to anything else.
    """
    if force_cpu:
        return "cpu"
    value = os.environ.get(DEVICE_ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in DEVICE_CHOICES:
        raise UsageError(f"{DEVICE_ENV}={value!r} is not a device; use cpu, cuda, or leave it unset (auto)")
    return value


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
    import torch  # expensive: torch (seconds); zero-train --help imports this module

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


def launched_device_type() -> str:
    """ "cuda" or "cpu": where ranks started from this environment will run (their records say so too).

    For records written by a parent process (a profile cell that failed before its ranks did): the same
    choice init_distributed makes, without a process group.
    """
    import torch  # expensive: torch (seconds); zero-train --help imports this module

    requested = requested_device()
    if requested is not None:
        return requested
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "cpu"


def pin_deepspeed_accelerator() -> None:
    """Set DS_ACCELERATOR=cpu when this process will run on CPU; entry points call it before anything
    imports DeepSpeed, which picks its accelerator once, at import (CUDA wherever torch sees a GPU).

    A DS_ACCELERATOR already set is kept: init_distributed reports one that contradicts the device.
    """
    if DS_ACCELERATOR_ENV not in os.environ and launched_device_type() == "cpu":
        os.environ[DS_ACCELERATOR_ENV] = "cpu"


def synchronize(device: torch.device | str) -> None:
    """Wait until every kernel queued on `device` has finished (CUDA); nothing to wait for on CPU.

    CUDA kernels run asynchronously: a wall-clock timing is only right if the queue is empty at both ends.
    """
    import torch  # expensive: torch (seconds); zero-train --help imports this module

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    else:  # a CPU run counts it as the CUDA run's sync it stands for
        # expensive: imports torch; zero-train --help imports this module
        from zero_train.runtime.host_syncs import note_emulated_synchronize

        note_emulated_synchronize()

"""What the launcher's environment says about this process, read without torch (every subcommand's start-up
imports this module): its rank, and the device it asks for.

    ZT_DEVICE=cpu     CPU tensors + gloo, also on a GPU machine (the tests set it: bit-exact CPU references)
    ZT_DEVICE=cuda    cuda:LOCAL_RANK + nccl; an error if this node has no such device
    unset / auto      CUDA + NCCL where torch sees a GPU, else CPU + gloo

zero_train.runtime.dist.choose_device turns the request into the rank's device and backend, which always
agree; an existing default group (a test's gloo ranks, a launcher that initialised one) decides, and a request
that contradicts it is one clear UsageError.
"""

from __future__ import annotations

import os

from zero_train.runtime.errors import UsageError

DEVICE_ENV = "ZT_DEVICE"
DEVICE_CHOICES = ("cpu", "cuda")
DS_ACCELERATOR_ENV = "DS_ACCELERATOR"


def read_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from the launcher's environment; (0, 1, 0) if none."""
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    return rank, world_size, local_rank


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


def launched_device_type() -> str:
    """ "cuda" or "cpu": where ranks started from this environment will run (their records say so too).

    For records written by a parent process (a profile cell that failed before its ranks did): the same
    choice init_distributed makes, without a process group.
    """
    requested = requested_device()
    if requested is not None:
        return requested
    import torch  # expensive: torch (seconds); every subcommand's start-up imports this module

    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "cpu"


def pin_deepspeed_accelerator() -> None:
    """Set DS_ACCELERATOR=cpu when this process will run on CPU; entry points call it before anything
    imports DeepSpeed, which picks its accelerator once, at import (CUDA wherever torch sees a GPU).

    A DS_ACCELERATOR already set is kept: init_distributed reports one that contradicts the device.
    """
    if DS_ACCELERATOR_ENV not in os.environ and launched_device_type() == "cpu":
        os.environ[DS_ACCELERATOR_ENV] = "cpu"

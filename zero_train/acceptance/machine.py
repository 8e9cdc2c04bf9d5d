"""What the acceptance run runs on: the device, its world size, versions; and on CUDA the GPU margin's fixed
terms measured in this process (the CUDA context, one NCCL communicator's buffers).

    facts = machine_facts(cpu=False)     # {"device": "NVIDIA H100 80GB HBM3", "kind": "cuda", "world_size": 1, ...}
    terms = measure_fixed_terms()        # {"cuda_context": bytes, "nccl_buffers": bytes, "world_size": 1}
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess

import torch
import torch.distributed as dist
import transformers

from zero_train.runtime.ports import free_port

CPU_WORLD_SIZE = 2
"""Gloo ranks of `--cpu`: the multi-rank checks need two."""
MAX_GPUS = 8


def machine_facts(*, cpu: bool) -> dict:
    """The device the ranks use (CUDA when torch sees a GPU and `cpu` is False), world size and versions."""
    facts = dict(
        torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version()
    )
    try:  # the version only: importing DeepSpeed is the engines' business
        facts["deepspeed"] = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        facts["deepspeed"] = None
    if cpu or not torch.cuda.is_available():
        facts.update(
            kind="cpu",
            device=f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores), gloo",
            world_size=CPU_WORLD_SIZE,
        )
        return facts
    count = min(torch.cuda.device_count(), MAX_GPUS)
    name = torch.cuda.get_device_name(0)
    facts.update(
        kind="cuda",
        device=f"{count} x {name}",
        gpu_name=name,
        world_size=count,
        cuda=torch.version.cuda,
        nccl=".".join(map(str, torch.cuda.nccl.version())),
        bf16=torch.cuda.is_bf16_supported(including_emulation=False),
    )
    return facts


def measure_fixed_terms() -> dict:
    """On GPU 0: the device memory the CUDA context takes (free before torch's first CUDA call minus after it,
    through the driver's own count) and what a one-rank NCCL communicator adds after its first all-reduce."""
    free_before = _driver_free_bytes()
    torch.cuda.init()
    torch.zeros(1, device="cuda:0")
    free_context, total = torch.cuda.mem_get_info(0)
    allocated = torch.cuda.memory_reserved(0)
    context = None if free_before is None else free_before - free_context - allocated
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        device_id=torch.device("cuda:0"),
    )
    try:
        tensor = torch.ones(1 << 20, device="cuda:0")
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        free_nccl, _ = torch.cuda.mem_get_info(0)
        nccl = free_context - free_nccl - (torch.cuda.memory_reserved(0) - allocated)
    finally:
        dist.destroy_process_group()
    return dict(cuda_context=context, nccl_buffers=nccl, world_size=1, total_bytes=total)


def _driver_free_bytes() -> int | None:
    """Free bytes of GPU 0 as the driver counts them, without a CUDA context in this process (nvidia-smi, MiB);
    None without it."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return int(float(out.stdout.split()[0]) * 2**20)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None

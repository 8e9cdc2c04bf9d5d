"""The machine a benchmark ran on: CPU, cores, accelerator, library versions, load (noise) around the run."""

from __future__ import annotations

import os
import pathlib
import platform
import sys
from importlib import metadata

import torch


def cpu_model() -> str:
    """The CPU's marketing name (/proc/cpuinfo on Linux, else platform's best guess)."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16")
"""The x86 flags that decide CPU matmul speed: without avx512_bf16 / amx_bf16, bf16 math is emulated, several
times slower than fp32 (measured: docs/bench.md#emulated-bf16)."""


def cpu_flags() -> list[str]:
    """Which of CPU_FLAGS the CPU has (/proc/cpuinfo on Linux; [] elsewhere)."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return []
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return [flag for flag in CPU_FLAGS if flag in present]
    return []


NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def bf16_emulated_on_cpu() -> bool:
    """True on an x86 CPU without AVX512-BF16 or AMX-BF16 (bf16 matmuls emulated, slow),
    when the ranks run on the CPU (no CUDA device). Not x86 (no flags read): False, nothing is claimed."""
    if torch.cuda.is_available() or platform.machine() not in ("x86_64", "AMD64", "i686"):
        return False
    return not set(NATIVE_BF16_FLAGS) & set(cpu_flags())


def _version(module_name: str) -> str | None:

    try:
        return metadata.version(module_name)
    except metadata.PackageNotFoundError:
        return None


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (None where the OS has none): other work competing for the cores."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict:
    """CPU model, logical cores, GPUs, OS, Python and library versions."""
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return dict(
        cpu=cpu_model(),
        cpu_flags=cpu_flags(),
        logical_cpus=os.cpu_count(),
        gpus=gpus,
        os=platform.platform(),
        python=sys.version.split()[0],
        torch=torch.__version__,
        deepspeed=_version("deepspeed"),
        transformers=_version("transformers"),
        accelerate=_version("accelerate"),
    )

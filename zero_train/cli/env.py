"""`zero-train env`: what a bug report needs about this machine and environment, as text or JSON.

    zero-train env            # paste into an issue
    zero-train env --json

Versions (torch, DeepSpeed, transformers, accelerate, peft, datasets, ...; from package metadata), the device a
run here uses, CUDA / NCCL / gloo, bf16 (native or emulated), DeepSpeed's ops (pre-built, and JIT-built in
TORCH_EXTENSIONS_DIR with whether the ninja on PATH would rebuild them), CPU flags, cores, memory, and the
environment variables that change what runs. It imports torch, never DeepSpeed or transformers: read, not
loaded, so that it answers in the time torch takes to import.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import pathlib
import platform
import subprocess
import sys
from importlib import metadata

from zero_train import __version__
from zero_train.cli.commands import COMMANDS
from zero_train.runtime.device import launched_device_type
from zero_train.runtime.extensions import built_ops, extensions_dir, ninja_on_path, would_rebuild

PACKAGES = (
    "torch",
    "deepspeed",
    "transformers",
    "accelerate",
    "peft",
    "datasets",
    "tokenizers",
    "safetensors",
    "huggingface_hub",
    "ninja",
)
ENV_PREFIXES = ("ZT_", "DS_", "NCCL_", "HF_", "TRANSFORMERS_", "CUDA_", "OMP_", "TORCH_", "ACCELERATE_")
REPORT_CPU_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
)
GB = 1e9


def env_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `env`."""
    parser = subparsers.add_parser("env", help=COMMANDS["env"], description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=env_command, uses_deepspeed=False)  # it reports DS_ACCELERATOR as it is
    return parser


def env_command(args: argparse.Namespace) -> int:
    """Print the report."""
    report = collect()
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def collect() -> dict:
    """Everything the report shows, JSON-ready."""
    return dict(
        zero_train=dict(version=__version__, path=str(pathlib.Path(__file__).resolve().parents[1])),
        python=dict(
            version=platform.python_version(), executable=sys.executable, platform=platform.platform()
        ),
        packages={name: _version(name) for name in PACKAGES},
        torch=torch_report(),
        cpu=cpu_report(),
        memory=memory_report(),
        deepspeed_ops=deepspeed_ops_report(),
        environment={k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    )


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def torch_report() -> dict:
    """Device, CUDA / NCCL / gloo, bf16 as a run here would see them."""
    import torch
    import torch.distributed as dist

    from zero_train.bench.machine import bf16_emulated_on_cpu

    cuda = torch.cuda.is_available()
    gpus = [
        dict(
            name=torch.cuda.get_device_name(i),
            capability=".".join(map(str, torch.cuda.get_device_capability(i))),
            memory_gb=round(torch.cuda.get_device_properties(i).total_memory / GB, 1),
        )
        for i in range(torch.cuda.device_count() if cuda else 0)
    ]
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda and dist.is_nccl_available() else None
    if cuda:
        bf16 = "native" if torch.cuda.is_bf16_supported(including_emulation=False) else "emulated"
    else:
        bf16 = "emulated (no AVX512-BF16 / AMX-BF16)" if bf16_emulated_on_cpu() else "native"
    return dict(
        device=launched_device_type(),
        cuda_build=torch.version.cuda,
        cuda_available=cuda,
        gpus=gpus,
        nccl=nccl,
        gloo=dist.is_gloo_available(),
        mpi=dist.is_mpi_available(),
        bf16=bf16,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        threads=torch.get_num_threads(),
    )


def cpu_report() -> dict:
    """Model, the flags that decide matmul speed, cores (all, and the ones this process may use)."""
    from zero_train.bench.machine import cpu_model  # torch

    flags: set[str] = set()
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.exists():
        line = next((x for x in cpuinfo.read_text().splitlines() if x.startswith("flags")), "flags:")
        flags = set(line.split(":", 1)[1].split())
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return dict(
        model=cpu_model(),
        machine=platform.machine(),
        flags=[flag for flag in REPORT_CPU_FLAGS if flag in flags],
        logical_cores=os.cpu_count(),
        usable_cores=usable,
        cgroup_cpu_max=_read("/sys/fs/cgroup/cpu.max"),
    )


def memory_report() -> dict:
    """Total and available memory (/proc/meminfo), the cgroup's limit if any."""
    meminfo = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("MemTotal", "MemAvailable", "SwapTotal"):
            meminfo[key] = round(int(value.split()[0]) * 1024 / GB, 1)
    limit = _read("/sys/fs/cgroup/memory.max")
    return dict(
        total_gb=meminfo.get("MemTotal"),
        available_gb=meminfo.get("MemAvailable"),
        swap_gb=meminfo.get("SwapTotal"),
        cgroup_limit_gb=round(int(limit) / GB, 1) if limit and limit.isdigit() else limit,
    )


def deepspeed_ops_report() -> dict:
    """Ops installed pre-built with DeepSpeed, and JIT-built ones in TORCH_EXTENSIONS_DIR (up to date for the
    ninja on PATH, or how many build steps their first load would run)."""
    ninja = ninja_on_path()
    jit = {
        name: (
            "up to date"
            if not (steps := would_rebuild(folder, ninja))
            else f"would rebuild ({len(steps)} steps)"
        )
        if ninja
        else "no ninja on PATH"
        for name, folder in built_ops().items()
    }
    return dict(
        prebuilt=_prebuilt_ops(),
        extensions_dir=str(extensions_dir()),
        jit_built=jit,
        ninja=str(ninja) if ninja else None,
        ninja_version=_ninja_version(ninja),
    )


def _prebuilt_ops() -> list[str] | None:
    """The ops DeepSpeed's wheel was built with (git_version_info_installed.py, read, not imported)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return None
    info = pathlib.Path(list(spec.submodule_search_locations)[0]) / "git_version_info_installed.py"
    if not info.is_file():
        return None
    for node in ast.parse(info.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "installed_ops":
            return sorted(name for name, built in ast.literal_eval(node.value).items() if built)
    return None


def _ninja_version(ninja: pathlib.Path | None) -> str | None:
    if ninja is None:
        return None
    done = subprocess.run([str(ninja), "--version"], capture_output=True, text=True, timeout=10, check=False)
    return done.stdout.strip() or None


def _read(path: str) -> str | None:
    try:
        return pathlib.Path(path).read_text().strip()
    except OSError:
        return None


def render(report: dict) -> str:
    """The report as indented `key: value` lines under each section, for pasting into an issue."""
    lines = []
    for section, values in report.items():
        lines.append(f"{section}:")
        for key, value in values.items():
            lines.append(f"  {key}: {_shown(value, section)}")
    return "\n".join(lines)


def _shown(value, section: str) -> str:
    if value is None:
        return "not installed" if section == "packages" else "-"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
    return str(value)

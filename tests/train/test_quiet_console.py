"""A quiet console on CPU, `zero-train --version` and `zero-train env`.

1. `zero-train estimate`, `plan`, `config check` and scripts/train.py (the DeepSpeed engine, one process)
   print nothing on stderr with DS_ACCELERATOR unset: no DeepSpeed "Setting accelerator to CPU ... unable to
   detect it", no transformers warning (`loss_type=None ...`), no torch FutureWarning from DeepSpeed's calls;
   and no such line on stdout either. (scripts/demo.sh runs `config`, `estimate`, `profile` and `report`:
   tests/cli/test_profile.py checks profile's stderr the same way.)
2. `zero-train --version` says the version pyproject.toml gives.
3. `zero-train env --json` reports what the sources say (package metadata, /proc/cpuinfo, the ops folder)
   without importing DeepSpeed or transformers.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from importlib import metadata

import pytest

pytestmark = pytest.mark.tier("slow")

REPO = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "zero_train.cli.main"]
TRAIN = [sys.executable, "scripts/train.py", "--model", "tiny", "--max-steps", "2", "--block-size", "32",
         "--eval-batches", "1", "--no-progress"]  # fmt: skip
COMMANDS = {
    "estimate": [*CLI, "estimate", "--model", "tiny", "--world-size", "2", "--device", "cpu"],
    "plan": [*CLI, "plan", "--model", "tiny", "--gpus-per-node", "2", "--gpu-memory", "1", "--host-memory", "8",
             "--global-batch-size", "4", "--block-size", "32", "--device", "cpu"],
    "config check": [*CLI, "config", "check", "ds_configs/zero3_hf_auto.json"],
    "train.py deepspeed": [*TRAIN, "--engine", "deepspeed"],
}  # fmt: skip
NOISE = (
    "Setting accelerator",
    "[transformers]",
    "Warning:",
    "warnings.warn",
    "Attempting to get learning rate",
)


@pytest.fixture(scope="module")
def outputs() -> dict[str, subprocess.CompletedProcess]:
    """Every command run once, two at a time, with DS_ACCELERATOR unset (tests/conftest.py sets it)."""
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    results = {}
    names = list(COMMANDS)
    for pair in (names[i : i + 2] for i in range(0, len(names), 2)):
        procs = {name: subprocess.Popen(COMMANDS[name], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True) for name in pair}  # fmt: skip
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=600)
            results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return results


@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_accelerator_or_transformers_warning_on_cpu(outputs, name):
    done = outputs[name]
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""
    assert not [line for line in done.stdout.splitlines() if any(noise in line for noise in NOISE)]


def test_version_is_the_projects():
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    done = subprocess.run([*CLI, "--version"], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout == f"zero-train {version}\n"


def test_env_reports_what_the_sources_say_without_importing_deepspeed():
    from zero_train.bench.machine import cpu_model
    from zero_train.runtime.extensions import built_ops

    probe = (
        "import json, sys; from zero_train.cli.env import collect; report = collect(); "
        "print(json.dumps([report, sorted({'deepspeed', 'transformers'} & set(sys.modules))]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    report, heavy = json.loads(done.stdout)
    assert heavy == []  # read from metadata and files, never imported
    for name in ("torch", "deepspeed", "transformers", "accelerate", "datasets"):
        assert report["packages"][name] == metadata.version(name)
    cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
    flags = set(next(line for line in cpuinfo.splitlines() if line.startswith("flags")).split(":")[1].split())
    assert set(report["cpu"]["flags"]) == flags & {"avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16",
                                                   "avx512_fp16", "amx_tile", "amx_bf16"}  # fmt: skip
    assert report["cpu"]["model"] == cpu_model() and report["cpu"]["logical_cores"] == os.cpu_count()
    native = bool({"avx512_bf16", "amx_bf16"} & flags)
    if not report["torch"]["cuda_available"]:
        assert report["torch"]["bf16"] == ("native" if native else "emulated (no AVX512-BF16 / AMX-BF16)")
    assert report["torch"]["gloo"] is True and report["torch"]["device"] in ("cpu", "cuda")
    assert set(report["deepspeed_ops"]["jit_built"]) == set(built_ops())
    assert report["memory"]["total_gb"] > 0
    text = subprocess.run([*CLI, "env"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert f"  deepspeed: {metadata.version('deepspeed')}" in text and "  bf16: " in text

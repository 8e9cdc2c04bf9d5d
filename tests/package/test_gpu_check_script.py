"""scripts/gpu_check.sh on a CPU-only machine: a shim that installs the wheel folder without the network, then
runs `zero-train gpu-check` from the checkout (a recording python stands in for the interpreter)."""

from __future__ import annotations

import os
import subprocess

import pytest

pytestmark = pytest.mark.tier("slow")

RECORDER = """#!/usr/bin/env bash
{ printf '%s' "$(basename "$0")"; printf '\\x1f%s' "$@"; printf '\\n'; } >> "$FAKE_CALLS"
"""


def test_gpu_check_sh_installs_the_wheels_then_runs_gpu_check(repo_root, tmp_path):
    """With ZT_WHEELS it installs DeepSpeed from that folder (pip --no-index), then runs `zero-train gpu-check`
    with the flags given (--out by default); every flag parses with our parser."""
    from zero_train.cli.main import build_parser

    assert subprocess.run(["bash", "-n", str(repo_root / "scripts" / "gpu_check.sh")]).returncode == 0
    fake_python = tmp_path / "python"
    fake_python.write_text(RECORDER)
    fake_python.chmod(0o755)
    calls = tmp_path / "calls"
    env = dict(
        os.environ, ZT_PYTHON=str(fake_python), ZT_WHEELS=str(tmp_path / "wheels"), FAKE_CALLS=str(calls)
    )
    script = repo_root / "scripts" / "gpu_check.sh"
    done = subprocess.run(["bash", str(script), "--model", "tiny"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    install, check = [line.split("\x1f")[1:] for line in calls.read_text().splitlines()]
    wheels = str(tmp_path / "wheels")
    assert install == ["-m", "pip", "install", "--quiet", "--no-index", "--find-links", wheels, "deepspeed"]
    assert check[:3] == ["-m", "zero_train.cli.main", "gpu-check"]
    args = build_parser(check[2:]).parse_args(check[2:])
    assert (args.model, str(args.out), args.cpu) == ("tiny", "runs/gpu_check", False)

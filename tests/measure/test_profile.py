"""`zero-train profile` end to end: a tiny matrix through the real launcher and scripts/train.py.

Two cells at world size 1 in fp16 through the real launcher: ddp (our engine scales the loss) succeeds;
the DeepSpeed ZeRO-1 cell runs a train script that dies for `--engine ds1` (the profile command's own
`--train-script` hook), which must be recorded with its error line, not fatal. (A real fp16 failure would
depend on the CPU: DeepSpeed runs fp16 on CPUs whose oneDNN has fp16 kernels, e.g. AVX512-FP16.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from zero_train.launch.cells import last_error_line
from zero_train.memory.record import CATEGORIES, load_record, load_records

pytestmark = pytest.mark.tier("slow")

FAILING_FOR_DEEPSPEED = """
import runpy, sys
if sys.argv[sys.argv.index("--engine") + 1] == "ds1":
    sys.exit("error: deepspeed cell broken on purpose")
runpy.run_module("zero_train.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.tier("multiproc")
def test_profile_records_every_cell_and_survives_a_failing_one(tmp_path):
    out = tmp_path / "profile"
    script = tmp_path / "train_failing_for_deepspeed.py"
    script.write_text(FAILING_FOR_DEEPSPEED)
    argv = ["--model", "tiny", "--world-sizes", "1", "--engines", "ddp,ds1", "--precision", "fp16",
            "--steps", "2", "--block-size", "32", "--out", str(out), "--train-script", str(script)]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "zero_train.cli.main", "profile", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"
        },  # as a user's shell (conftest sets it)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Setting accelerator" not in proc.stderr and "transformers" not in proc.stderr  # a quiet console
    ddp = load_record(out / "cells" / "ddp-w1-fp16.json")
    failed = load_record(out / "cells" / "ds1-w1-fp16.json")
    assert ddp["error"] is None and ddp["engine"] == "ddp" and ddp["steps"] == 2
    rank = ddp["ranks"][0]
    assert sum(rank["categories"][c] for c in CATEGORIES) == rank["allocator_bytes"]
    model_states = sum(
        rank["categories"][c] for c in ("params", "grads", "master_params", "optimizer_states")
    )
    assert model_states == pytest.approx(
        16 * ddp["num_params"], rel=0.02
    )  # fp16 params+grads, fp32 master+Adam
    assert failed["error"] == "exit code 1: error: deepspeed cell broken on purpose"
    assert failed["engine"] == "ds1" and failed["zero_stage"] == 1 and failed["ranks"] == []
    assert json.loads((out / "configs" / "ds1-w1-fp16.json").read_text())["zero_optimization"]["stage"] == 1
    assert len(load_records(out)) == 2
    assert "FAILED" in proc.stdout and "ds1-w1-fp16" in proc.stdout


@pytest.mark.tier("quick")
def test_last_error_line_prefers_the_error():
    log = "starting\n[rank0]: ValueError: Type fp16 is not supported\nexiting with code 1\n"
    assert last_error_line(log) == "[rank0]: ValueError: Type fp16 is not supported"
    assert last_error_line("a\nb\n") == "b"
    assert last_error_line("") == "no output"


def test_unknown_engine_is_a_usage_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "zero_train.cli.main", "profile", "--model", "tiny", "--engines", "ddp,fsdp",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "unknown engine(s) fsdp" in proc.stderr

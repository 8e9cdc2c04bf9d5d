"""`zero-train profile`'s own rules: the exit code, the error line it keeps, an unknown engine.

Its end-to-end run (fp16 at 1 rank through the real deepspeed launcher, a ds1 cell whose train script dies)
is tests/report/test_report.py::test_profile_records_every_cell_and_survives_a_failing_one: that file's
report lists the same run's failed cell, so the run is launched once for both.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zero_train.launch.cells import last_error_line

pytestmark = pytest.mark.tier("slow")


@pytest.mark.tier("quick")
def test_the_profile_fails_only_when_every_cell_failed(tmp_path, monkeypatch):
    """A failed cell among good ones is recorded and the profile exits 0; every cell failed is exit 1 (the
    real failing cell and its record: test_report.py's run)."""
    from zero_train.cli import profile
    from zero_train.cli.main import build_parser
    from zero_train.memory.record import error_record

    def run_cell(engine: str, world_size: int, args, out, meta) -> dict:
        return error_record(
            "exit code 1: boom" if engine == "ds1" else None, engine=engine, world_size=world_size
        )

    monkeypatch.setattr(profile, "run_cell", run_cell)
    monkeypatch.setattr(profile, "_model_meta", lambda args: {})  # no model read
    monkeypatch.setattr(profile, "_summary_line", lambda record: record["engine"])
    for engines, code in (("ddp,ds1", 0), ("ds1", 1)):
        argv = ["profile", "--model", "tiny", "--world-sizes", "1", "--engines", engines,
                "--out", str(tmp_path / engines)]  # fmt: skip
        args = build_parser(argv).parse_args(argv)
        assert args.func(args) == code, engines


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


def test_one_launch_per_world_size_records_each_cell_as_its_own_launch_would(tmp_path):
    """--launch once under DeepSpeed's launcher (its --local_rank flag reaches the worker): DDP, our ZeRO-1 and
    DeepSpeed ZeRO-2 on 2 ranks in one launch, each with its own run record, whose fp32 model states are the
    paper's 16 and 4 + 4 + 8/2 bytes per parameter, whose peak less its own "other" is our peak model's within 10%
    (the memory matrix's goal for such small models); and DeepSpeed built none of its CPU ops (its shared-memory
    collectives serve inference only)."""
    import json

    from zero_train.report.compare import compare_cell
    from zero_train.report.models import model_facts

    extensions = tmp_path / "extensions"
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions), OMP_NUM_THREADS="1")
    # 4 steps, not 2: the CPU peak is sampled (memory.measure: a lower bound), and on a loaded 2-core machine the
    # measured peak of zero1 once came out 25% under ours in a clean-clone CI (not reproduced alone or under load in
    # 10 runs; most likely the sampler missing the brief loss temporaries in both steps); the run's peak is the
    # highest of its steps
    proc = subprocess.run(
        [sys.executable, "-m", "zero_train.cli.main", "profile", "--model", "tiny", "--world-sizes", "2",
         "--engines", "ddp,zero1,ds2", "--launch", "once", "--steps", "4", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    plans = list((tmp_path / "out" / "configs").glob("plan-w2-*.json"))
    assert [p.name for p in plans] == ["plan-w2-0.json"]  # one launch
    per_param = {}
    for engine in ("ddp", "zero1", "ds2"):
        record = json.loads((tmp_path / "out" / "cells" / f"{engine}-w2-fp32.json").read_text())
        assert record["error"] is None and record["world_size"] == 2
        states = sum(record["ranks"][0]["categories"][c] for c in ("params", "grads", "master_params",
                                                                    "optimizer_states"))  # fmt: skip
        per_param[engine] = states / record["num_params"]
        facts = model_facts(record["model"], record["num_params"], record.get("lora"))
        assert abs(compare_cell(record, facts)["peak"]["ratio_without_other"] - 1) <= 0.10, engine
    assert per_param["ddp"] == pytest.approx(16, rel=1e-3) and per_param["zero1"] == pytest.approx(
        12, rel=1e-2
    )
    assert not list(extensions.glob("*/*.so"))  # no op built

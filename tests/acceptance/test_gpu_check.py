"""`zero-train gpu-check --cpu`: the acceptance run on 2 gloo ranks, launched once (tests/acceptance covers
zero_train/acceptance and zero_train/cli/gpu_check.py).

The one run trains every engine of the registry (and the Trainer peers) in one launch, plus one launch at one
rank; its JSON must hold >= 30 checks, every engine among them, none failed. Then a planted failure (one loss
of a resumed run moved by 1e-3) must make `--checks-only` on the same directory exit 1, naming that check.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import subprocess

import pytest

from zero_train.bench.cells import BENCH_REGISTRY
from zero_train.registry import engine_names

pytestmark = pytest.mark.tier("slow")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _gpu_check(*argv: str) -> subprocess.CompletedProcess:
    """`zero-train gpu-check --cpu ARGV` in this process: what is checked is what its ranks and its checks do, and a
    fresh interpreter for the command would only add its imports (~5 CPU-s). The environment it sets (offline,
    ZT_DEVICE) is restored after; the ranks it launches import this checkout."""
    from zero_train.cli.main import main

    stdout, stderr, environment, cwd = io.StringIO(), io.StringIO(), dict(os.environ), os.getcwd()
    code = 0
    try:  # os.chdir, not contextlib.chdir: the project supports Python 3.10
        os.environ["PYTHONPATH"] = str(ROOT)
        os.chdir(ROOT)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            main(["gpu-check", "--cpu", *argv])
    except SystemExit as end:
        code = end.code
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environment)
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    done = _gpu_check("--out", str(out))
    return out, done


def test_every_engine_passes_every_check_it_can_run_here(checked):
    out, done = checked
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "gpu_check.json").read_text())
    checks = result["checks"]
    assert [check for check in checks if check["passed"] is False] == []
    asserted = [check for check in checks if check["kind"] == "assert" and check["passed"]]
    assert len(asserted) >= 30
    engines = {check["engine"] for check in asserted}
    assert set(engine_names()) <= engines
    assert {name for name, bench in BENCH_REGISTRY.items() if bench.peer and name in engines}
    for engine in engine_names():  # each engine matched DDP, resumed exactly, exported DDP's weights
        names = {check["name"] for check in asserted if check["engine"] == engine}
        assert {"trains fp32", "exact resume from step 2", "export loads, weights vs ddp's"} <= names, engine
        assert engine == "ddp" or "fp32 losses vs ddp" in names, engine
    margin = [check for check in checks if check["name"].startswith("GPU margin")]
    assert margin and all(check["value"] == "cannot run here" for check in margin)  # listed, never dropped
    assert (out / "gpu_check.md").read_text().startswith("# zero-train gpu-check: CPU")


def test_a_planted_failure_exits_1_and_names_its_check(checked):
    out, _ = checked
    metrics = out / "runs" / "zero1-resume.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    step_line = next(line for line in lines if "step_time_s" in line)
    step_line["loss"] += 1e-3
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = _gpu_check("--out", str(out), "--checks-only")
    assert done.returncode == 1, done.stderr[-2000:]
    result = json.loads((out / "gpu_check.json").read_text())
    failed = [(check["name"], check["engine"]) for check in result["checks"] if check["passed"] is False]
    assert failed == [("exact resume from step 2", "zero1")]
    assert result["failed"] == 1


@pytest.mark.tier("quick")
@pytest.mark.parametrize(
    "argv, words",
    [(["--steps", "2"], "at least 3 steps"), (["--checks-only"], "holds no runs/")],
)
def test_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, argv, words):
    from zero_train.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["gpu-check", "--cpu", "--out", str(tmp_path / "out"), *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err

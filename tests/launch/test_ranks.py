"""`zero-train train --nproc-per-node 2` (zero_train.cli.train, zero_train.launch.ranks): real launches, 2 CPU ranks.

- a normal run under torchrun prints under 15 lines in all (launcher banners included) and exits 0;
- a usage error the plan finds (a block size above the model's context) is one line and exit 2 before any rank
  starts, under torchrun and under DeepSpeed's launcher, in under 10 CPU-seconds each (`deepspeed` itself
  imports DeepSpeed twice before a rank starts and finds it);
- an error only the ranks find (a broken jsonl line) is their one line and exit 2: no torchrun ChildFailedError
  report (which `torchrun` itself prints for any failed rank), no agent log lines.
"""

from __future__ import annotations

import os
import pathlib
import resource
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tier("slow")

TINY = ["--model", "tiny", "--block-size", "32", "--max-steps", "2", "--no-progress"]
TOO_LONG = ["--model", "tiny", "--block-size", "99999", "--max-steps", "2"]
LIMIT_S = 240  # a launch of two tiny ranks takes 20-60 s on 2 loaded cores


def _zero_train(*argv: str, cwd: pathlib.Path) -> tuple[subprocess.CompletedProcess, float]:
    """The command's result and the CPU seconds it and its children used (the machine's load aside)."""
    started = _children_cpu_s()
    done = subprocess.run(
        [sys.executable, "-m", "zero_train.cli.main", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=LIMIT_S,
        env=dict(os.environ, COLUMNS="200"),
    )
    return done, _children_cpu_s() - started


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]


def test_a_normal_two_rank_run_prints_under_15_lines(tmp_path):
    done, _ = _zero_train(
        "train", "--nproc-per-node", "2", "--engine", "zero2", *TINY, "--output-dir", "run", cwd=tmp_path
    )
    lines = _lines(done)
    assert done.returncode == 0, "\n".join(lines[-30:])
    assert len(lines) < 15, "\n".join(lines)
    assert lines[0].startswith("zero_train: engine zero2 |") and lines[-1].startswith("done: 2 steps")
    assert sum(line.startswith("step ") for line in lines) == 2


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_a_usage_error_is_one_line_before_any_rank_starts(tmp_path, launcher):
    done, cpu_s = _zero_train(
        "train", "--nproc-per-node", "2", "--launcher", launcher, "--engine", "ds2", *TOO_LONG, cwd=tmp_path
    )
    assert done.returncode == 2
    assert _lines(done) == [
        "error: --block-size 99999 is above the model's context of 256 tokens; use --block-size 256 or less"
    ]
    assert cpu_s < 10  # one plan: docs/launch.md#zero-train-train---nproc-per-node


def test_an_error_the_ranks_find_is_their_line_and_exit_2_without_torchrun_s_report(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"text": "def f():\\n    return 1\\n"}\n{"text": broken\n')
    flags = ["--engine", "zero1", *TINY, "--dataset", "data.jsonl"]
    done, _ = _zero_train("train", "--nproc-per-node", "2", *flags, cwd=tmp_path)
    errors = [line for line in _lines(done) if line.startswith("error: ")]
    assert done.returncode == 2, "\n".join(_lines(done)[-30:])
    assert errors == [  # both ranks found it; one says it (runtime.errors.SAID_ENV)
        "error: dataset 'data.jsonl' line 2: not JSON (Expecting value, column 10); fix or remove the line"
    ]
    assert all(line.startswith(("error: ", "zero_train: ")) for line in _lines(done)), "\n".join(_lines(done))

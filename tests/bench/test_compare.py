"""`zero-train bench --launch compare`: one launch against a launch per run.

The verdict arithmetic against hand-computed numbers, and one real comparison of a tiny model (ddp and zero1,
fp32, one repeat: one launch of both runs and a launch of each) whose per-step bytes on the wire must be the
same both ways, byte for byte, and whose peak memory per rank, reported for a run of the one launch minus what
the runs before it left behind, must be what that run measured in its own launch. Step times are not asserted
(noisy); the bench reports them. Each launch's ranks are forked from the preloaded forkserver rather than
started by a launcher (tests/bench/test_bench.py runs the bench through the launcher).
"""

from __future__ import annotations

import json
import math
import os
import statistics

import pytest

from zero_train.bench.compare import cell_noise, check_table, launch_check, run_noise
from zero_train.bench.summary import target_ratios
from zero_train.launch.command import TRAIN_MODULE

pytestmark = pytest.mark.tier("quick")


def run_bench(argv: list[str]) -> int:
    """scripts/bench.py's command in this process (the runs are launched as the script launches them; the
    script's own interpreter and imports are spared); the environment it sets is restored after."""
    from zero_train.cli.bench import BENCH_SAMPLER_DUTY, add_bench_flags, bench_command
    from zero_train.memory.measure import SAMPLER_DUTY_ENV
    from zero_train.runtime.parser import OneLineParser

    parser = OneLineParser(prog="bench.py")
    add_bench_flags(parser)
    with pytest.MonkeyPatch.context() as patch:  # the sampler duty bench_command sets, unset again after
        patch.setenv(SAMPLER_DUTY_ENV, os.environ.get(SAMPLER_DUTY_ENV, str(BENCH_SAMPLER_DUTY)))
        return bench_command(parser.parse_args(argv))


def sample(engine: str, repeat: int, steps: list[float], warmup: int = 1) -> dict:
    measured = steps[warmup:]
    return dict(cell=f"{engine}-fp32", engine=engine, precision="fp32", repeat=repeat, error=None,
                step_times_s=steps, warmup=warmup, median_step_s=statistics.median(measured))  # fmt: skip


def test_step_noise_is_the_coefficient_of_variation_after_warm_up():
    assert run_noise(sample("ddp", 0, [9.0, 1.0, 2.0, 3.0])) == pytest.approx(statistics.stdev([1, 2, 3]) / 2)
    assert run_noise(sample("ddp", 0, [9.0, 1.0])) is None  # one measured step: no noise estimate
    assert run_noise(dict(sample("ddp", 0, [1.0, 1.0, 1.0]), error="exit code 1")) is None
    runs = [
        sample("ddp", 0, [9.0, 1.0, 1.0]),
        sample("ddp", 1, [9.0, 1.0, 3.0]),
        sample("ddp", 2, [9.0, 2.0, 2.2]),
    ]
    cvs = sorted(run_noise(s) for s in runs)
    assert cell_noise(runs) == {"ddp-fp32": cvs[1]}


def test_ratios_agree_within_the_step_noise_and_differ_beyond_it():
    # zero1's median step: 1.00 in one launch, 1.03 per run (-2.9%); ddp's 2.00 both ways. Step noise: zero1's
    # runs have cv 0.071 and 0.069, ddp's 0.071: 0.099 for the ratio, so the 2.9% agree.
    def runs(zero1_steps):
        return [sample("zero1", 0, [5.0, *zero1_steps]), sample("ddp", 0, [5.0, 1.9, 2.1])]

    once, per_run = runs([0.95, 1.05]), runs([0.98, 1.08])
    targets = [target_ratios(s, {}, ["fp32"]) for s in (once, per_run)]
    check = launch_check(once, per_run, *targets)
    row = next(r for r in check["ratios"] if r["name"] == "zero1 / ddp step time")
    assert (row["once"], row["per_run"]) == (pytest.approx(0.5), pytest.approx(1.03 / 2))
    assert row["difference"] == pytest.approx(0.5 / (1.03 / 2) - 1)  # -2.9%
    cv_zero1 = statistics.median(
        [statistics.stdev(s) / statistics.mean(s) for s in ([0.95, 1.05], [0.98, 1.08])]
    )
    cv_ddp = statistics.stdev([1.9, 2.1]) / 2.0
    assert row["noise"] == pytest.approx(math.hypot(cv_zero1, cv_ddp))  # 0.089
    assert row["agree"] is True and check["agree"] is True
    cell = next(c for c in check["cells"] if c["cell"] == "zero1-fp32")
    assert cell["agree"] is True and cell["difference"] == pytest.approx(1 / 1.03 - 1)

    slow = runs([1.19, 1.21])  # per run 20% slower, with little noise of its own
    check = launch_check(once, slow, targets[0], target_ratios(slow, {}, ["fp32"]))
    row = next(r for r in check["ratios"] if r["name"] == "zero1 / ddp step time")
    assert row["agree"] is False and check["agree"] is False
    assert (
        "**differ**" in "\n".join(check_table(check)) and "Not every verdict agrees" in check_table(check)[0]
    )
    assert not any(r["name"].startswith("zero1 / ds1") for r in check["ratios"])  # no ds1 cell: no row


def launch_in_forked_ranks(
    args, argv, log_path, *, module=TRAIN_MODULE, script=None, done_files=None
) -> int | None:
    """zero_train.bench.ranks.launch without a launcher: the module's main (train.py's, or the bench worker's
    for the one launch) with the same argv in --world-size fresh ranks forked from this process's preloaded
    forkserver; each launch gets ranks of its own, so each run's peak and baseline are its own launch's."""
    from zero_train.bench.one_launch import WORKER_MODULE
    from zero_train.testing.console import bench_worker_py, forked_launch, train_py

    assert script is None, script
    rank_main = {TRAIN_MODULE: train_py, WORKER_MODULE: bench_worker_py}[module]
    return forked_launch(rank_main, args.world_size, argv, log_path, timeout_s=args.timeout)


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    from zero_train.bench import ranks

    out = tmp_path_factory.mktemp("compare")
    argv = ["--model", "tiny", "--engines", "ddp,zero1", "--precisions", "fp32", "--repeats", "1", "--steps", "3",
            "--warmup", "1", "--block-size", "32", "--launch", "compare", "--out", str(out)]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ranks, "launch", launch_in_forked_ranks)
        assert run_bench(argv) == 0
    return json.loads((out / "bench.json").read_text()), (out / "bench.md").read_text(), out


@pytest.mark.tier("slow")
def test_compare_runs_every_cell_both_ways_with_the_same_bytes_and_peaks(compared):
    result, markdown, out = compared
    per_run = result["launch_check"]["per_run"]["samples"]
    assert [(s["cell"], s["error"]) for s in result["samples"]] == [("ddp-fp32", None), ("zero1-fp32", None)]
    assert [(s["cell"], s["error"]) for s in per_run] == [("ddp-fp32", None), ("zero1-fp32", None)]
    assert "teardown" in result["samples"][1] and "teardown" not in per_run[1]  # one launch vs its own
    assert (out / "once" / "plan-r0-0.json").exists() and (
        out / "per-run" / "logs" / "ddp-fp32-r0.log"
    ).exists()
    for once_run, own_run in zip(result["samples"], per_run, strict=True):
        for rank_once, rank_own in zip(once_run["ranks"], own_run["ranks"], strict=True):
            assert rank_once["comm_bytes_per_step"] == rank_own["comm_bytes_per_step"]
            # the run after ddp, minus what ddp left behind, peaks where its own launch did (CPU allocator)
            assert rank_once["peak_bytes"] == pytest.approx(rank_own["peak_bytes"], rel=0.10)
    wire = next(r for r in result["launch_check"]["ratios"] if r["what"] == "wire")
    assert wire["difference"] == 0 and wire["agree"] is True
    steps = [r for r in result["launch_check"]["ratios"] if r["what"] == "step"]
    assert [r["name"] for r in steps] == ["zero1 / ddp step time"] and steps[0]["noise"] > 0
    assert "### One launch vs a launch per run" in markdown and "| zero1-fp32 |" in markdown

"""`zero-train bench` plumbing: real runs of a tiny model through the launcher, numbers read back, no timing.

One bench of 10 runs in ONE launch (ddp, zero1, zero2 and the HF Trainer peer with DeepSpeed ZeRO-1 twice,
FSDP2 at stage 2 and 3 once; fp32; 2 steps) checks that every engine is torn down (the second repeat leaves no
more memory behind than the first did, well under one fp32 copy of the model), the JSON cells, that every number
that must be positive is, and that the bytes per step are what the model's size says: the ZeRO paper's 2 Psi (as
a 2-rank ring sends it: Psi elements per rank) plus, exactly, the few words every step agrees on, for DDP and our
ZeRO-1 and ZeRO-2; DeepSpeed's all-reduce + all-gather of Psi each; FSDP2's reduce-scatter of Psi and
all-gathers of Psi (stage 2) or 2 Psi (stage 3). Timings are never compared here (noisy); only the benchmark
compares them.
"""

from __future__ import annotations

import argparse
import json
import os

import pytest

from zero_train.bench.cells import Cell, interleaved
from zero_train.bench.machine import CPU_FLAGS
from zero_train.bench.summary import WIRE_TOLERANCE, target_ratios
from zero_train.bench.targets import TARGET_ENGINES
from zero_train.cli.bench import bench_command
from zero_train.hf.models import build_model, model_config
from zero_train.runtime.errors import UsageError

pytestmark = pytest.mark.tier("multiproc")


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


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = ["--model", "tiny", "--engines", "ddp,zero1,zero2,hf-ds1,fsdp2-z2,fsdp2-z3", "--precisions", "fp32",
            "--repeats", "2", "--steps", "2", "--warmup", "1", "--block-size", "32", "--out", str(out)]  # fmt: skip
    assert run_bench(argv) == 0
    return json.loads((out / "bench.json").read_text()), (out / "bench.md").read_text()


def test_every_cell_ran_and_reports_positive_numbers(tiny_bench):
    result, _ = tiny_bench
    engines = ["ddp", "zero1", "zero2", "hf-ds1", "fsdp2-z2", "fsdp2-z3"]
    assert [c["cell"] for c in result["cells"]] == [f"{engine}-fp32" for engine in engines]
    for cell in result["cells"]:
        repeats = 2 if cell["engine"] in TARGET_ENGINES else 1  # the others: --other-repeats
        assert cell["runs"] == repeats, cell
        assert cell["errors"] == [], cell["errors"]
        assert cell["step_time_s"]["median"] > 0 and cell["tokens_per_s"]["median"] > 0
        assert len(cell["peak_bytes"]) == 2 and min(cell["peak_bytes"]) > 0
    assert len(result["samples"]) == sum(cell["runs"] for cell in result["cells"]) and all(
        len(s["step_times_s"]) == 2 for s in result["samples"]
    )
    assert result["machine"]["logical_cpus"] >= 1 and result["machine"]["torch"]
    assert set(result["machine"]["cpu_flags"]) <= set(CPU_FLAGS)


def test_one_launch_tears_every_engine_down(tiny_bench):
    result, _ = tiny_bench
    samples = result["samples"]
    assert result["meta"]["launch"] == "once" and all("teardown" in s for s in samples)
    baseline = samples[0]["teardown"]["baseline_bytes"]
    assert all(s["teardown"]["baseline_bytes"] == baseline for s in samples)  # one launch, one baseline
    residue = [[a - b for a, b in zip(s["teardown"]["after_bytes"], baseline, strict=True)] for s in samples]
    first_repeat_end, second_repeat_end = residue[5], residue[9]  # 6 engines in repeat 0, the 4 targets' in 1
    one_model_copy = 4 * result["meta"]["num_params"]  # a leaked engine holds at least 16 B/param
    for rank in range(2):
        assert second_repeat_end[rank] - first_repeat_end[rank] < one_model_copy, residue
        # a run's peak is reported without what earlier runs left behind
        assert all(samples[k + 1]["residue_before_bytes"][rank] == residue[k][rank] for k in range(9))


def test_bytes_per_step_are_the_models_size(tiny_bench):
    result, _ = tiny_bench
    psi_bytes = 4 * result["meta"]["num_params"]  # fp32; a 2-rank ring sends Psi of the paper's 2 Psi
    cells = {c["engine"]: c["comm"] for c in result["cells"]}
    assert cells["ddp"]["payload"]["all_reduce"] == psi_bytes  # DDP's buckets: every parameter once
    assert cells["zero1"]["payload"]["send_recv"] == 2 * psi_bytes  # both ends of each message, no padding
    assert cells["zero2"]["payload"]["send_recv"] == 2 * psi_bytes  # the buckets to their owners + all-gather
    # our sharders agree on the step in one small all-reduce: a has-gradient flag per tensor and the sum of squares
    # (float64 words); the training loop all-gathers its step record (loss, memory, save flag)
    tensors = sum(1 for p in build_model(model_config("tiny")).parameters() if p.requires_grad)
    agreement = {"ddp": 0, "zero1": 8 * (tensors + 1), "zero2": 8 * (tensors + 1)}
    step_record = cells["ddp"]["wire"]["all_gather"]
    assert 0 < step_record <= 64
    for engine in ("ddp", "zero1", "zero2"):
        assert cells[engine]["paper_wire"] == psi_bytes
        assert cells[engine]["wire"]["all_gather"] == step_record
        if engine != "ddp":
            assert cells[engine]["wire"]["all_reduce"] == agreement[engine]
        assert cells[engine]["wire"]["total"] == psi_bytes + agreement[engine] + step_record
        assert agreement[engine] <= WIRE_TOLERANCE * psi_bytes  # what the bench's wire target allows
    deepspeed = cells["hf-ds1"]["payload"]  # ZeRO-1 on CPU: all-reduce the gradients, all-gather partitions
    assert deepspeed["all_reduce"] == pytest.approx(psi_bytes, rel=1e-3)
    assert deepspeed["all_gather"] == pytest.approx(psi_bytes, rel=1e-3)
    assert cells["hf-ds1"]["wire_vs_paper"] == pytest.approx(1.5, rel=1e-3)
    # FSDP2 (no padding: every dim 0 of tiny is even): the gradients reduce-scattered once in fp32 (an all-reduce
    # on gloo, so Psi sent at N = 2), the parameters all-gathered once (stage 2) or again in backward (stage 3).
    # Its gradient norm's all-reduce (a few bytes) goes through DTensor's C++ functional collectives, which
    # the ledger does not see: the totals below are exact without it.
    step_record_payload = cells["ddp"]["payload"]["all_gather"]
    for engine, gathers, stage in (("fsdp2-z2", 1, 2), ("fsdp2-z3", 2, 3)):
        fsdp = cells[engine]
        assert fsdp["payload"]["reduce_scatter"] == psi_bytes
        assert fsdp["payload"]["all_gather"] == gathers * psi_bytes + step_record_payload
        assert fsdp["wire"]["total"] == psi_bytes + gathers * psi_bytes // 2 + step_record
        assert fsdp["paper_wire"] == (3 if stage == 3 else 2) * psi_bytes // 2
    assert cells["fsdp2-z2"]["wire_vs_paper"] == pytest.approx(
        1.5, rel=1e-3
    )  # 1.0 where reduce-scatter is one
    assert cells["fsdp2-z3"]["wire_vs_paper"] == pytest.approx(4 / 3, rel=1e-3)


def test_targets_and_markdown(tiny_bench):
    result, markdown = tiny_bench
    wire = next(t for t in result["targets"] if t["name"] == "zero1 / ddp wire bytes per step")
    assert wire["by_precision"]["fp32"]["met"]
    step = next(t for t in result["targets"] if t["name"] == "zero1 / ddp step time")
    assert step["by_precision"]["fp32"]["median"] > 0  # a ratio exists; its value is the benchmark's business
    assert "| **zero1 (ours)** |" in markdown and "### Targets" in markdown and "logical CPUs" in markdown


def test_cells_count_host_syncs_and_collectives_in_their_warm_up_step(tiny_bench):
    """--warmup 1: each run counts step 1 only (counting slows a step; docs/gpu.md), logged like every step here;
    the HF Trainer peer writes no counters."""
    result, markdown = tiny_bench
    for cell in result["cells"]:
        counts = cell["per_step"]
        if cell["engine"] == "hf-ds1":
            assert counts is None
            continue
        assert counts["loop_syncs"] == 1 and counts["loop_calls"] == 1  # the step's one read and all_gather
        assert counts["engine_calls"] >= 1
    assert "not counted" in markdown and "collective calls engine / loop" in markdown


@pytest.mark.tier("quick")
def test_interleaving_runs_target_engines_more_and_shuffles_later_repeats():
    cells = [Cell(engine, "fp32") for engine in ("ddp", "zero1", "ds1", "ds2", "ds3", "torch-zero")]
    order = interleaved(cells, [3, 3, 3, 1, 1, 3])
    counts = {cell.engine: sum(1 for _, c in order if c == cell) for cell in cells}
    assert counts == dict(ddp=3, zero1=3, ds1=3, ds2=1, ds3=1, **{"torch-zero": 3})
    assert [c.engine for r, c in order if r == 0] == [c.engine for c in cells]
    later = [[c.engine for r, c in order if r == k] for k in (1, 2)]
    assert later[0] != later[1] and sorted(later[0]) == sorted(["ddp", "zero1", "ds1", "torch-zero"])


@pytest.mark.tier("quick")
def test_ratios_pair_runs_of_the_same_repeat():
    def sample(engine, repeat, median):
        return dict(cell=f"{engine}-fp32", repeat=repeat, error=None, median_step_s=median)

    samples = [sample("zero1", 0, 1.0), sample("ddp", 0, 2.0), sample("zero1", 1, 3.0), sample("ddp", 1, 3.0)]
    rows = {row["name"]: row["by_precision"]["fp32"] for row in target_ratios(samples, {}, ["fp32"])}
    ratio = rows["zero1 / ddp step time"]
    assert (ratio["min"], ratio["median"], ratio["max"], ratio["met"]) == (0.5, 0.75, 1.0, True)
    assert rows["zero1 / ds1 step time"] is None  # no ds1 runs


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(engines=["ddp", "fsdp"]), "unknown engine(s) fsdp"),
        (dict(precisions=["fp8"]), "unknown precision(s) fp8"),
        (dict(warmup=7), "--warmup 7 must be at least 0 and below --steps 7"),
        (dict(bf16_steps=2, bf16_warmup=2), "--bf16-warmup 2 must be at least 0 and below --bf16-steps 2"),
    ],
)
@pytest.mark.tier("quick")
def test_bad_flags_are_usage_errors(flags, message, tmp_path):
    args = dict(
        engines=["ddp"], precisions=["fp32"], warmup=2, steps=7, launcher="torchrun", out=str(tmp_path)
    )
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bench_command(argparse.Namespace(**{**args, **flags}))


@pytest.mark.tier("quick")
@pytest.mark.parametrize("emulated, expected, runs", [(True, (2, 1), 1), (False, (7, 2), 3)])
def test_bf16_runs_take_few_steps_only_where_the_cpu_emulates_bf16(emulated, expected, runs, monkeypatch):
    from zero_train.bench import machine
    from zero_train.bench.cells import Cell, run_argv, steps_of
    from zero_train.bench.targets import TARGET_ENGINES
    from zero_train.cli.bench import _runs_of, resolve_scenario

    monkeypatch.setattr(machine, "bf16_emulated_on_cpu", lambda: emulated)
    args = argparse.Namespace(precisions=["fp32", "bf16"], steps=7, warmup=2, scenario=None, dataset=None,
                              repeats=3, other_repeats=1)  # fmt: skip
    resolve_scenario(args)
    assert _runs_of(Cell("zero1", "bf16"), args, TARGET_ENGINES) == runs
    assert _runs_of(Cell("zero1", "fp32"), args, TARGET_ENGINES) == 3
    assert _runs_of(Cell("fsdp2-z2", "bf16"), args, TARGET_ENGINES) == 1  # in no target (ds3 is, since zero3)
    assert steps_of(Cell("zero1", "bf16"), args) == expected
    assert steps_of(Cell("zero1", "fp32"), args) == (7, 2)
    paths = dict(config="c.json", record="r.json", metrics="m.jsonl")
    argv = run_argv(Cell("ddp", "bf16"), args, paths)
    assert argv[argv.index("--max-steps") + 1] == str(expected[0])


@pytest.mark.tier("quick")
def test_the_targets_table_leaves_out_targets_whose_engines_did_not_run():
    from zero_train.bench.markdown import targets_table

    ran = dict(name="zero3 / ds3 step time", target="<= 0.8", what="step",
               by_precision={"fp32": dict(min=0.5, median=0.6, max=0.7, n=3, met=True)})  # fmt: skip
    absent = dict(name="zero1 / ddp step time", target="<= 1", what="step", by_precision={"fp32": None})
    lines = targets_table([absent, ran], ["fp32"])
    assert lines[2:] == ["| zero3 / ds3 step time | 0.500 / **0.600** / 0.700 (met) | <= 0.8 |"]


@pytest.mark.tier("quick")
def test_a_runs_launch_and_the_one_launch_are_their_launcher_commands(monkeypatch, tmp_path):
    """zero_train.bench.ranks.launch, the seam tests/bench/test_compare.py swaps for forked ranks: a run's own launch
    (train.py, or the Trainer peer's module) runs to its timeout, the one launch of the worker until no run
    finishes for the timeout."""
    from zero_train.bench import ranks
    from zero_train.bench.cells import run_program
    from zero_train.bench.one_launch import WORKER_MODULE

    calls = []
    monkeypatch.setattr(
        ranks,
        "run_logged",
        lambda command, log, *, timeout, done_files: calls.append((command, done_files)) or 0,
    )
    args = argparse.Namespace(launcher="torchrun", world_size=2, timeout=60.0, train_script=None)
    for engine in ("zero1", "hf-ds1"):
        ranks.launch(args, ["--engine", engine], tmp_path / "log", **run_program(Cell(engine, "fp32"), args))
    done = [tmp_path / "run.done.json"]
    ranks.launch(args, ["--plan", "plan.json"], tmp_path / "log", module=WORKER_MODULE, done_files=done)
    assert [(command[1:3], command[5:], watched) for command, watched in calls] == [
        (["--nproc_per_node", "2"], ["-m", "zero_train.train", "--engine", "zero1"], None),
        (["--nproc_per_node", "2"], ["-m", "zero_train.bench.peer_main", "--engine", "hf-ds1"], None),
        (["--nproc_per_node", "2"], ["-m", "zero_train.bench.worker", "--plan", "plan.json"], done),
    ]
    assert all(command[0].endswith("torchrun") and command[3] == "--master_port" for command, _ in calls)

"""`zero-train report` on a real profile: the numbers in summary.json, cells.json and report.md against the
records and against the ZeRO paper's formulas and DeepSpeed's estimators, computed here independently.

One real matrix (model tiny, world sizes 1 and 2, engines ddp, zero1, ds2, fp32) runs once for the module
through `zero-train profile`'s command, each cell's ranks forked from the preloaded forkserver. A second,
tests/cli/test_profile.py's (fp16 at 1 rank, deepspeed launcher: ddp, and a ds1 cell whose train script dies
through --train-script), writes the failed record the report lists with its error (bad input: test_build.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from report_reference import (
    cell_name,
    cell_other_drift,
    comm_paper_unit,
    deepspeed_zero2_bytes,
    our_peak,
    paper_fp32_bytes,
    peak_minus_other,
    table_row,
)

from zero_train.memory.record import (
    CATEGORIES,
    MODEL_STATE_CATEGORIES,
    load_record,
    load_records,
)

pytestmark = pytest.mark.tier("multiproc")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DS1_ERROR = "exit code 1: error: deepspeed cell broken on purpose"
FAILING_FOR_DEEPSPEED = """
import runpy, sys
if sys.argv[sys.argv.index("--engine") + 1] == "ds1":
    sys.exit("error: deepspeed cell broken on purpose")
runpy.run_module("zero_train.train", run_name="__main__", alter_sys=True)
"""


def run_cli(*argv: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zero_train.cli.main", *argv], capture_output=True, text=True, timeout=timeout,
        env=env,
    )  # fmt: skip


def run_failing_fp16_profile(root: pathlib.Path) -> tuple[pathlib.Path, subprocess.CompletedProcess]:
    """tests/cli/test_profile.py's profile: ddp and ds1 at 1 rank in fp16 through the deepspeed launcher,
    ds1's train script dying; run once for both files (the report takes its failed cell)."""
    script = root / "train_failing_for_deepspeed.py"
    script.write_text(FAILING_FOR_DEEPSPEED)
    out = root / "profile-fp16"
    proc = run_cli(
        "profile", "--model", "tiny", "--world-sizes", "1", "--engines", "ddp,ds1", "--precision", "fp16",
        "--steps", "2", "--block-size", "32", "--out", str(out), "--train-script", str(script), timeout=300,
        env={k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"},  # as a user's shell (conftest sets it)
    )  # fmt: skip
    return out, proc


@pytest.fixture(scope="module")
def fp16_profile(tmp_path_factory) -> tuple[pathlib.Path, subprocess.CompletedProcess]:
    return run_failing_fp16_profile(tmp_path_factory.mktemp("profile-fp16"))


def launch_in_forked_ranks(argv: list[str], world_size: int, args, log_path: pathlib.Path) -> int | None:
    """zero_train.cli.profile.launch_cell without a launcher: the cell's train.py main (the same argv) in
    `world_size` fresh ranks forked from this process's preloaded forkserver, one rank group per cell."""
    from zero_train.testing.console import forked_launch, train_py

    return forked_launch(train_py, world_size, argv, log_path, timeout_s=args.timeout)


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory, fp16_profile) -> pathlib.Path:
    """`zero-train profile`'s command in this process, each cell's ranks forked rather than launched (no
    interpreter start per rank: the launchers are tested by the fp16 profile and tests/bench/test_bench.py);
    each cell still runs in ranks of its own, so its peak and baseline are its run's alone."""
    from zero_train.cli import profile
    from zero_train.cli.main import build_parser

    out = tmp_path_factory.mktemp("report") / "profile"
    argv = ["profile", "--model", "tiny", "--world-sizes", "1,2", "--engines", "ddp,zero1,ds2", "--steps", "2",
            "--block-size", "32", "--timeout", "600", "--out", str(out)]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(profile, "launch_cell", launch_in_forked_ranks)
        args = build_parser(argv).parse_args(argv)
        assert args.func(args) == 0
    assert not [r["error"] for r in load_records(out) if r["error"]]
    failed = fp16_profile[0] / "cells" / "ds1-w1-fp16.json"  # a real profile's failed cell
    shutil.copy2(failed, out / "cells" / failed.name)
    return out


@pytest.fixture(scope="module")
def report(profile_dir) -> dict:
    proc = run_cli("report", str(profile_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = profile_dir / "report"
    assert f"report: {out / 'report.md'}" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    return dict(
        out=out,
        summary=summary,
        markdown=(out / "report.md").read_text(),
        records=load_records(profile_dir),
        cells={cell["cell"]: cell for cell in summary["cells"]},
    )


def test_profile_records_every_cell_and_survives_a_failing_one(fp16_profile):
    """`zero-train profile` end to end (tests/cli/test_profile.py's run): two cells at world size 1 in fp16
    through the real deepspeed launcher; ddp (our engine scales the loss) succeeds, the DeepSpeed ZeRO-1 cell's
    train script dies for `--engine ds1`, which must be recorded with its error line, not fatal. (A real fp16
    failure would depend on the CPU: DeepSpeed runs fp16 on CPUs whose oneDNN has fp16 kernels.)"""
    out, proc = fp16_profile
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
    assert failed["error"] == DS1_ERROR
    assert failed["engine"] == "ds1" and failed["zero_stage"] == 1 and failed["ranks"] == []
    assert json.loads((out / "configs" / "ds1-w1-fp16.json").read_text())["zero_optimization"]["stage"] == 1
    assert len(load_records(out)) == 2
    assert "FAILED" in proc.stdout and "ds1-w1-fp16" in proc.stdout


def test_every_record_appears_with_its_numbers(report):
    successful = [r for r in report["records"] if r["error"] is None]
    assert {cell_name(r) for r in successful} == set(report["cells"])
    assert {"ddp-w1-fp32", "zero1-w2-fp32", "ds2-w2-fp32"} <= set(report["cells"])
    for record in successful:
        cell = report["cells"][cell_name(record)]
        worst = max(record["ranks"], key=lambda rank: (rank["peak_bytes"], -rank["rank"]))
        assert cell["reported_rank"] == worst["rank"]
        assert cell["categories"] == worst["categories"]
        assert (
            cell["allocator_bytes"]
            == worst["allocator_bytes"]
            == sum(worst["categories"][c] for c in CATEGORIES)
        )
        assert cell["peak_bytes"] == worst["peak_bytes"]
        assert len(cell["ranks"]) == record["world_size"]
        states = sum(worst["categories"][c] for c in MODEL_STATE_CATEGORIES)
        assert cell["model_states"]["measured"] == states
        assert cell["bytes_per_param"]["model_states"] == pytest.approx(states / record["num_params"])
        assert cell["bytes_per_param"]["peak"] == pytest.approx(worst["peak_bytes"] / record["num_params"])


def test_theory_columns_equal_the_formulas_computed_here(report):
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    for cell in report["cells"].values():
        psi, world_size, stage = cell["num_params"], cell["world_size"], cell["zero_stage"]
        states = cell["model_states"]
        assert states["paper"] == pytest.approx(paper_fp32_bytes(psi, world_size, stage))
        assert states["paper_ratio"] == pytest.approx(states["paper"] / states["measured"])
        if stage == 2:
            _, gpu_bytes = estimate_zero2_model_states_mem_needs(
                psi, num_gpus_per_node=world_size, cpu_offload=False
            )
            assert states["deepspeed"] == gpu_bytes == deepspeed_zero2_bytes(psi, world_size)
            assert states["deepspeed_ratio"] == pytest.approx(gpu_bytes / states["measured"])
        else:
            assert states["deepspeed"] is None and states["deepspeed_ratio"] is None
        assert states["ours_ratio"] == pytest.approx(states["ours"] / states["measured"])


def test_ddp_and_zero1_model_states_match_the_paper(report):
    """tiny's tied embedding is 82% of the model: whole tensors per rank put it on one rank (its owner held
    1.6x its share at 2 ranks); equal slices of the flat buffer split it, and zero1 meets the paper."""
    for name in ("ddp-w1-fp32", "ddp-w2-fp32", "zero1-w1-fp32", "zero1-w2-fp32"):
        assert report["cells"][name]["model_states"]["paper_ratio"] == pytest.approx(1, abs=0.02)
    from zero_train.report.models import model_facts
    from zero_train.sharding.accounting import partition_of

    numels = model_facts("tiny", None).facts.param_numels
    assert max(numels) > sum(numels) - max(numels)
    partition = partition_of(numels, 2)
    zero1 = report["cells"]["zero1-w2-fp32"]
    for rank in zero1["ranks"]:  # Adam: two fp32 moments per owned element, a 4-byte step per owned piece
        r = rank["rank"]
        expected = 8 * partition.loads()[r] + 4 * len(partition.pieces(r))
        assert rank["categories"]["optimizer_states"] == expected
    states = [s for s in zero1["explanations"] if s.startswith("Adam states")]
    assert not any("whole-tensor" in s or "unexplained" in s for s in states)  # no gap left to explain


def test_peak_and_comm_ratios(report):
    for cell in report["cells"].values():
        model = our_peak(cell)
        peak = cell["peak"]
        reported = next(r for r in cell["ranks"] if r["rank"] == cell["reported_rank"])
        assert peak["other_source"] == "between steps"  # the probe measures the baseline between steps
        assert peak["other"] == reported["other_between_steps"] == peak["other_between_steps"]
        assert cell_other_drift(reported) < 0.05 * cell["categories"]["other"]
        assert cell["ours_peak"]["peak_bytes"] == model.peak_bytes == peak["ours_without_other"]
        assert peak["ours"] == model.peak_bytes + peak["other"]
        assert peak["ours_ratio"] == pytest.approx(peak["ours"] / cell["peak_bytes"])
        assert peak["within_goal_with_other"] == (abs(peak["ours_ratio"] - 1) <= 0.10)
        assert peak["within_goal"] == (
            abs(peak["ratio_without_other"] - 1) <= 0.10
        )  # the headline: ours alone
        assert peak["baseline"] == reported["baseline_bytes"] > 0  # the process before the model
        assert peak["ours_plus_baseline_ratio"] == pytest.approx(
            (model.peak_bytes + reported["baseline_bytes"]) / cell["peak_bytes"]
        )
        assert peak["measured_without_other"] == peak_minus_other(cell)
        comm = cell["comm"]
        rank = next(r for r in cell["ranks"] if r["rank"] == cell["reported_rank"])
        measured = comm_paper_unit(rank["comm_bytes_per_step"], cell["world_size"])
        paper = 2 * cell["num_params"] * 4  # DDP, ZeRO-1, ZeRO-2: 2 Psi fp32 elements
        assert comm["measured_volume"] == pytest.approx(measured)
        assert comm["paper_volume"] == paper and comm["ratio"] == pytest.approx(measured / paper)
    ddp, ds2 = report["cells"]["ddp-w2-fp32"]["comm"], report["cells"]["ds2-w2-fp32"]["comm"]
    assert ddp["ratio"] == pytest.approx(1.0, abs=0.01)  # one all-reduce of every gradient
    assert ds2["ratio"] == pytest.approx(1.5, abs=0.01)  # all-reduce of the buckets + all-gather


def test_our_peak_within_10_percent_of_the_measured_peak_minus_other(report):
    """The peak model's accuracy goal (ours within 10% of the measured peak) on real runs (tiny: ddp, zero1, ds2 at 1 and 2 ranks), with nothing hidden in "other".

    ours + other within 10% of the peak, and ours alone never more than 10% below the peak minus other.
    Above it by up to 25% is allowed HERE: the CPU peak is sampled every millisecond, a lower bound, and on
    tiny (its tied embedding is 82% of the model) DeepSpeed ZeRO-2's peak at 2 ranks is the sum of the
    embedding's two gradient contributions and their sum, alive for one addition kernel: 13.7 MB above
    other when the sampler misses it, 15.35 MB by an exact tally of every tensor the ops allocate (6.41 MB
    kept between steps + 8.94 MB), ours 15.28 MB. The two-sided 10% check runs where the sampled peak is
    reliable: tests/memory/test_memory_accuracy.py
    (ddp, zero1, torch-zero) and tests/memory/test_peak_model.py (all six engines, gpt2-25m).
    """
    for name, cell in report["cells"].items():
        model = our_peak(cell)
        measured = peak_minus_other(cell)
        assert 0.90 * measured <= model.peak_bytes <= 1.25 * measured, (name, model.phase_bytes, measured)
        assert cell["peak"]["within_goal_with_other"], name
        sentence = next(s for s in cell["explanations"] if s.startswith("our model"))
        assert (
            f"{model.peak_bytes / 1e6:.2f} MB" in sentence or f"{model.peak_bytes / 1e6:.1f} MB" in sentence
        )


def test_explanations_carry_their_numbers(report):
    ds2 = report["cells"]["ds2-w2-fp32"]
    master = next(s for s in ds2["explanations"] if s.startswith("fp32 master parameters"))
    assert f"{4 * ds2['num_params'] / 2 / 1e6:.2f} MB = 4 bytes/param / 2 ranks" in master
    assert any("use_multi_rank_bucket_allreduce" in s for s in ds2["explanations"])
    ddp = report["cells"]["ddp-w2-fp32"]
    assert any(
        s.startswith("comm_buffers: ddp holds") and "flat gradient buckets" in s for s in ddp["explanations"]
    )
    for cell in report["cells"].values():
        other = next(s for s in cell["explanations"] if s.startswith("other = "))
        assert (
            f"{cell['categories']['other'] / 1e6:.0f} MB" in other
            or f"{cell['categories']['other'] / 1e6:.1f}" in other
        )
        assert any("the 10% goal" in s for s in cell["explanations"])


def test_failed_cells_are_listed_with_their_error(report):
    failed = report["summary"]["failed"]
    assert failed == [
        dict(cell="ds1-w1-fp16", engine="ds1", world_size=1, precision="fp16", model="tiny", error=DS1_ERROR)
    ]
    section = report["markdown"].split("## Failed cells")[1]
    assert f"| ds1-w1-fp16 | {DS1_ERROR} |" in section


def test_plots_are_real_pngs(report):
    import matplotlib.image

    for name in ("memory_by_category.png", "bytes_per_param.png"):
        path = report["out"] / name
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 20_000
        height, width = matplotlib.image.imread(path).shape[:2]
        assert width >= 800 and height >= 400
        assert f"]({name})" in report["markdown"]
    assert set(report["summary"]["files"]) == {p.name for p in report["out"].iterdir()}


def test_cells_json_is_the_summary_cut_to_the_numbers_that_matter(report):
    compact = json.loads((report["out"] / "cells.json").read_text())
    summary = report["summary"]
    assert compact["schema"] == "zero_train.report_cells/1" and compact["source"] == summary["source"]
    assert (compact["groups"], compact["failed"]) == (summary["groups"], summary["failed"])
    assert [cell["cell"] for cell in compact["cells"]] == list(report["cells"])
    for cell in compact["cells"]:
        full = report["cells"][cell["cell"]]
        for key in ("engine", "world_size", "precision", "ds_config", "reported_rank", "categories", "peak_bytes",
                    "allocator_bytes", "baseline_bytes", "model_states", "peak"):  # fmt: skip
            assert cell[key] == full[key], key
        assert cell["ours_peak"]["phase_bytes"] == full["ours_peak"]["phase_bytes"]
        assert cell["comm"]["ratio"] == full["comm"]["ratio"]
        for rank, full_rank in zip(cell["ranks"], full["ranks"], strict=True):
            expected = {
                key: value for key, value in full_rank.items() if key not in ("phases", "comm_bytes_per_step")
            }
            syncs = expected["host_syncs_per_step"]
            expected["host_syncs_per_step"] = {
                k: syncs[k] for k in ("engine", "loop", "loop_unlogged", "steps_counted")
            }
            assert rank == expected
        assert "explanations" not in cell
    assert (report["out"] / "cells.json").stat().st_size < 5000 * len(
        compact["cells"]
    ) + 3000  # with issue 37's counters


def test_a_summary_renders_again_without_its_records_and_without_plots(report, tmp_path, cli_main):
    proc = cli_main("report", str(report["out"] / "summary.json"), "--out", str(tmp_path), "--no-plots")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cells.json", "report.md", "summary.json"]
    without_images = re.sub(r"\n\n!\[[^\]]*\]\([^)]*\.png\)", "", report["markdown"])
    assert ".png" not in without_images and (tmp_path / "report.md").read_text() == without_images
    assert (tmp_path / "cells.json").read_text() == (report["out"] / "cells.json").read_text()
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again.pop("files") == ["report.md", "summary.json", "cells.json"]
    assert again == {key: value for key, value in report["summary"].items() if key != "files"}


def test_markdown_tables_show_the_summary_numbers(report):
    markdown = report["markdown"]
    assert "mallinfo2" in markdown and "lower bound" in markdown
    for name, cell in report["cells"].items():
        states = table_row(markdown, "Model states: measured vs theory", name)
        psi = cell["num_params"]
        assert states[1] == f"{cell['model_states']['measured'] / psi:.2f}"
        assert states[3] == f"{cell['model_states']['paper'] / psi:.2f}"
        assert states[4] == f"{cell['model_states']['paper_ratio']:.2f}"
        assert states[6] == (
            "n/a" if cell["zero_stage"] != 2 else f"{cell['model_states']['deepspeed_ratio']:.2f}"
        )
        peak = table_row(markdown, "Peak: measured vs estimates", name)
        assert peak[4] == f"{cell['peak']['ratio_without_other']:.2f}"  # the headline column
        assert peak[5] == ("yes" if cell["peak"]["within_goal"] else "**no**")
        assert peak[7] == f"{cell['peak']['ours_ratio']:.2f}"  # the old in-sample figure, labelled
        categories = table_row(markdown, "Per-rank memory by category (MB)", name)
        assert categories[1] == str(cell["reported_rank"]) and len(categories) == 2 + len(CATEGORIES) + 4
        assert f"### {name} (" in markdown


def test_cells_carry_host_syncs_collectives_and_overlap_per_step(report):
    """Issue 37: every profile cell's record counts its first steps (--counted-steps, 2 by default) and the
    report carries them through with the CUDA entry. DDP all-reduces each gradient once per step: its payload is
    Psi x 4 bytes (fp32); our ZeRO-1's step makes no host sync; the loop reads once per (logged) step."""
    for record in (r for r in report["records"] if r["error"] is None):
        cell = report["cells"][cell_name(record)]
        assert "cuda" in cell and all(
            "cuda" in rank for rank in cell["ranks"]
        )  # None on CPU, carried through
        for rank, row in zip(record["ranks"], cell["ranks"], strict=True):
            syncs, collectives = rank["host_syncs_per_step"], rank["collectives_per_step"]
            assert row["host_syncs_per_step"] == syncs and row["collectives_per_step"] == collectives
            assert syncs["steps_counted"] == [1, 2] and syncs["loop"] == 1
            if record["engine"] == "zero1":
                assert syncs["engine"] == 0, syncs["sites"]
            if record["engine"] == "ddp" and record["world_size"] == 2:
                all_reduce = collectives["by_collective"]["engine"]["all_reduce"]
                assert all_reduce["bytes"] == record["num_params"] * 4
                assert collectives["engine"] == all_reduce["calls"] >= 1
    assert "## Host syncs and collectives per step" in report["markdown"]

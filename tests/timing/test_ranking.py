"""zero_train/timing/ranking.py and `zero-train plan`'s time columns: set-ups ranked by hours, the term that slows each
runner-up."""

from __future__ import annotations

import pytest

from zero_train.memory.model.theory import ModelShape
from zero_train.registry import ENGINES, engine_spec
from zero_train.timing.machine import preset_machine

pytestmark = pytest.mark.tier("quick")


def test_plan_ranks_set_ups_by_hours_and_names_what_slows_each_runner_up():
    from zero_train.memory.model.plan import PlanRequest
    from zero_train.timing.ranking import rank_plan

    request = PlanRequest(shape=ModelShape(num_params=1_000_000_000, num_layers=24, hidden_size=2048,
                                           num_heads=16, vocab_size=50_000),
                          nodes=2, gpus_per_node=8, gpu_memory_gb=80, host_memory_gb=2000, global_batch_size=64,
                          block_size=2048)  # fmt: skip
    ranked, plan = rank_plan(request, preset_machine("h100-sxm"), tokens=1e9)
    hours = [row.hours for row in ranked]
    assert hours == sorted(hours) and len(ranked) > 5 and plan.chosen is ranked[0].candidate
    assert all(row.why for row in ranked[1:] if row.slower_by > 0.01)
    assert ranked[0].hours == pytest.approx(1e9 / ranked[0].step.tokens_per_s / 3600)
    slower, _ = rank_plan(request, preset_machine("a100-80"), tokens=1e9)
    assert slower[0].hours > ranked[0].hours
    assert {row.candidate.setup.engine for row in ranked} <= {spec.name for spec in ENGINES if spec.planned}
    assert engine_spec(ranked[0].candidate.setup.engine).planned


def test_plan_prints_time_beside_memory_fastest_first(capsys):
    """`zero-train plan --gpu` (no --gpu-memory or --host-memory: the preset's memory, host unchecked) ranks by
    hours with step, tokens/s and MFU beside memory."""
    from zero_train.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["plan", "--model", "gpt2-25m", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "a100-40",
              "--tokens", "1e9", "--block-size", "256", "--global-batch-size", "64"])  # fmt: skip
    out = capsys.readouterr().out
    assert exited.value.code == 0, out
    header = next(line for line in out.splitlines() if "tokens/s" in line)
    assert all(word in header for word in ("step", "MFU", "hours", "peak/rank"))
    rows = [
        line for line in out.splitlines() if line.startswith(("->", "  ")) and " x " in line and "GB" in line
    ]
    hours = [float(line.split("%")[1].split()[0]) for line in rows]
    assert rows[0].startswith("->") and hours == sorted(hours) and len(rows) > 3
    assert "of 40 GB" in out and "host memory not checked" in out and "64 x 256 tokens" in out
    # host/machine is a load-time peak for engines that build the whole model on each rank: said under the table,
    # and the number is the 8 ranks' fp32 copies (our ZeRO-3, no offload: training holds nothing on the host)
    from zero_train.hf.models import model_config
    from zero_train.memory.model.theory import model_shape

    legend = next(line for line in out.splitlines() if line.startswith("host/machine:"))
    assert "8 ranks together" in legend and "--load-dtype fp32" in legend and "--host-memory GB" in legend
    ours = next(line for line in rows if line[2:].startswith("our ZeRO-3 ") and "checkpointing" not in line)
    host_gb = float(ours.split("GB")[2].split()[0])
    assert host_gb == pytest.approx(8 * 4 * model_shape(model_config("gpt2-25m")).num_params / 1e9, abs=0.051)


def test_a_calibrated_cpu_machine_says_whether_the_engines_host_work_is_fitted(capsys, tmp_path):
    """A calibration alone prices the model's terms; on CPU ranks the engines' fitted host work is much of a small
    model's step, so `estimate --machine` says which engines have it, or that none do and steps run longer."""
    import json
    import pathlib

    from zero_train.cli.main import main

    fitted = pathlib.Path(__file__).with_name("machine_epyc-2core.json")
    bare = tmp_path / "machine.json"
    bare.write_text(json.dumps(json.loads(fitted.read_text()) | {"engine_host": {}}))

    def estimate(machine: pathlib.Path) -> dict:
        with pytest.raises(SystemExit) as exited:
            main(["estimate", "--model", "tiny", "--world-size", "2", "--device", "cpu", "--machine", str(machine),
                  "--json"])  # fmt: skip
        out = capsys.readouterr().out
        assert exited.value.code == 0, out
        return json.loads(out)

    with_host, without = estimate(fitted), estimate(bare)
    assert "host work fitted for ddp, ds1" in with_host["time_machine"]
    assert (
        "no engine host work fitted" in without["time_machine"]
        and "docs/steptime.md" in without["time_machine"]
    )
    ddp = [
        next(s["time"] for s in result["stages"] if s["engine"] == "ddp") for result in (with_host, without)
    ]
    assert ddp[0]["terms"]["host work (fitted)"] > 0 and "host work (fitted)" not in ddp[1]["terms"]
    # 0.086 s against 0.041 s: on 0.6M parameters the fitted work is no rounding
    assert ddp[0]["seconds"] > ddp[1]["seconds"] * 1.5

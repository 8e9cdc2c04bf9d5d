"""Our per-phase peak model (zero_train.memory.model.peak): its terms, and its accuracy on real measured runs.

The accuracy check needs no new run: docs/report/cells.json holds what 36 real runs measured (gpt2-25m,
fp32 and bf16, 1/2/4 ranks, all six engines: peak, "other" and the categories per rank); our model is
recomputed here from the model's shape and each cell's settings and must land within 10% of the measured
peak minus the measured "other" (the part no estimator predicts) in every cell.
"""

from __future__ import annotations

import json
import pathlib
import warnings

import pytest

from zero_train.memory.model.peak import PHASES, backend_for, engine_peak
from zero_train.memory.model.theory import ModelShape, activation_bytes

pytestmark = pytest.mark.tier("quick")

SUMMARY = pathlib.Path(__file__).resolve().parents[2] / "docs" / "report" / "cells.json"
PSI = 1_000_000
TIED = 100_000
SHAPE = ModelShape(num_params=PSI, param_numels=(TIED, 400_000, 300_000, 200_000), tied_embedding_params=TIED)
STATES = ("params", "grads", "master_params", "optimizer_states")


def peak(engine: str, world_size: int, *, precision: str = "fp32", shape=SHAPE, **kwargs):
    return engine_peak(
        engine, shape, world_size, precision=precision, micro_batch_size=1, block_size=1, **kwargs
    )


def test_ddp_backward_ends_with_every_gradient_and_the_tied_sum_then_steps_with_adamw_temporaries():
    model = peak("ddp", 2)
    end, step = model.phases["backward_end"], model.phases["step"]
    assert end["grads"] == 4 * PSI and end["tied_gradient_copies"] == 2 * 4 * TIED
    assert step["grads"] == 4 * PSI and "adamw_temporaries" not in step  # CUDA: fused AdamW keeps none
    on_cpu = peak("ddp", 2, backend="gloo").phases["step"]
    assert on_cpu["adamw_temporaries"] == 4 * PSI  # foreach AdamW: the square roots of every exp_avg_sq
    mixed = peak("ddp", 2, precision="bf16").phases["step"]
    assert mixed["grads"] == 2 * PSI and mixed["fp32_grads"] == 4 * PSI  # MasterWeights.grads_to_master
    assert model.boundary["grads"] == 4 * PSI and model.boundary["comm_buffers"] == 4 * PSI  # DDP buckets


def test_deepspeed_zero1_peaks_with_whole_gradients_but_holds_a_partition_at_the_boundary():
    model = peak("ds1", 4, precision="bf16", shape=ModelShape(num_params=PSI))  # sizes unknown: even slices
    assert model.peak_phase == "backward_end"
    assert model.phases["backward_end"]["grads"] == 2 * PSI  # the paper's 2 Psi, before the reduction
    assert model.boundary["grads"] == 2 * PSI // 4
    assert model.peak_bytes >= sum(model.boundary[c] for c in STATES) + 2 * PSI * 3 // 4


def test_deepspeed_keeps_the_gradients_of_the_whole_tensors_its_slice_touches():
    # slices of 250k elements over tensors of 100k, 400k, 300k, 200k (in that order)
    touched = {0: 500_000, 1: 400_000, 2: 300_000, 3: 500_000}
    for rank, elements in touched.items():
        assert peak("ds2", 4, rank=rank).boundary["grads"] == 4 * elements
    assert peak("ds2", 4).rank in (0, 3)  # the most touched: the highest peak
    step = peak("ds2", 4, rank=1).phases["step"]  # FusedAdam: the fp64 norm copy of its 250k piece is largest
    assert step == {
        **peak("ds2", 4, rank=1).phases["forward"],
        "grads": 4 * 400_000,
        "norm_fp64_copy": 8 * 250_000,
    }


def test_deepspeed_step_temporaries_follow_the_optimizer_and_the_backend():
    torch_adam = {"optimizer": {"params": {"torch_adam": True}}, "zero_optimization": {"stage": 2}}
    rest = peak("ds2", 2).phases["forward"]["params"] + 12 * PSI // 2  # 16-bit model + fp32 master + Adam
    step = peak("ds2", 2, ds_config=torch_adam).phases["step"]
    assert step["fp32_grads"] == 4 * PSI // 2 and step["adamw_temporaries"] == 8 * PSI // 2
    assert sum(step.values()) == rest + 12 * PSI // 2
    fused = peak("ds2", 2).phases["step"]  # FusedAdam (DeepSpeed's default): no temporaries
    assert "adamw_temporaries" not in fused
    gloo = peak("ds1", 4, ds_config=torch_adam, backend="gloo").phases["step"]
    assert gloo.get("gather_buffer") == 4 * PSI  # gloo's all-gather output: the whole flat model
    assert "gather_buffer" not in peak("ds1", 1, ds_config=torch_adam, backend="gloo").phases["step"]


def test_zero3_gathers_the_model_only_across_ranks_and_keeps_its_gradient_partition():
    one, two = peak("ds3", 1), peak("ds3", 2)
    assert "gathered_params" not in one.phases["forward"]
    assert two.phases["forward"]["gathered_params"] == 4 * PSI
    limited = peak("ds3", 2, ds_config={"zero_optimization": {"stage3_max_live_parameters": 1000}})
    assert limited.phases["forward"]["gathered_params"] == 4 * 1000
    assert two.boundary["grads"] == 4 * PSI // 2 and two.phases["forward"]["grads"] == 4 * PSI // 2


def test_sharding_models_the_rank_with_the_highest_peak():
    worst = peak("zero1", 3)
    for rank in range(3):
        assert worst.peak_bytes >= peak("zero1", 3, rank=rank).peak_bytes
    owned = [peak("zero1", 3, rank=r).boundary["optimizer_states"] // 8 for r in range(3)]
    assert owned == [333_334, 333_334, 333_332]  # equal slices of the flat buffer (padding on the last)
    whole = [peak("torch-zero", 2, rank=r).boundary["optimizer_states"] // 8 for r in range(2)]
    assert whole == [500_000, 500_000]  # torch's sorted-greedy whole tensors: 400k + 100k vs 300k + 200k
    assert peak("ddp", 2, rank=1).phases == peak("ddp", 2).phases  # every DDP rank is alike


def test_peak_is_the_largest_phase_and_deepspeed_defaults_apply_to_auto():
    model = peak("ds2", 8, ds_config={"zero_optimization": {"reduce_bucket_size": "auto"}})
    assert set(model.phases) == set(PHASES)
    assert model.peak_bytes == max(model.phase_bytes.values())
    assert model.phases["backward_start"]["comm_buffers"] == 500_000_000 * 4  # DeepSpeed's 5e8 default
    assert model.boundary["comm_buffers"] == 0  # released at the end of backward
    with pytest.raises(ValueError, match="unknown engine"):
        peak("ds4", 2)


def baseline_other(rank: dict) -> int:
    """The rank's "other" between steps; these records predate it, so "other" at the step boundary."""
    between = rank.get("other_between_steps")
    return rank["categories"]["other"] if between is None else between


def _summary_cells() -> list[dict]:
    return json.loads(SUMMARY.read_text())["cells"]


def test_the_committed_example_covers_every_engine_world_size_and_precision():
    cells = {(c["engine"], c["world_size"], c["precision"]) for c in _summary_cells()}
    engines = ("ddp", "zero1", "torch-zero", "ds1", "ds2", "ds3")
    assert cells == {(e, n, p) for e in engines for n in (1, 2, 4) for p in ("fp32", "bf16")}


@pytest.mark.parametrize("cell", _summary_cells(), ids=lambda cell: cell["cell"])
def test_our_peak_within_10_percent_of_the_measured_peak_on_real_runs(cell):
    from zero_train.report.models import model_facts

    facts = model_facts(cell["model"], cell["num_params"]).facts
    model = engine_peak(
        cell["engine"], facts.shape, cell["world_size"], precision=cell["precision"],
        micro_batch_size=cell["micro_batch_size"], block_size=cell["block_size"], ds_config=cell["ds_config"],
        backend=backend_for(cell["device"]),
    )  # fmt: skip
    reported = next(rank for rank in cell["ranks"] if rank["rank"] == cell["reported_rank"])
    measured = max(rank["peak_bytes"] - baseline_other(rank) for rank in cell["ranks"])
    assert model.peak_bytes == pytest.approx(measured, rel=0.10)  # nothing hidden in "other"
    assert model.peak_bytes + baseline_other(reported) == pytest.approx(cell["peak_bytes"], rel=0.10)
    measured = cell["categories"]["activations"]
    ours = activation_bytes(facts.shape, micro_batch_size=cell["micro_batch_size"], block_size=cell["block_size"],
                            precision=cell["precision"])  # fmt: skip
    assert ours == pytest.approx(measured, rel=0.005)


def test_a_different_torch_or_deepspeed_is_warned_about_once(monkeypatch):
    from zero_train.memory.model import versions

    installed = {"torch": "2.14.1", "deepspeed": versions.DERIVED_WITH["deepspeed"]}
    monkeypatch.setattr(versions, "installed_version", installed.get)
    monkeypatch.setattr(versions, "_warned", False)
    assert versions.version_mismatches() == ["torch 2.14.1 (derived with 2.13.0)"]
    with pytest.warns(UserWarning, match=r"installed: torch 2\.14\.1 \(derived with 2\.13\.0\)"):
        versions.warn_if_versions_differ()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        versions.warn_if_versions_differ()  # once per process: no second warning
    installed.update(torch="2.13.0", deepspeed="0.20.0")
    assert versions.version_mismatches() == ["deepspeed 0.20.0 (derived with 0.19.8)"]
    assert versions.DERIVED_WITH == {"torch": "2.13.0", "deepspeed": "0.19.8"}


def test_our_model_keeps_torch_zero_masters_whole():
    from zero_train.memory.model.peak import engine_categories
    from zero_train.memory.model.theory import ModelShape

    shape = ModelShape(num_params=1_000_000)
    bf16 = engine_categories("torch-zero", shape, 4, precision="bf16", micro_batch_size=1, block_size=1)
    assert bf16["master_params"] == 4_000_000  # whole on every rank (zero_train.engines.torch_zero)
    assert bf16["optimizer_states"] == 8_000_000 / 4  # only Adam's moments are sharded
    fp32 = engine_categories("torch-zero", shape, 4, precision="fp32", micro_batch_size=1, block_size=1)
    assert fp32["master_params"] == 0

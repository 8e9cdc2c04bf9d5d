"""Our and torch's engines against real references, on 2 gloo ranks and a tiny GPT-2 (~133k parameters).

- ddp is the reference (torch DDP + torch AdamW, the textbook recipe);
- zero1 and torch-zero must give the same fp32 parameters and losses, bit for bit; zero2 (which averages
  every micro-step, as DDP without no_sync would) within rounding, with every gradient held once over the ranks;
- a save -> load round trip continues exactly as the uninterrupted run, for every engine;
- memory categories are checked against the sizes they must have (AdamW fp32: 8 bytes per owned param).

DeepSpeed's engine: test_deepspeed_engine.py; the runs both compare: zero_train/testing/engine_runs.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from zero_train.testing.engine_runs import (
    BASE_CONFIG,
    DEEPSPEED_PARAM_TOLERANCE,
    FP16_SKIPPED_STEPS,
    STEPS_BEFORE_SAVE,
    build_tiny,
    max_diff,
    run_with_checkpoint,
    tiny_model_fn,
    tiny_settings,
    train_steps,
    without_tensors,
)

pytestmark = pytest.mark.tier("multiproc")


def _local_engines_ranks(rank: int, world_size: int, tmp: str, names: tuple[str, ...]) -> dict:
    runs = {name: run_with_checkpoint(name, rank, world_size, tmp) for name in names}
    reference = runs["ddp"]["final"]
    for run in runs.values():
        run["diff_to_ddp"] = max_diff(reference, run["final"])
    # fp16 from a loss scale of 2**20: the first steps overflow and must be skipped (DeepSpeed runs fp16 on
    # a CPU only where oneDNN has fp16 kernels, so its rules are checked through its DynamicLossScaler in
    # the parent, on any machine)
    fp16 = {
        name: build_tiny(name, rank, world_size, precision="fp16", scale_power=20)
        for name in names
        if name != "torch-zero"
    }
    runs["fp16"] = {}
    for name, engine in fp16.items():
        initial = engine.full_state_dict()
        history = train_steps(engine, rank, range(FP16_SKIPPED_STEPS))
        unchanged = max_diff(initial, engine.full_state_dict())
        history += train_steps(engine, rank, range(FP16_SKIPPED_STEPS, 6))
        runs["fp16"][name] = dict(
            history=history,
            unchanged_while_skipping=unchanged,
            loss_scales=engine.loss_scale(),
            final=engine.full_state_dict(),
        )
    finals = {name: runs["fp16"][name].pop("final") for name in fp16}
    runs["fp16"]["zero1_diff"] = max_diff(finals["ddp"], finals["zero1"]) if "zero1" in finals else None
    return {name: without_tensors(run) for name, run in runs.items()}


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory, rank_pool):
    names = ("ddp", "torch-zero", "zero1", "zero2")
    return rank_pool(2).run(_local_engines_ranks, (str(tmp_path_factory.mktemp("local")), names))


@pytest.mark.parametrize("name", ["zero1", "torch-zero"])
def test_sharded_engines_match_ddp_bit_for_bit_in_fp32(local_runs, name):
    for rank_runs in local_runs:
        assert rank_runs[name]["history"] == rank_runs["ddp"]["history"]  # losses, grad norms, lrs
    assert local_runs[0][name]["diff_to_ddp"] == 0.0
    if name == "zero1":
        assert (
            local_runs[0][name]["split_tensors"] >= 1
        )  # a tensor split between the ranks, updated in pieces


def test_clipping_and_schedule_are_exercised(local_runs):
    history = local_runs[0]["ddp"]["history"]
    assert all(grad_norm > BASE_CONFIG["gradient_clipping"] for _, grad_norm, _, _ in history)
    lrs = [lr for _, _, lr, _ in history]
    assert len(set(lrs)) > 2 and max(lrs) <= 3e-3  # warmup then decay, never above the peak


@pytest.mark.parametrize("name", ["ddp", "zero1", "zero2", "torch-zero"])
def test_local_engine_checkpoint_round_trip_is_exact(local_runs, name):
    for rank, rank_runs in enumerate(local_runs):
        run = rank_runs[name]
        assert run["resumed_history"] == run["history"][STEPS_BEFORE_SAVE:]
        assert run["client_state"] == (rank, [rank, 7])
    assert local_runs[0][name]["resumed_diff"] == 0.0


def test_memory_categories_match_known_sizes(local_runs):
    ddp = local_runs[0]["ddp"]
    num_params, num_tensors = ddp["num_params"], ddp["num_tensors"]
    adam_bytes = 8 * num_params + 4 * num_tensors  # exp_avg + exp_avg_sq fp32, one fp32 `step` per tensor
    for rank_runs in local_runs:
        memory = rank_runs["ddp"]["memory_boundary"]
        assert memory["params"] == 4 * num_params
        assert memory["grads"] == 4 * num_params
        assert memory["master_params"] == 0  # fp32: the model's parameters are the master weights
        assert memory["optimizer_states"] == adam_bytes
        assert memory["comm_buffers"] >= 4 * num_params  # DDP's flat buckets hold every gradient once
        assert rank_runs["ddp"]["memory_after_step"]["grads"] == 0  # zero_grad(set_to_none)
    torch_zero = [
        rank_runs["torch-zero"]["memory_after_step"]["optimizer_states"] for rank_runs in local_runs
    ]
    assert sum(torch_zero) == adam_bytes and max(torch_zero) < adam_bytes


def test_zero1_memory_categories_are_sharded(local_runs):
    num_params, num_tensors = local_runs[0]["ddp"]["num_params"], local_runs[0]["ddp"]["num_tensors"]
    zero1 = [rank_runs["zero1"]["memory_after_step"] for rank_runs in local_runs]
    assert abs(sum(m["optimizer_states"] for m in zero1) - 8 * num_params) <= 4 * num_tensors * 2
    for memory in zero1:
        assert memory["params"] == 4 * num_params
        assert abs(memory["optimizer_states"] - 8 * num_params / 2) <= 0.05 * 8 * num_params


def test_zero2_engine_trains_like_ddp_and_keeps_each_gradient_once(local_runs):
    num_params = local_runs[0]["ddp"]["num_params"]
    for rank_runs in local_runs:
        for ours, ddp in zip(rank_runs["zero2"]["history"], rank_runs["ddp"]["history"], strict=True):
            assert ours[0] == pytest.approx(ddp[0], rel=1e-5) and ours[1] == pytest.approx(ddp[1], rel=1e-4)
            assert ours[2:] == ddp[2:]  # lr, skipped
    assert local_runs[0]["zero2"]["diff_to_ddp"] < DEEPSPEED_PARAM_TOLERANCE  # averaged per micro-step
    held = [rank_runs["zero2"]["memory_boundary"]["grads"] for rank_runs in local_runs]
    assert sum(held) == 4 * num_params  # before the step: every averaged gradient on exactly one rank
    assert all(abs(g - 4 * num_params / 2) < 0.6 * 4 * num_params for g in held)
    for rank_runs in local_runs:
        # the same overflowing steps skipped (the norm is inf or nan depending on the summation order)
        overflows = [
            [(loss, math.isfinite(norm), lr, skipped) for loss, norm, lr, skipped in run["history"]]
            for run in (rank_runs["fp16"]["zero2"], rank_runs["fp16"]["ddp"])
        ]
        assert overflows[0][:FP16_SKIPPED_STEPS] == overflows[1][:FP16_SKIPPED_STEPS]
        assert rank_runs["fp16"]["zero2"]["loss_scales"] == rank_runs["fp16"]["ddp"]["loss_scales"]


@pytest.mark.tier("quick")
def test_loss_scaler_follows_deepspeeds_rules(monkeypatch):
    """Our DynamicLossScaler against DeepSpeed's own, over a sequence with overflows and long calm."""
    from deepspeed.runtime.fp16 import loss_scaler as ds_loss_scaler

    from zero_train.engines.precision import DynamicLossScaler

    monkeypatch.setattr(ds_loss_scaler.dist, "get_rank", lambda: 0)  # it only logs on rank 0
    ours = DynamicLossScaler(init_scale=2.0**8, scale_window=3, hysteresis=2, min_scale=1.0)
    theirs = ds_loss_scaler.DynamicLossScaler(
        init_scale=2.0**8,
        scale_window=3,
        min_scale=1.0,
        delayed_shift=2,
        consecutive_hysteresis=False,
        raise_error_at_min_scale=False,
    )
    overflows = [True, True, True, False, False, False, False, True, False] + [False] * 7 + [True] * 12
    for overflow in overflows:
        ours.update_scale(overflow)
        theirs.update_scale(overflow)
        assert ours.loss_scale == theirs.cur_scale
    assert ours.loss_scale == 1.0  # clamped at min_scale after the long run of overflows


@pytest.mark.tier("quick")
def test_build_engine_rejects_unknown_name_and_wrong_world_size():
    from zero_train.engines import build_engine
    from zero_train.runtime.dist import DistInfo
    from zero_train.runtime.errors import UsageError

    settings, ds_config = tiny_settings(1, "fp32", world_size=2)
    single = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    with pytest.raises(UsageError, match="unknown engine 'fsdp'"):
        build_engine(
            "fsdp", model_fn=tiny_model_fn(), settings=settings, ds_config=ds_config, dist_info=single
        )
    with pytest.raises(UsageError, match="world size 2 but 1"):
        build_engine(
            "ddp", model_fn=tiny_model_fn(), settings=settings, ds_config=ds_config, dist_info=single
        )


def test_fp16_overflow_skips_steps_and_schedule_like_deepspeed(local_runs, monkeypatch):
    from deepspeed.runtime.fp16 import loss_scaler as ds_loss_scaler

    from zero_train.ds_config import lr_at

    monkeypatch.setattr(ds_loss_scaler.dist, "get_rank", lambda: 0)
    settings, _ = tiny_settings(1, "fp16", world_size=2, scale_power=20)
    for rank_runs in local_runs:
        run = rank_runs["fp16"]["ddp"]
        skipped = [was_skipped for *_, was_skipped in run["history"]]
        assert skipped == [True] * FP16_SKIPPED_STEPS + [False] * (len(skipped) - FP16_SKIPPED_STEPS)
        assert all(not math.isfinite(norm) for _, norm, _, _ in run["history"][:FP16_SKIPPED_STEPS])
        expected_lrs = [lr_at(settings, max(0, step - FP16_SKIPPED_STEPS)) for step in range(len(skipped))]
        assert [lr for _, _, lr, _ in run["history"]] == expected_lrs  # the schedule waits for applied steps
        reference = ds_loss_scaler.DynamicLossScaler(
            init_scale=2.0**20,
            scale_window=settings.fp16_loss_scale_window,
            min_scale=settings.fp16_min_loss_scale,
            delayed_shift=settings.fp16_hysteresis,
            consecutive_hysteresis=False,
        )
        for was_skipped in skipped:
            reference.update_scale(was_skipped)
        assert run["loss_scales"] == reference.cur_scale
    assert local_runs[0]["fp16"]["ddp"]["unchanged_while_skipping"] == 0.0


def test_zero1_fp16_matches_ddp_fp16(local_runs):
    for rank_runs in local_runs:
        # skipped steps report a NaN grad norm, and NaN != NaN: compare their reprs
        assert repr(rank_runs["fp16"]["zero1"]["history"]) == repr(rank_runs["fp16"]["ddp"]["history"])
        assert rank_runs["fp16"]["zero1"]["loss_scales"] == rank_runs["fp16"]["ddp"]["loss_scales"]
    assert local_runs[0]["fp16"]["zero1_diff"] == 0.0

"""DeepSpeed's engine (engines/deepspeed_engine.py) against DDP, on 2 gloo ranks and a tiny GPT-2.

- DeepSpeed ZeRO-1/2 in fp32 must agree with ddp within rounding (it clips and reduces in another order);
- DeepSpeed ZeRO-3 (model built under zero.Init) is checked against ddp started from its weights;
- bf16: ddp's fp32 masters against DeepSpeed ZeRO-1's;
- a save -> load round trip continues exactly as the uninterrupted run; a planted pickle is refused.

The runs: zero_train/testing/engine_runs.py (shared with test_engines.py).
"""

from __future__ import annotations

import pytest
import torch

from zero_train.testing import run_ranks
from zero_train.testing.engine_runs import (
    BF16_PARAM_TOLERANCE,
    DEEPSPEED_PARAM_TOLERANCE,
    STEPS_AFTER_SAVE,
    STEPS_BEFORE_SAVE,
    broadcast_state,
    build_tiny,
    max_diff,
    run_with_checkpoint,
    train_steps,
    without_key_bias,
    without_tensors,
)

pytestmark = pytest.mark.tier("multiproc")


def _deepspeed_ranks(rank: int, world_size: int, tmp: str) -> dict:
    import deepspeed

    total_steps = range(STEPS_BEFORE_SAVE + STEPS_AFTER_SAVE)
    ddp = build_tiny("ddp", rank, world_size)
    ddp_history = train_steps(ddp, rank, total_steps)
    reference = ddp.full_state_dict()
    runs = {
        f"ds{stage}": run_with_checkpoint("deepspeed", rank, world_size, tmp, stage=stage) for stage in (1, 2)
    }
    for run in runs.values():
        run["diff_to_ddp"] = max_diff(reference, run["final"])

    bf16 = {
        name: build_tiny(name, rank, world_size, stage=1, precision="bf16") for name in ("ddp", "deepspeed")
    }
    bf16_histories = {name: train_steps(engine, rank, total_steps) for name, engine in bf16.items()}
    runs["bf16"] = dict(
        ddp_history=bf16_histories["ddp"],
        ds1_history=bf16_histories["deepspeed"],
        ddp_memory=bf16["ddp"].memory_categories(),
        diff_to_ddp=max_diff(*(without_key_bias(bf16[n].full_state_dict()) for n in ("ddp", "deepspeed"))),
    )

    zero3 = build_tiny("deepspeed", rank, world_size, stage=3)
    initial = zero3.full_state_dict()  # the weights zero.Init created, gathered from the fp32 partitions
    zero3_history = train_steps(zero3, rank, total_steps)
    zero3_final = zero3.full_state_dict()
    params = list(zero3.model.parameters())
    partitioned = all(p.numel() == 0 for p in params)  # released after use: each rank holds ds_tensor only
    with deepspeed.zero.GatheredParameters(params):
        gathered = {name: p.detach().clone() for name, p in zero3.model.named_parameters()}
    runs["ds3"] = dict(
        history=zero3_history,
        memory_after_step=zero3.memory_categories(),
        gathered_diff=max_diff({k: zero3_final[k] for k in gathered}, gathered) if rank == 0 else None,
        partitioned=partitioned,
    )
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()  # the ZeRO-3 engine keeps it alive; the ddp model must not go to zero.Init
    initial = broadcast_state(initial)
    ddp_from_zero3 = build_tiny("ddp", rank, world_size, initial_weights=initial)
    runs["ds3"]["ddp_history"] = train_steps(ddp_from_zero3, rank, total_steps)
    runs["ds3"]["diff_to_ddp"] = max_diff(ddp_from_zero3.full_state_dict(), zero3_final)
    runs["ddp"] = dict(history=ddp_history)
    return {name: without_tensors(run) for name, run in runs.items()}


@pytest.fixture(scope="module")
def deepspeed_runs(tmp_path_factory):
    return run_ranks(_deepspeed_ranks, 2, (str(tmp_path_factory.mktemp("ds")),))


@pytest.mark.parametrize("name", ["ds1", "ds2"])
def test_deepspeed_zero12_fp32_matches_ddp(deepspeed_runs, name):
    for rank_runs in deepspeed_runs:
        ds, ddp = rank_runs[name]["history"], rank_runs["ddp"]["history"]
        assert [lr for _, _, lr, _ in ds] == [lr for _, _, lr, _ in ddp]  # lr_at == DeepSpeed's scheduler
        for (ds_loss, ds_norm, _, _), (ddp_loss, ddp_norm, _, _) in zip(ds, ddp, strict=True):
            assert ds_loss == pytest.approx(ddp_loss, rel=1e-5)
            assert ds_norm == pytest.approx(ddp_norm, rel=1e-5)
    assert deepspeed_runs[0][name]["diff_to_ddp"] < DEEPSPEED_PARAM_TOLERANCE


@pytest.mark.parametrize("name", ["ds1", "ds2"])
def test_deepspeed_checkpoint_round_trip_is_exact(deepspeed_runs, name):
    for rank, rank_runs in enumerate(deepspeed_runs):
        run = rank_runs[name]
        assert run["resumed_history"] == run["history"][STEPS_BEFORE_SAVE:]
        assert run["client_state"] == (rank, [rank, 7])
    assert deepspeed_runs[0][name]["resumed_diff"] == 0.0


def test_deepspeed_zero3_full_state_dict_and_training(deepspeed_runs):
    zero3 = deepspeed_runs[0]["ds3"]
    assert zero3["gathered_diff"] == 0.0  # fp32 partitions == the gathered module parameters
    for rank_runs in deepspeed_runs:
        run = rank_runs["ds3"]
        for (loss, norm, _, _), (ddp_loss, ddp_norm, _, _) in zip(
            run["history"], run["ddp_history"], strict=True
        ):
            assert loss == pytest.approx(ddp_loss, rel=1e-5)
            assert norm == pytest.approx(ddp_norm, rel=1e-5)
    assert zero3["diff_to_ddp"] < DEEPSPEED_PARAM_TOLERANCE


def test_deepspeed_memory_categories_read_its_partitions(deepspeed_runs):
    for stage in ("ds1", "ds2"):
        per_rank = [rank_runs[stage]["memory_after_step"] for rank_runs in deepspeed_runs]
        total_params = deepspeed_runs[0][stage]["num_params"]
        masters = [m["master_params"] for m in per_rank]
        assert sum(masters) >= 4 * total_params and max(masters) < 4 * total_params  # fp32 partitions
        states = [m["optimizer_states"] for m in per_rank]
        assert all(s == 2 * master + 4 for s, master in zip(states, masters, strict=True))  # moments + step


def test_bf16_ddp_keeps_fp32_masters_and_matches_deepspeed_zero1(deepspeed_runs):
    """Both reduce bf16 gradients and update fp32 masters; ZeRO-1 only shards the update (the ZeRO-2 path
    reduce-scatters every micro-batch and accumulates in bf16, so it rounds differently)."""
    for rank_runs in deepspeed_runs:
        run = rank_runs["bf16"]
        for (loss, norm, lr, _), (ddp_loss, ddp_norm, ddp_lr, _) in zip(
            run["ds1_history"], run["ddp_history"], strict=True
        ):
            assert (loss, lr) == pytest.approx((ddp_loss, ddp_lr), rel=1e-5)
            # Measured (2 ranks, 4 steps): losses identical to the last bit; norms 6e-7..8e-7 apart on
            # steps 1-3 (fp32 summation order) and 2.0e-5 on step 4, where a few bf16 gradient
            # elements round one bf16 ulp (2**-8 relative) apart between DeepSpeed's bucketed
            # reduction and DDP's. 1e-4 is five times that and still far below bf16's resolution.
            assert norm == pytest.approx(ddp_norm, rel=1e-4)
        num_params = rank_runs["ds1"]["num_params"]
        memory = run["ddp_memory"]
        assert (memory["params"], memory["master_params"]) == (2 * num_params, 4 * num_params)
    # bf16 weights round each update, so the 1e-8 fp32 differences of steps 1-3 flip a few bf16 roundings
    # and the runs drift apart chaotically: 6.5e-5 after step 4 (measured), still far below the ~lr (3e-3)
    # that a real difference (a wrong lr or wrong gradients) makes.
    assert deepspeed_runs[0]["bf16"]["diff_to_ddp"] < BF16_PARAM_TOLERANCE


class _PlantedPayload:
    """Pickles into a call of os.system: what a tampered checkpoint would carry."""

    def __reduce__(self):
        import os

        return (os.system, ("echo should-never-run",))


@pytest.mark.tier("quick")
def test_deepspeed_checkpoint_with_a_planted_pickle_is_refused(tmp_path):
    from zero_train.engines.deepspeed_engine import refuse_unexpected_pickles
    from zero_train.runtime.errors import UsageError

    torch.save(
        {"module": {"w": torch.zeros(2)}, "ds_version": "0.19.8"}, tmp_path / "mp_rank_00_model_states.pt"
    )
    refuse_unexpected_pickles(tmp_path)  # tensors and plain containers pass
    torch.save(
        {"optimizer_state_dict": _PlantedPayload()}, tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    )
    with pytest.raises(UsageError, match="refusing to load .*zero_pp_rank_0.*system"):
        refuse_unexpected_pickles(tmp_path)
    (tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"\x00garbage")
    with pytest.raises(UsageError, match="cannot read DeepSpeed checkpoint file"):
        refuse_unexpected_pickles(tmp_path)

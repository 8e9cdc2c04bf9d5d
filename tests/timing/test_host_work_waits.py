"""Designs v13's and v16's host work (zero_train.timing.host_work): a wait priced by the work between waits (the
fit recovers it, the step model adds it from its own other terms), a run's speed read from the calibration cells
nearest a step's shape and ranks, and a cost per ATen op a micro-batch dispatches (ActivationCount.ops)."""

from __future__ import annotations

import dataclasses

import pytest

from zero_train.memory.model.theory import ModelShape
from zero_train.timing.host_work import (
    TERM,
    fit_host_work,
    host_seconds,
    nearest_rows,
    run_scale,
    with_host_work,
)
from zero_train.timing.machine import preset_machine
from zero_train.timing.step import StepSetup, step_time

pytestmark = pytest.mark.tier("quick")


def _cpu():
    return dataclasses.replace(preset_machine("a100-80"), device="cpu", shared=True, overlap=0.0, cores=2)


def test_a_wait_costs_a_share_of_the_work_between_waits():
    # 2% of the step's other terms at each sync point plus 10 ms a micro-batch: a 0.05 s step's 20 waits cost
    # 20 ms, a 1 s step's 1 s; cells of both sizes give both back, where a fixed cost per wait cannot fit them
    rows = [
        dict(engine="zero3", grad_accum=1, num_params=0, host_cores=1.0, sync_points=n, predicted_s=p,
             residual_s=0.01 + 0.02 * n * p, measured_s=p + 0.01 + 0.02 * n * p)
        for p, n in ((0.05, 0), (0.05, 20), (1.0, 20), (1.0, 50))
    ]  # fmt: skip
    fits = fit_host_work(rows, ("per_micro_batch_s", "per_sync_work_s"), relative=True)
    assert fits["zero3"]["per_sync_work_s"] == pytest.approx(0.02)
    assert fits["zero3"]["per_micro_batch_s"] == pytest.approx(0.01)
    fixed = fit_host_work(rows, ("per_micro_batch_s", "per_sync_s"), relative=True)
    # a fixed cost per wait overprices the small step's (30 ms of host work) by more than 10%
    assert host_seconds(with_host_work(_cpu(), fixed), "zero3", grad_accum=1, num_params=0, ranks_on_node=2,
                        sync_points=20) > 1.1 * rows[1]["residual_s"]  # fmt: skip
    # the step model prices it from its own terms without host work
    shape = ModelShape(num_params=10**6, num_layers=2, hidden_size=64, vocab_size=8192)
    setup = StepSetup(engine="zero3", world_size=2, gpus_per_node=2, micro_batch_size=2, block_size=64,
                      precision="fp32", threads_per_rank=1)  # fmt: skip
    bare = step_time(shape, None, setup, _cpu())
    fitted = step_time(shape, None, setup, with_host_work(_cpu(), {"zero3": dict(per_sync_work_s=0.02)}))
    assert bare.sync_points > 0
    assert fitted.terms[TERM] == pytest.approx(0.02 * bare.sync_points * bare.seconds)


def test_a_step_is_scaled_by_the_calibration_cells_of_its_nearest_shape_and_ranks():
    cells = [
        dict(num_params=p, world_size=w, measured_s=s, engine="ddp", predicted_s=1.0, grad_accum=1,
             comm_s=0.0, logits=0, ckpt_layers=0, calls=0, sync_points=0)
        for p, w, s in ((617_000, 1, 1.1), (617_000, 2, 1.3), (24_800_000, 1, 0.9), (24_800_000, 2, 1.0))
    ]  # fmt: skip
    # 640k parameters (a tiny model) at 4 ranks: llama-tiny's 2-rank cells; 60M at 1 rank: gpt2-25m's 1-rank
    assert nearest_rows(cells, 640_768, 4) == [cells[1]]
    assert nearest_rows(cells, 60_000_000, 1) == [cells[2]]
    assert nearest_rows([], 10, 1) == []
    machine = _cpu()
    assert run_scale(machine, nearest_rows(cells, 640_768, 4)) == pytest.approx(1.3)
    assert run_scale(machine, cells) == pytest.approx(1.05)  # all of them: the median of four


def test_a_cost_per_op_is_fitted_shared_and_charged_per_op_the_count_dispatched():
    # design v16: seconds per ATen op a micro-batch dispatches, on one core, shared by every engine
    import torch

    from zero_train.hf.models import model_config
    from zero_train.memory.model.activations import count_activations

    per_op, own = 1.5e-5, {"ddp": 0.004, "ds1": 0.02}
    cells = ((1, 1.0, 300), (2, 1.0, 900), (1, 0.5, 2_400))  # accumulation, host cores, ops per micro-batch
    rows = [
        dict(engine=e, grad_accum=k, num_params=620_000, host_cores=h, ops=ops, measured_s=1.0)
        | dict(residual_s=(a * k + per_op * ops * k) / h)
        for e, a in own.items()
        for k, h, ops in cells
    ]
    fits = fit_host_work(rows, terms=("per_micro_batch_s",), shared=("per_op_s",), relative=True)
    assert {e: (f["per_micro_batch_s"], f["per_op_s"]) for e, f in fits.items()} == {
        e: (pytest.approx(a, rel=1e-6), pytest.approx(per_op, rel=1e-6)) for e, a in own.items()
    }
    config = model_config("tiny")
    count = count_activations(config, micro_batch_size=2, block_size=32, dtype=torch.float32)
    assert count.ops > 100  # every op of a 2-layer forward and backward
    machine = with_host_work(_cpu(), fits)
    setup = StepSetup(engine="ds1", world_size=1, gpus_per_node=1, micro_batch_size=2, block_size=32,
                      grad_accum=2, precision="fp32", threads_per_rank=1)  # fmt: skip
    shape = ModelShape(num_params=620_000, num_layers=2, hidden_size=64, vocab_size=8192)
    with_ops, without = step_time(shape, count, setup, machine), step_time(shape, None, setup, machine)
    assert with_ops.terms[TERM] - without.terms[TERM] == pytest.approx(per_op * count.ops * 2)

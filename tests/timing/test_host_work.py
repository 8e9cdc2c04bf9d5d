"""An engine's fitted host work (zero_train.timing.host_work) and a CPU rank's share of the machine: the fit recovers
the per-micro-batch and per-parameter costs it was given (and the terms shared by every engine: per logit element,
per checkpointed layer, per collective call), the term scales with accumulation and with ranks beyond the cores,
and the step model adds it only for engines fitted on the machine."""

from __future__ import annotations

import dataclasses

import numpy
import pytest

from zero_train.memory.model.theory import ModelShape
from zero_train.timing.host_work import (
    SCALE_TERM,
    TERM,
    TERMS,
    at_speed,
    fit_host_work,
    host_seconds,
    reductions,
    run_scale,
    speed_scale,
    with_host_work,
)
from zero_train.timing.machine import preset_machine
from zero_train.timing.step import StepSetup, step_time

pytestmark = pytest.mark.tier("quick")


def _cpu(cores: int = 2):
    """A 2-core CPU machine (the figures are a GPU preset's: only the sharing matters here)."""
    return dataclasses.replace(preset_machine("a100-80"), device="cpu", shared=True, overlap=0.0, cores=cores)


def test_the_fit_recovers_per_micro_batch_and_per_parameter_costs():
    a, b = 0.05, 4e-9  # 50 ms per forward/backward, 4 ns per parameter
    rows = [
        dict(engine="ds1", grad_accum=k, num_params=n, host_cores=1.0, residual_s=a * k + b * n)
        for k, n in ((1, 24_800_000), (1, 620_000))
    ]
    rows.append(dict(engine="ddp", grad_accum=1, num_params=620_000, host_cores=0.5, residual_s=0.2))
    fits = fit_host_work(rows)
    assert fits["ds1"]["per_micro_batch_s"] == pytest.approx(a)
    assert fits["ds1"]["per_param_s"] == pytest.approx(b)
    # one size measured: all of it per micro-batch, on the host share it ran on (half a core: 0.2 s -> 0.1 s)
    assert fits["ddp"] == dict(per_micro_batch_s=pytest.approx(0.1), per_param_s=0.0, cells=1)


def test_the_term_scales_with_accumulation_and_ranks_beyond_the_cores():
    machine = with_host_work(_cpu(), {"zero1": dict(per_micro_batch_s=0.1, per_param_s=1e-9, cells=2)})

    def host(engine="zero1", grad_accum=1, ranks=2):
        return host_seconds(machine, engine, grad_accum=grad_accum, num_params=10**8, ranks_on_node=ranks)

    assert host() == pytest.approx(0.1 + 0.1)
    assert host(grad_accum=2, ranks=1) == pytest.approx(0.3)  # one rank: still one core, not two
    assert host(ranks=4) == pytest.approx(2 * host())  # four ranks on two cores: half a core each
    assert host("ddp") == 0.0


def test_a_rank_on_one_thread_gets_one_core_not_the_machine():
    machine = _cpu(cores=2)
    assert machine.per_rank(1) == 1.0  # the cores shared equally: one rank has both
    assert machine.per_rank(1, threads=1) == 0.5  # OMP_NUM_THREADS=1: one of two cores
    assert machine.per_rank(4, threads=1) == 0.25  # four ranks on two cores: half a core each
    shape = ModelShape(num_params=10**8)
    setup = dict(engine="ddp", world_size=1, gpus_per_node=1, micro_batch_size=2, block_size=64)
    setup["precision"] = "fp32"
    whole = step_time(shape, None, StepSetup(**setup), machine)
    single = step_time(shape, None, StepSetup(**setup, threads_per_rank=1), machine)
    assert single.terms["matmuls forward"] == pytest.approx(2 * whole.terms["matmuls forward"])
    assert TERM not in single.terms
    fitted = with_host_work(machine, {"ddp": dict(per_micro_batch_s=0.25, per_param_s=0.0)})
    assert step_time(shape, None, StepSetup(**setup), fitted).terms[TERM] == pytest.approx(0.25)


def test_a_fit_with_communication_separates_it_from_host_work():
    a, b, c = 0.08, 3e-9, 0.6  # 80 ms per micro-batch, 3 ns per parameter, 60% more than the modelled comm
    cells = [
        (1, 24_800_000, 1.0, 0.0),
        (1, 620_000, 1.0, 0.0),
        (1, 24_800_000, 1.0, 0.4),
        (1, 620_000, 1.0, 0.02),
    ]
    rows = [
        dict(
            engine="zero3",
            grad_accum=k,
            num_params=n,
            host_cores=h,
            comm_s=comm,
            residual_s=(a * k + b * n) / h + c * comm,
        )
        for k, n, h, comm in cells
    ]
    fit = fit_host_work(rows, ("per_micro_batch_s", "per_param_s", "per_comm_s"))["zero3"]
    assert (fit["per_micro_batch_s"], fit["per_param_s"], fit["per_comm_s"]) == pytest.approx((a, b, c))
    machine = with_host_work(_cpu(), {"zero3": fit})
    one_rank = host_seconds(machine, "zero3", grad_accum=2, num_params=10**6, ranks_on_node=1)
    # no communication at one rank: none of its excess; ZeRO-3 reduces every micro-batch: its per-parameter work twice
    assert one_rank == pytest.approx(2 * a + 2 * b * 1e6)
    four = host_seconds(machine, "zero3", grad_accum=1, num_params=10**6, ranks_on_node=4, comm_s=1.0)
    assert four == pytest.approx(2 * (a + b * 1e6) + c)


def test_per_parameter_work_runs_with_each_gradient_reduction():
    # the registry's reductions: every micro-batch for ZeRO-2/3, DeepSpeed ZeRO-2/3, FSDP2; at the boundary only
    # for DDP (no_sync), our ZeRO-1 and DeepSpeed ZeRO-1
    every = {"zero2", "zero3", "ds2", "ds3", "fsdp2-z2", "fsdp2-z3"}
    for engine in ("ddp", "zero1", "zero2", "zero3", "ds1", "ds2", "ds3", "fsdp2-z2", "fsdp2-z3"):
        assert reductions(engine, 4) == (4 if engine in every else 1), engine
        assert reductions(engine, 1) == 1
    fit = dict(per_micro_batch_s=0.05, per_param_s=4e-9)
    machine = with_host_work(_cpu(), {"ds1": fit, "ds2": fit})

    def host(engine, grad_accum):
        return host_seconds(machine, engine, grad_accum=grad_accum, num_params=10**7, ranks_on_node=2)

    assert host("ds1", 3) == pytest.approx(3 * 0.05 + 0.04)  # the per-parameter work once per step
    assert host("ds2", 3) == pytest.approx(3 * 0.05 + 3 * 0.04)  # once per micro-batch
    # a fit on cells with accumulation counts the per-parameter column per reduction: it recovers the costs
    rows = [
        dict(engine="ds2", grad_accum=k, num_params=n, host_cores=1.0, residual_s=0.05 * k + 4e-9 * n * k)
        for k, n in ((1, 24_800_000), (2, 620_000), (1, 620_000))
    ]
    assert fit_host_work(rows)["ds2"] == dict(
        per_micro_batch_s=pytest.approx(0.05), per_param_s=pytest.approx(4e-9), cells=3
    )


def test_shared_terms_are_fitted_once_for_every_engine_beside_each_engines_own():
    # per logit element, per checkpointed layer (both per micro-batch on one core) and per collective call,
    # shared; each engine's own per micro-batch and per parameter: exact residuals give back every value
    shared = dict(per_logit_s=1e-8, per_ckpt_layer_s=4e-3, per_call_s=2e-3)
    own = {"ds2": (0.01, 6e-9), "zero1": (0.005, 1e-9)}
    cells = [  # grad_accum, params, host cores, logits, checkpointed layers, calls
        (1, 24_800_000, 1.0, 128 * 8192, 0, 0),
        (1, 620_000, 1.0, 512 * 8192, 0, 40),
        (2, 620_000, 0.5, 512 * 8192, 2, 80),
        (1, 60_000_000, 1.0, 64 * 8192, 10, 0),
    ]
    rows = []
    for engine, (a, b) in own.items():
        for k, n, h, logits, layers, calls in cells:
            row = dict(engine=engine, grad_accum=k, num_params=n, host_cores=h, logits=logits, ckpt_layers=layers,
                       calls=calls)  # fmt: skip
            seconds = (a * k + b * n * reductions(engine, k)) / h
            seconds += (shared["per_logit_s"] * logits + shared["per_ckpt_layer_s"] * layers) * k / h
            seconds += shared["per_call_s"] * calls
            rows.append(row | dict(residual_s=seconds, measured_s=seconds + 0.5))
    fits = fit_host_work(rows, shared=tuple(shared), relative=True)
    for engine, (a, b) in own.items():
        expected = dict(shared, per_micro_batch_s=a, per_param_s=b)
        assert fits[engine] == {t: pytest.approx(v, rel=1e-6) for t, v in expected.items()} | {"cells": 4}
    # and the step model charges them: one rank (no calls) against two, with checkpointing
    machine = with_host_work(_cpu(), fits)
    shape = ModelShape(num_params=620_000, num_layers=2, hidden_size=64, vocab_size=8192)
    setup = dict(engine="ds2", gpus_per_node=2, micro_batch_size=4, block_size=128, precision="fp32")
    one = step_time(shape, None, StepSetup(**setup, world_size=1, gradient_checkpointing=True), machine)
    two = step_time(shape, None, StepSetup(**setup, world_size=2, gradient_checkpointing=True), machine)
    own_s = 0.01 + 6e-9 * 620_000
    assert one.terms[TERM] == pytest.approx(own_s + 1e-8 * 512 * 8192 + 4e-3 * 2)
    calls = sum(entry["calls"] for entry in two.comm.values())
    assert calls > 0
    assert two.terms[TERM] == pytest.approx(one.terms[TERM] + 2e-3 * calls)


def test_a_collinear_engine_drops_only_its_own_dependent_column_not_every_later_engines():
    # ddp measured at one accumulation and one size only: its per-parameter column is its per-micro-batch column
    # times 100, so only their sum is known; zero2 (later in the joint fit) has two independent cells and must keep
    # its own 0.1 s per micro-batch and 1 ms per parameter (a defect fitted it 0 / 0 behind ddp's dependent column)
    def row(engine, k, n, seconds):
        return dict(
            engine=engine, grad_accum=k, num_params=n, host_cores=1.0, residual_s=seconds, measured_s=1.0
        )

    rows = [row("ddp", 1, 100, 0.3)] * 3
    rows += [row("zero2", k, n, 0.1 * k + 0.001 * n * k) for k, n in ((1, 100), (1, 400), (2, 100))]
    for how in (dict(), dict(relative=True), dict(shared=("per_call_s",))):
        fits = fit_host_work(rows, **how)
        assert fits["zero2"]["per_micro_batch_s"] == pytest.approx(0.1), how
        assert fits["zero2"]["per_param_s"] == pytest.approx(0.001), how
        # ddp: all of its residual on its first column, the dependent one fitted as 0
        assert fits["ddp"]["per_micro_batch_s"] == pytest.approx(0.3), how
        assert fits["ddp"]["per_param_s"] == 0.0, how


def test_the_fit_is_never_negative_where_the_unconstrained_one_is():
    # zero2's residual falls as the model grows (the terms overcount its larger model): unconstrained least squares
    # gives it a negative cost per parameter, which would predict a step faster the more parameters it reduces
    cells = ((1, 1_000_000, 0.10), (1, 20_000_000, 0.08), (2, 1_000_000, 0.21))
    rows = [
        dict(engine="zero2", grad_accum=k, num_params=n, host_cores=1.0, residual_s=r) for k, n, r in cells
    ]
    a = numpy.array([[k, n * k] for k, n, _ in cells], dtype=float)
    y = numpy.array([r for _, _, r in cells])
    unconstrained = numpy.linalg.lstsq(a, y, rcond=None)[0]
    assert unconstrained[1] < 0 < unconstrained[0]
    fit = fit_host_work(rows)["zero2"]
    # the per-parameter cost at 0, and the per-micro-batch one the least squares of the k column alone:
    # sum(k r) / sum(k^2) = (0.10 + 0.08 + 0.42) / 6
    assert fit["per_param_s"] == 0.0
    assert fit["per_micro_batch_s"] == pytest.approx(0.60 / 6)
    # the same with a shared term whose unconstrained value is negative (calls the terms overprice): the reference
    # is numpy's least squares with per_call_s held at 0, which is the constrained optimum when its values are all
    # positive and moving per_call_s up from 0 would fit worse (the residual's correlation with the calls < 0)
    cells = [
        (e, n, c)
        for e in ("ds1", "ds3")
        for n, c in ((10**6, 0), (10**6, 40), (24 * 10**6, 10), (24 * 10**6, 90))
    ]
    rows = [_row(e, n, c, 0.05 + 2e-9 * n - 1e-3 * c) for e, n, c in cells]
    a = numpy.array(
        [[float(e == f) * v for f in ("ds1", "ds3") for v in (1.0, n / 1e6)] + [c] for e, n, c in cells]
    )
    y = numpy.array([row["residual_s"] for row in rows])
    assert numpy.linalg.lstsq(a, y, rcond=None)[0][4] < 0
    held = numpy.linalg.lstsq(a[:, :4], y, rcond=None)[0]
    assert (held > 0).all() and a[:, 4] @ (y - a[:, :4] @ held) < 0
    fits = fit_host_work(rows, shared=("per_call_s",), relative=True)
    assert fits["ds1"]["per_call_s"] == fits["ds3"]["per_call_s"] == 0.0
    got = [fits[e][t] * (1e6 if t == "per_param_s" else 1) for e in ("ds1", "ds3") for t in TERMS[:2]]
    assert got == pytest.approx(list(held), rel=1e-6)


def _row(engine: str, num_params: int, calls: int, residual_s: float) -> dict:
    """A cell at one micro-batch on one core (all measured alike: relative error weighs them the same)."""
    return dict(
        engine=engine,
        grad_accum=1,
        num_params=num_params,
        host_cores=1.0,
        calls=calls,
        residual_s=residual_s,
        measured_s=0.5,
    )


def test_a_rank_waits_where_it_blocks_and_longer_with_more_ranks_than_cores():
    # sync points from the engines' collectives: DeepSpeed ZeRO-2 waits at every bucket's all-reduce (blocking in
    # backward), our ZeRO-2 launches as many reduce-scatters and waits once per micro-batch; both once for the
    # gather after the step; nobody at one rank
    numels = (100_000,) * 6 + (20_000,) * 2
    shape = ModelShape(
        num_params=sum(numels), num_layers=2, hidden_size=64, vocab_size=8192, param_numels=numels
    )
    setup = dict(gpus_per_node=4, micro_batch_size=4, block_size=128, precision="fp32", grad_accum=2)
    setup["bucket_elements"] = 200_000
    steps = {
        e: step_time(shape, None, StepSetup(engine=e, world_size=4, **setup), _cpu())
        for e in ("ds2", "zero2")
    }
    for engine, step in steps.items():
        reduce_calls = sum(v["calls"] for k, v in step.comm.items() if "all_gather" not in k)
        assert reduce_calls > 2 * 2  # more than one bucket per micro-batch
        # blocking: a wait at each call; launched in backward: one wait per micro-batch
        waits = reduce_calls if engine == "ds2" else 2
        assert step.sync_points == waits + 1, engine
    alone = step_time(shape, None, StepSetup(engine="ds2", world_size=1, **setup), _cpu())
    assert alone.sync_points == 0
    # the oversubscribed term: 0 while ranks fit the cores, (ranks / cores - 1) x sync points beyond them
    fit = dict(per_sync_s=3e-3, per_oversubscribed_sync_s=2e-3)
    machine = with_host_work(_cpu(), {"ds2": fit})

    def host(ranks):
        return host_seconds(machine, "ds2", grad_accum=1, num_params=0, ranks_on_node=ranks, sync_points=10)

    assert (host(2), host(4), host(8)) == pytest.approx((0.030, 0.030 + 0.020, 0.030 + 3 * 0.020))
    assert step_time(shape, None, StepSetup(engine="ds2", world_size=4, **setup), machine).terms[TERM] == (
        pytest.approx(steps["ds2"].sync_points * (3e-3 + 2e-3))
    )
    # and the fit separates the two from cells at 1, 2 and 4 ranks on 2 cores (exact residuals give them back)
    rows = [
        dict(
            engine="ds2",
            grad_accum=1,
            num_params=10**6,
            host_cores=min(1.0, 2 / r),
            sync_points=s,
            residual_s=0.01 / min(1.0, 2 / r) + 3e-3 * s + 2e-3 * s * max(0, r / 2 - 1),
            measured_s=0.5,
        )
        for r, s in ((1, 0), (2, 20), (2, 35), (4, 20), (4, 35))
    ]
    fits = fit_host_work(rows, ("per_micro_batch_s",), shared=("per_sync_s", "per_oversubscribed_sync_s"))
    assert (fits["ds2"]["per_sync_s"], fits["ds2"]["per_oversubscribed_sync_s"]) == pytest.approx(
        (3e-3, 2e-3)
    )


def test_another_runs_cells_are_rescaled_to_this_runs_speed_by_the_cells_both_measured():
    # the earlier run measured three shared calibration cells at 1.0 / 2.0 / 4.0 s and one this run did not;
    # this run measured them at 0.8 / 1.5 / 3.6 s (0.8, 0.75, 0.9 of them): the median ratio 0.8, not the mean
    earlier = [
        dict(set="cal-a", engine="ddp", measured_s=1.0, predicted_s=0.5, residual_s=0.5),
        dict(set="cal-a", engine="ds3", measured_s=2.0, predicted_s=1.0, residual_s=1.0),
        dict(set="cal-b", engine="ddp", measured_s=4.0, predicted_s=3.0, residual_s=1.0),
        dict(set="held", engine="ddp", measured_s=3.0, predicted_s=2.0, residual_s=1.0),
    ]
    this = [
        dict(set="cal-a", engine="ddp", measured_s=0.8),
        dict(set="cal-a", engine="ds3", measured_s=1.5),
        dict(set="cal-b", engine="ddp", measured_s=3.6),
    ]
    scale = speed_scale(earlier, this)
    assert scale == pytest.approx(0.8)
    assert speed_scale(earlier, [dict(set="other", engine="ddp", measured_s=9.0)]) == 1.0  # nothing shared
    scaled = at_speed(earlier, scale)
    # each step 0.8 as long; its residual over that run's own prediction what is left: 3.0 s -> 2.4 - 2.0
    assert [row["measured_s"] for row in scaled] == pytest.approx([0.8, 1.6, 3.2, 2.4])
    assert [row["residual_s"] for row in scaled] == pytest.approx([0.3, 0.6, 0.2, 0.4])
    assert earlier[3]["measured_s"] == 3.0  # the stored rows are not changed


def test_a_run_scales_every_step_by_its_own_calibration_cells_measured_over_predicted():
    machine = with_host_work(_cpu(), {"ddp": dict(per_micro_batch_s=0.1, per_param_s=0.0)})
    cell = dict(engine="ddp", grad_accum=1, num_params=10**6, world_size=1, comm_s=0.0, logits=0, ckpt_layers=0,
                calls=0, sync_points=0)  # fmt: skip
    # predicted 0.4 + 0.1 s of host work = 0.5 s each; measured 0.55 / 0.6 / 0.9 s: the median ratio 1.2
    rows = [cell | dict(predicted_s=0.4, measured_s=m) for m in (0.55, 0.6, 0.9)]
    assert run_scale(machine, rows) == pytest.approx(1.2)
    assert run_scale(machine, []) == 1.0
    shape = ModelShape(num_params=10**8)
    setup = StepSetup(engine="ddp", world_size=1, gpus_per_node=1, micro_batch_size=2, block_size=64,
                      precision="fp32", threads_per_rank=1)  # fmt: skip
    plain = step_time(shape, None, setup, machine)
    scaled = step_time(shape, None, setup, dataclasses.replace(machine, step_scale=1.2))
    assert SCALE_TERM not in plain.terms
    assert scaled.seconds == pytest.approx(1.2 * plain.seconds)  # every term alike, the terms still the sum
    assert scaled.terms[SCALE_TERM] == pytest.approx(0.2 * plain.seconds)


def test_a_wait_may_cost_each_engine_its_own_but_not_per_engine_and_shared_at_once():
    # ds3 waits 5 ms at each of its sync points, zero3 1 ms, both 20 ms a micro-batch: per engine, both recovered
    rows = [
        dict(engine=e, grad_accum=k, num_params=0, host_cores=1.0, sync_points=n, residual_s=0.02 * k + s * n)
        for e, s in (("ds3", 0.005), ("zero3", 0.001))
        for k, n in ((1, 0), (1, 30), (2, 60))
    ]
    fits = fit_host_work(rows, ("per_micro_batch_s", "per_sync_s"))
    assert fits["ds3"]["per_sync_s"] == pytest.approx(0.005)
    assert fits["zero3"]["per_sync_s"] == pytest.approx(0.001)
    assert fits["zero3"]["per_micro_batch_s"] == pytest.approx(0.02)
    with pytest.raises(ValueError, match="per_sync_s: fitted per engine or shared, not both"):
        fit_host_work(rows, ("per_micro_batch_s", "per_sync_s"), shared=("per_sync_s",))


def test_a_wait_may_grow_with_the_peers_it_waits_for():
    # 1 ms a wait plus 2 ms a wait per peer beyond the rank: 3 ms at 2 ranks, 7 ms at 4, none at 1 (no waits);
    # fitted from 1- and 2-rank cells and a 4-rank one, it prices a 4-rank wait at 7 ms, not at 2 ranks' 3 ms
    rows = [
        dict(engine="ds3", grad_accum=1, num_params=0, host_cores=1.0, sync_points=n, world_size=w,
             residual_s=0.02 + n * (0.001 + 0.002 * (w - 1)))
        for w, n in ((1, 0), (2, 30), (2, 60), (4, 30))
    ]  # fmt: skip
    fits = fit_host_work(rows, ("per_micro_batch_s", "per_sync_s", "per_sync_peer_s"))
    assert fits["ds3"]["per_sync_s"] == pytest.approx(0.001)
    assert fits["ds3"]["per_sync_peer_s"] == pytest.approx(0.002)
    machine = with_host_work(_cpu(cores=4), fits)  # a core per rank: the micro-batch's 20 ms alike
    at = {w: host_seconds(machine, "ds3", grad_accum=1, num_params=0, ranks_on_node=w, sync_points=10, world_size=w)
          for w in (2, 4)}  # fmt: skip
    assert at[2] == pytest.approx(0.02 + 10 * 0.003)
    assert at[4] == pytest.approx(0.02 + 10 * 0.007)


def test_the_losss_work_splits_into_a_part_stretched_by_ranks_over_cores_and_a_part_not():
    # 3 ns a logit stretched (doubled at half a core), 5 ns not: cells at one core and at half a core recover
    # both, and the step at 4 ranks on 2 cores costs 2 x 3 + 5 = 11 ns a logit, not 2 x 8 = 16
    logits = 512 * 32_000
    rows = [
        dict(engine="ddp", grad_accum=k, num_params=0, host_cores=h, logits=logits,
             residual_s=k * logits * (3e-9 / h + 5e-9), measured_s=1.0)
        for k, h in ((1, 1.0), (2, 1.0), (1, 0.5), (2, 0.5))
    ]  # fmt: skip
    fits = fit_host_work(rows, (), ("per_logit_s", "per_logit_rank_s"))
    assert fits["ddp"]["per_logit_s"] == pytest.approx(3e-9)
    assert fits["ddp"]["per_logit_rank_s"] == pytest.approx(5e-9)
    machine = with_host_work(_cpu(cores=2), fits)
    seconds = host_seconds(machine, "ddp", grad_accum=1, num_params=0, ranks_on_node=4, logits=logits)
    assert seconds == pytest.approx(logits * 11e-9)

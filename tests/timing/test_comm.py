"""zero_train/timing/comm.py: an engine's collectives on a set-up, against the CommLedger's measured bytes per engine
(docs/bench.md) and the ring algorithms' bus-bandwidth formula."""

from __future__ import annotations

import dataclasses

import pytest

from zero_train.hf.models import model_config
from zero_train.memory.model.theory import ModelShape, model_shape
from zero_train.registry import ENGINES
from zero_train.timing.comm import CommSetup, collective_seconds, ring_factor
from zero_train.timing.machine import preset_machine
from zero_train.timing.step import StepSetup, step_time

pytestmark = pytest.mark.tier("quick")


GPT2_25M_FP32_PSI_MB = 99.3
"""Psi of gpt2-25m in fp32 (24.8M x 4 B), the unit of docs/bench.md's ledger table at world size 2."""
LEDGER_PER_STEP = {
    "ddp": {"all_reduce": 1}, "zero1": {"reduce_scatter": 1, "all_gather": 1},
    "zero2": {"reduce_scatter": 1, "all_gather": 1}, "torch-zero": {"all_reduce": 1, "broadcast": 1},
    "ds1": {"all_reduce": 1, "all_gather": 1}, "ds2": {"all_reduce": 1, "all_gather": 1},
    "fsdp2-z2": {"reduce_scatter": 1, "all_gather": 1}, "fsdp2-z3": {"reduce_scatter": 1, "all_gather": 2},
    "zero3": {"reduce_scatter": 1, "all_gather": 2}, "ds3": {"reduce_scatter": 1, "all_gather": 1},
}  # fmt: skip
"""Payload per step in Psi, as the CommLedger measured it (docs/bench.md, gpt2-25m, 2 ranks, fp32; our ZeRO-1/2/3's
p2p rings counted as the collectives they implement). DeepSpeed ZeRO-1/2 all-reduce their gradient buckets
(stage_1_and_2.py allreduce_and_scatter, use_multi_rank_bucket_allreduce's default); DeepSpeed ZeRO-3 gathers once:
below stage3_max_reuse_distance it keeps the parameters gathered from forward to backward."""


@pytest.mark.parametrize("engine", sorted(LEDGER_PER_STEP))
def test_each_engines_bytes_per_step_are_what_the_ledger_measured(engine):
    shape = model_shape(model_config("gpt2-25m"))
    setup = StepSetup(engine=engine, world_size=2, gpus_per_node=2, micro_batch_size=2, block_size=64,
                      precision="fp32")  # fmt: skip
    step = step_time(shape, None, setup, preset_machine("h100-sxm"))
    by_op: dict[str, float] = {}
    for name, entry in step.comm.items():
        op = name.split()[0]
        by_op[op] = by_op.get(op, 0) + entry["payload_bytes"] / 1e6
    assert by_op == pytest.approx({op: n * GPT2_25M_FP32_PSI_MB for op, n in LEDGER_PER_STEP[engine].items()},
                                  rel=0.01)  # fmt: skip


def test_every_engine_with_ranks_to_talk_to_declares_its_collectives():
    assert all(spec.collectives for spec in ENGINES)


def test_ring_time_is_the_bus_bandwidth_formula():
    """1 GB all-reduced over 8 ranks of one H100 machine: 2 x 7/8 x 1e9 / (450 GB/s x 0.8) + one call's latency."""
    machine = preset_machine("h100-sxm")
    setup = CommSetup(world_size=8, gpus_per_node=8, precision="bf16", num_params=1, trainable_params=1,
                      num_tensors=1, units=1, bucket_elements=1)  # fmt: skip
    seconds = collective_seconds(machine, "all_reduce", 10**9, 1, setup)
    bandwidth = 2 * 7 / 8 * 1e9 / (450 * 0.8 * 1e9)
    assert seconds == pytest.approx(bandwidth + 10e-6 + 6 * 1e-6)
    assert ring_factor("all_gather", 8) == 7 / 8 and ring_factor("all_reduce", 1) == 0
    across = dataclasses.replace(setup, world_size=16)  # two machines: 8 NICs of 50 GB/s carry the ring
    assert collective_seconds(machine, "all_gather", 10**9, 1, across) == pytest.approx(
        15 / 16 * 1e9 / (min(450, 8 * 50) * 0.8 * 1e9) + 25e-6 + 15e-6
    )


def test_deepspeed_zero3_gathers_again_in_backward_only_what_it_released():
    """Below 0.5B parameters nothing is released after forward (reuse distance ~2N < 1e9); at 8B the blocks
    whose reuse distance passes 1e9, all but the last 1/16 of them, are gathered again."""
    shapes = {
        n: ModelShape(num_params=n, num_layers=32, trainable_numels=(n,)) for n in (400_000_000, 8 * 10**9)
    }
    setup = StepSetup(engine="ds3", world_size=8, gpus_per_node=8, micro_batch_size=1, block_size=4096)
    small, large = (step_time(shapes[n], None, setup, preset_machine("h100-sxm")) for n in sorted(shapes))
    assert "all_gather params (backward_gather)" not in small.comm
    again = large.comm["all_gather params (backward_gather)"]["payload_bytes"]
    assert again == pytest.approx(large.comm["all_gather params (forward)"]["payload_bytes"] * 15 / 16)

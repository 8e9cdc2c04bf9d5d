"""The step-time model (zero_train.timing) against its references: the FLOP formula of a GPT-2 forward, the
ledger's measured bytes per engine (docs/bench.md), the ring algorithms' factors, the overlap rules, the presets'
datasheet figures, and `zero-train plan` ranking by time."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from zero_train.hf.models import model_config
from zero_train.memory.model.activations import count_activations
from zero_train.memory.model.theory import ModelShape, model_shape
from zero_train.registry import ENGINES, engine_spec
from zero_train.timing.comm import CommSetup, collective_seconds, ring_factor
from zero_train.timing.machine import load_machine, preset_machine
from zero_train.timing.presets import GPUS, LINKS
from zero_train.timing.step import StepSetup, step_time

pytestmark = pytest.mark.tier("quick")


def test_flops_counted_on_the_fake_pass_are_the_gpt2_formula_and_checkpointing_adds_its_recompute():
    """tiny GPT-2 (2 layers, h 64, MLP 256, vocab 8192), 2 x 32 tokens: forward = 2 T (4 h^2 + 2 h m) per layer
    + the tied LM head's 2 T V h + attention's two batched matmuls 2 x 2 b s^2 h per layer, exactly."""
    config = model_config("tiny")
    layers, hidden, vocab, inner = config.n_layer, config.n_embd, config.vocab_size, config.n_inner
    batch, seq = 2, 32
    tokens = batch * seq
    plain, checkpointed = (
        count_activations(
            config, micro_batch_size=batch, block_size=seq, dtype=torch.float32, gradient_checkpointing=flag
        )  # fmt: skip
        for flag in (False, True)
    )
    attention = layers * 2 * (2 * batch * seq * seq * hidden)
    dense = 2 * tokens * layers * (4 * hidden * hidden + 2 * hidden * inner) + 2 * tokens * vocab * hidden
    assert plain.forward_flops == dense + attention
    assert checkpointed.forward_flops == plain.forward_flops and plain.recompute_flops == 0
    # backward: dX and dW of every matmul (2x forward), attention's backward 2.5x its forward (torch's formula)
    assert plain.backward_flops == 2 * dense + 5 * attention // 2
    assert plain.attention_flops == attention + 5 * attention // 2
    # checkpointing re-runs the blocks' forward in backward (torch stops at the last tensor backward needs)
    assert checkpointed.backward_flops - plain.backward_flops == checkpointed.recompute_flops
    blocks_forward = plain.forward_flops - 2 * tokens * vocab * hidden
    assert 0.5 * blocks_forward < checkpointed.recompute_flops <= blocks_forward
    assert plain.memory_bytes > 0


GPT2_25M_FP32_PSI_MB = 99.3
"""Psi of gpt2-25m in fp32 (24.8M x 4 B), the unit of docs/bench.md's ledger table at world size 2."""
LEDGER_PER_STEP = {
    "ddp": {"all_reduce": 1}, "zero1": {"reduce_scatter": 1, "all_gather": 1},
    "zero2": {"reduce_scatter": 1, "all_gather": 1}, "torch-zero": {"all_reduce": 1, "broadcast": 1},
    "ds1": {"reduce_scatter": 1, "all_gather": 1}, "ds2": {"reduce_scatter": 1, "all_gather": 1},
    "fsdp2-z2": {"reduce_scatter": 1, "all_gather": 1}, "fsdp2-z3": {"reduce_scatter": 1, "all_gather": 2},
    "zero3": {"reduce_scatter": 1, "all_gather": 2},
}  # fmt: skip
"""Payload per step in Psi, as the CommLedger measured it (docs/bench.md, gpt2-25m, 2 ranks, fp32; our ZeRO-1/2/3's
p2p rings counted as the collectives they implement; DeepSpeed's gloo all-reduce of the gradients as the
reduce-scatter it stands for). ds3 is left out: DeepSpeed keeps parameters gathered from forward to backward
when they are reused within stage3_max_reuse_distance (1e9 elements), so on a small model it gathers once, and
the model's second gather overcounts it (docs/steptime.md)."""


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


def test_reductions_launched_in_backward_hide_but_the_last_bucket_and_blocking_ones_do_not():
    shape = model_shape(model_config("gpt2-25m"))
    count = count_activations(
        model_config("gpt2-25m"), micro_batch_size=8, block_size=512, dtype=torch.bfloat16
    )
    gpu = preset_machine("a100-80", inter_node_gbps=10)  # a slow network: the reduction is long
    setup = StepSetup(engine="ddp", world_size=16, gpus_per_node=8, micro_batch_size=8, block_size=512)
    overlapped, serial = (step_time(shape, count, setup, machine)
                          for machine in (gpu, dataclasses.replace(gpu, overlap=0.0)))  # fmt: skip
    name = "comm: all_reduce grads (backward)"
    calls = overlapped.comm["all_reduce grads (backward)"]["calls"]
    total = serial.terms[name]
    backward_window = sum(
        overlapped.terms[k] for k in overlapped.terms if not k.startswith(("comm", "optim"))
    )
    assert overlapped.terms[name] == pytest.approx(
        max(total / calls, total - backward_window * 2 / 3), rel=0.2
    )
    assert overlapped.terms[name] < total and serial.hidden.get("all_reduce grads (backward)", 0) == 0
    blocking = step_time(shape, count, dataclasses.replace(setup, engine="ds1"), gpu)
    assert "reduce_scatter grads (backward_blocking)" not in blocking.hidden


def test_checkpointing_costs_its_recompute_and_accumulation_scales_compute_not_the_step_gather():
    config = model_config("gpt2-25m")
    shape, machine = model_shape(config), preset_machine("h100-sxm")
    counts = {flag: count_activations(config, micro_batch_size=4, block_size=256, dtype=torch.bfloat16,
                                      gradient_checkpointing=flag) for flag in (False, True)}  # fmt: skip
    base = StepSetup(engine="ds1", world_size=8, gpus_per_node=8, micro_batch_size=4, block_size=256)
    plain = step_time(shape, counts[False], base, machine)
    recomputed = step_time(
        shape, counts[True], dataclasses.replace(base, gradient_checkpointing=True), machine
    )
    assert recomputed.terms["recompute (checkpointing)"] > 0 and recomputed.seconds > plain.seconds
    assert recomputed.mfu < plain.mfu  # the same model FLOPs in more time
    accumulated = step_time(shape, counts[False], dataclasses.replace(base, grad_accum=4), machine)
    assert accumulated.terms["matmuls forward"] == pytest.approx(4 * plain.terms["matmuls forward"])
    gather = "comm: all_gather params (after_step)"
    assert accumulated.terms[gather] == pytest.approx(plain.terms[gather])
    assert accumulated.tokens_per_step == 4 * plain.tokens_per_step


def test_presets_name_their_links_and_sources_and_overrides_apply():
    for gpu in GPUS.values():
        assert {gpu.intra_link, gpu.inter_link, gpu.host_link} <= set(LINKS) and gpu.source
        assert gpu.tflops["bf16"] >= gpu.tflops["fp32"]
    h100 = preset_machine("h100-sxm", tflops=500, intra_node_gbps=100, inter_node_gbps=200)
    assert h100.peak_tflops["bf16"] == pytest.approx(500) and h100.intra.bus_gbps == pytest.approx(80)
    assert h100.inter.bus_gbps == pytest.approx(200 / 8 * 0.8)
    with pytest.raises(ValueError, match="unknown --gpu"):
        preset_machine("h100")


def test_a_machine_round_trips_through_its_json(tmp_path):
    machine = preset_machine("l40s")
    path = tmp_path / "machine.json"
    import json

    path.write_text(json.dumps(machine.as_dict()))
    assert load_machine(path) == machine
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a calibration file"):
        load_machine(path)


def test_lora_trains_fewer_bytes_and_offload_moves_the_optimizer_to_the_host():
    shape = ModelShape(num_params=8_000_000_000, num_layers=32, trainable_numels=(20_000_000,))
    machine = preset_machine("h100-sxm")
    setup = StepSetup(engine="ds3", world_size=8, gpus_per_node=8, micro_batch_size=1, block_size=4096)
    step = step_time(shape, None, setup, machine)
    assert step.comm["reduce_scatter grads (backward)"]["payload_bytes"] == 2 * 20_000_000
    assert step.comm["all_gather params (forward)"]["payload_bytes"] == 2 * 8_000_000_000
    moved = step_time(shape, None, dataclasses.replace(setup, offload_optimizer=True), machine)
    assert "optimizer step" not in moved.terms
    assert moved.terms["offload: host optimizer"] == pytest.approx(20e6 / 8 / (1e9 / 8))
    assert math.isclose(step.model_flops, 6 * 8e9 * 4096)


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

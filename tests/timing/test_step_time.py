"""zero_train/timing/step.py: one step's terms. Compute from the FLOPs the fake-tensor pass counts (checked against the
GPT-2 formula), the overlap rules, checkpointing, accumulation, LoRA and offload."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from zero_train.hf.models import model_config
from zero_train.memory.model.activations import count_activations
from zero_train.memory.model.theory import ModelShape, model_shape
from zero_train.timing.machine import preset_machine
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
    assert "all_reduce grads (backward_blocking)" not in blocking.hidden


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


def test_the_optimizer_is_priced_as_the_engine_runs_it_and_the_clip_reads_and_writes_the_shard():
    """DeepSpeed steps one flat partition single-tensor, the others foreach per parameter (calibrate measures
    both); every engine clips: 12 bytes per parameter of its gradient shard at memory bandwidth."""
    shape = ModelShape(num_params=100_000_000, num_layers=12, trainable_numels=(100_000_000,))
    machine = dataclasses.replace(
        preset_machine("h100-sxm"), optimizer_layouts={"foreach": 1000.0, "flat": 500.0}
    )
    setup = StepSetup(engine="ddp", world_size=4, gpus_per_node=4, micro_batch_size=1, block_size=1024)
    ddp = step_time(shape, None, setup, machine)
    ds1 = step_time(shape, None, dataclasses.replace(setup, engine="ds1"), machine)
    assert ddp.terms["optimizer step"] == pytest.approx(100e6 * 40 / 1000e9)
    assert ds1.terms["optimizer step"] == pytest.approx(25e6 * 40 / 500e9)
    assert ddp.terms["gradient clipping"] == pytest.approx(100e6 * 12 / (machine.memory_gbps * 1e9))
    unclipped = step_time(shape, None, dataclasses.replace(setup, gradient_clipping=False), machine)
    assert "gradient clipping" not in unclipped.terms


def test_the_recompute_is_the_blocks_whole_forward_as_torch_runs_it():
    """torch's non-reentrant checkpoint re-runs a block until the last tensor its backward saved, a linear's
    weight among them: the block's last linear runs again too. Counted by torch's profiler on a real tiny GPT-2
    (matmul calls per step, plain vs checkpointed; under a dispatch mode, as the count's fake pass runs, torch
    stops one linear earlier) and priced so: the step's recompute is the forward less the LM head."""
    from zero_train.hf.models import build_model, enable_gradient_checkpointing
    from zero_train.timing.step import Compute

    config = model_config("tiny")
    batch, seq = 2, 32
    calls = {}
    for flag in (False, True):
        torch.manual_seed(0)
        model = build_model(config)
        model.train()
        if flag:
            enable_gradient_checkpointing(model)
        ids = torch.randint(0, config.vocab_size, (batch, seq))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            model(input_ids=ids, labels=ids).loss.backward()
        calls[flag] = sum(e.count for e in profile.key_averages() if e.key in ("aten::addmm", "aten::mm"))
    assert calls[True] - calls[False] == 4 * config.n_layer  # every block linear (qkv, proj, fc, proj) again
    plain, checkpointed = (
        count_activations(
            config, micro_batch_size=batch, block_size=seq, dtype=torch.float32, gradient_checkpointing=flag
        )  # fmt: skip
        for flag in (False, True)
    )
    tokens, shape = batch * seq, model_shape(config)
    blocks_forward = plain.forward_flops - 2 * tokens * config.vocab_size * config.n_embd
    work = Compute.of(shape, checkpointed, tokens)
    assert checkpointed.recompute_flops < blocks_forward  # the fake pass's count stops before the last linear
    assert work.recompute_flops == blocks_forward
    assert work.backward_flops == plain.backward_flops + blocks_forward
    assert Compute.of(shape, plain, tokens).backward_flops == plain.backward_flops  # nothing without it

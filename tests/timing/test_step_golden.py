"""Stored predictions: a change to the step-time model (its constants, presets, FLOP count or collectives) that moves
any of these set-ups' step time by more than 1% fails here until tests/timing/step_golden.json is rewritten in the
same change (`ZT_UPDATE_GOLDEN=1` and this test rewrites it; the diff then shows what moved)."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
import torch

from zero_train.hf.models import model_config
from zero_train.memory.model.activations import count_activations
from zero_train.memory.model.theory import model_shape
from zero_train.timing.machine import load_machine, preset_machine
from zero_train.timing.step import StepSetup, step_time

pytestmark = pytest.mark.tier("quick")

GOLDEN = pathlib.Path(__file__).with_name("step_golden.json")
SETUPS = [
    dict(model="llama-3-8b", gpu="h100-sxm", engine="fsdp2-z3", world_size=16, gpus_per_node=8, micro_batch_size=1,
         block_size=4096, grad_accum=4),
    dict(model="llama-3-8b", gpu="h100-sxm", engine="ds3", world_size=64, gpus_per_node=8, micro_batch_size=1,
         block_size=4096, gradient_checkpointing=True),
    dict(model="llama-3-8b", gpu="a100-80", engine="ds2", world_size=8, gpus_per_node=8, micro_batch_size=1,
         block_size=4096, offload_optimizer=True),
    dict(model="gpt2-25m", gpu="rtx-4090", engine="ddp", world_size=2, gpus_per_node=2, micro_batch_size=8,
         block_size=1024, precision="fp32"),
    dict(model="gpt2-25m", gpu="l40s", engine="torch-zero", world_size=4, gpus_per_node=4, micro_batch_size=8,
         block_size=1024, grad_accum=2),
    dict(model="gpt2-25m", gpu="h200", engine="zero2", world_size=32, gpus_per_node=8, micro_batch_size=16,
         block_size=1024, grad_accum=2),
    dict(model="gpt2-25m", machine="epyc-2core", engine="ds3", world_size=4, gpus_per_node=4, micro_batch_size=2,
         block_size=64, grad_accum=2, precision="fp32", threads_per_rank=1),
    dict(model="llama-tiny", machine="epyc-2core", engine="zero1", world_size=1, gpus_per_node=1, micro_batch_size=4,
         block_size=128, gradient_checkpointing=True, precision="fp32", threads_per_rank=1),
]  # fmt: skip
"""Set-ups across engines, GPUs, precisions, one and several machines, checkpointing, accumulation, offload; and CPU
ranks on a calibrated machine with its engines' fitted host work (machine_epyc-2core.json: design v3's calibration
in docs/steptime.md's check on this 2-core EPYC)."""


def _predict(case: dict) -> dict:
    case = dict(case)
    config, gpu, stored = model_config(case.pop("model")), case.pop("gpu", None), case.pop("machine", None)
    setup = StepSetup(**case)
    dtype = torch.float32 if setup.precision == "fp32" else torch.bfloat16
    count = count_activations(config, micro_batch_size=setup.micro_batch_size, block_size=setup.block_size,
                              dtype=dtype, gradient_checkpointing=setup.gradient_checkpointing)  # fmt: skip
    machine = load_machine(GOLDEN.with_name(f"machine_{stored}.json")) if stored else preset_machine(gpu)
    step = step_time(model_shape(config), count, setup, machine)
    return dict(seconds=step.seconds, tokens_per_s=step.tokens_per_s, mfu=step.mfu)


def test_stored_predictions_have_not_moved():
    predicted = [dict(setup=case, **_predict(case)) for case in SETUPS]
    if os.environ.get("ZT_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(predicted, indent=1) + "\n")
    stored = json.loads(GOLDEN.read_text())
    assert [row["setup"] for row in stored] == SETUPS, "the set-ups changed: rewrite with ZT_UPDATE_GOLDEN=1"
    for now, then in zip(predicted, stored, strict=True):
        assert now["seconds"] == pytest.approx(then["seconds"], rel=0.01), (now["setup"], now, then)
        assert now["mfu"] == pytest.approx(then["mfu"], rel=0.01)

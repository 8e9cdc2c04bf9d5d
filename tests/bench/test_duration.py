"""The bench's up-front duration (zero_train.bench.duration): its FLOP count against torch's FLOP counter, its
arithmetic against a hand computation, its line."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from zero_train.bench import duration
from zero_train.hf.models import build_model, model_config
from zero_train.launch.launcher import model_meta

pytestmark = pytest.mark.tier("quick")


def test_step_flops_are_within_5_percent_of_torchs_flop_counter():
    model = build_model(model_config("tiny"))
    meta = dict(model_meta("tiny", 32), micro_batch_size=2, block_size=32)
    ids = torch.randint(0, model.config.vocab_size, (2, 32))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    assert duration.step_flops(meta) / counter.get_total_flops() == pytest.approx(1.0, abs=0.05)


def test_bench_seconds_adds_launches_runs_and_steps(monkeypatch):
    rates = {"fp32": 4e10, "bf16": 1e10}
    monkeypatch.setattr(duration, "matmul_rate", lambda precision, width: rates[precision])
    monkeypatch.setattr(duration.os, "cpu_count", lambda: 2)
    meta = dict(
        num_params=1e8, num_layers=12, hidden_size=768, micro_batch_size=2, block_size=256, world_size=4
    )
    flops = 512 * (6e8 + 12 * 12 * 768 * 256)
    step = {
        p: flops * 2 / (duration.STEP_SHARE_OF_MATMUL * rate) for p, rate in rates.items()
    }  # 4 ranks, 2 cores
    prediction = duration.bench_seconds(meta, [("fp32", 6), ("bf16", 2), ("fp32", 6)], launches=1)
    # the launch's start stretched as its steps are: 4 ranks' interpreters on 2 cores
    expected = 2 * duration.LAUNCH_START_S + 3 * duration.RUN_START_S + 12 * step["fp32"] + 2 * step["bf16"]
    assert prediction["total_s"] == pytest.approx(expected)
    line = duration.duration_line(prediction, 3)
    assert line.startswith(f"bench: 3 runs, about {expected / 60:.0f} min on this machine")


def test_matmul_rate_is_a_plausible_single_thread_rate():
    rate = duration.matmul_rate("fp32", 256, seconds=0.05)
    assert 1e8 < rate < 1e12  # one core: between an old laptop's and ten AVX-512 cores'

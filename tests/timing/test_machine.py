"""zero_train/timing/machine.py and presets.py: the presets' datasheet figures, overrides, the machine JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest

from zero_train.timing.machine import load_machine, preset_machine
from zero_train.timing.presets import GPUS, LINKS

pytestmark = pytest.mark.tier("quick")


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

    path.write_text(json.dumps(machine.as_dict()))
    assert load_machine(path) == machine
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a calibration file"):
        load_machine(path)


def test_a_cpu_ranks_share_pays_the_calibrated_contention_once_every_core_is_busy():
    """2 cores whose matmul rate per core halves when both run (contention 0.5): one rank on one thread keeps a
    whole core (1/2 of the machine), two ranks each get a core at half its rate, four half of that."""
    cpu = dataclasses.replace(
        preset_machine("l40s"), shared=True, cores=2, contention={"matmul": 0.5, "memory": 0.8}
    )
    assert cpu.rank_share("matmul", 1, threads=1) == pytest.approx(0.5)
    assert cpu.rank_share("matmul", 2, threads=1) == pytest.approx(0.25)
    assert cpu.rank_share("memory", 2, threads=1) == pytest.approx(0.4)
    assert cpu.rank_share("matmul", 4, threads=1) == pytest.approx(0.125)
    assert cpu.rank_share("matmul", 1) == pytest.approx(0.5)  # one rank's threads on both cores
    assert dataclasses.replace(cpu, contention={}).rank_share("matmul", 2, threads=1) == pytest.approx(0.5)
    # a measured ratio above 1 (design v5's calibration: memory 1.40) is noise: busy cores are not faster
    noisy = dataclasses.replace(cpu, contention={"matmul": 1.04, "memory": 1.4})
    assert noisy.rank_share("memory", 2, threads=1) == noisy.rank_share("matmul", 4, threads=1) * 2 == 0.5


def test_a_calibrated_cpus_matmul_rate_is_read_at_the_micro_batchs_tokens_and_the_models_width():
    """Log-log between the linear-layer shapes calibrate timed, clamped at their edges; none timed: None."""
    rates = {"64,64": 0.1, "64,256": 0.2, "256,64": 0.2, "256,256": 0.4}
    cpu = dataclasses.replace(preset_machine("l40s"), linear_by_shape={"fp32": rates})
    assert cpu.linear_rate("fp32", 128, 128) == pytest.approx(0.2)  # the geometric mean of the four
    assert cpu.linear_rate("fp32", 64, 256) == pytest.approx(0.2)
    assert cpu.linear_rate("fp32", 16, 4096) == pytest.approx(0.2)  # clamped to (64, 256)
    assert cpu.linear_rate("bf16", 128, 128) is None and cpu.linear_rate("fp32", 128, 0) is None

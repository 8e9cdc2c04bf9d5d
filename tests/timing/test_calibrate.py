"""`zero-train calibrate` (zero_train.timing.calibrate, cli/calibrate.py): what it measures is a Machine the step-time
model reads back, with positive rates, and its gloo ranks agree on every collective's calls (a mismatch would hang,
not fail)."""

from __future__ import annotations

import json

import pytest

from zero_train.timing import calibrate as calibrate_module
from zero_train.timing.calibrate import COMM_OPS, contention_ratios, measure_collectives
from zero_train.timing.machine import load_machine

pytestmark = pytest.mark.tier("quick")


def test_calibrate_measures_this_machine_into_a_machine_json(tmp_path, monkeypatch, cli_main):
    # what is checked is the Machine's shape and positive rates, not their precision: windows a quarter as long
    # (0.2 -> 0.05 s per microbenchmark, 1 -> 0.25 s per contention run) still time every one of them, and the
    # same 3 x 3 grid of linear shapes, smaller, and square sizes up to 256 still time every precision's kernels
    # (on a CPU without AVX512-BF16, which emulates bf16, the full-size bf16 shapes were most of the test's time:
    # docs/setup.md)
    monkeypatch.setattr(calibrate_module, "TIMED_SECONDS", 0.05)
    monkeypatch.setattr(calibrate_module, "CONTENTION_SECONDS", 0.25)
    monkeypatch.setattr(calibrate_module, "SIZES", (128, 256))
    monkeypatch.setattr(calibrate_module, "LINEAR_TOKENS", (64, 128, 256))
    monkeypatch.setattr(calibrate_module, "LINEAR_WIDTHS", (64, 128, 256))
    path = tmp_path / "machine.json"
    for bad in ("0", "two"):  # refused before anything is measured
        refused = cli_main("calibrate", "-o", str(path), "--world-sizes", bad)
        assert refused.returncode == 2 and "--world-sizes" in refused.stderr and not path.exists()
    done = cli_main("calibrate", "-o", str(path), "--world-sizes", "1")  # 1: no collective to time
    assert done.returncode == 0 and done.stdout.strip().endswith(f"wrote {path}")
    machine = load_machine(path)
    written = json.loads(path.read_text())
    assert written == json.loads(json.dumps(machine.as_dict()))  # read back, nothing lost
    assert machine.measured == {}
    assert machine.device == "cpu" and machine.shared and machine.overlap == 0
    assert all(rate > 0 for rates in machine.matmul_by_size.values() for rate in rates.values())
    assert machine.memory_gbps > 0 and machine.optimizer_gbps > 0 and machine.attention_tflops["fp32"] > 0
    assert (
        set(machine.optimizer_layouts) == {"foreach", "flat"} and min(machine.optimizer_layouts.values()) > 0
    )
    assert machine.cores < 2 or (
        set(machine.contention) == {"matmul", "memory"}
        and 0 < min(machine.contention.values()) <= max(machine.contention.values()) <= 1
        and "measured raw" in machine.sources["contention"]
    )
    assert all(
        len(machine.linear_by_shape[p]) == 9 and min(machine.linear_by_shape[p].values()) > 0
        for p in ("fp32", "bf16")
    )
    again = cli_main("calibrate", "-o", str(path), "--world-sizes", "1")
    assert again.returncode == 2 and "exists; pass --force" in again.stderr


def test_contention_is_the_median_round_capped_at_one():
    # three rounds of one process alone (rate 10) and two together: per round the mean together rate over the
    # alone rate (matmul 0.5, 0.95, 1.0; memory 0.7, 1.3, 1.2): one disturbed round (v7's calibration measured
    # matmul 0.54 where four earlier runs measured 1.01-1.07) does not set it, the median does
    alone = [{"matmul": 10.0, "memory": 10.0}] * 3
    together = [
        [{"matmul": 4.0, "memory": 6.0}, {"matmul": 6.0, "memory": 8.0}],
        [{"matmul": 9.0, "memory": 13.0}, {"matmul": 10.0, "memory": 13.0}],
        [{"matmul": 10.0, "memory": 11.0}, {"matmul": 10.0, "memory": 13.0}],
    ]
    used, raw = contention_ratios(alone, together)
    assert raw == pytest.approx({"matmul": 0.95, "memory": 1.2})
    assert used == pytest.approx({"matmul": 0.95, "memory": 1.0})  # busy cores are not faster than one alone


@pytest.mark.tier("multiproc")
def test_collectives_are_timed_over_gloo_ranks():
    fits = measure_collectives(2)
    assert set(fits) == set(COMM_OPS)
    assert all(fit["payload_gbps"] > 0 and fit["latency_s"] >= 0 for fit in fits.values())

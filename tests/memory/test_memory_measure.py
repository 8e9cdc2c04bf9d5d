"""The CPU allocator measurement: a tensor of N bytes shows +N, freeing it -N, and peaks are caught."""

from __future__ import annotations

import time

import pytest
import torch

from zero_train.memory.measure import allocated_bytes, cpu_allocated_bytes, peak_bytes, reset_peak

pytestmark = pytest.mark.tier("quick")

CPU = torch.device("cpu")
TOLERANCE = 64 * 1024  # malloc chunk headers + small Python objects created between the two readings


@pytest.mark.parametrize("num_bytes", [1 << 20, 37 * (1 << 20) + 4096, 256 << 20])
def test_allocating_n_bytes_shows_plus_n(num_bytes):
    before = allocated_bytes(CPU)
    tensor = torch.empty(num_bytes, dtype=torch.uint8)
    during = allocated_bytes(CPU)
    del tensor
    after = allocated_bytes(CPU)
    assert abs((during - before) - num_bytes) < TOLERANCE
    assert abs((during - after) - num_bytes) < TOLERANCE


def test_small_tensor_in_arena_is_counted():
    before = cpu_allocated_bytes()
    tensor = torch.ones(64 * 1024, dtype=torch.float32)  # 256 KiB: below glibc's mmap threshold after warm-up
    grown = cpu_allocated_bytes() - before
    assert abs(grown - tensor.numel() * 4) < TOLERANCE


def test_peak_sees_a_freed_temporary_through_a_snapshot():
    reset_peak(CPU)
    base = allocated_bytes(CPU)
    temporary = torch.zeros(64 << 20, dtype=torch.uint8)
    allocated_bytes(CPU)  # a snapshot (as taken at a phase boundary) feeds the peak
    del temporary
    assert allocated_bytes(CPU) - base < TOLERANCE
    assert abs(peak_bytes(CPU) - base - (64 << 20)) < TOLERANCE


def test_peak_sampler_sees_a_temporary_without_snapshots():
    reset_peak(CPU)
    base = cpu_allocated_bytes()
    temporary = torch.zeros(32 << 20, dtype=torch.uint8)
    time.sleep(0.05)  # the sampler thread reads mallinfo2 every millisecond
    del temporary
    assert peak_bytes(CPU) - base >= (32 << 20) - TOLERANCE


def test_reset_peak_starts_from_the_current_level():
    temporary = torch.zeros(48 << 20, dtype=torch.uint8)
    allocated_bytes(CPU)
    del temporary
    reset_peak(CPU)
    assert peak_bytes(CPU) - allocated_bytes(CPU) < TOLERANCE


@pytest.mark.parametrize("duty", [None, "0.02"])
def test_a_slow_mallinfo2_is_sampled_less_often_only_under_a_duty_bound(duty, monkeypatch):
    """mallinfo2 made to cost 2 ms (a fragmented heap costs 0.2 ms): with no bound the sampler reads it back
    to back (every 1 ms + 2 ms); under ZT_MEM_SAMPLER_DUTY=0.02 it waits 2 ms / 0.02 = 100 ms between reads."""
    import threading

    from zero_train.memory import measure

    calls = []

    def slow_mallinfo2() -> int:
        calls.append((threading.get_ident(), time.perf_counter()))
        time.sleep(0.002)
        return 0

    if duty is None:
        monkeypatch.delenv(measure.SAMPLER_DUTY_ENV, raising=False)
    else:
        monkeypatch.setenv(measure.SAMPLER_DUTY_ENV, duty)
    monkeypatch.setattr(measure, "cpu_allocated_bytes", slow_mallinfo2)
    tracker = measure.CpuPeakTracker()
    time.sleep(0.6)
    tracker.stop()
    calls = [
        when for thread, when in calls if thread == tracker._thread.ident
    ]  # not the process's own sampler
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    if duty is None:
        assert len(calls) > 60 and max(sorted(gaps)[: len(gaps) // 2]) < 0.02
    else:
        assert 3 <= len(calls) <= 7 and min(gaps) >= 0.1

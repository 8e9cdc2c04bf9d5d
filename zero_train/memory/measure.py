"""Bytes allocated right now, and the peak since a reset, on CUDA or on CPU.

CUDA: the caching allocator's own counters (`torch.cuda.memory_allocated` / `max_memory_allocated`),
exact, peak included. They count live tensors only; what the GPU also holds is recorded beside them by
`cuda_memory_info`: the allocator's reserve (`max_memory_reserved`: cached blocks never returned), and,
from the driver (`torch.cuda.mem_get_info`), everything else in use on the device: the CUDA context,
NCCL's buffers, other processes.

CPU: glibc's `mallinfo2()` through ctypes. `uordblks` (bytes in use in the malloc arenas, all arenas
summed) plus `hblkhd` (bytes in mmap-ed chunks, where large tensors live) is the allocator-level
total: allocating a tensor of N bytes shows +N (+ a few bytes of chunk header), freeing it shows -N.
Process RSS is not used: it counts the interpreter and shared libraries and never shrinks.

glibc keeps no peak counter, so the CPU peak comes from two sources:
- a background thread samples `mallinfo2()` every `SAMPLE_INTERVAL_S` (or less often under `$ZT_MEM_SAMPLER_DUTY`,
  which zero-train bench sets: see `sampler_duty`);
- every `allocated_bytes()` / `sample()` call (phase boundaries, hooks) also feeds the peak.
Precision: the CPU peak is a LOWER BOUND of the true peak. A temporary that lives shorter than the
sampling interval (and is not alive at a snapshot) can be missed. Python's GIL lets the sampler in at
least every `sys.getswitchinterval()` (5 ms) and whenever torch releases the GIL inside a kernel,
which is where large temporaries are alive. On glibc-less systems (macOS, musl) CPU numbers are
unavailable and `allocated_bytes` raises RuntimeError.

The CPU counters describe the whole process (the allocator is process-wide), so the peak tracker is
one per process, created on first use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time

import torch

SAMPLE_INTERVAL_S = 0.001
"""How often the CPU sampler thread reads mallinfo2 (seconds), at most."""

SAMPLER_DUTY_ENV = "ZT_MEM_SAMPLER_DUTY"


def sampler_duty() -> float | None:
    """The share of time the sampler thread may spend inside mallinfo2 ($ZT_MEM_SAMPLER_DUTY; None: no bound).

    Under a bound the sampler waits (last call's cost) / duty between calls, at least SAMPLE_INTERVAL_S.
    mallinfo2 walks every free chunk under the arena's lock, so on a fragmented heap a fixed 1 ms slows the
    run it measures (measured: docs/bench.md#the-memory-samplers-bound). Unbounded unless asked: profile, the
    memory checks and the tests keep every 1 ms, since a small model's temporaries live for microseconds.
    """
    value = os.environ.get(SAMPLER_DUTY_ENV)
    return float(value) if value else None


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (glibc >= 2.33): every field a size_t."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _load_mallinfo2():
    """The `mallinfo2` function of the C library this process uses, or None if it has none."""
    try:
        libc = ctypes.CDLL(None)
        function = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return function


_MALLINFO2 = _load_mallinfo2()


def cpu_allocated_bytes() -> int:
    """Bytes in use in glibc's malloc right now: in-arena chunks (uordblks) + mmap-ed chunks (hblkhd).

    Raises:
        RuntimeError: the C library has no mallinfo2 (not glibc >= 2.33).
    """
    if _MALLINFO2 is None:
        raise RuntimeError("CPU memory measurement needs glibc >= 2.33 (mallinfo2); this libc has none")
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


class CpuPeakTracker:
    """Highest `cpu_allocated_bytes()` seen since the last reset: a sampler thread plus explicit samples."""

    def __init__(self, *, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._peak = cpu_allocated_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zero_train-mem-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        duty, wait = sampler_duty(), self.interval_s
        while not self._stop.wait(wait):
            started = time.perf_counter()
            self.sample()
            if duty:
                wait = max(self.interval_s, (time.perf_counter() - started) / duty)

    def sample(self) -> int:
        """Read the allocator now, fold it into the peak, and return the current bytes."""
        current = cpu_allocated_bytes()
        with self._lock:
            if current > self._peak:
                self._peak = current
        return current

    def peak(self) -> int:
        """The peak since the last reset (including a sample taken now)."""
        self.sample()
        with self._lock:
            return self._peak

    def reset(self) -> None:
        """Start a new peak window at the current level."""
        current = cpu_allocated_bytes()
        with self._lock:
            self._peak = current

    def stop(self) -> None:
        """Stop the sampler thread (samples at snapshots still work)."""
        self._stop.set()
        self._thread.join()


_CPU_TRACKER: CpuPeakTracker | None = None
_TRACKER_LOCK = threading.Lock()


def cpu_peak_tracker() -> CpuPeakTracker:
    """This process's CPU peak tracker (its sampler thread starts on first use)."""
    global _CPU_TRACKER
    with _TRACKER_LOCK:
        if _CPU_TRACKER is None:
            _CPU_TRACKER = CpuPeakTracker()
        return _CPU_TRACKER


def stop_cpu_tracker() -> None:
    """Stop this process's sampler thread, if one runs (a long-lived process between two measured pieces of
    work: an idle sampler still reads the allocator every interval); the next use starts a fresh tracker."""
    global _CPU_TRACKER
    with _TRACKER_LOCK:
        tracker, _CPU_TRACKER = _CPU_TRACKER, None
    if tracker is not None:
        tracker.stop()


def _is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


def allocated_bytes(device: torch.device | str) -> int:
    """Bytes allocated right now on `device` (CPU: the whole process's malloc; also feeds the peak).

    Args:
        device: a CUDA device or "cpu".

    Returns:
        CUDA: `torch.cuda.memory_allocated(device)`; CPU: mallinfo2 uordblks + hblkhd.
    """
    if _is_cuda(device):
        return int(torch.cuda.memory_allocated(device))
    return cpu_peak_tracker().sample()


def peak_bytes(device: torch.device | str) -> int:
    """Highest allocated bytes on `device` since the last `reset_peak` (CPU: a lower bound, see module doc)."""
    if _is_cuda(device):
        return int(torch.cuda.max_memory_allocated(device))
    return cpu_peak_tracker().peak()


def peak_reserved_bytes(device: torch.device | str) -> int:
    """Highest bytes the CUDA caching allocator reserved on `device` since the last `reset_peak` (0 off CUDA)."""
    return int(torch.cuda.max_memory_reserved(device)) if _is_cuda(device) else 0


def reset_peak(device: torch.device | str) -> None:
    """Start a new peak window at the current allocation level."""
    if _is_cuda(device):
        torch.cuda.reset_peak_memory_stats(device)
    else:
        cpu_peak_tracker().reset()


def cuda_memory_info(device: torch.device | str) -> dict[str, int] | None:
    """What a CUDA device holds beyond live tensors (None on CPU).

    Returns:
        max_allocated_bytes, max_reserved_bytes, reserved_bytes (the caching allocator; reserved minus
        allocated is its cache), free_bytes and total_bytes (the driver, mem_get_info), and
        outside_allocator_bytes = total - free - reserved: the CUDA context, NCCL's buffers, cuBLAS
        workspaces outside the allocator, and any other process on this GPU.
    """
    if not _is_cuda(device):
        return None
    free, total = torch.cuda.mem_get_info(device)
    reserved = int(torch.cuda.memory_reserved(device))
    return dict(
        max_allocated_bytes=int(torch.cuda.max_memory_allocated(device)),
        max_reserved_bytes=int(torch.cuda.max_memory_reserved(device)),
        reserved_bytes=reserved,
        free_bytes=int(free),
        total_bytes=int(total),
        outside_allocator_bytes=int(total) - int(free) - reserved,
    )

"""`zero-train calibrate`: this machine's rates, measured, as the Machine the step-time model reads (--machine).

    machine = calibrate(world_sizes=(1, 2, 4))      # a Machine; machine.as_dict() is the JSON

What is measured, each the best of repeats after a warm-up (a call over a second: itself), on one thread and multiplied by the cores (an OpenMP
region on a busy machine waits for its slowest thread; ranks of one machine share the cores: the model gives each
rank 1/ranks):
- matmul TFLOPS per precision (fp32, bf16) at square sizes 128-1024, and a linear layer's three matmuls (forward,
  input and weight gradients) at 64-1024 tokens x 64-1024 wide (a step's rate follows its tokens and width);
- fused attention (scaled_dot_product_attention, causal) TFLOPS of the FLOPs it executes;
- elementwise bytes/s (add, GELU, layer norm, softmax: bytes read + written, as OpCost counts them) per precision;
- contention: the per-core rate of a matmul and of elementwise ops with every core running them at once, over
  one core running them alone (the model scales a rank's compute by it when more than one core is busy);
- torch's AdamW step over 8M fp32 parameters, foreach over 16 tensors and single-tensor over one flat tensor (the
  ways the engines run it; bytes per parameter as constants.OPTIMIZER_BYTES_PER_PARAM);
- over gloo ranks on 127.0.0.1 at each world size: all_reduce, reduce_scatter_tensor, all_gather_into_tensor,
  broadcast and a point-to-point ring (our sharders' gloo collective), each at three sizes, fitted to
  seconds = latency + payload / rate (least squares).
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from zero_train.runtime.ports import free_port
from zero_train.timing import constants
from zero_train.timing.machine import Link, Machine, Measured

SIZES = (128, 256, 512, 1024)
"""Square matmul sizes measured."""
PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
COMM_ELEMENTS = (1 << 14, 1 << 18, 1 << 22)
"""fp32 elements of the payloads each collective is timed at (64 KB, 1 MB, 16 MB)."""
COMM_CALLS = (30, 10, 3)
"""Calls per repeat at each payload (every rank the same: a collective's calls must pair up)."""
COMM_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "p2p_ring")


TIMED_SECONDS = 0.2
"""Wall seconds each microbenchmark's repeats share (the optimizer's: 2.5 times that)."""


def _timed(work, *, seconds: float | None = None, repeats: int = 5, calls: int = 0) -> float:
    """Seconds of one call of `work`, the best of `repeats` batches (the machine's rate, not its neighbours'
    load); calls batched to `seconds` (default TIMED_SECONDS) / repeats each, or `calls` (ranks timing a
    collective must agree on it). A warm-up call longer than `repeats` x `seconds` is its own measurement: its
    one-time costs are small against it, and repeating a call that slow (emulated bf16) makes calibration
    minutes long (docs/steptime.md, "Calibrating a machine")."""
    seconds = TIMED_SECONDS if seconds is None else seconds
    started = time.perf_counter()
    work()
    warm_up_s = time.perf_counter() - started
    if not calls and warm_up_s >= repeats * seconds:
        return warm_up_s
    if not calls:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds / repeats:
            work()
            calls += 1
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            work()
        samples.append((time.perf_counter() - started) / calls)
    return min(samples)


def matmul_tflops(dtype: torch.dtype) -> dict[int, float]:
    """TFLOPS of an n x n matmul per size."""
    rates = {}
    for n in SIZES:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        rates[n] = 2 * n**3 / _timed(lambda a=a, b=b: a @ b) / 1e12
    return rates


LINEAR_TOKENS = (64, 256, 1024)
LINEAR_WIDTHS = (64, 256, 1024)
"""Tokens (rows) and widths of the linear layers timed: a CPU step's micro-batch has few tokens, and a matmul
with 64 rows runs well below a square one of the same FLOPs."""


def linear_tflops(dtype: torch.dtype) -> dict[str, float]:
    """TFLOPS of a linear layer's three matmuls as autograd runs them (forward x @ W^T, input gradient g @ W,
    weight gradient g^T @ x; W: 4h x h, an MLP's) at each tokens x width, keyed "tokens,width"."""
    rates = {}
    for tokens in LINEAR_TOKENS:
        for width in LINEAR_WIDTHS:
            x, weight = torch.randn(tokens, width, dtype=dtype), torch.randn(4 * width, width, dtype=dtype)
            grad = torch.randn(tokens, 4 * width, dtype=dtype)

            def trio(x=x, weight=weight, grad=grad) -> None:
                x @ weight.t(), grad @ weight, grad.t() @ x

            rates[f"{tokens},{width}"] = 3 * 2 * tokens * width * 4 * width / _timed(trio) / 1e12
    return rates


def attention_tflops(dtype: torch.dtype) -> float:
    """TFLOPS of causal attention's executed FLOPs (half the full 4 b h s^2 d)."""
    batch, heads, seq, dim = 2, 6, 256, 64
    q, k, v = (torch.randn(batch, heads, seq, dim, dtype=dtype) for _ in range(3))
    seconds = _timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    return 4 * batch * heads * seq * seq * dim * constants.CAUSAL_FRACTION / seconds / 1e12


def elementwise_gbps(dtype: torch.dtype) -> float:
    """GB/s of bytes read + written by typical unfused ops on 4M-element tensors."""
    x, y = torch.randn(4096, 1024, dtype=dtype), torch.randn(4096, 1024, dtype=dtype)
    nbytes = x.numel() * x.element_size()
    ops = [
        (lambda: x + y, 3 * nbytes),
        (lambda: F.gelu(x), 2 * nbytes),
        (lambda: F.layer_norm(x, (1024,)), 2 * nbytes),
        (lambda: torch.softmax(x, -1), 2 * nbytes),
    ]
    return sum(moved for _, moved in ops) / sum(_timed(op) for op, _ in ops) / 1e9


def optimizer_gbps(layout: str = "foreach") -> float:
    """Effective GB/s of torch's AdamW over 8M fp32 parameters, run as the engines run it: "foreach" over 16
    tensors (optimizer_spec's choice off CUDA: ddp, FSDP2, ours), "flat" single-tensor over one flat tensor
    (DeepSpeed's torch_adam over its flat fp32 partition; torch's default off CUDA). On a CPU the two differ
    about 2x per byte (foreach keeps a list of temporaries per op; one flat tensor's temporaries leave the caches)."""
    shapes = [(512, 1024)] * 16 if layout == "foreach" else [(16 * 512 * 1024,)]
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    for param in params:
        param.grad = torch.randn_like(param)
    optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=layout == "foreach")
    seconds = _timed(optimizer.step, seconds=2.5 * TIMED_SECONDS)
    return sum(p.numel() for p in params) * constants.OPTIMIZER_BYTES_PER_PARAM["fp32"] / seconds / 1e9


CONTENTION_SECONDS = 1.0
"""How long each process runs each microbenchmark when timing contention (one round of alone and together)."""
CONTENTION_ROUNDS = 3
"""Rounds of alone-then-together timings, interleaved, of which the median ratio is taken: one round alone
measured matmul 0.54 / memory 0.49 in design v7's run where v3-v6's measured 1.01-1.07 / 0.72-1.40
(docs/steptime.md, v7's "why it missed")."""


def contention(cores: int) -> tuple[dict[str, float], dict[str, float]]:
    """Per-core rate with every core running a microbenchmark at once / with one core running it alone, for a
    matmul (fp32, 256) and elementwise ops: CPU ranks (or one rank's threads) on every core share what the cores
    share (SMT siblings' units, caches, memory bandwidth), which one thread timed alone does not see. (used,
    measured raw) ({}, {} on one core): the median over CONTENTION_ROUNDS interleaved rounds, used capped at 1."""
    if cores < 2:
        return {}, {}
    alone, together = _concurrent(cores, CONTENTION_ROUNDS)
    return contention_ratios(alone, together)


def contention_ratios(
    alone: list[dict[str, float]], together: list[list[dict[str, float]]]
) -> tuple[dict[str, float], dict[str, float]]:
    """(used, raw) contention per kind from each round's alone rate and its processes' together rates: per round
    the mean together rate over the alone rate, the median over rounds (one disturbed round does not set it),
    used capped at 1 (cores busy together are not each faster than one alone: Machine.rank_share caps it too)."""
    raw = {
        kind: statistics.median(
            statistics.fmean(r[kind] for r in rates) / single[kind]
            for single, rates in zip(alone, together, strict=True)
        )
        for kind in alone[0]
    }
    return {kind: min(1.0, value) for kind, value in raw.items()}, raw


def _concurrent(processes: int, rounds: int) -> tuple[list[dict[str, float]], list[list[dict[str, float]]]]:
    """`processes` single-thread processes, spawned once, each round first one of them running each benchmark
    alone (the others blocked), then all together: (alone rates per round, every process's rates per round)."""
    context = mp.get_context("spawn")
    results, barrier = context.SimpleQueue(), context.Barrier(processes)
    workers = [  # the window passed on: a spawned process reads the module's constant afresh
        context.Process(target=_contention_main, args=(index, barrier, results, CONTENTION_SECONDS, rounds))
        for index in range(processes)
    ]
    for worker in workers:
        worker.start()
    outcomes = dict(results.get() for _ in workers)
    for worker in workers:
        worker.join()
    together = [[outcomes[i]["together"][r] for i in outcomes] for r in range(rounds)]
    return outcomes[0]["alone"], together


def _contention_main(index: int, barrier, results, seconds: float, rounds: int) -> None:
    torch.set_num_threads(1)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    x, y = torch.randn(4096, 1024), torch.randn(4096, 1024)
    work = {"matmul": (lambda: a @ b, 2 * 256**3), "memory": (lambda: x + y, 3 * x.numel() * 4)}
    timed: dict[str, list] = {"alone": [], "together": []}
    for _ in range(rounds):
        for phase in ("alone", "together"):
            rates = {}
            for kind, (op, amount) in work.items():
                op()
                barrier.wait()  # every process runs the same span of wall time (alone: process 0, the rest wait)
                if phase == "alone" and index:
                    continue
                calls, started = 0, time.perf_counter()
                while time.perf_counter() - started < seconds:
                    op()
                    calls += 1
                rates[kind] = calls * amount / (time.perf_counter() - started)
            if rates:
                timed[phase].append(rates)
    results.put((index, timed))


def _rank_main(rank: int, world_size: int, port: int, results) -> None:
    torch.set_num_threads(max(1, _cores() // world_size))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    fits = {}
    for op in COMM_OPS:
        points = []
        for elements, calls in zip(COMM_ELEMENTS, COMM_CALLS, strict=True):
            work, payload = _collective(op, elements, rank, world_size)
            dist.barrier()
            points.append((payload, _timed(work, repeats=5, calls=calls)))
        fits[op] = _line(points)
    if rank == 0:
        results.put(fits)
    dist.destroy_process_group()


def _line(points: list[tuple[int, float]]) -> dict[str, float]:
    """seconds = latency + bytes / rate, least squares over the points (latency at least 0)."""
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    slope = max(slope, 1e-15)
    return dict(latency_s=max(mean_y - slope * mean_x, 0.0), payload_gbps=1 / slope / 1e9)


def _collective(op: str, elements: int, rank: int, world_size: int):
    """(work, payload bytes) of one call; payload as the CommLedger counts it."""
    flat = torch.randn(elements - elements % world_size)
    part = torch.empty(flat.numel() // world_size)
    nbytes = flat.numel() * 4
    if op == "all_reduce":
        return (lambda: dist.all_reduce(flat)), nbytes
    if op == "reduce_scatter":
        return (lambda: dist.reduce_scatter_tensor(part, flat)), nbytes
    if op == "all_gather":
        return (lambda: dist.all_gather_into_tensor(flat, part)), nbytes
    if op == "broadcast":
        return (lambda: dist.broadcast(flat, 0)), nbytes
    chunks = list(flat.chunk(world_size))
    right, left = (rank + 1) % world_size, (rank - 1) % world_size

    def ring() -> None:  # an all-gather ring of isend/irecv, as our sharders run on gloo
        for step in range(world_size - 1):
            send, recv = chunks[(rank - step) % world_size], chunks[(rank - step - 1) % world_size]
            ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
            for request in dist.batch_isend_irecv(ops):
                request.wait()

    return ring, nbytes


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def measure_collectives(world_size: int) -> dict[str, dict]:
    """Every COMM_OPS fit at this world size (spawned gloo ranks on this machine)."""
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(
        _rank_main, args=(world_size, free_port(), results), nprocs=world_size, start_method="spawn"
    )
    return results.get()


def calibrate(*, world_sizes: tuple[int, ...] = (2, 4), name: str = "this machine") -> Machine:
    """Measure this machine (see the module docstring) into a Machine (device "cpu", ranks sharing it)."""
    torch.manual_seed(0)
    threads, cores = torch.get_num_threads(), _cores()
    torch.set_num_threads(1)
    try:
        by_size = {p: matmul_tflops(dtype) for p, dtype in PRECISION_DTYPES.items()}
        linear = {p: linear_tflops(dtype) for p, dtype in PRECISION_DTYPES.items()}
        attention = {p: attention_tflops(dtype) for p, dtype in PRECISION_DTYPES.items()}
        memory = {p: elementwise_gbps(dtype) for p, dtype in PRECISION_DTYPES.items()}
        layouts = {layout: optimizer_gbps(layout) for layout in ("foreach", "flat")}
    finally:
        torch.set_num_threads(threads)
    by_size = {p: {n: rate * cores for n, rate in rates.items()} for p, rates in by_size.items()}
    linear = {p: {key: rate * cores for key, rate in rates.items()} for p, rates in linear.items()}
    linear["fp16"] = linear["bf16"]
    attention = {p: rate * cores for p, rate in attention.items()}
    memory = {p: rate * cores for p, rate in memory.items()}
    layouts = {layout: rate * cores for layout, rate in layouts.items()}
    shared_cores, contention_raw = contention(cores)
    measured: dict[str, dict[int, Measured]] = {}
    for world in sorted(n for n in set(world_sizes) if n > 1):
        for op, fit in measure_collectives(world).items():
            measured.setdefault(op, {})[world] = Measured(**fit)
    by_size["fp16"] = by_size["bf16"]
    reference = measured.get("all_reduce", {})
    link = (
        Link(
            bus_gbps=next(iter(reference.values())).payload_gbps,
            latency_s=next(iter(reference.values())).latency_s,
        )
        if reference
        else Link(bus_gbps=1.0, latency_s=1e-4)
    )
    return Machine(
        name=name,
        device="cpu",
        peak_tflops={p: max(rates.values()) for p, rates in by_size.items()},
        matmul_tflops={p: rates[max(rates)] for p, rates in by_size.items()},
        matmul_by_size={p: {n: r for n, r in rates.items()} for p, rates in by_size.items()},
        linear_by_shape=linear,
        attention_tflops={**attention, "fp16": attention["bf16"]},
        memory_gbps=memory["fp32"],
        memory_scale={p: memory[p] / memory["fp32"] for p in memory}
        | {"fp16": memory["bf16"] / memory["fp32"]},
        optimizer_gbps=layouts["foreach"],
        optimizer_layouts=layouts,
        intra=link,
        inter=link,
        host_gbps=memory["fp32"],
        cpu_adam_params_per_s=layouts["flat"] * 1e9 / constants.OPTIMIZER_BYTES_PER_PARAM["fp32"],
        overlap=0.0,
        shared=True,
        measured=measured,
        cores=cores,
        contention=shared_cores,
        sources={
            "all": f"zero-train calibrate: one thread x {cores} cores, torch {torch.__version__}, gloo, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            "contention": "median of "
            f"{CONTENTION_ROUNDS} interleaved alone/together rounds, measured raw "
            + ", ".join(f"{kind} {value:.3f}" for kind, value in contention_raw.items())
            + ", used capped at 1",
        },
    )

"""Spawn a few gloo ranks on 127.0.0.1 and collect what each returns (used by tests and benchmarks).

    results = run_ranks(fn, world_size=2, args=(...,))   # results[rank] == fn(rank, world_size, *args)
    with RankPool(2) as pool:                             # the same ranks for many calls (tests/conftest.py)
        results = pool.run(fn, args=(...,))

`fn` must be a module-level function (it is pickled into the children). Each child gets the caller's
environment as it is at the call, plus RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, ZT_DEVICE=cpu (the
group is gloo: CPU tensors, also on a GPU machine), a gloo process group already initialised with the
collective timeout init_distributed uses ($ZT_COLLECTIVE_TIMEOUT_S, else 60 s), and one torch thread
(2-core machines: ranks would otherwise fight for cores).

Children are forked from a forkserver that has imported torch, transformers, zero_train's training loop
(and, where DS_ACCELERATOR=cpu, DeepSpeed, the model classes, datasets and peft: CPU_PRELOAD) once: each
child is still a fresh process with no collective, engine or DeepSpeed state of its own, but it starts
without re-importing those modules (measured: docs/startup.md#test-ranks). The server holds no thread and
no device context when it forks (it only imports), which is what makes forking safe. ZT_SPAWN=spawn restores
plain spawn.
"""

from __future__ import annotations

import datetime
import gc
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zero_train.runtime.dist import collective_timeout_s
from zero_train.runtime.ports import free_port

__all__ = [
    "RankPool",
    "free_port",
    "run_ranks",
]  # free_port re-exported: tests launching ranks themselves use it


# what every rank function imports anyway; the forkserver imports it once (see the module docstring)
PRELOAD = ("torch", "torch.distributed", "transformers", "zero_train.train.loop", "zero_train.engines.ddp")
# where DS_ACCELERATOR=cpu (the tests): also what ranks import lazily, none of which may probe a device in the
# server. transformers' model classes (modeling_gpt2 pulls in torch._dynamo), datasets (zero_train.hf.data),
# peft, DeepSpeed and its muon module (torch._inductor), which every deepspeed.initialize imports.
CPU_PRELOAD = (
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.llama.modeling_llama",
    "zero_train.hf.data",
    "peft",
    "zero_train.engines.deepspeed_engine",
    "deepspeed.runtime.zero.muon.muon_optimizer",
)
_context = None


def rank_context():
    """The multiprocessing context ranks start from: a preloaded forkserver (default) or spawn."""
    global _context  # one forkserver per process, started on first use: its imports are paid once
    if _context is None:
        if os.environ.get("ZT_SPAWN", "forkserver") == "spawn":
            _context = mp.get_context("spawn")
        else:
            _context = mp.get_context("forkserver")
            preload = list(PRELOAD)
            if os.environ.get("DS_ACCELERATOR") == "cpu":  # no device probing in the server before it forks
                preload.extend(CPU_PRELOAD)  # a module another version lacks is skipped
            _context.set_forkserver_preload(preload)
    return _context


def _become_rank(rank: int, world_size: int, port: int, environ: dict[str, str]) -> None:
    """A child's set-up before its group: the caller's environment (not the forkserver's at its start) with
    this rank's variables, one torch thread, the forkserver's imports frozen out of its collections."""
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        ZT_DEVICE="cpu",
    )
    torch.set_num_threads(1)
    gc.freeze()  # zero_train.runtime.startup


def _child(
    rank: int, world_size: int, port: int, fn: Callable, args: tuple, queue, environ: dict[str, str]
) -> None:
    _become_rank(rank, world_size, port, environ)
    try:
        timeout = datetime.timedelta(seconds=collective_timeout_s())
        _init_group(rank, world_size, timeout)
        result = fn(rank, world_size, *args)
        queue.put((rank, "ok", result))
    except BaseException:  # report any failure to the parent instead of hanging it
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _init_group(rank: int, world_size: int, timeout: datetime.timedelta) -> None:
    """The gloo group, then a barrier: init_process_group returns on a rank before its peers have finished
    connecting (torch adds no barrier unless TORCH_DIST_INIT_BARRIER=1), so a rank whose function returns at
    once could tear the group down under a peer still connecting ("Gloo connectFullMesh failed ... Connection
    closed by peer": 3 of 120 four-rank groups with three callers at once on the 2-core machine)."""
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout)
    dist.barrier()


def run_ranks(fn: Callable[..., Any], world_size: int, args: tuple = (), timeout_s: float = 300) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` gloo ranks; return the results by rank.

    Raises:
        RuntimeError: with the child's traceback if any rank failed or timed out.
    """
    ctx = rank_context()
    queue = ctx.SimpleQueue()
    port = free_port()
    environ = dict(os.environ)
    procs = [
        ctx.Process(target=_child, args=(r, world_size, port, fn, args, queue, environ))
        for r in range(world_size)
    ]
    for proc in procs:
        proc.start()
    results, errors = _collect(queue, procs, world_size, timeout_s)
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results[r] for r in range(world_size)]


def _collect(queue, procs: list, world_size: int, timeout_s: float) -> tuple[dict[int, Any], list[str]]:
    """Every rank's (rank, status, payload) from `queue`: (results by rank, error texts)."""
    results: dict[int, Any] = {}
    errors: list[str] = []
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout_s)
    while len(results) + len(errors) < world_size:
        if datetime.datetime.now() > deadline:
            errors.append(f"timed out after {timeout_s} s")
            break
        if queue.empty():
            if not any(p.is_alive() for p in procs) and queue.empty():
                errors.append("a rank died without reporting (killed or crashed)")
                break
            procs[0].join(0.05)
            continue
        rank, status, payload = queue.get()
        if status == "ok":
            results[rank] = payload
        else:
            errors.append(f"rank {rank}:\n{payload}")
    return results, errors


def _serve(rank: int, world_size: int, port: int, tasks, results, environ: dict[str, str]) -> None:
    """A pool rank: one gloo group for its whole life, then fn(rank, world_size, *args) per task."""
    _become_rank(rank, world_size, port, environ)
    timeout = datetime.timedelta(seconds=collective_timeout_s())
    _init_group(rank, world_size, timeout)
    try:
        while (task := tasks.get()) is not None:
            fn, args = task
            try:
                results.put((rank, "ok", fn(rank, world_size, *args)))
            except BaseException:  # report it; the pool is closed by the parent (peers may be mid-collective)
                results.put((rank, "error", traceback.format_exc()))
            finally:
                stop_memory_sampler()
    finally:
        dist.destroy_process_group()


def stop_memory_sampler() -> None:
    """Stop the CPU memory sampler a task started (zero_train.memory.measure), if any: it would go on reading
    the allocator every millisecond in an idle process for the rest of the session."""
    measure = sys.modules.get("zero_train.memory.measure")
    if measure is not None:
        measure.stop_cpu_tracker()


class RankPool:
    """`world_size` spawned gloo ranks kept alive across calls: the start-up (spawn, imports, group) once.

    `pool.run(fn, args)` is `run_ranks(fn, world_size, args)` on the same processes. Each call runs in the
    ranks' one process group (the default group, WORLD): a function may create sub-groups but must not
    destroy WORLD, and should not leave global state behind (what it imports stays imported). After a
    failed call the pool is closed (a peer may be stuck in a collective) and the next call raises.

    Args:
        world_size: ranks of the pool.
    """

    def __init__(self, world_size: int) -> None:
        ctx = rank_context()
        self.world_size = world_size
        self.tasks = [ctx.SimpleQueue() for _ in range(world_size)]
        self.results = ctx.SimpleQueue()
        port = free_port()
        self.procs = [
            ctx.Process(
                target=_serve,
                args=(r, world_size, port, self.tasks[r], self.results, dict(os.environ)),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for proc in self.procs:
            proc.start()
        self.broken: str | None = None

    def run(self, fn: Callable[..., Any], args: tuple = (), timeout_s: float = 300) -> list[Any]:
        """`fn(rank, world_size, *args)` on every rank of the pool; the results by rank.

        Raises:
            RuntimeError: a rank failed or timed out (with its traceback), or an earlier call did.
        """
        if self.broken is not None:
            raise RuntimeError(
                f"the {self.world_size}-rank pool is closed after an earlier failure: {self.broken}"
            )
        for queue in self.tasks:
            queue.put((fn, args))
        results, errors = _collect(self.results, self.procs, self.world_size, timeout_s)
        if errors:
            self.broken = errors[0].splitlines()[-1]
            self.close()
            raise RuntimeError("\n".join(errors))
        return [results[r] for r in range(self.world_size)]

    def close(self) -> None:
        """Stop the ranks (a rank that does not stop within 5 s is killed)."""
        for proc, queue in zip(self.procs, self.tasks, strict=True):
            if proc.is_alive():
                queue.put(None)
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

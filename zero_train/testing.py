"""Spawn a few gloo ranks on 127.0.0.1 and collect what each returns (used by tests and benchmarks).

    results = run_ranks(fn, world_size=2, args=(...,))   # results[rank] == fn(rank, world_size, *args)

`fn` must be a module-level function (it is pickled into the children). Each child gets RANK /
WORLD_SIZE / MASTER_ADDR / MASTER_PORT set, ZT_DEVICE=cpu (the group is gloo: CPU tensors, also on a
GPU machine), a gloo process group already initialised with the collective timeout init_distributed
uses ($ZT_COLLECTIVE_TIMEOUT_S, else 60 s), and one torch thread (2-core machines: ranks would otherwise
fight for cores).
"""

from __future__ import annotations

import datetime
import os
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zero_train.runtime.ports import free_port

__all__ = ["free_port", "run_ranks"]  # free_port re-exported: tests launching ranks themselves use it


def _child(rank: int, world_size: int, port: int, fn: Callable, args: tuple, queue) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        ZT_DEVICE="cpu",
    )
    torch.set_num_threads(1)
    try:
        from zero_train.runtime.dist import collective_timeout_s

        timeout = datetime.timedelta(seconds=collective_timeout_s())
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout)
        result = fn(rank, world_size, *args)
        queue.put((rank, "ok", result))
    except BaseException:  # report any failure to the parent instead of hanging it
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int, args: tuple = (), timeout_s: float = 300) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` gloo ranks; return the results by rank.

    Raises:
        RuntimeError: with the child's traceback if any rank failed or timed out.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(r, world_size, port, fn, args, queue)) for r in range(world_size)
    ]
    for proc in procs:
        proc.start()
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
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results[r] for r in range(world_size)]

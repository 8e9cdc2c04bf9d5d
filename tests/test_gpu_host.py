"""Defects that only a GPU host shows, each forced here on a CPU-only machine (issue 25, item 5).

torch.cuda and torch's default accelerator are monkeypatched to act like a GPU node, a launcher is a
small process tree, collectives are counted: the logic that was wrong on a GPU host runs here, the
hardware does not. tests/test_gpu_paths.py covers the device choice itself; scripts/gpu_check.sh runs the
real thing on GPUs.
"""

from __future__ import annotations

import contextlib
import datetime

import pytest
import torch
import torch.distributed as dist

from zero_train.testing import free_port


def _fake_gpu_node(monkeypatch, count: int = 2) -> None:
    """torch as on a node with `count` GPUs: CUDA available, and CUDA torch's default accelerator."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))


@contextlib.contextmanager
def _world_of_one():
    """A gloo default group of one rank in this process (a CPU run's group on the fake GPU node)."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_fsdp2_shards_on_the_runs_device_not_torchs_default_accelerator(monkeypatch):
    """ZT_DEVICE=cpu on a GPU host: the mesh is CPU over the gloo group (was: a CUDA mesh over gloo)."""
    from zero_train.ds_config import resolve_auto, train_settings
    from zero_train.engines import build_engine
    from zero_train.hf.models import build_model, model_config
    from zero_train.runtime.dist import DistInfo

    _fake_gpu_node(monkeypatch)
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}
    settings = train_settings(config, world_size=1)
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    with _world_of_one():
        engine = build_engine(
            "fsdp2",
            model_fn=lambda: build_model(model_config("tiny", vocab_size=64)),
            settings=settings,
            ds_config=resolve_auto(config, settings),
            dist_info=info,
        )
        meshes = {(p.device_mesh.device_type, p.device.type) for p in engine.model.parameters()}
        loss = engine.forward_backward(torch.randint(0, 64, (2, 8)))
        engine.step()
    assert meshes == {("cpu", "cpu")}
    assert torch.isfinite(loss)

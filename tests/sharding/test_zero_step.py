"""Our ZeRO-1/2/3 step never waits for the device, and ZeRO-1/2's gradient buckets travel during backward.

One spawned run at world size 2 (gloo) checks, for Zero1Optimizer (inside boundary_backward()) and
Zero2Optimizer, with small buckets, and for Zero3Model + Zero3Optimizer (one unit per layer):

- host reads: during one optimizer step (reduce_gradients, clip_grad_norm_, step, zero_grad) and during the
  backward before it, no scalar is read from a tensor (Tensor.item / .tolist / __bool__ / __float__ /
  __int__: aten._local_scalar_dense, or tolist) and no tensor is built from host data (aten.lift_fresh:
  on a GPU, a copy from pageable host memory); copies between devices are counted too. The inner torch
  optimizer's own step is checked apart: on CPU torch's foreach AdamW reads its `step` counters, which torch
  keeps on the CPU (also on a GPU host, unless fused: the CUDA path, which reads nothing), and those must be
  the only scalars it reads. A TorchDispatchMode sees the ops of this thread; the gloo rings' thread only
  sends, receives and adds.
- overlap: the first bucket's reduction is launched before the last gradient of backward is produced.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from zero_train.sharding import Zero1Optimizer, Zero2Optimizer, Zero3Model, Zero3Optimizer
from zero_train.sharding.zero12 import report as zero12_report
from zero_train.testing.sharders import TiedNet, batch, two_groups

pytestmark = pytest.mark.tier("multiproc")

BUCKET = 60  # elements: TiedNet's trainable tensors travel in several buckets
SHARDERS = {"zero1": Zero1Optimizer, "zero2": Zero2Optimizer}


class HostWaits(TorchDispatchMode):
    """Records every op that makes the host wait for the device or copy host data to it."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, int | None]] = []
        self.paused = False  # while the inner optimizer steps (watched apart)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            pass
        elif func is torch.ops.aten._local_scalar_dense.default:
            self.events.append(("scalar read", id(args[0])))
        elif func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default):
            self.events.append(("tensor from host data", None))
        elif func is torch.ops.aten._to_copy.default and "device" in kwargs:
            if torch.device(kwargs["device"]) != args[0].device:
                self.events.append(("copy between devices", None))
        return func(*args, **kwargs)


@contextlib.contextmanager
def counting_tolist(mode: HostWaits):
    """Tensor.tolist reads the values without dispatching an op: count it by hand (into mode's events, unless
    the mode is paused)."""
    original = torch.Tensor.tolist

    def tolist(self):
        if not mode.paused:
            mode.events.append(("tolist", id(self)))
        return original(self)

    torch.Tensor.tolist = tolist
    try:
        yield
    finally:
        torch.Tensor.tolist = original


def _sharded(stage: str):
    """(model, optimizer) of `stage` over TiedNet."""
    model = TiedNet()
    if stage == "zero3":
        units = [model.embed, model.hidden, model.frozen, model.out, model]
        return model, Zero3Optimizer(
            Zero3Model(model, unit_modules=units), torch.optim.AdamW, lr=3e-2, foreach=True
        )
    groups = two_groups(model, 3e-2)
    return model, SHARDERS[stage](groups, torch.optim.AdamW, bucket_elements=BUCKET, lr=3e-2, foreach=True)


def _reduce(optimizer) -> None:
    if hasattr(optimizer, "reduce_gradients"):  # ZeRO-3 reduce-scattered during backward
        optimizer.reduce_gradients()


def _one_step(model, optimizer, rank: int, step: int, stage: str) -> None:
    loss = model(batch(rank, step, 0))
    boundary = optimizer.boundary_backward() if stage == "zero1" else contextlib.nullcontext()
    with boundary:
        loss.backward()
    _reduce(optimizer)
    optimizer.clip_grad_norm_(0.05)
    optimizer.step()
    optimizer.zero_grad()


def _host_waits(rank: int, stage: str) -> dict:
    model, optimizer = _sharded(stage)
    _one_step(model, optimizer, rank, 0, stage)  # the flags of this layout are built on the device once
    inner_events: list = []
    inner_step, outer = optimizer.inner.step, []

    def watched_inner_step(*args, **kwargs):
        outer[0].paused = True
        with HostWaits() as mode, counting_tolist(mode):
            result = inner_step(*args, **kwargs)
        outer[0].paused = False
        inner_events.extend(mode.events)
        return result

    optimizer.inner.step = watched_inner_step
    loss = model(batch(rank, 1, 0))
    with HostWaits() as mode, counting_tolist(mode):
        outer.append(mode)
        boundary = optimizer.boundary_backward() if stage == "zero1" else contextlib.nullcontext()
        with boundary:
            loss.backward()
        in_backward = list(mode.events)
        _reduce(optimizer)
        optimizer.clip_grad_norm_(0.05)
        optimizer.step()
        optimizer.zero_grad()
    step_counters = {id(state["step"]) for state in optimizer.inner.state.values()}
    return dict(
        backward=[kind for kind, _ in in_backward],
        step=[kind for kind, _ in mode.events[len(in_backward) :]],
        inner_reads=[
            kind for kind, key in inner_events if kind == "scalar read" and key not in step_counters
        ],
        inner_counter_reads=sum(kind == "scalar read" and key in step_counters for kind, key in inner_events),
        split=sum(len(zero12_report.pieces_of(optimizer, p)) > 1 for p in model.parameters())
        if stage != "zero3"
        else 1,
    )


def _launch_order(rank: int, stage: str) -> dict:
    """The order of bucket launches and gradient arrivals in one backward."""
    model = TiedNet()
    optimizer = SHARDERS[stage](model.parameters(), torch.optim.AdamW, bucket_elements=BUCKET, lr=3e-2)
    counter, events = itertools.count(), []
    launch = optimizer._queue.launch

    def recorded_launch(*args, **kwargs):
        events.append(("launch", next(counter)))
        return launch(*args, **kwargs)

    optimizer._queue.launch = recorded_launch
    names = {id(p): name for name, p in model.named_parameters()}
    for param in model.parameters():
        if param.requires_grad:  # after the optimizer's own hook: the gradient is complete
            param.register_post_accumulate_grad_hook(lambda p: events.append((names[id(p)], next(counter))))
    loss = model(batch(rank, 0, 0))
    with optimizer.boundary_backward() if stage == "zero1" else contextlib.nullcontext():
        loss.backward()
    return dict(events=events, buckets=len(optimizer._schedule.order))


def _all(rank: int, world_size: int) -> dict:
    results = {}
    for stage in SHARDERS:
        results[stage, "waits"] = _host_waits(rank, stage)
        results[stage, "order"] = _launch_order(rank, stage)
    results["zero3", "waits"] = _host_waits(rank, "zero3")
    return results


@pytest.fixture(scope="module")
def runs(rank_pool):
    return rank_pool(2).run(_all)


@pytest.mark.parametrize("stage", [*SHARDERS, "zero3"])
def test_no_host_waits_in_a_step_or_in_backward(runs, stage):
    for results in runs:
        waits = results[stage, "waits"]
        assert waits["split"] >= 1  # a tensor split between the ranks is part of the step
        assert waits["backward"] == []
        assert waits["step"] == []
        assert waits["inner_reads"] == []  # torch's inner step reads only its CPU step counters
        assert waits["inner_counter_reads"] > 0  # ... which the watch does see


@pytest.mark.parametrize("stage", SHARDERS)
def test_the_first_bucket_travels_before_backward_produces_its_last_gradient(runs, stage):
    for results in runs:
        order = results[stage, "order"]
        assert order["buckets"] >= 3
        launches = [at for kind, at in order["events"] if kind == "launch"]
        gradients = [at for kind, at in order["events"] if kind != "launch"]
        assert len(launches) == order["buckets"]
        assert launches[0] < gradients[-1]  # started while backward still had gradients to produce
        assert sum(at < gradients[-1] for at in launches) >= 2

"""HostSyncCounter on CPU: it counts what would make a CUDA run's host wait, deciding placement as a GPU run would
(module docstring of zero_train/runtime/host_syncs.py). Each case names the CUDA behaviour it stands for."""

from __future__ import annotations

import pytest
import torch

from zero_train.runtime.host_syncs import HostSyncCounter, synchronize

pytestmark = pytest.mark.tier("quick")


@pytest.fixture
def counter():
    counter = HostSyncCounter(torch.device("cpu"))
    counter.start()
    yield counter
    counter.stop()


def test_reading_a_device_value_counts_and_a_host_value_does_not(counter):
    weight = torch.nn.Parameter(torch.ones(4), requires_grad=False)  # made before counting: a device tensor
    steps = torch.zeros(())  # no device: a host tensor (torch's optimizers' step counters)
    value = weight.sum()
    value.item(), float(value), bool(value > 0), value.tolist(), f"{value:.2f}"
    assert counter.counts["loop"] == 5
    steps.item(), (steps + 1).item(), float(steps * 2)  # computed from host tensors only: still host
    assert counter.counts["loop"] == 5
    assert any("item at" in site and "test_host_syncs.py" in site for site in counter.sites["loop"])


def test_copies_count_when_blocking_between_host_and_device(counter):
    weight = torch.nn.Parameter(torch.ones(4))
    host = weight.cpu()  # device-to-host: the host waits
    assert counter.counts["loop"] == 1
    host.sum().item()  # now a host value: free
    batch = torch.arange(4)  # made on the host
    batch.to(torch.device("cpu"), non_blocking=True)  # a pinned, non-blocking upload: no wait
    assert counter.counts["loop"] == 1
    on_device = batch.to(torch.device("cpu"))  # blocking upload from pageable memory
    assert counter.counts["loop"] == 2
    on_device.sum().item()  # the upload's result is a device tensor
    assert counter.counts["loop"] == 3
    torch.tensor([1.0, 2.0], device=torch.device("cpu"))  # host data copied to the device, blocking
    torch.zeros(3, device=torch.device("cpu"))  # a fill on the device: no copy
    assert counter.counts["loop"] == 4
    torch.tensor(1.0, device="cpu")  # on a CPU run every device argument names the device (DeepSpeed's "cpu")
    assert counter.counts["loop"] == 5


def test_value_dependent_shapes_and_explicit_syncs_count(counter):
    weight = torch.nn.Parameter(torch.arange(6.0))
    values = weight * 1
    values[values > 2]  # boolean-mask indexing: the size is the mask's count
    values.nonzero()
    values[values > 2] = 0.0  # a masked fill with a scalar: no sync
    synchronize("cpu")  # our synchronize, standing for torch.cuda.synchronize
    assert counter.counts["loop"] == 3


def test_sections_split_and_host_work_is_free(counter):
    weight = torch.nn.Parameter(torch.ones(2))
    with counter.section("engine"):
        weight.sum().item()
    with counter.host_work():  # the data pipeline: its tensors are host tensors, nothing it does counts
        batch = torch.ones(2) * 3
        batch.sum().item()
    batch.sum().item()  # still a host tensor after it
    weight.sum().item()
    assert dict(counter.counts) == {"engine": 1, "loop": 1}


def test_backward_hooks_are_counted(counter):
    """A backward hook runs inside autograd's engine; the counter pushes itself again so the hook is seen."""
    weight = torch.nn.Parameter(torch.ones(3))
    weight.register_post_accumulate_grad_hook(lambda p: None if p.grad.sum().item() else None)
    (weight * 2).sum().backward()
    torch.autograd.backward((weight * 3).sum())
    assert counter.counts["loop"] == 2
    assert torch.equal(weight.grad, torch.full((3,), 5.0))  # backward itself ran as usual


def test_torch_adamw_makes_no_host_sync(counter):
    """torch's foreach AdamW (not capturable) keeps `step` on the host: a GPU step makes no host sync."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=True)
    for _ in range(2):
        model(torch.ones(3, 4)).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    assert counter.counts["loop"] == 0, dict(counter.sites)

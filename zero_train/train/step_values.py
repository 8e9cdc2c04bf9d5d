"""The step's numbers, kept on the device until the loop logs: one host sync per logged step, none between.

    clock = StepClock(device)
    pending = PendingSteps(dist_info)
    started = clock.start()
    ... losses, result = engine.forward_backward(...), engine.step()
    pending.add(step=step, losses=losses, result=result, timing=clock.stop(started))
    if logged:
        for values in pending.read(save_failed=...):   # ONE transfer (and one small all_gather) for all of them
            values["loss"], values["grad_norm"], values["memory"], values["step_time_s"], ...

Reading a device value (`.item()`, `.tolist()`) makes the host wait until the device has run everything queued;
a CUDA run that does it every step cannot queue the next step's kernels while this one runs. So the losses and
gradient norms of the steps since the last read stay on the device, the allocator's per-rank levels (host
numbers: the CUDA allocator's statistics are host-side) wait beside them, and one collective plus one read
fetch them all. Step times come from CUDA events (read after that transfer, when they are complete) or, on
CPU, where every op has finished when it returns, the wall clock.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from zero_train.memory import measure


class StepClock:
    """Times steps without making the host wait: CUDA events on a GPU, the wall clock on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = torch.device(device).type == "cuda"

    def start(self):
        """A mark at the step's start (an event recorded on the current stream, or a time)."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, started) -> tuple:
        """(start, end) marks of the step; `seconds` reads them."""
        return started, self.start()

    @staticmethod
    def seconds(timing: tuple) -> float:
        """The step's seconds; for events, once the device has passed the end mark (after a read)."""
        started, ended = timing
        if isinstance(started, float):
            return ended - started
        return started.elapsed_time(ended) / 1000.0


class PendingSteps:
    """The optimizer steps whose values the loop has not read yet.

    Args:
        dist_info: this process's DistInfo (device, world size).
        tokens_per_step: tokens all ranks together train on per step (for tokens_per_s).
    """

    def __init__(self, dist_info, tokens_per_step: int) -> None:
        self.dist_info = dist_info
        self.tokens_per_step = tokens_per_step
        self.device = dist_info.device
        self.steps: list[dict] = []

    def add(self, *, step: int, losses: list, result, timing: tuple) -> None:
        """Keep one step: its micro-batch losses (tensors or floats), the engine's StepResult, its clock marks."""
        mean = sum(losses) / len(losses)  # on the device when the losses are tensors
        self.steps.append(
            dict(
                step=step,
                loss=mean,
                grad_norm=result.grad_norm,
                result=result,
                timing=timing,
                memory=(measure.allocated_bytes(self.device), measure.peak_bytes(self.device)),
            )
        )

    def read(self, *, save_failed: bool) -> tuple[list[dict], bool]:
        """Every pending step's values, averaged over ranks where they differ (collective: all ranks call it
        at the same step), and whether any rank's background save failed; the pending list empties.

        Returns:
            ([the step's record: {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "skipped",
              "loss_scale", "memory": [{"allocated_bytes", "peak_bytes"} per rank]}], failed anywhere)
        """
        steps, self.steps = self.steps, []
        on_device = [
            value for s in steps for value in (s["loss"], s["grad_norm"]) if isinstance(value, torch.Tensor)
        ]
        host = [float(value) for s in steps for value in (s["loss"], s["grad_norm"]) if _host_number(value)]
        host += [float(x) for s in steps for x in s["memory"]] + [float(save_failed)]
        rows = self._gather(on_device, host)
        values = [_unpack(row, steps, len(on_device)) for row in rows]
        mean_losses = [sum(rank[0][i] for rank in values) / len(values) for i in range(len(steps))]
        own = values[self.dist_info.rank]  # the global grad norm, as this rank computed it
        read = []
        for i, step in enumerate(steps):
            seconds, result = StepClock.seconds(step["timing"]), step["result"]
            read.append(
                dict(
                    step=step["step"],
                    loss=mean_losses[i],
                    lr=result.lr,
                    grad_norm=own[1][i],
                    tokens_per_s=self.tokens_per_step / seconds,
                    step_time_s=seconds,
                    skipped=result.skipped,
                    loss_scale=result.loss_scale,
                    memory=[
                        dict(allocated_bytes=int(rank[2][i][0]), peak_bytes=int(rank[2][i][1]))
                        for rank in values
                    ],
                )
            )
        return read, any(rank[3] for rank in values)

    def _gather(self, on_device: list, host: list[float]) -> list[list[float]]:
        """Every rank's numbers: one all_gather, one device-to-host read (float64: exact below 2**53)."""
        host_tensor = torch.tensor(host, dtype=torch.float64)
        if self.device.type == "cuda":  # pinned, so that the copy does not wait for the device
            host_tensor = host_tensor.pin_memory()
        parts = [host_tensor.to(self.device, non_blocking=True)]
        if on_device:
            parts.insert(0, torch.stack([t.detach().reshape(()).to(torch.float64) for t in on_device]))
        mine = torch.cat(parts)
        if self.dist_info.world_size > 1:
            gathered = [torch.empty_like(mine) for _ in range(self.dist_info.world_size)]
            dist.all_gather(gathered, mine)
            mine = torch.stack(gathered)
        else:
            mine = mine.unsqueeze(0)
        return mine.tolist()  # the one host sync


def _host_number(value) -> bool:
    return value is not None and not isinstance(value, torch.Tensor)


def _unpack(row: list[float], steps: list[dict], num_device: int):
    """One rank's row back into (losses, grad norms, memory pairs, save failed), in step order."""
    device_values, host_values = iter(row[:num_device]), iter(row[num_device:])
    losses, norms = [], []
    for step in steps:
        for key, out in (("loss", losses), ("grad_norm", norms)):
            value = step[key]
            out.append(
                None
                if value is None
                else next(device_values if isinstance(value, torch.Tensor) else host_values)
            )
    memory = [(next(host_values), next(host_values)) for _ in steps]
    return losses, norms, memory, bool(next(host_values))

"""StepCounters: what a training step costs a GPU beyond its arithmetic, counted on any device.

    counters = StepCounters(dist_info.device, steps=2)        # count the first 2 optimizer steps
    for step in ...:
        with counters.counting(step):
            with counters.host_work(): batch = next(batches)  # the data pipeline: host work
            with counters.engine(): engine.forward_backward(batch); engine.step()
            ...                                               # the loop's own work
            counters.end_step(logged=True)
    counters.summary()      # the run record's host_syncs_per_step, collectives_per_step, overlap

Per counted step and section ("engine": its forward_backward and step; "loop": everything else in the step):
- host syncs (zero_train.runtime.host_syncs): operations that block the host until the device catches up;
- collectives: calls and payload bytes per collective (zero_train.comm.ledger). NCCL pays per launch, so
  the calls matter as much as the bytes;
- the overlap schedule: of the gradient-reduction bytes (all_reduce, reduce_scatter, reduce, and the
  point-to-point messages of a ring a function named *reduce* runs) the engine issues in the step, the
  share issued while backward still had autograd nodes to start. A bucket issued from the hook of the
  last gradient, or after backward, overlaps nothing.

Counting runs a Python TorchFunctionMode over every torch call (a few microseconds each), so it is on for the
first `steps` steps only: the bench leaves those out of its medians as warm-up.
(measured: docs/gpu.md#host-syncs-and-collectives-per-step)
"""

from __future__ import annotations

import collections
import contextlib
import sys

import torch

from zero_train.comm.ledger import CommLedger
from zero_train.runtime.host_syncs import HostSyncCounter

REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")
SECTIONS = ("engine", "loop")


class StepCounters:
    """Counts host syncs, collectives and the overlap of gradient reductions with backward, per step.

    Args:
        device: the run's device (CUDA: exact device placement; CPU: as a GPU run would place tensors).
        steps: count optimizer steps 1..steps (0: count nothing).
    """

    def __init__(self, device: torch.device, *, steps: int) -> None:
        self.steps_to_count = steps
        self.syncs = HostSyncCounter(device, on_backward=self._observe_backward)
        self.ledger = CommLedger(on_call=self._collective)
        self.per_step: list[dict] = []
        self._active = False
        self._section = "loop"
        self._step: dict | None = None
        self._sequence = 0  # collectives and autograd node starts, in issue order
        self._last_node_start = 0
        self._in_backward = 0
        self._reductions: list[
            list
        ] = []  # [sequence, bytes, overlapped], overlapped decided when backward ends

    @contextlib.contextmanager
    def counting(self, step: int):
        """Count everything inside if `step` is one of the counted steps."""
        if step > self.steps_to_count:
            yield
            return
        self._step = dict(step=step, collectives={name: collections.Counter() for name in SECTIONS})
        self._reductions = []
        self.syncs.reset()
        self._active = True
        self.ledger.__enter__()
        self.syncs.start()
        try:
            yield
        finally:
            self.syncs.stop()
            self.ledger.__exit__(None, None, None)
            self._active = False

    @contextlib.contextmanager
    def engine(self):
        """The engine's part of the step (its forward_backward and step calls)."""
        if not self._active:
            yield
            return
        outer, self._section = self._section, "engine"
        with self.syncs.section("engine"):
            try:
                yield
            finally:
                self._section = outer

    def host_work(self):
        """Host-side work (the data pipeline): no sync counted, its tensors are host tensors."""
        return self.syncs.host_work() if self._active else contextlib.nullcontext()

    def end_step(self, *, logged: bool) -> None:
        """Close the counted step (inside `counting`); `logged`: the loop read and logged its values."""
        if not self._active:
            return
        overlapped = sum(nbytes for _, nbytes, overlaps in self._reductions if overlaps)
        self.per_step.append(
            dict(
                step=self._step["step"],
                logged=logged,
                syncs={name: self.syncs.counts[name] for name in SECTIONS},
                sites={name: dict(self.syncs.sites[name]) for name in SECTIONS if self.syncs.sites[name]},
                collectives={
                    name: _by_collective(counter) for name, counter in self._step["collectives"].items()
                },
                reduced_bytes=sum(nbytes for _, nbytes, _ in self._reductions),
                overlapped_bytes=overlapped,
            )
        )

    def summary(self) -> dict:
        """The run record's fields (per rank): host_syncs_per_step, collectives_per_step, overlap.

        The steady step is the last counted one (the first pays one-off set-up: optimizer states, buckets).
        None for each when no step was counted.
        """
        if not self.per_step:
            return dict(host_syncs_per_step=None, collectives_per_step=None, overlap=None)
        steady = self.per_step[-1]
        logged = [s["syncs"]["loop"] for s in self.per_step if s["logged"]]
        unlogged = [s["syncs"]["loop"] for s in self.per_step if not s["logged"]]
        syncs = dict(
            engine=steady["syncs"]["engine"],
            loop=max(logged) if logged else None,
            loop_unlogged=max(unlogged) if unlogged else None,
            first_step=dict(self.per_step[0]["syncs"], sites=self.per_step[0]["sites"]),
            steps_counted=[s["step"] for s in self.per_step],
            sites=steady["sites"],
        )
        collectives = {
            name: sum(c["calls"] for c in steady["collectives"][name].values()) for name in SECTIONS
        }
        collectives["by_collective"] = steady["collectives"]
        collectives["bytes"] = {
            name: sum(c["bytes"] for c in steady["collectives"][name].values()) for name in SECTIONS
        }
        reduced = steady["reduced_bytes"]
        overlap = dict(
            share=steady["overlapped_bytes"] / reduced if reduced else None,
            reduced_bytes=reduced,
            overlapped_bytes=steady["overlapped_bytes"],
        )
        return dict(host_syncs_per_step=syncs, collectives_per_step=collectives, overlap=overlap)

    def _collective(self, collective: str, nbytes: int) -> None:
        if not self._active:
            return
        self._sequence += 1
        counter = self._step["collectives"][self._section]
        counter[(collective, "calls")] += 1
        counter[(collective, "bytes")] += nbytes
        if self._section == "engine" and (
            collective in REDUCTIONS or (collective == "send_recv" and _in_reduction())
        ):
            self._reductions.append([self._sequence, nbytes, self._in_backward > 0])

    @contextlib.contextmanager
    def _observe_backward(self, roots):
        """Hook every node of the backward graph: each start is a point a reduction issued before it overlaps."""
        handles = [node.register_prehook(self._node_started) for node in _graph_nodes(roots)]
        first = len(self._reductions)
        self._in_backward += 1
        try:
            yield
        finally:
            self._in_backward -= 1
            for handle in handles:
                handle.remove()
            for reduction in self._reductions[first:]:  # issued inside: overlapped if a node started after
                reduction[2] = reduction[2] and reduction[0] < self._last_node_start

    def _node_started(self, grad_outputs):
        self._sequence += 1
        self._last_node_start = self._sequence


def _in_reduction(depth: int = 12) -> bool:
    """Whether a point-to-point message belongs to a reduction: the nearest caller named for a collective says
    "reduce" (on gloo our ZeRO reduces, and gathers, through rings of isend/irecv)."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        name = frame.f_code.co_name
        if "gather" in name:
            return False
        if "reduce" in name:
            return True
        frame = frame.f_back
    return False


def _by_collective(counter: collections.Counter) -> dict[str, dict[str, int]]:
    """{collective: {"calls", "bytes"}} from a Counter keyed by (collective, "calls" | "bytes")."""
    names = sorted({name for name, _ in counter})
    return {name: dict(calls=counter[(name, "calls")], bytes=counter[(name, "bytes")]) for name in names}


def _graph_nodes(roots) -> list:
    """Every autograd node reachable from the roots' grad_fn (each once)."""
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen = {id(node): node for node in stack}
    while stack:
        node = stack.pop()
        for child, _ in node.next_functions:
            if child is not None and id(child) not in seen:
                seen[id(child)] = child
                stack.append(child)
    return list(seen.values())

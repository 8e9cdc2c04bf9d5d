"""MemoryProbe: where each rank's bytes go during a real training run, gathered into one run record.

The train loop (scripts/train.py --memory-report FILE) drives it:

    probe = MemoryProbe(dist_info)                  # baseline: the allocator before the model exists
    with probe.phase("model_built"): model = ...
    with probe.phase("engine_initialized"): engine = build_engine(...)
    probe.attach(engine)                            # optional: lets step 1 be attributed too
    for step in ...:
        with probe.phase("forward"): engine.forward_backward(batch)   # or "forward" + "backward"
        with probe.phase("step"): engine.step()
        probe.on_step_end(engine, step)
    record = probe.finish(engine, meta=..., step_times_s=..., tokens_per_step=...)  # rank 0: dict

What is measured, per rank:
- phases: for each phase name, the allocator level at its end (last occurrence) and the peak inside it
  (max over occurrences); measure.py's precision applies (CPU peak: sampled, a lower bound).
- attribution, taken when the last "step" phase begins (gradients, optimizer states and buckets all
  exist then, activations are already freed): model-state categories and comm_buffers from
  engine.memory_categories(device) (the engine's own tensors ON THE MEASURED DEVICE, DeepSpeed's
  partitions and buffers), and "other" = that device's allocator level then minus those (the
  interpreter, libraries, data, unowned tensors). Tensors stored elsewhere (DeepSpeed's offloaded fp32
  masters and Adam states in pinned host memory on a GPU run, torch's CPU step counters) are not part of
  the device level: they go to off_device_bytes, per category, beside it.
- cuda (CUDA only, at the end): what the device holds beyond live tensors, measure.cuda_memory_info
  (max_memory_reserved, mem_get_info and the bytes outside the allocator: context, NCCL buffers); its
  maxima are the whole run's, folded across the phases (each phase resets CUDA's peak stats).
- activations: the bytes autograd saves for backward during a forward phase (saved-tensor hooks,
  each storage once, parameters excluded), the largest micro-batch's. Exact, without the transient
  temporaries of a forward; those show up in the phase peaks instead.
- allocator_bytes = allocator level at attribution + activations, i.e. the training-time footprint;
  categories + other == allocator_bytes exactly. peak_bytes: the highest level seen in the whole run.
- other_between_steps: the allocator level at the end of the last "step" phase minus the engine's
  categories then (what it keeps for the next forward). It equals "other" unless something no category
  owns lives only around the step boundary (DeepSpeed ZeRO-2 can hold a gradient there): the baseline a
  peak model is compared against.
- comm_bytes_per_step: the last step's bytes per collective from zero_train.comm.ledger.CommLedger.
- host_syncs_per_step, collectives_per_step, overlap: the counted steps' (zero_train.comm.step_counters),
  when the loop hands them to finish().
"""

from __future__ import annotations

import contextlib
import statistics
import sys

import torch
import torch.distributed as dist

from zero_train.comm.ledger import CommLedger
from zero_train.memory import measure
from zero_train.memory.record import CATEGORIES, MODEL_STATE_CATEGORIES, SCHEMA, empty_record

ATTRIBUTION_PHASE = "step"
ACTIVATION_PHASE_PREFIX = "forward"  # "forward" and a combined "forward_backward" both qualify


class _SavedTensorCounter:
    """Bytes of the storages autograd saves for backward (pack hook), parameters excluded."""

    def __init__(self, param_storages: set[int]) -> None:
        self.param_storages = param_storages
        self.seen: set[int] = set()
        self.total = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        base = tensor._base if tensor._base is not None else tensor
        if isinstance(tensor, torch.nn.Parameter) or isinstance(base, torch.nn.Parameter):
            return tensor
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in self.param_storages and pointer not in self.seen and storage.nbytes() > 0:
            self.seen.add(pointer)
            self.total += storage.nbytes()
        return tensor

    @staticmethod
    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor


class MemoryProbe:
    """Phase snapshots, peaks and per-category attribution of one rank's memory during training.

    Args:
        dist_info: this process's DistInfo (its device picks CUDA or CPU measurement).
    """

    def __init__(self, dist_info) -> None:
        self.dist_info = dist_info
        self.device = dist_info.device
        self.baseline_bytes = measure.allocated_bytes(self.device)
        self.phases: dict[str, dict] = {}
        self.engine = None
        self.activation_bytes = 0
        self.attribution: dict | None = None
        self.comm_bytes_per_step: dict | None = None
        self.other_between_steps: int | None = None
        self.ledger = self._open_ledger()
        measure.reset_peak(self.device)
        self.run_peak_bytes = self.baseline_bytes
        self.run_peak_reserved_bytes = 0

    @staticmethod
    def _open_ledger():

        ledger = CommLedger()
        ledger.__enter__()
        return ledger

    def attach(self, engine) -> None:
        """Tell the probe the engine early, so that every "step" phase (step 1 too) is attributed."""
        self.engine = engine

    @contextlib.contextmanager
    def phase(self, name: str):
        """Measure one phase: level at its end, peak inside it (and activations for forward phases)."""
        if name == ATTRIBUTION_PHASE and self.engine is not None:
            self._attribute(self.engine)
        self._fold_run_peaks()
        measure.reset_peak(self.device)
        counter = None
        hooks = contextlib.nullcontext()
        if name.startswith(ACTIVATION_PHASE_PREFIX):
            counter = _SavedTensorCounter(self._param_storages())
            hooks = torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack)
        with hooks:
            yield
        current, peak = measure.allocated_bytes(self.device), measure.peak_bytes(self.device)
        self._record_phase(name, current, peak)
        if counter is not None:
            self.activation_bytes = max(self.activation_bytes, counter.total)
        if name == ATTRIBUTION_PHASE and self.engine is not None:
            held = sum(int(value) for value in self.engine.memory_categories(self.device).values())
            self.other_between_steps = current - held

    def _fold_run_peaks(self) -> None:
        """Fold the allocator's peaks since its last reset into the run's: every phase resets them."""
        self.run_peak_bytes = max(self.run_peak_bytes, measure.peak_bytes(self.device))
        reserved = measure.peak_reserved_bytes(self.device)
        self.run_peak_reserved_bytes = max(self.run_peak_reserved_bytes, reserved)

    def _param_storages(self) -> set[int]:
        if self.engine is None:
            return set()

        # FSDP2: DTensors, whose own storage is not accessible; none exist unless FSDP2 imported their module
        dtensor_module = sys.modules.get("torch.distributed.tensor")
        dtensor = dtensor_module.DTensor if dtensor_module is not None else ()
        params = self.engine.model.parameters()
        return {(p.to_local() if isinstance(p, dtensor) else p).untyped_storage().data_ptr() for p in params}

    def _record_phase(self, name: str, current: int, peak: int) -> None:
        entry = self.phases.setdefault(name, dict(name=name, current_bytes=current, peak_bytes=peak, count=0))
        entry["current_bytes"] = current
        entry["peak_bytes"] = max(entry["peak_bytes"], peak)
        entry["count"] += 1
        self.run_peak_bytes = max(self.run_peak_bytes, peak)

    def _attribute(self, engine) -> None:
        """Snapshot the engine's categories (on the device, and elsewhere) and the device's level together."""
        on_device = {name: int(value) for name, value in engine.memory_categories(self.device).items()}
        everywhere = {name: int(value) for name, value in engine.memory_categories().items()}
        level = measure.allocated_bytes(self.device)
        off_device = {name: everywhere[name] - on_device.get(name, 0) for name in everywhere}
        self.attribution = dict(categories=on_device, off_device=off_device, level=level)

    def on_step_end(self, engine, step: int) -> None:
        """Called after every optimizer step: remembers the engine and the step's communication bytes."""
        self.engine = engine
        if self.ledger is not None:
            self.comm_bytes_per_step = {key: int(value) for key, value in self.ledger.totals().items()}
            self.ledger.reset()

    def close(self) -> None:
        """Stop counting communication (the ledger's hooks) and forget the engine."""
        if self.ledger is not None:
            self.ledger.__exit__(None, None, None)
            self.ledger = None
        self.engine = None

    def rank_summary(self, engine, step_counters: dict | None = None) -> dict:
        """This rank's part of the run record (attributes now if no "step" phase was seen); `step_counters`:
        zero_train.comm.step_counters.StepCounters.summary(), merged in."""
        if self.attribution is None:
            self._attribute(engine)
        states = self.attribution["categories"]
        categories = {name: states.get(name, 0) for name in (*MODEL_STATE_CATEGORIES, "comm_buffers")}
        categories["activations"] = self.activation_bytes
        categories["other"] = self.attribution["level"] - sum(states.get(name, 0) for name in categories)
        allocator_bytes = self.attribution["level"] + self.activation_bytes
        assert sum(categories[name] for name in CATEGORIES) == allocator_bytes
        self._fold_run_peaks()
        cuda = measure.cuda_memory_info(self.device)
        if cuda is not None:  # its max_* cover only the time since the last phase began
            cuda.update(
                max_allocated_bytes=self.run_peak_bytes, max_reserved_bytes=self.run_peak_reserved_bytes
            )
        return dict(
            rank=self.dist_info.rank,
            phases=list(self.phases.values()),
            categories=categories,
            allocator_bytes=allocator_bytes,
            peak_bytes=self.run_peak_bytes,
            baseline_bytes=self.baseline_bytes,
            comm_bytes_per_step=self.comm_bytes_per_step,
            other_between_steps=self.other_between_steps,
            off_device_bytes=self.attribution["off_device"],
            cuda=cuda,
            **(step_counters or {}),
        )

    def finish(
        self,
        engine,
        *,
        meta: dict,
        step_times_s: list[float],
        tokens_per_step: int,
        step_counters: dict | None = None,
    ) -> dict | None:
        """Gather every rank's summary to rank 0 and build the run record (collective: all ranks call it).

        Args:
            engine: the trained engine.
            meta: record fields known to the loop (engine, zero_stage, model, num_params, precision,
                world_size, micro_batch_size, grad_accum, block_size, device, ds_config).
            step_times_s: wall time of each optimizer step.
            tokens_per_step: tokens all ranks together process per optimizer step.
            step_counters: this rank's host syncs, collectives and overlap per step (StepCounters.summary()).

        Returns:
            The run record on rank 0, None on the other ranks.
        """
        if self.ledger is not None:
            self.ledger.__exit__(None, None, None)
            self.ledger = None
        summaries = _gather_to_rank0(self.rank_summary(engine, step_counters), self.dist_info)
        if summaries is None:
            return None
        record = empty_record(**meta)
        record.update(
            schema=SCHEMA, steps=len(step_times_s), ranks=sorted(summaries, key=lambda r: r["rank"])
        )
        if step_times_s:
            median = statistics.median(step_times_s)
            record["step_time_s"] = dict(median=median, min=min(step_times_s), max=max(step_times_s))
            record["tokens_per_s"] = tokens_per_step / median if median > 0 else None
        return record


def _gather_to_rank0(summary: dict, dist_info) -> list[dict] | None:
    """Every rank's summary on rank 0 (a list by rank), None on the others."""

    if dist_info.world_size == 1 or not dist.is_initialized():
        return [summary]
    gathered: list[dict] | None = [None] * dist_info.world_size if dist_info.rank == 0 else None
    dist.gather_object(summary, gathered, dst=0)
    return gathered

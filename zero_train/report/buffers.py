"""comm_buffers in words: the communication buffers each engine keeps, predicted from its settings.

- torch DDP (and ZeroRedundancyOptimizer, which wraps it): flat gradient buckets, with
  gradient_as_bucket_view=False (torch's default) a second copy of every gradient.
- our ZeRO-1: padding of its two flat buffers (fewer than N elements each: equal slices) plus, on gloo,
  the rings' receive buffer: zero_train.sharding.accounting computes them for the sharder itself, and
  here for the run's partition, bucket size and backend.
- our ZeRO-3: none between steps; a unit's reduce-scatter buffer lives only while its gradients travel.
- DeepSpeed: one reduce bucket of zero_optimization.reduce_bucket_size elements (default 5e8) in the
  gradient dtype, with contiguous_gradients; ZeRO-1/2 hold it only during backward, ZeRO-3 keeps it.
"""

from __future__ import annotations

from zero_train.memory.model.peak import backend_for
from zero_train.memory.model.theory import DEFAULT_REDUCE_BUCKET_SIZE, precision_bytes
from zero_train.registry import find_engine
from zero_train.report import units
from zero_train.report.compare import is_large
from zero_train.report.models import ModelFacts
from zero_train.sharding import accounting
from zero_train.sharding.accounting import BufferBytes


def _bucket_elements(row: dict) -> int:
    """zero_optimization.reduce_bucket_size of the cell's config (DeepSpeed's default when absent)."""
    bucket = (row.get("ds_config") or {}).get("zero_optimization", {}).get("reduce_bucket_size")
    return int(bucket) if isinstance(bucket, (int, float)) else DEFAULT_REDUCE_BUCKET_SIZE


def zero1_buffers(
    facts: ModelFacts, world_size: int, element_size: int, backend: str, bucket_elements: int
) -> BufferBytes:
    """Our ZeRO-1's buffers for this model, from the sharder's own accounting (zero_train.sharding.accounting).

    Args:
        facts: the model's parameter sizes.
        world_size: ranks.
        element_size: bytes per element of the model dtype.
        backend: "gloo" (CPU runs: our rings and their receive buffer) or "nccl".
        bucket_elements: zero_optimization.reduce_bucket_size (the receive buffer fits the largest bucket).
    """
    partition = accounting.partition_of(facts.param_numels, world_size)
    return accounting.zero1_buffers(partition, element_size, backend, bucket_elements)


def _ddp_words(row: dict, measured: int) -> tuple[str, int]:
    per_param = measured / row["num_params"]
    predicted = row["num_params"] * precision_bytes(row["precision"])["grads"]
    return (
        f"DDP's flat gradient buckets (gradient_as_bucket_view=False, torch's default): a second copy of "
        f"every gradient, {per_param:.2f} bytes/param",
        predicted,
    )


def _zero1_words(row: dict, facts: ModelFacts | None) -> tuple[str, int | None]:
    backend = backend_for(row.get("device"))
    receive_words = "the gloo ring's receive buffer" if backend == "gloo" else "no receive buffer (NCCL)"
    if facts is None:
        return f"padding of the two flat buffers and {receive_words} (model facts n/a)", None
    element_size = precision_bytes(row["precision"])["params"]
    parts = zero1_buffers(facts, row["world_size"], element_size, backend, _bucket_elements(row))
    padding = f"2 x {parts.padding} bytes" if parts.padding else "no padding"
    words = (
        f"padding of our ZeRO-1's two flat buffers (equal slices of {parts.partition_elements:,} elements: "
        f"{padding}) plus {receive_words}"
    )
    if parts.receive_elements:
        words += f" ({parts.receive_elements:,} elements, {units.mb(parts.receive)})"
    return words, parts.comm_buffers


def _zero2_words(row: dict, facts: ModelFacts | None) -> tuple[str, int | None]:
    """Our ZeRO-2 keeps its bucket buffer and receive buffer between steps (DeepSpeed frees its bucket)."""
    if facts is None:
        return "padding of the parameter buffer, the bucket and the receive buffer (model facts n/a)", None
    bucket = _bucket_elements(row)
    partition = accounting.partition_of(facts.param_numels, row["world_size"])
    element_size = precision_bytes(row["precision"])["params"]
    parts = accounting.zero2_buffers(partition, element_size, backend_for(row.get("device")), bucket)
    words = (
        f"our ZeRO-2's two bucket buffers ({units.mb(parts.bucket)}: twice the largest bucket it copies, at "
        f"most reduce_bucket_size = {bucket:,} elements, so that one fills while the other travels; a tensor "
        f"that large is reduced in its own gradient), kept between steps, the receive buffer "
        f"({parts.receive_elements:,} elements, {units.mb(parts.receive)}) and the parameter buffer's padding "
        f"({parts.padding} bytes)"
    )
    return words, parts.comm_buffers


def _deepspeed_words(row: dict) -> tuple[str, int]:
    """DeepSpeed's reduce bucket: kept by ZeRO-3, released at the end of backward by ZeRO-1/2."""
    zero = (row.get("ds_config") or {}).get("zero_optimization", {})
    bucket = zero.get("reduce_bucket_size", DEFAULT_REDUCE_BUCKET_SIZE)
    bucket = int(bucket) if isinstance(bucket, (int, float)) else DEFAULT_REDUCE_BUCKET_SIZE
    element_size = precision_bytes(row["precision"])["grads"]
    if not zero.get("contiguous_gradients", True):
        return "no contiguous reduce bucket (contiguous_gradients is false)", 0
    default_note = (
        ""
        if bucket == DEFAULT_REDUCE_BUCKET_SIZE
        else f"; DeepSpeed's default 5e8 would hold {units.mb(DEFAULT_REDUCE_BUCKET_SIZE * element_size)}"
    )
    words = (
        f"DeepSpeed's reduce bucket: zero_optimization.reduce_bucket_size = {bucket:,} elements x "
        f"{element_size} bytes = {units.mb(bucket * element_size)}{default_note}"
    )
    if row["zero_stage"] == 3:
        return words, bucket * element_size
    return (
        words + "; ZeRO-1/2 allocate it for backward and release it at its end (_release_ipg_buffers), so "
        "none is alive at the step boundary (our model counts it in the backward phases)",
        0,
    )


_ZERO3_WORDS = (
    "our ZeRO-3 keeps no communication buffer between steps: a unit's reduce-scatter buffer (N x its slice) and, "
    "on gloo, the N - 1 slices it receives exist only while that unit's gradients travel in backward, and a "
    "gathered unit counts as params while it is alive (none at the step boundary)"
)


def buffer_sentence(
    row: dict, facts: ModelFacts | None, measured: int, ours: int | None, footprint: int
) -> str:
    """One sentence on the cell's comm_buffers: measured, what produces them, and any residual.

    Args:
        row: the cell's comparison row (with "ds_config" when the record had one).
        facts: model facts (our ZeRO-1's layout needs them).
        measured: comm_buffers bytes measured on the reported rank.
        ours: our model's comm_buffers (None: n/a).
        footprint: the measured footprint without "other", for the size of a residual worth naming.
    """
    spec = find_engine(row["engine"])
    if spec is not None and spec.peak_model == "ddp_phases":  # torch DDP's reducer (torch-zero wraps DDP)
        words, predicted = _ddp_words(row, measured)
    elif spec is not None and spec.ours and spec.stage == 1:
        words, predicted = _zero1_words(row, facts)
    elif spec is not None and spec.ours and spec.stage == 2:
        words, predicted = _zero2_words(row, facts)
    elif spec is not None and spec.ours:
        words, predicted = _ZERO3_WORDS, 0
    else:
        words, predicted = _deepspeed_words(row)
    sentence = f"comm_buffers: {row['engine']} holds {units.mb(measured)}: {words}"
    if ours is not None and predicted is not None and is_large(ours - predicted, footprint):
        sentence += f"; our model counts {units.mb(ours)} at the step boundary instead"
    if predicted is not None and is_large(measured - predicted, footprint):
        alive = "not alive at the step boundary" if measured < predicted else "more than predicted"
        sentence += f"; {alive}: unexplained {units.mb(measured - predicted)}"
    return sentence + "."

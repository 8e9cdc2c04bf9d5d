"""comm_buffers in words: the communication buffers each engine keeps, predicted from its settings.

- torch DDP (and ZeroRedundancyOptimizer, which wraps it): flat gradient buckets, with
  gradient_as_bucket_view=False (torch's default) a second copy of every gradient.
- our ZeRO-1: padding of its two owner-ordered flat buffers (every rank's region is padded to the
  largest; zero_train.sharding.partition) plus, on gloo, the ring's receive buffer (at most
  RECV_BUFFER_ELEMENTS elements).
- DeepSpeed: one reduce bucket of zero_optimization.reduce_bucket_size elements (default 5e8) in the
  gradient dtype, with contiguous_gradients; ZeRO-1/2 hold it only during backward, ZeRO-3 keeps it.
"""

from __future__ import annotations

from zero_train.memory.model.theory import DEFAULT_REDUCE_BUCKET_SIZE, precision_bytes
from zero_train.report import units
from zero_train.report.compare import is_large
from zero_train.report.models import ModelFacts


def zero1_buffer_bytes(facts: ModelFacts, world_size: int, element_size: int) -> dict[str, int]:
    """Our ZeRO-1's buffers: padding of each flat buffer, receive buffer, region size (elements).

    Args:
        facts: the model's parameter sizes.
        world_size: ranks.
        element_size: bytes per element of the model dtype.
    """
    from zero_train.sharding.collectives import RECV_BUFFER_ELEMENTS
    from zero_train.sharding.partition import flat_layout, greedy_owners

    layout = flat_layout(facts.param_numels, greedy_owners(facts.param_numels, world_size), world_size)
    receive = min(layout.region_size, RECV_BUFFER_ELEMENTS) if world_size > 1 else 0
    return dict(
        padding=layout.padding() * element_size,
        receive=receive * element_size,
        receive_elements=receive,
        region_elements=layout.region_size,
    )


def _ddp_words(row: dict, measured: int) -> tuple[str, int]:
    per_param = measured / row["num_params"]
    predicted = row["num_params"] * precision_bytes(row["precision"])["grads"]
    return (
        f"DDP's flat gradient buckets (gradient_as_bucket_view=False, torch's default): a second copy of "
        f"every gradient, {per_param:.2f} bytes/param",
        predicted,
    )


def _zero1_words(row: dict, facts: ModelFacts | None) -> tuple[str, int | None]:
    if facts is None:
        return "padding of the two flat buffers and the gloo ring's receive buffer (model facts n/a)", None
    element_size = precision_bytes(row["precision"])["params"]
    parts = zero1_buffer_bytes(facts, row["world_size"], element_size)
    padding = f"2 x {units.mb(parts['padding'])}" if parts["padding"] else "no padding: the regions are equal"
    words = (
        f"padding of our ZeRO-1's two owner-ordered flat buffers (regions padded to the largest, "
        f"{parts['region_elements']:,} elements: {padding}) plus the gloo ring's "
        f"receive buffer ({parts['receive_elements']:,} elements, {units.mb(parts['receive'])})"
    )
    return words, 2 * parts["padding"] + parts["receive"]


def _deepspeed_words(row: dict) -> tuple[str, int]:
    """DeepSpeed's reduce bucket: kept by ZeRO-3, released at the end of backward by ZeRO-1/2."""
    zero = (row.get("ds_config") or {}).get("zero_optimization", {})
    bucket = zero.get("reduce_bucket_size", DEFAULT_REDUCE_BUCKET_SIZE)
    bucket = int(bucket) if isinstance(bucket, (int, float)) else DEFAULT_REDUCE_BUCKET_SIZE
    element_size = precision_bytes(row["precision"])["grads"]
    if not zero.get("contiguous_gradients", True):
        return "no contiguous reduce bucket (contiguous_gradients is false)", 0
    default_note = (
        "" if bucket == DEFAULT_REDUCE_BUCKET_SIZE else
        f"; DeepSpeed's default 5e8 would hold {units.mb(DEFAULT_REDUCE_BUCKET_SIZE * element_size)}"
    )  # fmt: skip
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
    engine = row["engine"]
    if engine in ("ddp", "torch-zero"):
        words, predicted = _ddp_words(row, measured)
    elif engine == "zero1":
        words, predicted = _zero1_words(row, facts)
    else:
        words, predicted = _deepspeed_words(row)
    sentence = f"comm_buffers: {row['engine']} holds {units.mb(measured)}: {words}"
    if ours is not None and predicted is not None and is_large(ours - predicted, footprint):
        sentence += f"; our model counts {units.mb(ours)} at the step boundary instead"
    if predicted is not None and is_large(measured - predicted, footprint):
        alive = "not alive at the step boundary" if measured < predicted else "more than predicted"
        sentence += f"; {alive}: unexplained {units.mb(measured - predicted)}"
    return sentence + "."

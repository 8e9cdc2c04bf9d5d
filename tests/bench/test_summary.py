"""zero_train/bench/summary.py: the per-cell numbers and the target ratios of a bench."""

from __future__ import annotations

import pytest

from zero_train.bench.markdown import _cell_row
from zero_train.bench.summary import _wire_ratio, comm_summary, spread

pytestmark = pytest.mark.tier("quick")


def test_one_rank_has_no_wire_ratio_instead_of_dividing_by_zero():
    """At world size 1 nothing travels: the wire-bytes targets have no ratio (the bench used to stop on it)."""
    cells = {f"{name}-fp32": dict(comm=dict(wire=dict(total=0))) for name in ("zero1", "ddp")}
    assert _wire_ratio(cells, "zero1", "ddp", "fp32") == []
    cells["zero1-fp32"]["comm"]["wire"]["total"] = cells["ddp-fp32"]["comm"]["wire"]["total"] = 8
    assert _wire_ratio(cells, "zero1", "ddp", "fp32") == [1.0]


def test_a_one_rank_cell_renders_its_row_with_no_paper_ratio():
    """At world size 1 the paper's volume is 0: the table says n/a (bench --world-size 1 stopped in the
    markdown with a TypeError after writing bench.json)."""
    meta = dict(world_size=1, backend="gloo", num_params=1000)
    comm = comm_summary({"all_reduce": 8}, stage=1, precision="fp32", meta=meta)
    assert comm["paper_wire"] == 0 and comm["wire_vs_paper"] is None
    cell = dict(
        engine="zero1",
        comm=comm,
        step_time_s=spread([0.1, 0.2]),
        tokens_per_s=spread([10.0, 20.0]),
        peak_bytes=[2**20],
        peak_bytes_per_param=16.0,
        per_step=None,
    )
    row = _cell_row(cell)
    assert row.split("|")[7].strip() == "n/a" and "not counted" in row

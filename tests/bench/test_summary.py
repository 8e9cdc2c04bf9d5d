"""zero_train/bench/summary.py: the per-cell numbers and the target ratios of a bench."""

from __future__ import annotations

import pytest

from zero_train.bench.summary import _wire_ratio

pytestmark = pytest.mark.tier("quick")


def test_one_rank_has_no_wire_ratio_instead_of_dividing_by_zero():
    """At world size 1 nothing travels: the wire-bytes targets have no ratio (the bench used to stop on it)."""
    cells = {f"{name}-fp32": dict(comm=dict(wire=dict(total=0))) for name in ("zero1", "ddp")}
    assert _wire_ratio(cells, "zero1", "ddp", "fp32") == []
    cells["zero1-fp32"]["comm"]["wire"]["total"] = cells["ddp-fp32"]["comm"]["wire"]["total"] = 8
    assert _wire_ratio(cells, "zero1", "ddp", "fp32") == [1.0]

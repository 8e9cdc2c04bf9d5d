"""scripts/sharding_reading_budget.py: each ZeRO stage of zero_train/sharding/ read within issue 38's budget.

The script follows a stage's imports inside sharding/ (comm/ left out, a module read for an earlier stage not
counted again). ZeRO-2 and ZeRO-3 are within their budgets and must stay so. ZeRO-1 is not yet (docs/sharding.md
says what it reads): it may not grow past today's count, and its 900-line budget is a strict expected failure
that turns into a failure the day it is met, so that the mark comes off.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

pytestmark = pytest.mark.tier("quick")

ROOT = pathlib.Path(__file__).resolve().parents[2]
ZERO1_TODAY = 1037
"""ZeRO-1's count now (checkpoints and byte accounting are functions apart from the class)."""


def _script():
    spec = importlib.util.spec_from_file_location("budget", ROOT / "scripts" / "sharding_reading_budget.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def budget():
    script = _script()
    return script, script.budgets(ROOT)


def test_the_count_follows_imports_counts_a_shared_module_once_and_leaves_comm_out(budget):
    script, counts = budget
    sharding = ROOT / "zero_train" / "sharding"
    zero1 = script.reached(ROOT, sharding / "zero12" / "zero1.py")
    zero3 = script.reached(ROOT, sharding / "zero3" / "optim.py")
    shared = {sharding / "step.py", sharding / "partition.py", sharding / "norms.py"}
    assert shared <= zero1 and shared <= zero3  # what every stage reads ...
    assert not any("comm" in path.parts for path in zero1 | zero3)
    new_in_zero3 = zero3 - zero1 - script.reached(ROOT, sharding / "zero12" / "zero2.py")
    assert counts["zero3"] == sum(len(path.read_text().splitlines()) for path in new_in_zero3)
    assert not shared & new_in_zero3  # ... is counted for ZeRO-1 only


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_zero2_and_zero3_are_read_within_their_budget(budget, stage):
    script, counts = budget
    assert counts[stage] <= script.BUDGETS[stage]


def test_zero1_does_not_grow(budget):
    assert budget[1]["zero1"] <= ZERO1_TODAY


@pytest.mark.xfail(
    strict=True, reason="issue 38: ZeRO-1 reads ~1,040 lines from its class down to torch, not 900"
)
def test_zero1_is_read_within_its_budget(budget):
    script, counts = budget
    assert counts["zero1"] <= script.BUDGETS["zero1"]

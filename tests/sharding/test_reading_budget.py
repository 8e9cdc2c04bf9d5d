"""scripts/sharding_reading_budget.py: each ZeRO stage of zero_train/sharding/ read within issue 38's budget.

The script follows a stage's imports inside sharding/ (comm/ left out, a module read for an earlier stage not
counted again). Every stage is within its budget and must stay so (what each reads: docs/sharding.md).
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

pytestmark = pytest.mark.tier("quick")

ROOT = pathlib.Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize("stage", ["zero1", "zero2", "zero3"])
def test_each_stage_is_read_within_its_budget(budget, stage):
    script, counts = budget
    assert counts[stage] <= script.BUDGETS[stage]

"""One check of the acceptance run, and the run's files it reads (losses, records).

A check either asserts (`passed` True or False against `limit`) or measures (a number printed beside what our
models assume, `passed` True once measured); one that cannot run on this machine says why and has `passed`
None: it is listed, never dropped.
"""

from __future__ import annotations

import json
import math
import pathlib
from dataclasses import asdict, dataclass
from typing import Any

CANNOT_RUN = "cannot run here"


@dataclass(kw_only=True, slots=True)
class Check:
    """One line of gpu_check.json's "checks"."""

    name: str
    """What is checked, e.g. "fp32 losses vs ddp", "peak vs estimate"."""
    engine: str | None
    """The engine (a registry name or a Trainer peer), None for a check of the machine."""
    passed: bool | None
    """True / False; None: not run on this machine (`note` says why)."""
    value: Any
    """What was measured (a number, or a short dict of numbers)."""
    limit: Any
    """What it is held against: a bound ("<= 1e-05"), or for a measurement what our model assumes."""
    kind: str = "assert"
    """"assert" (fails the run when not passed) or "measure" (reported beside the assumption)."""
    note: str = ""
    """One line: why it failed or could not run, or what the numbers are."""

    def as_dict(self) -> dict:
        """JSON-ready."""
        return asdict(self)


def within(name: str, engine: str | None, value: float | None, bound: float, *, note: str = "") -> Check:
    """An assert check `value <= bound` (value None or not finite: failed)."""
    ok = value is not None and math.isfinite(value) and value <= bound
    return Check(name=name, engine=engine, passed=ok, value=value, limit=f"<= {bound:g}", note=note)


def measured(name: str, engine: str | None, value: Any, *, limit: Any = None, note: str = "") -> Check:
    """A measure check: `value` reported beside what our model assumes (`limit`), passed once measured."""
    return Check(name=name, engine=engine, passed=True, value=value, limit=limit, kind="measure", note=note)


def cannot_run(name: str, engine: str | None, why: str, *, kind: str = "assert", limit: Any = None) -> Check:
    """A check this machine cannot run, listed with the reason."""
    return Check(name=name, engine=engine, passed=None, value=CANNOT_RUN, limit=limit, kind=kind, note=why)


def failed(name: str, engine: str | None, why: str, *, limit: Any = None) -> Check:
    """A check that could not be evaluated because its run failed (counts as failed)."""
    return Check(name=name, engine=engine, passed=False, value=None, limit=limit, note=why)


def losses(metrics_path: pathlib.Path) -> dict[int, float]:
    """{optimizer step: loss} of a metrics JSONL (evaluation lines left out); {} when there is none."""
    if not metrics_path.is_file():
        return {}
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    return {
        int(line["step"]): float(line["loss"]) for line in lines if "step_time_s" in line and "loss" in line
    }


def read_json(path: pathlib.Path) -> dict | None:
    """A record or done file, None when it is missing."""
    return json.loads(path.read_text()) if path.is_file() else None


def max_gap(ours: dict[int, float], reference: dict[int, float]) -> float | None:
    """The largest |ours - reference| over the steps both have; None when they share no step."""
    steps = sorted(set(ours) & set(reference))
    if not steps:
        return None
    return max(abs(ours[step] - reference[step]) for step in steps)

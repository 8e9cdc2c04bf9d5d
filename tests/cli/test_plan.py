"""`zero-train plan`'s precision for CPU ranks follows the CPU: fp32 where bf16 is emulated."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.tier("quick")


@pytest.mark.parametrize(("flags", "expected"), [(["avx2"], "fp32"), (["avx2", "avx512_bf16"], "bf16"),
                                                 (["amx_bf16"], "bf16")])  # fmt: skip
def test_plan_for_cpu_ranks_picks_bf16_only_where_the_cpu_has_it(monkeypatch, flags, expected):
    from zero_train.bench import machine
    from zero_train.cli.plan import plan_precision

    monkeypatch.setattr(machine, "cpu_flags", lambda: flags)
    monkeypatch.setattr(machine.platform, "machine", lambda: "x86_64")
    assert plan_precision("cpu") == expected
    assert plan_precision("cuda") == "bf16"  # a GPU plan: the GPU's bf16

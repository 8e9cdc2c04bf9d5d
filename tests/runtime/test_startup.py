"""zero_train.runtime.startup: entry points import with the cyclic garbage collector paused.

The mechanism, in fresh processes: importing what a `--engine deepspeed` run of a preset imports triggers
several full collections with the collector on and exactly one (the collection at the end of the block) inside
collector_paused(), after which the modules are frozen and the collector is back on. And the block's own
contract, in-process: a cycle made inside is freed at its end, a collector that was off stays off.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import subprocess
import sys
import weakref

import pytest

from zero_train.runtime.startup import collector_paused

pytestmark = pytest.mark.tier("slow")

PROBE = """
import gc, json, sys
from zero_train.runtime.startup import collector_paused
from zero_train.train.args import parse_args
args = parse_args(["--engine", "deepspeed", "--model", "llama-tiny"])
full_before = gc.get_stats()[2]["collections"]
def imports():
    from zero_train.train.loop import run_training  # noqa: F401
    from zero_train.train.setup import import_run_modules
    import_run_modules(args)
if sys.argv[1] == "paused":
    with collector_paused():
        imports()
else:
    imports()
print(json.dumps(dict(
    full=gc.get_stats()[2]["collections"] - full_before, frozen=gc.get_freeze_count(), enabled=gc.isenabled(),
    modules=[m for m in ("datasets", "transformers.models.llama.modeling_llama", "deepspeed",
                         "zero_train.engines.deepspeed_engine") if m in sys.modules])))
"""


@pytest.mark.skipif(
    sys.version_info >= (3, 14),
    reason="CPython 3.14 collects incrementally: gen-2 counts mean something else",
)
def test_a_runs_imports_trigger_full_collections_unless_paused():
    def probe(mode: str) -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    on, paused = probe("on"), probe("paused")
    everything = ["transformers.models.llama.modeling_llama", "deepspeed",
                  "zero_train.engines.deepspeed_engine"]  # fmt: skip
    assert on["modules"] == paused["modules"] == everything  # the same imports both ways
    assert on["full"] >= 3 and on["frozen"] == 0  # what every start-up paid: full passes over the modules
    assert paused["full"] == 1 and paused["enabled"] is True  # one collection at the end of the block
    assert paused["frozen"] > 100_000  # the imported modules, classes and functions: skipped from now on


class Node:
    def __init__(self) -> None:
        self.other = self


@pytest.mark.tier("quick")
def test_a_cycle_made_inside_is_freed_and_the_collector_state_is_kept():
    assert gc.isenabled()
    try:
        with collector_paused():
            assert not gc.isenabled()
            cycle = weakref.ref(Node())  # garbage at once, but only the collector can free a cycle
            assert cycle() is not None
        assert cycle() is None and gc.isenabled()
        gc.disable()
        with collector_paused():
            pass
        assert not gc.isenabled()  # off before: off after
    finally:
        gc.enable()
        gc.unfreeze()  # this test's worker keeps collecting what earlier tests left (the block froze it)


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="not in a virtual environment")
def test_deepspeeds_ops_are_built_in_this_venv_unless_told_otherwise(tmp_path):
    """Importing zero_train points torch's JIT builds (DeepSpeed's ops) at the venv, where set-up built them:
    venvs that shared ~/.cache/torch_extensions rebuilt each other's ops inside the tests."""
    show = [sys.executable, "-c", "import os, zero_train; print(os.environ['TORCH_EXTENSIONS_DIR'])"]
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    mine = subprocess.run(show, env=env, capture_output=True, text=True, timeout=60)
    venv_dir = pathlib.Path(sys.prefix) / "torch_extensions"
    assert mine.returncode == 0 and mine.stdout.strip() == str(venv_dir), mine.stderr
    told = subprocess.run(show, env=dict(env, TORCH_EXTENSIONS_DIR=str(tmp_path)), capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert told.stdout.strip() == str(tmp_path)
    if "TORCH_EXTENSIONS_DIR" not in os.environ:  # scripts/setup.sh built them there (CPU machines)
        for op in ("deepspeed_shm_comm", "cpu_adam"):
            assert list((venv_dir / op).glob("*.so")), (
                f"{op} was not built in {venv_dir}: run scripts/setup.sh"
            )


MUON = ("deepspeed.runtime.zero.muon.muon_optimizer", "deepspeed.runtime.zero.muon.original_muon")


@pytest.mark.tier("quick")
def test_deepspeeds_muon_module_is_imported_uncompiled_unless_the_run_trains_with_muon():
    """DeepSpeed imports its Muon module on every ZeRO initialize; its @torch.compile decorators cost ~2 CPU-s
    per rank at import (docs/startup.md#deepspeeds-muon-module). Our DeepSpeed engine imports it first with the
    decorators as no-ops, unless the config's optimizer is Muon, whose functions must stay compiled."""
    import deepspeed.runtime.zero.muon as package

    from zero_train.engines.deepspeed_engine import import_muon_uncompiled

    saved = {name: sys.modules.pop(name, None) for name in MUON}  # this worker may have imported it already
    attributes = {name: getattr(package, name, None) for name in ("muon_optimizer", "original_muon")}
    try:
        import_muon_uncompiled({"optimizer": {"type": "Muon", "params": {"lr": 0.02}}})
        assert not any(name in sys.modules for name in MUON)  # left to DeepSpeed, compiled
        import_muon_uncompiled({"optimizer": {"type": "AdamW", "params": {"lr": 0.001}}})
        muon = sys.modules["deepspeed.runtime.zero.muon.original_muon"]
        functions = [muon.muon_update, muon.zeropower_via_newtonschulz5, muon.zeropower_via_gram_newtonschulz]
        assert not [f for f in functions if hasattr(f, "_torchdynamo_orig_callable")]  # plain functions
        assert os.environ.get("TORCHDYNAMO_DISABLE") is None  # the switch is off again after the import
        reimported = sys.modules["deepspeed.runtime.zero.muon.muon_optimizer"]
        import_muon_uncompiled({})  # imported once: a second run of the process keeps what it has
        assert sys.modules["deepspeed.runtime.zero.muon.muon_optimizer"] is reimported
    finally:
        for name, module in saved.items():
            sys.modules.pop(name, None)
            if module is not None:
                sys.modules[name] = module
        for name, module in attributes.items():
            if module is not None:
                setattr(package, name, module)

"""zero_train: train Hugging Face causal LMs with ZeRO-sharded optimizers.

Packages, in the order data flows through them (imports go down this list only; pyproject.toml's import
contracts hold it):
    cli           `zero-train` subcommands, one module each.
    bench         `zero-train bench`: every engine on the same run, interleaved.
    report        run records -> report.md, PNG plots, summary.json + cells.json, measured next to theory.
    train         one training run, `python -m zero_train.train`: the typed run config, setup, loop, eval, ...
    launch        launch command lines (deepspeed, torchrun, accelerate, python); profile and bench cells.
    engines       one protocol over ddp, zero1, zero2, torch-zero, fsdp2 and deepspeed.
    memory        measuring memory, probing runs, run records; memory/model: predicting it (paper, DeepSpeed, ours).
    comm          the communication ledger (bytes per collective per step).
    checkpoint    atomic checkpoints with a manifest, resume state, elastic / universal resume, HF export.
    sharding      our hand-written ZeRO-1 (partition arithmetic, the optimizer, its collectives).
    ds_config     the one place that knows DeepSpeed's JSON keys: one table of keys and defaults, generate, check.
    hf            Hugging Face models, tokenizers and data (offline defaults included).
    runtime       the process: DistInfo, UsageError and faults, output checks, flag parsing, free ports.
Modules:
    registry      the engines, each defined once (name, stage, family, what the report and bench need).
    testing       run_ranks: spawn a few gloo ranks for tests and benchmarks.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# DeepSpeed JIT-compiles its ops (CPU: shared-memory collectives, CPUAdam) with torch.utils.cpp_extension into
# $TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions, shared by every environment of the user. The build
# records the environment's include paths, so two virtual environments (two clones) rebuild each other's ops
# whenever they alternate, inside whichever run or test loads one first (docs/startup.md#deepspeeds-cpu-ops).
# In a virtual environment they live in it instead (scripts/setup.sh builds them there once); an explicit
# setting wins.
# They are built and loaded with the venv's own ninja (torch runs the first `ninja` on PATH, and ninja 1.11 and
# 1.13 each discard the other's build log and rebuild everything): an activated venv, scripts/test.sh and a bare
# `.venv/bin/python` then agree (zero_train.runtime.extensions; scripts/setup.sh builds with it).


def _venv_ninja_first(venv_bin: str) -> None:
    """Put `venv_bin` first on PATH when it holds a ninja and PATH would find another one first."""
    path = _os.environ.get("PATH", "")
    if not _os.path.isfile(_os.path.join(venv_bin, "ninja")):
        return
    first = next((d for d in path.split(_os.pathsep) if _os.path.isfile(_os.path.join(d, "ninja"))), None)
    if first is None or _os.path.realpath(first) != _os.path.realpath(venv_bin):
        _os.environ["PATH"] = venv_bin + _os.pathsep + path


if _sys.prefix != _sys.base_prefix:
    _os.environ.setdefault("TORCH_EXTENSIONS_DIR", _os.path.join(_sys.prefix, "torch_extensions"))
    _venv_ninja_first(_os.path.join(_sys.prefix, "bin"))

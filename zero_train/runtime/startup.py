"""Start-up imports without CPython's cyclic garbage collector walking over them.

Importing torch, transformers with a model's module, datasets and DeepSpeed makes ~750,000 objects, ~450,000
of which live as long as the process. CPython 3.11 runs a full collection each time the long-lived objects
grow by a quarter, each one walking every module imported so far: 7 of them during a DeepSpeed run's imports
(tests/test_startup.py). Measured on a 2-core AMD EPYC (AVX512-BF16), interleaved, medians: a one-rank tiny
zero1 run 5.38 -> 3.90 s, a two-rank DeepSpeed run under torchrun 9.28 -> 7.10 s. Every rank of every launch
pays it, so the entry points that own their process (scripts/train.py, scripts/hf_trainer.py, the bench
worker) import inside

    with collector_paused():
        from zero_train.train.loop import run_training
        import_run_modules(args)

After the block: one full collection (frees any cycle the imports made) and gc.freeze(), which moves what is
still alive (modules, classes, functions) to the permanent generation that later collections skip; then
the collector runs as before. Only for imports in a process's own entry point: what is alive at the end of
the block is never collected if it later becomes cyclic garbage, so it must not hold a model or an engine,
and a library function called in-process (tests, the bench worker's runs) must not use it. The `zero-train`
command does not use it: its subcommands import inside their functions, and some (plan) run long after.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside; after: one collection, gc.freeze(), and on again if it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        if enabled:
            gc.enable()

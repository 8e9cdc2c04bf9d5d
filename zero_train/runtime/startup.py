"""Start-up imports without CPython's cyclic garbage collector walking over them.

Importing torch, transformers with a model's module, datasets and DeepSpeed creates ~750,000 objects that
live as long as the process. CPython 3.11 runs a full collection each time the long-lived objects grow by a
quarter, and each one walks every module imported so far. Measured on a 2-core AMD EPYC (AVX512-BF16):
3.9-4.5 s for those imports with the collector on, 3.0-3.2 s with it off, and a one-rank tiny training run
5.1-5.7 s -> 3.7-3.8 s. Every rank of every launch pays it, so the entry points that own their process
(scripts/train.py, scripts/hf_trainer.py, the bench worker, the `zero-train` command) import inside

    with collector_paused():
        from zero_train.train.loop import run_training
        import_run_modules(args)

After the block: one full collection (frees any cycle the imports made) and gc.freeze(), which moves what is
still alive (modules, classes, functions) to the permanent generation that later collections skip; then
the collector runs as before. Only for imports in a process's own entry point: what is alive at the end of
the block is never collected if it later becomes cyclic garbage, so it must not hold a model or an engine,
and a library function called in-process (tests, the bench worker's runs) must not use it.
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

"""Start-up imports without CPython's cyclic garbage collector walking over them.

The imports of a training run make ~450,000 objects that live as long as the process, and each full
collection among them walks every module imported so far; an entry point that owns its process
(scripts/train.py, scripts/hf_trainer.py, the bench worker) imports inside

    with collector_paused():
        from zero_train.train.loop import run_training
        import_run_modules(args)

(measured: docs/startup.md#the-garbage-collector-paused).

After the block: one full collection (frees any cycle the imports made) and gc.freeze(), which moves what is
still alive (modules, classes, functions) to the permanent generation that later collections skip; then
the collector runs as before. Only for imports in a process's own entry point: what is alive at the end of
the block is never collected if it later becomes cyclic garbage, so it must not hold a model or an engine,
and a library function called in-process (tests, the bench worker's runs) must not use it. The `zero-train`
command uses it for the subcommands that name their imports (estimate, plan: zero_train.cli.main), only when it
runs as its own process, never when a test calls main(argv).
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

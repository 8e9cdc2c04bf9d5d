"""The training entry point: `python -m zero_train.train` (what scripts/train.py, `zero-train train` and every
launcher run).

    # one process, no launcher
    python -m zero_train.train --engine ddp --model tiny --max-steps 5
    # 2 ranks (CPU ranks + gloo here, GPUs elsewhere): each launcher starts the module as `python -m` would
    torchrun --nproc_per_node 2 -m zero_train.train --engine zero2 --max-steps 30
    deepspeed --num_gpus 2 --module zero_train.train --deepspeed_config ds_configs/zero2.json --engine ds2
    accelerate launch --config_file accel.yaml -m zero_train.train --engine deepspeed
    # the settings from a file, flags overriding it
    zero-train train --config run.toml --max-steps 50

Flags and outputs: docs/launch.md (or --help). The steps: zero_train.train.loop.
"""

from __future__ import annotations

import sys

from zero_train.hf.sources import check_local_path
from zero_train.runtime.device import pin_deepspeed_accelerator, read_env
from zero_train.runtime.errors import Fault, run_cli
from zero_train.runtime.faults import mark_reporting
from zero_train.runtime.memory_limit import is_out_of_memory
from zero_train.runtime.startup import collector_paused
from zero_train.train.args import parse_args
from zero_train.train.config import RunConfig
from zero_train.train.out_of_memory import out_of_memory_line


def train(config: RunConfig) -> int:
    """Plan the run (every usage error, before the engine's and the data's imports: seconds per rank under a
    launcher), import what it needs with the collector paused (faster start-up), then train; returns 0.

    A rank that runs out of memory ends with one line (zero_train.train.out_of_memory: the phase, the largest
    term of our estimate against what it had, the cheapest change that fits) and exit code 1, once the failed
    run's objects are released."""
    check_local_path(config.data.dataset)  # a missing path: one line now, not after seconds of imports
    with collector_paused():  # less start-up per rank (zero_train.runtime.startup)
        pin_deepspeed_accelerator()  # before anything below imports DeepSpeed
        # expensive: torch and transformers, imported with the collector paused
        from zero_train.train.setup import import_run_modules, plan_run

        plan = plan_run(config, world_size=read_env()[1])
        # expensive: torch and the engines, imported with the collector paused
        from zero_train.train.loop import run_training

        import_run_modules(config)
    failure = None
    try:
        run_training(config, plan=plan)
    except (MemoryError, RuntimeError, OSError) as err:
        if not is_out_of_memory(err):
            raise
        failure = err.with_traceback(None)  # its frames held the model and the engine
    if failure is not None:
        mark_reporting()  # a launcher's SIGTERM must not cut the explanation short
        raise Fault(out_of_memory_line(failure))
    return 0


def check_run(config: RunConfig, *, world_size: int) -> None:
    """Plan the run as each of `world_size` ranks will (zero_train.train.setup.plan_run): UsageError on anything
    the user can fix, before a launcher starts the ranks."""
    check_local_path(config.data.dataset)
    with collector_paused():
        pin_deepspeed_accelerator()  # the ranks inherit it: a DeepSpeed config is checked on their accelerator
        # expensive: torch and transformers, imported with the collector paused
        from zero_train.train.setup import plan_run

        plan_run(config, world_size=world_size)


def main(argv: list[str] | None = None, *, prog: str = "python -m zero_train.train") -> None:
    """Parse the flags (and --config file) and train; errors a user can fix print one line and exit 2."""
    run_cli(lambda: train(parse_args(sys.argv[1:] if argv is None else argv, prog=prog)))

"""`python -m zero_train.bench.peer_main`: the Hugging Face Trainer peer on train.py's flags (zero_train.bench.hf_peer).

The flags are parsed before transformers loads (a bad flag answers at once), and the run's modules are imported
with the collector paused, as the training entry point does (zero_train.runtime.startup).
"""

from __future__ import annotations

import sys

from zero_train.runtime.device import pin_deepspeed_accelerator
from zero_train.runtime.errors import run_cli
from zero_train.runtime.startup import collector_paused
from zero_train.train.args import parse_args


def main(argv: list[str] | None = None, *, prog: str = "python -m zero_train.bench.peer_main") -> None:
    """Parse train.py's flags and train with transformers.Trainer; user errors: one line, exit 2."""

    def entry() -> int:
        config = parse_args(sys.argv[1:] if argv is None else argv, prog=prog)
        with collector_paused():
            pin_deepspeed_accelerator()  # before anything below imports DeepSpeed
            # expensive: transformers' Trainer, torch, imported with the collector paused
            from zero_train.bench.hf_peer import run_peer
            from zero_train.train.setup import import_run_modules

            import_run_modules(config)
        run_peer(config)
        return 0

    run_cli(entry)


if __name__ == "__main__":
    main()

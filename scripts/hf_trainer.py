"""The Hugging Face Trainer on scripts/train.py's flags: the peer `zero-train bench` compares against.

    # the Trainer with the same DeepSpeed config (here ZeRO-1), model and data as scripts/train.py
    deepspeed --num_gpus 2 scripts/hf_trainer.py --deepspeed_config ds_configs/zero1.json --engine deepspeed \
        --model gpt2-25m --max-steps 8 --metrics-file hf.jsonl --memory-report hf.json
    # the Trainer without DeepSpeed (its own DDP)
    torchrun --nproc_per_node 2 scripts/hf_trainer.py --engine ddp --model gpt2-25m --max-steps 8

The logic lives in zero_train.bench.hf_peer.
"""

import sys

from zero_train.runtime.device import pin_deepspeed_accelerator
from zero_train.runtime.errors import run_cli
from zero_train.runtime.startup import collector_paused
from zero_train.train.args import parse_args


def main() -> None:
    """Parse scripts/train.py's flags and train with transformers.Trainer; user errors: one line, exit 2."""

    def entry() -> int:
        args = parse_args(sys.argv[1:])
        with collector_paused():  # faster start-up (zero_train.runtime.startup)
            pin_deepspeed_accelerator()  # before anything below imports DeepSpeed
            from zero_train.bench.hf_peer import run_peer
            from zero_train.train.setup import import_run_modules

            import_run_modules(args)
        run_peer(args)
        return 0

    run_cli(entry)


if __name__ == "__main__":
    main()

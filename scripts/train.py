"""Train a Hugging Face causal LM with DeepSpeed ZeRO-1/2/3, our ZeRO-1, torch's ZeroRedundancyOptimizer or DDP.

    # 2 ranks through DeepSpeed's launcher (CPU ranks + gloo here, GPUs elsewhere)
    deepspeed --num_gpus 2 scripts/train.py --deepspeed_config ds_configs/zero2.json --engine deepspeed \
        --model tiny --max-steps 30
    # the same config through our ZeRO-1 or plain DDP (batch sizes, optimizer, schedule from the JSON)
    deepspeed --num_gpus 2 scripts/train.py --deepspeed_config ds_configs/zero1.json --engine zero1 --model tiny
    # torchrun works too
    torchrun --nproc_per_node 2 scripts/train.py --engine ddp --model tiny --max-steps 30
    # one process, no launcher
    python scripts/train.py --engine ddp --model tiny --max-steps 5
    # several machines: DeepSpeed's hostfile launcher (one line per host: `worker-1 slots=8`)
    deepspeed --hostfile hostfile --master_addr worker-1 --master_port 29500 scripts/train.py \
        --deepspeed_config ds_configs/zero3.json --engine deepspeed --model gpt2-small

Flags and outputs: docs/launch.md (or --help). The logic lives in zero_train.train.loop.
"""

import sys

from zero_train.runtime.device import pin_deepspeed_accelerator
from zero_train.runtime.errors import run_cli
from zero_train.runtime.startup import collector_paused
from zero_train.train.args import parse_args


def main() -> None:
    """Parse the flags and train; errors a user can fix print one line and exit 2."""

    def entry() -> int:
        args = parse_args(sys.argv[1:])
        with collector_paused():  # ~1.4 s less start-up per rank (zero_train.runtime.startup)
            pin_deepspeed_accelerator()  # before anything below imports DeepSpeed
            from zero_train.train.loop import run_training
            from zero_train.train.setup import import_run_modules

            import_run_modules(args)
        run_training(args)
        return 0

    run_cli(entry)


if __name__ == "__main__":
    main()

"""Benchmark every engine side by side: step time, tokens/s, comm bytes per step, peak memory per rank.

    .venv/bin/python scripts/bench.py                   # gpt2-25m, 2 ranks, fp32 + bf16, 3 interleaved repeats
    .venv/bin/python scripts/bench.py --engines ddp,zero1,ds1,hf-ds1 --precisions fp32 --repeats 5
    zero-train bench ...                                # the same command

Every run is `torchrun --nproc_per_node 2 scripts/train.py ...` (--launcher deepspeed: `deepspeed --num_gpus 2`),
or scripts/hf_trainer.py for the Hugging Face Trainer peer, with a generated DeepSpeed config;
results in runs/bench/bench.{json,md}.
The logic lives in zero_train.cli.bench and zero_train.bench.
"""

import sys

from zero_train.cli.bench import add_bench_flags, bench_command
from zero_train.runtime.errors import run_cli
from zero_train.runtime.parser import OneLineParser


def main() -> None:
    """Parse the flags and run the benchmark; user errors print one line and exit 2."""
    parser = OneLineParser(prog="bench.py", description=__doc__.splitlines()[0])
    add_bench_flags(parser)
    run_cli(lambda: bench_command(parser.parse_args(sys.argv[1:])))


if __name__ == "__main__":
    main()

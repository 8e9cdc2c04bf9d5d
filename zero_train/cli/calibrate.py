"""`zero-train calibrate`: measure this machine's rates into a JSON that `estimate` and `plan` take (--machine).

    zero-train calibrate -o machine.json                   # matmul, attention, elementwise, AdamW; gloo at 2 and 4
    zero-train estimate --model gpt2-25m --world-size 2 --device cpu --machine machine.json --explain

Measures with every core (CPU ranks of one machine share them), then spawns gloo ranks on 127.0.0.1 at each
--world-sizes to time all-reduce, reduce-scatter, all-gather, broadcast and our sharders' point-to-point ring
(zero_train.timing.calibrate). About a minute; a busy machine measures its busy rates (say so beside them).
"""

from __future__ import annotations

import argparse
import json
import pathlib

from zero_train.cli.commands import COMMANDS
from zero_train.runtime.errors import UsageError


def _world_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not sizes or any(size < 1 or size > 64 for size in sizes):
        raise argparse.ArgumentTypeError(f"world sizes must be 1..64, got {text!r}")
    return sizes


def calibrate_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `calibrate`."""
    parser = subparsers.add_parser(
        "calibrate", help=COMMANDS["calibrate"], description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--world-sizes",
        type=_world_sizes,
        default=(2, 4),
        help="gloo ranks to time the collectives at (default 2,4)",
    )
    parser.add_argument(
        "-o", "--output", default="machine.json", help="the JSON to write (default machine.json)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    parser.set_defaults(func=calibrate_command, uses_deepspeed=False)
    return parser


def calibrate_command(args: argparse.Namespace) -> int:
    """Measure, write the JSON, print what was measured."""
    from zero_train.runtime.outputs import check_output_file
    from zero_train.timing.calibrate import calibrate

    path = pathlib.Path(args.output).expanduser()
    check_output_file(path, flag="-o")
    if path.exists() and not args.force:
        raise UsageError(f"{str(path)!r} exists; pass --force to overwrite it (or another -o)")
    machine = calibrate(world_sizes=args.world_sizes)
    path.write_text(json.dumps(machine.as_dict(), indent=1) + "\n")
    for precision, rates in machine.matmul_by_size.items():
        sizes = ", ".join(f"{n}: {rate * 1e3:.0f}" for n, rate in rates.items())
        print(f"matmul {precision} GFLOPS by size: {sizes}")
    print(
        f"attention GFLOPS: {', '.join(f'{p} {r * 1e3:.0f}' for p, r in machine.attention_tflops.items())}; "
        f"elementwise {machine.memory_gbps:.1f} GB/s (bf16 x{machine.memory_scale.get('bf16', 1):.2f}); "
        f"AdamW {', '.join(f'{k} {v:.1f}' for k, v in machine.optimizer_layouts.items())} GB/s"
    )
    for op, sizes in machine.measured.items():
        fits = "; ".join(
            f"{n} ranks {m.latency_s * 1e6:.0f} us + {m.payload_gbps:.2f} GB/s" for n, m in sizes.items()
        )
        print(f"{op}: {fits}")
    print(f"wrote {path}")
    return 0

"""--gpu, --tflops, --intra-node-gbps, --inter-node-gbps and --machine for `zero-train estimate` and `plan`: the
machine the step-time model predicts for (zero_train.timing.machine)."""

from __future__ import annotations

import argparse

from zero_train.memory.model.limits import flag_type
from zero_train.runtime.errors import UsageError
from zero_train.runtime.parser import non_negative_float, positive_float
from zero_train.timing.presets import GPUS

DEFAULT_GPU = "h100-sxm"
"""The preset a GPU estimate assumes without --gpu or --machine (said in its output)."""


def add_machine_flags(parser: argparse.ArgumentParser) -> None:
    """Register the machine flags."""
    add = parser.add_argument
    add(
        "--gpu",
        choices=tuple(GPUS),
        metavar="NAME",
        help=f"GPU preset for the predicted step time: {', '.join(GPUS)} (datasheet figures; default {DEFAULT_GPU} "
        "on --device cuda; docs/steptime.md)",
    )
    add(
        "--tflops",
        type=positive_float,
        metavar="TF",
        help="the GPU's dense BF16 peak instead of the preset's",
    )
    add(
        "--intra-node-gbps",
        type=positive_float,
        metavar="GB/s",
        help="the link between one machine's GPUs, GB/s one direction, instead of the preset's (NVLink 4: 450)",
    )
    add(
        "--inter-node-gbps",
        type=positive_float,
        metavar="Gb/s",
        help="the network per GPU in Gb/s instead of the preset's (InfiniBand NDR: 400)",
    )
    add("--machine", metavar="FILE", help="a machine measured by `zero-train calibrate` (instead of --gpu)")


def machine_from_args(args: argparse.Namespace, *, device: str):
    """(Machine, note) for the flags: a calibration file, a preset with overrides, or the default preset on
    GPUs; (None, why) on CPU ranks without --machine. UsageError for a bad file or a contradiction."""
    from zero_train.timing.machine import load_machine, preset_machine

    overrides = dict(
        tflops=args.tflops, intra_node_gbps=args.intra_node_gbps, inter_node_gbps=args.inter_node_gbps
    )
    if args.machine:
        if args.gpu or any(value is not None for value in overrides.values()):
            raise UsageError("--machine FILE describes the whole machine; drop --gpu/--tflops/--*-node-gbps")
        try:
            machine = load_machine(args.machine)
        except ValueError as err:
            raise UsageError(str(err)) from err
        return machine, f"machine {args.machine} (zero-train calibrate{_host_work_note(machine)})"
    if device == "cpu" and not args.gpu:
        return None, "no step time on CPU ranks without --machine FILE (write one with zero-train calibrate)"
    name = args.gpu or DEFAULT_GPU
    note = f"GPU {name} ({GPUS[name].label}, datasheet figures)" + (
        "" if args.gpu else ", assumed: give --gpu"
    )
    try:
        return preset_machine(name, **overrides), note
    except ValueError as err:
        raise UsageError(str(err)) from err


def _host_work_note(machine) -> str:
    """What a calibrated CPU machine says of the engines' host work: a calibration alone prices the model's terms,
    and on CPU ranks each engine's Python, hooks and waits are much of a small model's step, fitted on measured
    bench steps, not microbenchmarks (how much: docs/steptime.md, "CPU ranks: fit the engines' host work too")."""
    if machine.device != "cpu":
        return ""
    if machine.engine_host:
        return f"; host work fitted for {', '.join(sorted(machine.engine_host))}"
    return (
        "; no engine host work fitted: CPU steps run longer than this, about 2x on small models; "
        "fit it as docs/steptime.md 'CPU ranks: fit the engines' host work too' says"
    )


def add_gpu_margin_flag(parser) -> None:
    """--gpu-margin, as `zero-train estimate` and `zero-train plan` take it."""
    parser.add_argument(
        "--gpu-margin",
        type=flag_type("gpu_memory_gb", non_negative_float),
        metavar="GB",
        help="GB kept free on each GPU for the CUDA context, NCCL buffers and allocator slack (default: rules from "
        "published measurements, by world size, NCCL's settings and each set-up's churned bytes: docs/gpu.md)",
    )

"""`zero-train estimate`'s step time: each stage's predicted step, tokens/s and MFU beside its memory, and with
--explain the terms (zero_train.timing.step)."""

from __future__ import annotations

import argparse

from zero_train.cli.machine_flags import add_machine_flags, machine_from_args


def add_time_flags(parser: argparse.ArgumentParser) -> None:
    """The machine flags and --explain."""
    add_machine_flags(parser)
    parser.add_argument("--explain", action="store_true", help="print each stage's step-time terms")


def add_step_times(result: dict, args: argparse.Namespace, model, ds_config: dict | None) -> str | None:
    """Put each stage's predicted step under row["time"] (StepTime.as_dict) and return the machine's note (None and
    nothing added where there is no machine: CPU ranks without --machine)."""
    from zero_train.memory.model.activations import ActivationCount
    from zero_train.memory.model.theory import ModelShape, model_shape
    from zero_train.timing.constants import DEEPSPEED_DEFAULT_BUCKET_ELEMENTS as DEFAULT_BUCKET
    from zero_train.timing.step import StepSetup, step_time

    machine, note = machine_from_args(args, device=args.device)
    if machine is not None and not result["block_size"]:
        machine, note = (
            None,
            "no step time for a bare parameter count (give --model: tokens and FLOPs need it)",
        )
    result["time_machine"] = note
    if machine is None:
        return note
    shape = (
        ModelShape(num_params=int(model))
        if isinstance(model, (int, float))
        else model_shape(model, _lora(args))
    )
    count = ActivationCount(**result["activations"]) if result["activations"] else None
    zero = (ds_config or {}).get("zero_optimization", {})
    for row in result["stages"]:
        moved = bool(row["host_per_rank"])
        setup = StepSetup(
            engine=row["engine"],
            world_size=result["world_size"],
            gpus_per_node=result["gpus_per_node"],
            micro_batch_size=result["micro_batch_size"],
            block_size=result["block_size"] or 1,
            grad_accum=result["grad_accum"],
            gradient_checkpointing=result["gradient_checkpointing"],
            precision=result["precision"],
            offload_optimizer=moved and result["offload"]["optimizer"] != "none",
            offload_param=moved and result["offload"]["param"] != "none",
            bucket_elements=int(zero.get("reduce_bucket_size") or DEFAULT_BUCKET),
            overlap_comm=zero.get("overlap_comm"),
        )
        row["time"] = step_time(shape, count, setup, machine).as_dict()
    return note


def _lora(args: argparse.Namespace):
    from zero_train.cli.lora_flags import lora_spec

    return lora_spec(args)


def print_times(result: dict, *, explain: bool, names) -> None:
    """The time table (and the terms with `explain`)."""
    print(f"step time: {result['time_machine']}")
    if "time" not in result["stages"][0]:
        return
    print(f"{'stage':<14} {'step':>9} {'tokens/s':>12} {'MFU':>5}  largest terms")
    for row in result["stages"]:
        time = row["time"]
        top = sorted(time["terms"].items(), key=lambda item: -item[1])[:3]
        words = ", ".join(f"{name} {_seconds(value)}" for name, value in top)
        print(
            f"{names(row):<14} {_seconds(time['seconds']):>9} {time['tokens_per_s']:>12,.0f} "
            f"{time['mfu']:>5.0%}  {words}"
        )
    if not explain:
        print("(--explain: every term; docs/steptime.md: the model and its error against measured runs)")
        return
    for row in result["stages"]:
        time = row["time"]
        terms = " | ".join(f"{name} {_seconds(value)}" for name, value in time["terms"].items())
        hidden = " | ".join(f"{name} {_seconds(value)}" for name, value in time["hidden"].items() if value)
        print(f"  {names(row)}: {terms}" + (f"; hidden behind compute: {hidden}" if hidden else ""))
        for name, entry in time["comm"].items():
            print(f"    {name}: {entry['calls']:,} calls, {entry['payload_bytes'] / 1e6:,.1f} MB per step")


def _seconds(value: float) -> str:
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"

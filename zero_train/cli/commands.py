"""The `zero-train` subcommands and their one-line help: what `zero-train --help` lists without importing
any of them (each lives in its own module, zero_train.cli.NAME, which registers its flags)."""

COMMANDS = {
    "train": "train a model: one run in this process, or on --nproc-per-node ranks (torchrun or deepspeed)",
    "config": "generate a DeepSpeed ZeRO config (or: config check FILE)",
    "export": "export a checkpoint (any engine, ZeRO-3 included) as a Hugging Face model folder",
    "estimate": "per-rank memory of ZeRO stages 0-3 (device and host): paper, DeepSpeed's estimator, ours; which fit",
    "plan": "the ZeRO / FSDP2 set-ups that fit, fastest first by predicted time; the fastest as a DeepSpeed JSON",
    "calibrate": "measure this machine's matmul, memory and collective rates for estimate/plan --machine",
    "profile": "run the memory comparison matrix (engines x world sizes), one run record per cell",
    "report": "write report.md, PNG plots, summary.json and cells.json from a profile directory's run records",
    "explain": "why a run's ranks ran out of memory and the cheapest change that fits, or how close it came",
    "bench": "step time, tokens/s, comm bytes and peak memory of every engine, interleaved repeats",
    "gpu-check": "the acceptance run: every engine trains, matches DDP, resumes, exports, fits its estimate; exit 1 on a failure",
    "env": "versions, device, CUDA/NCCL/gloo, bf16, DeepSpeed ops, CPU and memory: for bug reports (--json)",
}
"""Subcommand -> the one line `zero-train --help` shows for it, in the order listed. Each module registers itself
with `subparsers.add_parser(NAME, help=COMMANDS[NAME], description=...)` in its NAME_command_parser (accelerate's
commands/ layout), so the thirteen registrations share a shape (cli/bench.py's and cli/profile.py's among them)."""

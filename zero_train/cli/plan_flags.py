"""`zero-train plan`'s flags (zero_train.cli.plan registers the command and runs it)."""

from __future__ import annotations

from zero_train.cli.lora_flags import add_lora_flags
from zero_train.cli.machine_flags import add_gpu_margin_flag, add_machine_flags
from zero_train.ds_config.keys import LOAD_DTYPES, PRECISIONS
from zero_train.memory.model.limits import flag_type
from zero_train.runtime.defaults import default_for
from zero_train.runtime.parser import positive_float, positive_int

DEFAULT_STEP_TOKENS = 2**20
"""Tokens per optimizer step when no --global-batch-size is given (about a million: GPT-3's 0.5-3.2M, Llama
2's 4M for its largest runs)."""
FORMAT_SUFFIXES = {"deepspeed": (".json",), "accelerate": (".yaml", ".yml"), "slurm": (".sbatch", ".sh")}
"""--format -> the suffixes -o may have (the JSON goes beside the YAML or the batch script)."""


def add_plan_flags(parser) -> None:
    """Every flag of `zero-train plan`."""
    add = parser.add_argument
    add("--model", required=True, help="a preset, a shape preset (llama-3-8b, ...) or an HF config folder")
    add("--nodes", type=flag_type("nodes", positive_int), default=1, help="machines (default 1)")
    add(
        "--gpus-per-node",
        type=flag_type("gpus_per_node", positive_int),
        required=True,
        help="ranks per machine",
    )
    add(
        "--gpu-memory",
        type=flag_type("gpu_memory_gb", positive_float),
        metavar="GB",
        help="memory of one GPU (1e9 B; default: the --gpu preset's)",
    )
    add_gpu_margin_flag(parser)
    add(
        "--host-memory",
        type=flag_type("host_memory_gb", positive_float),
        metavar="GB",
        help="CPU memory of one machine (default: not checked)",
    )
    add(
        "--global-batch-size",
        type=flag_type("global_batch_size", positive_int),
        help=f"sequences per optimizer step (default: about {DEFAULT_STEP_TOKENS:,} tokens, a multiple of the ranks)",
    )
    add(
        "--block-size",
        type=flag_type("block_size", positive_int),
        help="tokens per sequence (default: the model's context, at most 4096)",
    )
    add(
        "--tokens",
        type=positive_float,
        default=1e9,
        help="tokens to train: set-ups are ranked by the hours this takes (default 1e9)",
    )
    add_machine_flags(parser)
    add(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help=f"default {default_for('precision', 'plan')}; with --device cpu, fp32 on a CPU that emulates bf16 "
        "(no AVX512-BF16 / AMX-BF16: zero-train env)",
    )
    add(
        "--load-dtype",
        choices=tuple(LOAD_DTYPES),
        default=default_for("load_dtype", "plan"),
        help="the dtype each rank builds the model in on the host (train.py --load-dtype; bf16: half the host "
        "memory; ZeRO-3 builds under zero.Init on the GPU)",
    )
    add(
        "--headroom",
        type=float,
        default=0.0,
        help="extra fraction of GPU memory kept free beyond the GPU margin, default 0",
    )
    add("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: CPU ranks with gloo (tests here)")
    add(
        "--format",
        choices=tuple(FORMAT_SUFFIXES),
        default="deepspeed",
        help="deepspeed: the JSON; accelerate: its YAML + the JSON beside it; slurm: a batch script + the JSON",
    )
    add(
        "--hf-auto",
        action="store_true",
        help='for the HF Trainer: DeepSpeed set-ups only, "auto" for lr, betas, eps, weight decay and clipping '
        "(its arguments), no scheduler block (its lr_scheduler_type); prints the TrainingArguments to pass",
    )
    add_lora_flags(parser)
    add(
        "-o",
        "--output",
        help="write the chosen set-up here (.json; .yaml with --format accelerate, .sbatch or .sh "
        "with --format slurm) and print the commands that train it",
    )
    add(
        "--max-steps", type=positive_int, help="optimizer steps the printed commands train (default: train's)"
    )
    add("--force", action="store_true", help="overwrite files -o would write that exist")
    add(
        "--master-addr",
        metavar="HOST",
        help="node 0's address, written into the commands (several nodes; "
        "default: $MASTER_ADDR, set on each node)",
    )
    add(
        "--master-port",
        type=positive_int,
        default=29500,
        help="the rendezvous port on node 0 (default 29500)",
    )

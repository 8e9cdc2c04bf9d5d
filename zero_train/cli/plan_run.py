"""How to run a plan as printed: train's flags for the chosen set-up, one command per launcher, a SLURM script.

    config = train_config(plan.chosen, model="llama-2-70b", block_size=4096, json_path="plan.json")
    cluster = Cluster(nodes=256, gpus_per_node=8)
    print("\\n".join(run_lines(config, cluster, accelerate_yaml="plan.yaml", sbatch=None)))
    pathlib.Path("plan.sbatch").write_text(sbatch_script(config, cluster, gpus=True))

Every train flag comes from the typed run config (zero_train.train.args.run_argv; the plan's choices are given
even at train.py's defaults) and every command line from zero_train.launch.command: no flag is spelled here. On
several nodes a line holds shell variables that each node sets ($NODE_RANK; $MASTER_ADDR unless --master-addr
gave the address), so one printed line serves every node; the SLURM script sets them from SLURM's own
($SLURM_NODEID, the job's first host).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from zero_train.launch.command import Launch, ShellVariable, launch_command, shell_text
from zero_train.train.args import run_argv
from zero_train.train.config import (
    DataConfig,
    EngineConfig,
    LoraConfig,
    ModelConfig,
    RunConfig,
    TrainingConfig,
)

NODE_RANK = ShellVariable("$NODE_RANK")
"""This node's index (0 .. nodes - 1), set on each node before its torchrun / accelerate line."""
MASTER_ADDR = ShellVariable("$MASTER_ADDR")
"""Node 0's address, set on every node when --master-addr did not give it."""
EXPLICIT = (
    "model",
    "load_dtype",
    "block_size",
    "max_steps",
    "micro_batch_size",
    "grad_accum",
    "engine",
    "deepspeed_config",
)
"""Train flags printed even at train.py's defaults: the plan's lines must not change meaning with them."""
HOSTFILE = "hostfile"
"""The file DeepSpeed's launcher reads on several nodes: one `HOST slots=GPUS` line per node (docs/launch.md)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """Where the plan runs."""

    nodes: int
    """Machines."""
    gpus_per_node: int
    """Ranks per machine."""
    master_addr: str | None = None
    """Node 0's address; None: $MASTER_ADDR, set on each node."""
    master_port: int = 29500
    """The rendezvous port on node 0."""

    @property
    def several(self) -> bool:
        """More than one machine: the lines need a node rank and node 0's address."""
        return self.nodes > 1


def train_config(
    candidate,
    *,
    model: str,
    block_size: int,
    json_path: str,
    load_dtype: str = "fp32",
    max_steps: int | None = None,
    lora: LoraConfig | None = None,
) -> RunConfig:
    """The run config that trains the chosen set-up: the model, the dtype it is built in, its block, the
    micro-batch and accumulation the plan picked, the engine, recomputation, and the written DeepSpeed JSON (which
    holds the rest), LoRA's adapters the plan was made for; `max_steps` None: train.py's default."""
    setup = candidate.setup
    steps = {} if max_steps is None else dict(max_steps=max_steps)
    return RunConfig(
        model=ModelConfig(model=model, gradient_checkpointing=setup.checkpointing, load_dtype=load_dtype),
        data=DataConfig(block_size=block_size),
        training=TrainingConfig(
            micro_batch_size=candidate.micro_batch_size, grad_accum=candidate.grad_accum, **steps
        ),
        engine=EngineConfig(engine=setup.engine, deepspeed_config=json_path),
        lora=lora or LoraConfig(),
    )


def launches(cluster: Cluster, *, accelerate_yaml: str | None) -> dict[str, Launch]:
    """One Launch per launcher (accelerate only with its YAML), each on the plan's port (another job on the node
    may hold the launchers' default); several nodes also need node 0's address, a node rank (torchrun,
    accelerate) or DeepSpeed's hostfile."""
    several = cluster.several
    address = (cluster.master_addr or MASTER_ADDR) if several else None
    common = dict(
        nproc_per_node=cluster.gpus_per_node,
        nnodes=cluster.nodes,
        master_addr=address,
        master_port=cluster.master_port,
    )
    result = {
        "deepspeed": Launch(launcher="deepspeed", hostfile=HOSTFILE if several else None, **common),
        "torchrun": Launch(launcher="torchrun", node_rank=NODE_RANK if several else None, **common),
    }
    if accelerate_yaml is not None:
        result["accelerate"] = Launch(
            launcher="accelerate",
            node_rank=NODE_RANK if several else None,
            config_file=accelerate_yaml,
            **common,
        )
    return result


def run_lines(
    config: RunConfig, cluster: Cluster, *, accelerate_yaml: str | None, sbatch: str | None
) -> list[str]:
    """The `run:` block: one command per launcher, and what several nodes must set."""
    argv = run_argv(config, explicit=EXPLICIT)
    lines = [f"run (each line trains the chosen set-up with {config.engine.deepspeed_config}):"]
    for name, launch in launches(cluster, accelerate_yaml=accelerate_yaml).items():
        lines.append(f"  {name:<11} {shell_text(launch_command(launch, argv, local=False))}")
    if accelerate_yaml is None:
        lines.append(
            f"  {'accelerate':<11} (--format accelerate -o FILE.yaml writes the YAML its line reads)"
        )
    if sbatch is not None:
        lines.append(f"  {'slurm':<11} sbatch {shlex.quote(sbatch)}")
    else:
        lines.append(
            f"  {'slurm':<11} (--format slurm -o FILE.sbatch writes a batch script for SLURM clusters)"
        )
    if cluster.several:
        address = "" if cluster.master_addr else "MASTER_ADDR = node 0's address (or --master-addr HOST), "
        lines.append(
            f"  on every node set {address}NODE_RANK = its index 0..{cluster.nodes - 1} (torchrun, accelerate); "
            f"deepspeed runs on node 0 only and starts the others over ssh from ./{HOSTFILE} "
            f"(one `HOST slots={cluster.gpus_per_node}` line per node, node 0 first; docs/launch.md)"
        )
    return lines


def sbatch_script(config: RunConfig, cluster: Cluster, *, gpus: bool, job_name: str = "zero-train") -> str:
    """A SLURM batch script: one task per node, each running torchrun with SLURM's node index; node 0 (the job's
    first host) is the rendezvous. `gpus`: ask SLURM for the GPUs (False: CPU ranks)."""
    several = cluster.several
    launch = Launch(
        launcher="torchrun",
        nproc_per_node=cluster.gpus_per_node,
        nnodes=cluster.nodes,
        node_rank=ShellVariable("$SLURM_NODEID") if several else None,
        master_addr=MASTER_ADDR if several else None,
        master_port=cluster.master_port,
    )
    command = "exec " + shell_text(launch_command(launch, run_argv(config, explicit=EXPLICIT), local=False))
    directives = [f"--job-name={job_name}", f"--nodes={cluster.nodes}", "--ntasks-per-node=1"]
    if gpus:
        directives.append(f"--gpus-per-node={cluster.gpus_per_node}")
    lines = [
        "#!/bin/bash",
        "# zero-train plan: one task per node; each starts its ranks with torchrun (sbatch THIS_FILE)",
        *(f"#SBATCH {directive}" for directive in directives),
        "set -euo pipefail",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        # bash -c: $SLURM_NODEID must be expanded by each task, not once by this script
        f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(command)}",
    ]
    return "\n".join(lines) + "\n"

"""Launch command lines, built in one place: a training run (or any module or script) under deepspeed, torchrun,
accelerate or plain python.

    launch = Launch(launcher="torchrun", nproc_per_node=2, master_port=29600)
    command = launch_command(launch, run_argv(config))
    # [".../torchrun", "--nproc_per_node", "2", "--master_port", "29600", "-m", "zero_train.train", "--engine", ...]
    shell_text(launch_command(launch, run_argv(config), local=False))   # to print: `torchrun ... -m ...`

Every launcher starts a module as `python -m` would (deepspeed --module, torchrun -m, accelerate launch -m), so
an installed wheel launches `zero_train.train` with no script path; a script path (`script=`) still works.
`zero-train profile` and `bench`, the memory matrix and `zero-train plan`'s printed run blocks build theirs here.
"""

from __future__ import annotations

import pathlib
import shlex
import shutil
import sys
from dataclasses import dataclass

from zero_train.runtime.errors import UsageError

LAUNCHERS = ("deepspeed", "torchrun", "accelerate", "python")
"""Every launcher a command line can be built for."""
RANK_LAUNCHERS = ("deepspeed", "torchrun")
"""The launchers `zero-train profile` and `bench` start their ranks with."""
TRAIN_MODULE = "zero_train.train"
"""The training entry point: `python -m zero_train.train` (scripts/train.py is a shim of it)."""


class ShellVariable(str):
    """An argument the shell expands where the command runs, e.g. ShellVariable("$NODE_RANK"): one printed line
    serves every node. shell_text leaves it unquoted."""

    def __new__(cls, text: str) -> ShellVariable:
        if not text.startswith("$") or not text[1:].replace("_", "").isalnum():
            raise ValueError(f"{text!r} is not a shell variable ($NAME)")
        return super().__new__(cls, text)


@dataclass(frozen=True, kw_only=True, slots=True)
class Launch:
    """How to start the ranks of one run."""

    launcher: str = "torchrun"
    """One of LAUNCHERS ("python": one process, no launcher)."""
    nproc_per_node: int = 1
    """Ranks per machine (deepspeed's --num_gpus)."""
    nnodes: int = 1
    """Machines."""
    node_rank: int | ShellVariable | None = None
    """This machine's rank (torchrun --node_rank, accelerate --machine_rank), or a variable set on each machine;
    deepspeed reads its hostfile."""
    master_addr: str | None = None
    """Rank 0's machine (several machines), or a ShellVariable."""
    master_port: int | None = None
    """The rendezvous port (None: the launcher's default, 29500)."""
    hostfile: str | None = None
    """deepspeed: the hostfile naming the machines (`worker-1 slots=8` per line)."""
    config_file: str | None = None
    """accelerate: its YAML (distributed type, DeepSpeed / FSDP plugin)."""

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher {self.launcher!r} is not one of {', '.join(LAUNCHERS)}")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError(
                f"nproc_per_node and nnodes must be at least 1, got {self.nproc_per_node}, {self.nnodes}"
            )
        if self.launcher == "python" and self.nproc_per_node * self.nnodes > 1:
            raise ValueError(
                "launcher python starts one process; use torchrun, deepspeed or accelerate for more"
            )

    @property
    def world_size(self) -> int:
        """Ranks over all machines."""
        return self.nproc_per_node * self.nnodes


def launcher_path(name: str) -> str:
    """The launcher executable: the one next to this Python if present, else the one on PATH."""
    local = pathlib.Path(sys.executable).parent / name
    return str(local) if local.exists() else str(shutil.which(name) or name)


def check_launcher(name: str) -> None:
    """Raise UsageError unless launcher `name` (deepspeed, torchrun) is next to this Python or on PATH."""
    if not (pathlib.Path(sys.executable).parent / name).exists() and shutil.which(name) is None:
        raise UsageError(
            f"launcher {name!r} not found next to {sys.executable}; install it or use --launcher"
        )


def launch_command(
    launch: Launch,
    argv: list[str] = (),
    *,
    module: str = TRAIN_MODULE,
    script: str | pathlib.Path | None = None,
    local: bool = True,
) -> list[str]:
    """The command line that starts `module` (or `script`) with `argv` on every rank.

    Args:
        launch: the launcher and the ranks.
        argv: the program's own flags (for the training run: zero_train.train.args.run_argv(config)).
        module: the module to run as `python -m` would (default: the training entry point).
        script: a script path instead of the module.
        local: resolve the launcher to the one next to this Python (to run it here); False: its bare name
            (to print for another machine).

    Returns:
        The command as a list (shell_text joins it for printing).
    """
    target = [str(script)] if script is not None else ["-m", module]
    program = launch.launcher if not local or launch.launcher == "python" else launcher_path(launch.launcher)
    if launch.launcher == "python":
        return [sys.executable if local else "python", *target, *argv]
    prefix = {"deepspeed": _deepspeed, "torchrun": _torchrun, "accelerate": _accelerate}[launch.launcher](
        launch
    )
    if launch.launcher == "deepspeed" and script is None:
        target = ["--module", module]
    return [program, *prefix, *target, *argv]


def _deepspeed(launch: Launch) -> list[str]:
    flags = ["--num_gpus", str(launch.nproc_per_node)]
    if launch.hostfile is not None:
        flags += ["--hostfile", launch.hostfile]
    if launch.nnodes > 1:
        flags += ["--num_nodes", str(launch.nnodes)]
    return flags + _rendezvous(launch, "--master_addr", "--master_port")


def _torchrun(launch: Launch) -> list[str]:
    flags = ["--nproc_per_node", str(launch.nproc_per_node)]
    if launch.nnodes > 1:
        flags += ["--nnodes", str(launch.nnodes), "--node_rank", _text(launch.node_rank or 0)]
    return flags + _rendezvous(launch, "--master_addr", "--master_port")


def _accelerate(launch: Launch) -> list[str]:
    flags = ["launch"]
    if launch.config_file is not None:
        flags += ["--config_file", launch.config_file]
    elif launch.world_size > 1:
        flags.append("--multi_gpu")  # without a config, the way to more than one process (CPU ranks too)
    flags += ["--num_processes", str(launch.world_size)]
    if launch.nnodes > 1:
        flags += ["--num_machines", str(launch.nnodes), "--machine_rank", _text(launch.node_rank or 0)]
    return flags + _rendezvous(launch, "--main_process_ip", "--main_process_port")


def _rendezvous(launch: Launch, addr_flag: str, port_flag: str) -> list[str]:
    flags = [addr_flag, launch.master_addr] if launch.master_addr is not None else []
    return flags + ([port_flag, str(launch.master_port)] if launch.master_port is not None else [])


def _text(value: int | str) -> str:
    """An argument as text, a ShellVariable kept as one (str() would make it a plain string)."""
    return value if isinstance(value, str) else str(value)


def shell_text(command: list[str]) -> str:
    """The command shell-quoted, to print or paste (a ShellVariable unquoted: the shell running it expands it)."""
    return " ".join(arg if isinstance(arg, ShellVariable) else shlex.quote(arg) for arg in command)

"""The defaults of the flags several commands share, in one table, with the reason wherever a command differs.

    default_for("block_size", "profile")     # 64, as train.py's
    default_for("precision", "plan")         # "bf16": plan sizes GPU runs
    default_for("model", "estimate")         # REQUIRED

train.py (zero_train.train.config), `zero-train profile`, `bench` (its default scenario; --scenario compute
chooses other values on purpose), `estimate` and `plan` read their defaults of these flags here. Pure data at the bottom of the import layers: ds_config's "auto" fill values read it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The command has no default: the flag must be given."""

COMMANDS = ("train", "profile", "bench", "estimate", "plan")
"""The commands that share flags (train: scripts/train.py, python -m zero_train.train, zero-train train)."""


@dataclass(frozen=True, slots=True)
class Differs:
    """A command's own default of a shared flag, and why it may not take the shared one."""

    value: Any
    why: str


@dataclass(frozen=True, kw_only=True, slots=True)
class SharedDefault:
    """One flag's default in every command."""

    value: Any
    """The default of every command `differs` does not name."""
    differs: dict[str, Differs] = field(default_factory=dict)
    """command -> its own default and why."""


_GPU_RUNS = "it sizes GPU runs, where mixed precision is the norm"
SHARED_DEFAULTS: dict[str, SharedDefault] = {
    "model": SharedDefault(
        value="tiny",
        differs={
            "bench": Differs("gpt2-25m", "its --scenario's: a model whose optimizer step is most of a step"),
            "estimate": Differs(REQUIRED, "an estimate is of one model (or --params)"),
            "plan": Differs(REQUIRED, "a plan is for one model"),
        },
    ),
    "dataset": SharedDefault(value=None),  # None: the offline stdlib corpus (zero_train.hf.data)
    "block_size": SharedDefault(
        value=64,
        differs={
            "estimate": Differs(
                None, "the model's context at most 4,096 (memory.model.estimate): the real run's"
            ),
            "plan": Differs(REQUIRED, "the real run's sequence length decides the plan (issue 28 owns this)"),
        },
    ),
    "micro_batch_size": SharedDefault(
        value=2,
        differs={
            "train": Differs(
                None, "the DeepSpeed config's; this table's 2 fills its \"auto\" (ds_config.keys)"
            ),
            "estimate": Differs(1, "the smallest activations: the question is whether a set-up fits at all"),
        },
    ),
    "grad_accum": SharedDefault(
        value=1,
        differs={"train": Differs(None, "the DeepSpeed config's; \"auto\" becomes 1 (the HF Trainer's)")},
    ),
    "precision": SharedDefault(
        value="fp32",
        differs={
            "train": Differs(None, "the DeepSpeed config's (its fp16 / bf16 sections)"),
            "bench": Differs(None, "--precisions: fp32 and bf16"),
            "estimate": Differs(None, f"the config's, else bf16: {_GPU_RUNS}"),
            "plan": Differs("bf16", _GPU_RUNS),
        },
    ),
    "gradient_checkpointing": SharedDefault(value=False),
    # what train.py always did: the host's 4 bytes/param, then the engine's cast
    "load_dtype": SharedDefault(value="fp32"),
}
"""Flag (its dest: --block-size -> block_size) -> its defaults."""


def default_for(flag: str, command: str) -> Any:
    """The default of shared flag `flag` (a dest, e.g. "block_size") in `command` (one of COMMANDS)."""
    assert command in COMMANDS, command
    shared = SHARED_DEFAULTS[flag]
    differs = shared.differs.get(command)
    return shared.value if differs is None else differs.value

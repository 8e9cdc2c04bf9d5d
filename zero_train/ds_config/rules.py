"""The checks of a DeepSpeed config that need no DeepSpeed import: every engine runs them before any rank works.

`zero-train config check` (zero_train.ds_config.check) runs these and then DeepSpeed's own pydantic classes; a
training run runs these on every engine (ours too, which never import DeepSpeed), so a typo'd key is one line
naming the nearest known key whatever the engine. The names DeepSpeed knows are read from its installed sources
(found, not imported: an import costs seconds per rank): the string keys of its config modules, the fields and
aliases of DeepSpeedZeroConfig, the scheduler names.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib.util
import pathlib
import re

from zero_train.ds_config.auto import auto_keys, get_key
from zero_train.ds_config.keys import AUTO, AUTO_KEYS
from zero_train.ds_config.parse import batch_triple
from zero_train.runtime.errors import UsageError

ZERO3_ONLY = re.compile(r"^(stage3_|offload_param$)")


@dataclasses.dataclass(kw_only=True, slots=True)
class CheckReport:
    """What the checks found."""

    problems: list[str] = dataclasses.field(default_factory=list)
    """Errors: DeepSpeed would fail, or train differently from what the file says."""
    warnings: list[str] = dataclasses.field(default_factory=list)
    """Settings DeepSpeed ignores at this stage (harmless, but misleading)."""
    summary: list[str] = dataclasses.field(default_factory=list)
    """What the config does, one line per topic."""

    def raise_if_invalid(self, path: str) -> None:
        """UsageError listing every problem (each printed as its own `error:` line), if there is any.

        A single problem is a single line (`<path>: <problem>`), as every other user error is.
        """
        if len(self.problems) == 1:
            raise UsageError(f"{path}: {self.problems[0]}")
        if self.problems:
            count = len(self.problems)
            raise UsageError(
                f"{path}: {count} problem{'s' * (count != 1)} found; fix them and run `zero-train config check` "
                "again",
                problems=self.problems,
            )


def check_rules(cfg: dict, *, world_size: int | None = None) -> CheckReport:
    """Every check that needs no DeepSpeed import (keys, zero_optimization's names, cross fields, "auto", batch)."""
    report = CheckReport()
    _check_top_level_keys(cfg, report)
    _check_zero_keys(cfg, report)
    _check_cross_fields(cfg, report)
    _check_autos(cfg, report)
    _check_batch(cfg, world_size, report)
    return report


def deepspeed_root() -> pathlib.Path:
    """DeepSpeed's installed package folder, found without importing it."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("DeepSpeed is not installed; pip install deepspeed (its config names are checked)")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


@functools.cache
def zero_field_names() -> frozenset[str]:
    """Field names and aliases of DeepSpeed's DeepSpeedZeroConfig (the keys zero_optimization may hold), read from
    its source: the class's annotated fields and every `alias=` of their Field(...)."""
    tree = ast.parse((deepspeed_root() / "runtime" / "zero" / "config.py").read_text(encoding="utf-8"))
    zero = next(
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "DeepSpeedZeroConfig"
    )
    names = set()
    for statement in zero.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            names.add(statement.target.id)
            for node in ast.walk(statement.value) if statement.value is not None else ():
                if (
                    isinstance(node, ast.keyword)
                    and node.arg == "alias"
                    and isinstance(node.value, ast.Constant)
                ):
                    names.add(node.value.value)
    return frozenset(names)


@functools.cache
def deepspeed_schedulers() -> tuple[str, ...]:
    """DeepSpeed's scheduler names (VALID_LR_SCHEDULES of runtime/lr_schedules.py), read from its source."""
    text = (deepspeed_root() / "runtime" / "lr_schedules.py").read_text(encoding="utf-8")
    constants = dict(re.findall(r"^([A-Z_]+) = ['\"](\w+)['\"]", text, flags=re.M))
    listed = re.search(r"^VALID_LR_SCHEDULES = \[([^\]]*)\]", text, flags=re.M)[1]
    return tuple(constants[name.strip()] for name in listed.split(",") if name.strip())


def nearest(name: str, known) -> str:
    """`did you mean 'x'?` for the closest known name, else "remove it"."""
    guess = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return f"did you mean {guess[0]!r}?" if guess else "remove it"


def _check_zero_keys(cfg: dict, report: CheckReport) -> None:
    zero = cfg.get("zero_optimization", {})
    if not isinstance(zero, dict):
        report.problems.append(f"zero_optimization must be a JSON object, got {zero!r}")
        return
    for key in zero:
        if key not in zero_field_names():
            report.problems.append(
                f"unknown key zero_optimization.{key} (DeepSpeed refuses it); {nearest(key, zero_field_names())}"
            )


@functools.cache
def deepspeed_known_keys() -> frozenset[str]:
    """Every key name DeepSpeed's config code mentions (string literals in its config/constants modules)."""
    root = deepspeed_root()
    names: set[str] = set()
    for path in root.rglob("*.py"):
        if path.name in ("constants.py", "config.py", "config_utils.py"):
            names |= set(re.findall(r"""['"]([a-z][a-z0-9_]*)['"]""", path.read_text(encoding="utf-8")))
    return frozenset(names)


TOP_LEVEL_COMMON = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "optimizer",
    "scheduler",
    "fp16",
    "bf16",
    "zero_optimization",
    "steps_per_print",
    "wall_clock_breakdown",
    "zero_allow_untested_optimizer",
    "activation_checkpointing",
    "flops_profiler",
    "communication_data_type",
)


def _check_top_level_keys(cfg: dict, report: CheckReport) -> None:
    known = deepspeed_known_keys()
    for key in cfg:
        if key in zero_field_names() and key not in TOP_LEVEL_COMMON:
            report.problems.append(f"top-level key {key!r} belongs inside zero_optimization; move it there")
        elif key in ("lr", "betas", "eps", "weight_decay", "momentum"):
            report.problems.append(f"top-level key {key!r} belongs inside optimizer.params; move it there")
        elif key not in known:
            hint = nearest(key, set(TOP_LEVEL_COMMON) | known)
            report.problems.append(f"unknown top-level key {key!r} (DeepSpeed silently ignores it); {hint}")


def offload_device(cfg: dict, key: str) -> str:
    """zero_optimization.<key>.device, "none" when absent."""
    value = get_key(cfg, f"zero_optimization.{key}.device")
    return value if isinstance(value, str) else "none"


def _check_cross_fields(cfg: dict, report: CheckReport) -> None:
    stage = get_key(cfg, "zero_optimization.stage") or 0
    if get_key(cfg, "fp16.enabled") is True and True in (
        get_key(cfg, "bf16.enabled"),
        get_key(cfg, "bfloat16.enabled"),
    ):
        report.problems.append("fp16.enabled and bf16.enabled are both true; enable only one precision")
    if offload_device(cfg, "offload_param") != "none" and stage != 3:
        report.problems.append(
            f"zero_optimization.offload_param needs stage 3 (stage is {stage}); set stage 3 or remove it"
        )
    optimizer_device = offload_device(cfg, "offload_optimizer")
    if optimizer_device != "none" and stage == 0:
        report.problems.append("zero_optimization.offload_optimizer needs stage 1, 2 or 3 (stage is 0)")
    if optimizer_device == "nvme" and stage in (1, 2):
        report.problems.append(
            f"offload_optimizer device nvme needs stage 3 (stage is {stage}); use device cpu"
        )
    for key in ("offload_optimizer", "offload_param"):
        if offload_device(cfg, key) == "nvme" and not get_key(cfg, f"zero_optimization.{key}.nvme_path"):
            report.problems.append(
                f"zero_optimization.{key} device nvme has no nvme_path; add the NVMe directory"
            )
    if isinstance(cfg.get("optimizer"), dict) and get_key(cfg, "optimizer.params.max_grad_norm") is not None:
        report.problems.append(
            "optimizer.params.max_grad_norm is rejected by DeepSpeed; use top-level gradient_clipping"
        )
    _check_scheduler(cfg, report)
    zero = cfg.get("zero_optimization", {})
    if isinstance(zero, dict) and isinstance(stage, int):
        ignored = [k for k in zero if ZERO3_ONLY.match(k)] if stage < 3 else []
        ignored += ["allgather_bucket_size"] if stage == 3 and "allgather_bucket_size" in zero else []
        ignored += [k for k in zero if k != "stage"] if stage == 0 else []
        for key in dict.fromkeys(ignored):
            if not (stage == 0 and key == "offload_optimizer"):
                report.warnings.append(f"zero_optimization.{key} is ignored at stage {stage}; remove it")
    lr, peak = get_key(cfg, "optimizer.params.lr"), get_key(cfg, "scheduler.params.warmup_max_lr")
    if lr not in (None, AUTO) and peak not in (None, AUTO) and lr != peak:
        report.warnings.append(
            f"optimizer.params.lr {lr} is overridden by scheduler.params.warmup_max_lr {peak}"
        )


def _check_scheduler(cfg: dict, report: CheckReport) -> None:
    if not isinstance(cfg.get("scheduler"), dict):
        return

    kind = get_key(cfg, "scheduler.type")
    if kind not in deepspeed_schedulers():
        report.problems.append(
            f"scheduler.type {kind!r} is not a DeepSpeed scheduler; use one of {', '.join(deepspeed_schedulers())}"
        )
    if (
        kind in ("WarmupDecayLR", "WarmupCosineLR")
        and get_key(cfg, "scheduler.params.total_num_steps") is None
    ):
        report.problems.append(f'scheduler {kind} needs params.total_num_steps; add it (or "auto")')
    steps = get_key(cfg, "scheduler.params.warmup_num_steps")
    if steps not in (None, AUTO) and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        report.problems.append(
            f"scheduler.params.warmup_num_steps must be a whole number >= 1, got {steps!r}"
        )
    warmup_type = get_key(cfg, "scheduler.params.warmup_type")
    if warmup_type is not None and warmup_type not in ("log", "linear"):
        report.problems.append(
            f"scheduler.params.warmup_type {warmup_type!r} is not log or linear (DeepSpeed would use log)"
        )


def _check_autos(cfg: dict, report: CheckReport) -> None:
    for key in auto_keys(cfg):
        if key not in AUTO_KEYS:
            report.problems.append(
                f'{key} is "auto" but neither the HF Trainer nor zero_train fills it; write a value'
            )


def _without_autos(node):
    if isinstance(node, dict):
        return {k: _without_autos(v) for k, v in node.items() if v != AUTO}
    return node


def _check_batch(cfg: dict, world_size: int | None, report: CheckReport) -> None:
    concrete = _without_autos(cfg)
    names = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    if not any(n in concrete for n in names):
        if not any(cfg.get(n) == AUTO for n in names):
            report.problems.append("no batch size: set train_micro_batch_size_per_gpu (or train_batch_size)")
        return
    if world_size is None and not (
        "train_batch_size" in concrete and "train_micro_batch_size_per_gpu" in concrete
    ):
        world_size = 1  # the file alone fixes nothing else; DeepSpeed derives the rest at launch
    if world_size is None:
        per_rank = concrete["train_micro_batch_size_per_gpu"] * concrete.get("gradient_accumulation_steps", 1)
        if isinstance(per_rank, int) and per_rank > 0 and isinstance(concrete["train_batch_size"], int):
            if concrete["train_batch_size"] % per_rank:
                report.problems.append(
                    f"train_batch_size {concrete['train_batch_size']} is not a multiple of micro batch x accumulation "
                    f"= {per_rank}: no world size fits; fix one of them"
                )
                return
            world_size = concrete["train_batch_size"] // per_rank
    try:
        batch_triple(concrete, world_size=world_size)
    except UsageError as err:
        report.problems.append(str(err))

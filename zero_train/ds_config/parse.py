"""Reading single fields of a DeepSpeed config (no "auto" left) with DeepSpeed's defaults and rules.

Defaults are DeepSpeed 0.19.8's (the `deepspeed` column of zero_train.ds_config.keys.KEYS): deepspeed/runtime/
constants.py, config.py, lr_schedules.py, and the torch / FusedAdam constructors the engine calls with
`optimizer.params` (engine.py `_configure_basic_optimizer`). The ones that depend on other keys are the table's
rules, applied here.
"""

from __future__ import annotations

from zero_train.ds_config.keys import deepspeed_default as default
from zero_train.runtime.errors import UsageError

SCHEDULER_NAMES = {
    "WarmupLR": "warmup_constant",
    "WarmupDecayLR": "warmup_linear",
    "WarmupCosineLR": "warmup_cosine",
}


def section(cfg: dict, key: str) -> dict:
    """`cfg[key]` if present (must be a JSON object), else {}."""
    value = cfg.get(key, {})
    if not isinstance(value, dict):
        raise UsageError(f"{key} must be a JSON object, got {value!r}")
    return value


def _whole(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a whole number >= 1, got {value!r}")
    return value


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise UsageError(f"{name} must be a number >= 0, got {value!r}")
    return float(value)


def batch_triple(cfg: dict, *, world_size: int) -> tuple[int, int, int]:
    """(micro batch per rank, gradient accumulation steps, train batch size), derived like DeepSpeed.

    DeepSpeed derives whichever of the three is missing (config.py `_set_batch_related_parameters`) and
    then requires train_batch_size == micro * accumulation * world_size. A mismatch shows the arithmetic.
    """
    names = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
    micro, accum, total = (None if cfg.get(n) is None else _whole(n, cfg[n]) for n in names)
    if micro is None and total is None:
        raise UsageError(
            "the config sets neither train_batch_size nor train_micro_batch_size_per_gpu; "
            "set train_micro_batch_size_per_gpu (e.g. --micro-batch-size)"
        )
    if total is not None and (micro is None or accum is None):
        known = micro or accum or 1
        if total % (known * world_size):
            other = "train_micro_batch_size_per_gpu" if micro is not None else "gradient_accumulation_steps"
            raise UsageError(
                f"train_batch_size {total} is not divisible by {other} {known} * world_size {world_size} = "
                f"{known * world_size}; choose a train_batch_size that is a multiple of {known * world_size}"
            )
        if micro is None:
            micro = total // (world_size * (accum or 1))
        accum = accum or total // (micro * world_size)
    accum = accum or 1
    product = micro * accum * world_size
    if total is not None and total != product:
        raise UsageError(
            f"train_batch_size {total} != train_micro_batch_size_per_gpu {micro} * gradient_accumulation_steps "
            f'{accum} * world_size {world_size} = {product}; set train_batch_size to {product} or "auto"'
        )
    return micro, accum, product


def precision_of(cfg: dict) -> str:
    """ "fp16", "bf16" or "fp32" from fp16.enabled / bf16.enabled (alias bfloat16); both on is an error."""
    fp16 = bool(section(cfg, "fp16").get("enabled", False))
    bf16 = bool(section(cfg, "bf16").get("enabled", False) or section(cfg, "bfloat16").get("enabled", False))
    if fp16 and bf16:
        raise UsageError("fp16.enabled and bf16.enabled are both true; enable only one precision")
    return "fp16" if fp16 else "bf16" if bf16 else "fp32"


DTYPE_NAMES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
}  # fmt: skip
"""The spellings DeepSpeed's DtypeEnum accepts for data_types.grad_accum_dtype (runtime/config.py)."""


def gradient_dtypes(cfg: dict) -> tuple[str, str]:
    """(accumulation, communication) dtype names of our sharders' gradients: "fp32", "bf16" or "fp16".

    fp32 unless the config says otherwise, whatever the model's precision: a bf16/fp16 run accumulates its
    micro-batches and sums the ranks' gradients in fp32 (FSDP2's reduce_dtype, DeepSpeed's BF16_Optimizer; in
    bf16 every add rounds to 8 bits of mantissa: docs/zero2.md#gradient-dtypes). `data_types.grad_accum_dtype`
    picks the accumulation dtype and `communication_data_type` the one gradients travel in (default: the
    accumulation dtype). DeepSpeed's own defaults are the model's dtype for both.
    """
    accum = section(cfg, "data_types").get("grad_accum_dtype")
    accum = "fp32" if accum is None else _dtype_name("data_types.grad_accum_dtype", accum, DTYPE_NAMES)
    comm = cfg.get("communication_data_type")
    plain = {name: name for name in ("fp32", "bf16", "fp16")}  # DeepSpeed's get_communication_data_type
    return accum, accum if comm is None else _dtype_name("communication_data_type", comm, plain)


def _dtype_name(key: str, value, names: dict) -> str:
    name = names.get(str(value).lower())
    if name is None:
        raise UsageError(f"{key} is {value!r}; use one of fp32, bf16, fp16")
    return name


def reduce_bucket_elements(cfg: dict) -> int | None:
    """zero_optimization.reduce_bucket_size if the config sets it (None if absent or "auto")."""
    value = section(cfg, "zero_optimization").get("reduce_bucket_size")
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        raise UsageError(
            f"zero_optimization.reduce_bucket_size is {value!r}; set it to a positive number of elements (e.g. 5e7)"
        )
    return int(value)


def optimizer_fields(cfg: dict) -> dict:
    """optimizer, lr, weight_decay, betas, eps, momentum from the optimizer section (torch defaults)."""
    block = section(cfg, "optimizer")
    params = block.get("params", {}) or {}
    if not isinstance(params, dict):
        raise UsageError(f"optimizer.params must be a JSON object, got {params!r}")
    kind = str(block.get("type", "AdamW")).lower()
    if kind == "adam":
        kind = (
            "adamw" if params.get("adam_w_mode", True) else "adam"
        )  # DeepSpeed: Adam means AdamW by default
    if kind not in ("adamw", "sgd", "adam"):
        raise UsageError(
            f"optimizer type {block.get('type')!r} is not supported by zero_train's engines; use AdamW, Adam or SGD"
        )
    # keys.WEIGHT_DECAY_DS: torch_adam passes params to torch.optim.AdamW (default weight_decay 0.01);
    # FusedAdam/CPUAdam default to 0
    default_decay = 0.01 if kind == "adamw" and params.get("torch_adam", False) else 0.0
    betas = params.get("betas", default("optimizer.params.betas"))
    if not (isinstance(betas, list | tuple) and len(betas) == 2):
        raise UsageError(f"optimizer.params.betas must be a list of two numbers, got {betas!r}")
    return dict(
        optimizer=kind,
        lr=_number("optimizer.params.lr", params.get("lr", default("optimizer.params.lr"))),
        weight_decay=_number("optimizer.params.weight_decay", params.get("weight_decay", default_decay)),
        betas=(_number("betas[0]", betas[0]), _number("betas[1]", betas[1])),
        eps=_number("optimizer.params.eps", params.get("eps", default("optimizer.params.eps"))),
        momentum=(
            _number("optimizer.params.momentum", params.get("momentum", default("optimizer.params.momentum")))
            if kind == "sgd"
            else 0.0
        ),
    )


def scheduler_fields(cfg: dict, *, optimizer_lr: float) -> dict:
    """The schedule fields of TrainSettings from the scheduler section (DeepSpeed's defaults)."""
    if "scheduler" not in cfg:
        return dict(scheduler="constant", lr=optimizer_lr, overrides_optimizer_lr=False)
    block = section(cfg, "scheduler")
    kind = block.get("type")
    if kind not in SCHEDULER_NAMES:
        raise UsageError(
            f"scheduler type {kind!r} is not supported by zero_train's engines; "
            f"use one of {', '.join(SCHEDULER_NAMES)} or drop the scheduler section"
        )
    params = block.get("params", {}) or {}
    warmup_steps = params.get("warmup_num_steps", default("scheduler.params.warmup_num_steps"))
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps <= 0:
        raise UsageError(
            f"scheduler.params.warmup_num_steps must be a whole number >= 1, got {warmup_steps!r}"
        )
    warmup_type = params.get("warmup_type", default("scheduler.params.warmup_type"))
    if warmup_type not in ("log", "linear"):
        raise UsageError(f'scheduler.params.warmup_type must be "log" or "linear", got {warmup_type!r}')
    total_steps = None
    if kind != "WarmupLR":
        total_steps = _whole("scheduler.params.total_num_steps", params.get("total_num_steps"))
    fields = dict(scheduler=SCHEDULER_NAMES[kind], warmup_steps=warmup_steps, warmup_type=warmup_type)
    if kind == "WarmupCosineLR":
        ratio = _number(
            "scheduler.params.warmup_min_ratio",
            params.get("warmup_min_ratio", default("scheduler.params.warmup_min_ratio")),
        )
        floor = _number(
            "scheduler.params.cos_min_ratio",
            params.get("cos_min_ratio", default("scheduler.params.cos_min_ratio")),
        )
        return fields | dict(
            lr=optimizer_lr,
            warmup_min_ratio=ratio,
            warmup_min_lr=optimizer_lr * ratio,
            total_steps=total_steps,
            min_lr_ratio=floor,
            overrides_optimizer_lr=False,
        )
    default_max = optimizer_lr if kind == "WarmupLR" else 0.001  # keys.WARMUP_MAX_LR_DS
    peak = _number("scheduler.params.warmup_max_lr", params.get("warmup_max_lr", default_max))
    start = _number(
        "scheduler.params.warmup_min_lr",
        params.get("warmup_min_lr", default("scheduler.params.warmup_min_lr")),
    )
    ratio = start / peak if peak else 0.0
    return fields | dict(
        lr=peak,
        warmup_min_lr=start,
        warmup_min_ratio=ratio,
        total_steps=total_steps,
        min_lr_ratio=ratio if kind == "WarmupDecayLR" else 1.0,
        overrides_optimizer_lr=True,
    )

"""Flags -> the minimal honest DeepSpeed config: every key it writes is one DeepSpeed reads at that stage.

Stage rules (deepspeed 0.19.8, runtime/engine.py `_configure_zero_optimizer`, runtime/zero/config.py):
- stages 1/2 (stage_1_and_2.py) read reduce_bucket_size, allgather_bucket_size, overlap_comm,
  contiguous_gradients and offload_optimizer (cpu only: nvme optimizer offload is ZeRO-3's ZeRO-Infinity);
- stage 3 reads reduce_bucket_size, overlap_comm, contiguous_gradients, the stage3_* knobs and both offloads;
  it never reads allgather_bucket_size (it prefetches with stage3_prefetch_bucket_size instead);
- stage 0 reads none of them.
Model-derived sizes follow the HF integration (transformers/integrations/deepspeed.py): reduce bucket h*h,
prefetch bucket 0.9*h*h, persistence threshold 10*h.
"""

from __future__ import annotations

import dataclasses

from zero_train.ds_config.keys import AUTO, deepspeed_default, generated_default
from zero_train.runtime.errors import UsageError

SCHEDULER_TYPES = {
    "warmup_constant": "WarmupLR",
    "warmup_linear": "WarmupDecayLR",
    "warmup_cosine": "WarmupCosineLR",
}
STAGE12_KNOBS = ("allgather_bucket_size",)
STAGE3_KNOBS = (
    "prefetch_bucket_size",
    "param_persistence_threshold",
    "max_live_parameters",
    "gather_16bit_weights",
)
ZERO = "zero_optimization"
FP16_KNOBS = ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale")


@dataclasses.dataclass(kw_only=True, slots=True)
class ConfigRequest:
    """What the user asked for; None means "not given" (a default, or "auto" with hf_auto)."""

    stage: int = generated_default("zero_optimization.stage")
    """ZeRO stage 0..3."""
    precision: str | None = None
    """fp32, bf16 or fp16 (fp16 gets dynamic loss scaling); None: fp32, or both "auto" with hf_auto."""
    offload_optimizer: str = "none"
    """none, cpu or nvme (nvme: stage 3 only)."""
    offload_param: str = "none"
    """none, cpu or nvme (stage 3 only)."""
    nvme_path: str | None = None
    """Directory for nvme offload (required with any nvme offload)."""
    micro_batch_size: int | None = None
    """Sequences per rank per micro-step (default 1)."""
    grad_accum: int | None = None
    """Micro-steps per optimizer step (default 1)."""
    world_size: int | None = None
    """Number of ranks; with it (or global_batch_size) train_batch_size is written."""
    global_batch_size: int | None = None
    """train_batch_size; world_size is derived from it when not given."""
    optimizer: str = "adamw"
    """adamw, adam or sgd."""
    lr: float | None = None
    """Peak learning rate (default 5e-5, the HF Trainer's fine-tuning lr: keys.GENERATED_LR)."""
    weight_decay: float | None = None
    """Weight decay (default 0, the HF Trainer's)."""
    betas: tuple[float, float] | None = None
    """Adam betas (default 0.9, 0.999)."""
    eps: float | None = None
    """Adam epsilon (default 1e-8)."""
    momentum: float | None = None
    """SGD momentum (default 0)."""
    torch_adam: bool = True
    """Use torch.optim.AdamW/Adam (no kernel build); cpu optimizer offload always uses DeepSpeedCPUAdam."""
    scheduler: str | None = None
    """constant, warmup_constant, warmup_linear, warmup_cosine (default: resolved_scheduler)."""
    warmup_steps: int | None = None
    """Warmup optimizer steps (0: none; DeepSpeed's schedulers take at least 1, as the HF integration writes)."""
    warmup_type: str = "linear"
    """linear or log."""
    total_steps: int | None = None
    """Decay horizon (total optimizer steps) for warmup_linear / warmup_cosine."""
    min_lr_ratio: float | None = None
    """Cosine floor as a fraction of lr (DeepSpeed's cos_min_ratio, default 1e-4)."""
    grad_clip: float | None = None
    """Max gradient norm, 0 = off (default 1.0, DeepSpeed's own default)."""
    hidden_size: int | None = None
    """The model's hidden size (from --model): sets the bucket defaults like the HF integration."""
    reduce_bucket_size: int | None = None
    """Elements per gradient reduction bucket (stages 1-3)."""
    allgather_bucket_size: int | None = None
    """Elements per parameter all-gather bucket (stages 1-2)."""
    overlap_comm: bool | None = None
    """Overlap gradient reduction with backward (stages 1-3)."""
    contiguous_gradients: bool | None = None
    """Copy gradients into one contiguous buffer as they are produced (stages 1-3)."""
    prefetch_bucket_size: int | None = None
    """stage3_prefetch_bucket_size."""
    param_persistence_threshold: int | None = None
    """stage3_param_persistence_threshold: smaller parameters stay unpartitioned."""
    max_live_parameters: int | None = None
    """stage3_max_live_parameters."""
    gather_16bit_weights: bool | None = None
    """stage3_gather_16bit_weights_on_model_save (default false; hf_auto: true, or save_model() writes none)."""
    loss_scale: float | None = None
    """fp16 static loss scale, 0 = dynamic."""
    initial_scale_power: int | None = None
    """fp16 dynamic loss scale starts at 2**this (default 16)."""
    loss_scale_window: int | None = None
    """fp16: overflow-free steps before the scale doubles (default 1000)."""
    hysteresis: int | None = None
    """fp16: overflows tolerated before the scale halves (default 2)."""
    min_loss_scale: float | None = None
    """fp16: lowest loss scale (default 1)."""
    hf_auto: bool = False
    """Write "auto" wherever the HF Trainer fills a value the user did not give."""

    def __post_init__(self):
        _check_request(self)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_request(req: ConfigRequest) -> None:
    """Cross-flag rules; each failure names the flag and the fix."""
    if req.stage not in (0, 1, 2, 3):
        raise UsageError(f"--stage must be 0, 1, 2 or 3, got {req.stage}")
    if req.offload_param != "none" and req.stage != 3:
        raise UsageError(f"--offload-param {req.offload_param} needs --stage 3 (got --stage {req.stage})")
    if req.offload_optimizer != "none" and req.stage == 0:
        raise UsageError(
            f"--offload-optimizer {req.offload_optimizer} needs --stage 1, 2 or 3 (got --stage 0)"
        )
    if req.offload_optimizer == "nvme" and req.stage != 3:
        raise UsageError(
            f"--offload-optimizer nvme needs --stage 3 (ZeRO-Infinity); use cpu at --stage {req.stage}"
        )
    uses_nvme = "nvme" in (req.offload_optimizer, req.offload_param)
    if uses_nvme and not req.nvme_path:
        raise UsageError("nvme offload needs --nvme-path DIR (a directory on a fast local NVMe drive)")
    if req.nvme_path and not uses_nvme:
        raise UsageError("--nvme-path is only used with --offload-optimizer nvme or --offload-param nvme")
    if req.offload_optimizer != "none" and req.optimizer == "sgd":
        raise UsageError(
            "optimizer offload runs DeepSpeedCPUAdam; use --optimizer adamw or adam with --offload-optimizer"
        )
    _check_stage_knobs(req)
    _check_optimizer_knobs(req)
    _check_schedule(req)


def _check_stage_knobs(req: ConfigRequest) -> None:
    knobs = (*STAGE12_KNOBS, *STAGE3_KNOBS, "reduce_bucket_size", "overlap_comm", "contiguous_gradients")
    given = [name for name in knobs if getattr(req, name) is not None]
    for name in given:
        if req.stage == 0:
            raise UsageError(f"{_flag(name)} has no effect at --stage 0; drop it or use --stage 1-3")
        if name in STAGE3_KNOBS and req.stage != 3:
            raise UsageError(
                f"{_flag(name)} is a ZeRO-3 setting; drop it or use --stage 3 (got --stage {req.stage})"
            )
        if name in STAGE12_KNOBS and req.stage == 3:
            raise UsageError(
                f"{_flag(name)} is not used by ZeRO-3 (it prefetches instead); use --prefetch-bucket-size"
            )
    if req.hidden_size is not None and req.hidden_size < 1:
        raise UsageError(f"the model's hidden size must be >= 1, got {req.hidden_size}")


def _check_optimizer_knobs(req: ConfigRequest) -> None:
    if req.precision not in ("fp16", None) or (req.precision is None and not req.hf_auto):
        for name in FP16_KNOBS:
            if getattr(req, name) is not None:
                raise UsageError(
                    f"{_flag(name)} only applies to --precision fp16 (got {req.precision or 'fp32'})"
                )
    if req.optimizer == "sgd" and (req.betas is not None or req.eps is not None):
        raise UsageError("--betas and --eps are Adam settings; drop them with --optimizer sgd")
    if req.optimizer != "sgd" and req.momentum is not None:
        raise UsageError("--momentum is an SGD setting; use --optimizer sgd or drop it")


def _check_schedule(req: ConfigRequest) -> None:
    if req.scheduler in ("warmup_linear", "warmup_cosine") and req.total_steps is None and not req.hf_auto:
        raise UsageError(f"--scheduler {req.scheduler} decays over --max-steps N; give --max-steps")
    if req.scheduler == "constant" and (req.warmup_steps or req.total_steps):
        raise UsageError("--scheduler constant has no warmup or decay; drop --warmup-steps/--max-steps")
    if req.min_lr_ratio is not None and resolved_scheduler(req) != "warmup_cosine":
        raise UsageError("--min-lr-ratio is the cosine floor; use it with --scheduler warmup_cosine")
    if req.warmup_steps is not None and req.total_steps is not None and req.warmup_steps > req.total_steps:
        raise UsageError(f"--warmup-steps {req.warmup_steps} exceeds --max-steps {req.total_steps}")


def hf_owns_schedule(req: ConfigRequest) -> bool:
    """hf_auto without a schedule flag: no scheduler block, so that the HF Trainer's lr_scheduler_type and
    warmup apply (transformers/integrations/deepspeed.py `deepspeed_optim_sched`: a block replaces them)."""
    return req.hf_auto and req.scheduler is None and not req.warmup_steps and req.total_steps is None


def resolved_scheduler(req: ConfigRequest) -> str:
    """The scheduler to write: explicit, else from which of warmup/total steps were given ("constant": none)."""
    if req.scheduler is not None:
        return req.scheduler
    if hf_owns_schedule(req):
        return "constant"
    if req.total_steps is not None or req.hf_auto:
        return "warmup_linear"
    return "warmup_constant" if req.warmup_steps else "constant"


def batch_section(req: ConfigRequest) -> dict:
    """train_batch_size (when the world size is known), micro batch and accumulation; checks the triple."""
    micro, accum = req.micro_batch_size, req.grad_accum
    if req.hf_auto:
        micro = AUTO if micro is None else micro
        accum = AUTO if accum is None else accum
    micro = generated_default("train_micro_batch_size_per_gpu") if micro is None else micro
    accum = generated_default("gradient_accumulation_steps") if accum is None else accum
    out: dict = {}
    if isinstance(micro, int) and isinstance(accum, int):
        per_rank = micro * accum
        if req.global_batch_size is not None:
            if req.world_size is not None and req.global_batch_size != per_rank * req.world_size:
                raise UsageError(
                    f"--global-batch-size {req.global_batch_size} != --micro-batch-size {micro} * --grad-accum "
                    f"{accum} * --world-size {req.world_size} = {per_rank * req.world_size}; drop one of them"
                )
            if req.global_batch_size % per_rank:
                raise UsageError(
                    f"--global-batch-size {req.global_batch_size} is not a multiple of --micro-batch-size {micro} "
                    f"* --grad-accum {accum} = {per_rank}; choose a multiple of {per_rank}"
                )
            out["train_batch_size"] = req.global_batch_size
        elif req.world_size is not None:
            out["train_batch_size"] = per_rank * req.world_size
        elif req.hf_auto:
            out["train_batch_size"] = AUTO
    elif req.hf_auto:
        if req.global_batch_size is not None or req.world_size is not None:
            raise UsageError(
                "with --hf-auto the Trainer derives the global batch; give --micro-batch-size and "
                "--grad-accum too, or drop --world-size/--global-batch-size"
            )
        out["train_batch_size"] = AUTO
    out["train_micro_batch_size_per_gpu"] = micro
    out["gradient_accumulation_steps"] = accum
    return out


def _value(req: ConfigRequest, name: str, default, *, hf_filled: bool = True):
    """The given value, else "auto" (hf_auto, where the Trainer fills it), else the default."""
    value = getattr(req, name)
    if value is not None:
        return value
    return AUTO if req.hf_auto and hf_filled else default


def optimizer_section(req: ConfigRequest) -> dict:
    """DeepSpeed's optimizer block; Adam means AdamW to DeepSpeed unless adam_w_mode is false."""
    params: dict = {"lr": _value(req, "lr", generated_default("optimizer.params.lr"))}
    weight_decay = generated_default("optimizer.params.weight_decay")
    if req.optimizer == "sgd":
        params["momentum"] = _value(
            req, "momentum", generated_default("optimizer.params.momentum"), hf_filled=False
        )
        params["weight_decay"] = _value(req, "weight_decay", weight_decay)
        return {"type": "SGD", "params": params}
    betas = _or(req.betas, AUTO if req.hf_auto else generated_default("optimizer.params.betas"))
    params["betas"] = betas if betas == AUTO else list(betas)
    params["eps"] = _value(req, "eps", generated_default("optimizer.params.eps"))
    params["weight_decay"] = _value(req, "weight_decay", weight_decay)
    if req.optimizer == "adam":
        params["adam_w_mode"] = False
    if req.torch_adam and req.offload_optimizer == "none":
        params["torch_adam"] = True
    return {"type": "AdamW" if req.optimizer == "adamw" else "Adam", "params": params}


def scheduler_section(req: ConfigRequest) -> dict | None:
    """DeepSpeed's scheduler block (None for a constant lr)."""
    kind = resolved_scheduler(req)
    if kind == "constant":
        return None
    params: dict = {}
    no_warmup = req.warmup_steps == 0  # then DeepSpeed's warmup (at least 2 steps) starts at the peak
    if kind != "warmup_cosine":
        peak = _value(req, "lr", generated_default("scheduler.params.warmup_max_lr"))
        start = AUTO if req.hf_auto else generated_default("scheduler.params.warmup_min_lr")
        params["warmup_min_lr"], params["warmup_max_lr"] = peak if no_warmup else start, peak
    else:
        params["warmup_min_ratio"] = (
            1.0 if no_warmup else generated_default("scheduler.params.warmup_min_ratio")
        )
        params["cos_min_ratio"] = _or(req.min_lr_ratio, generated_default("scheduler.params.cos_min_ratio"))
    warmup = _value(req, "warmup_steps", generated_default("scheduler.params.warmup_num_steps"))
    params["warmup_num_steps"] = warmup if warmup == AUTO else max(1, warmup)  # DeepSpeed rejects 0
    if kind != "warmup_constant":
        params["total_num_steps"] = _value(req, "total_steps", None)
    params["warmup_type"] = req.warmup_type
    return {"type": SCHEDULER_TYPES[kind], "params": params}


def precision_section(req: ConfigRequest) -> dict:
    """fp16 (dynamic loss scaling spelled out) or bf16 block; fp32 writes nothing.

    With hf_auto and no --precision both blocks say "auto": the Trainer's --bf16/--fp16 decide.
    """
    if req.precision is None and req.hf_auto:
        return {"fp16": _fp16_block(req, AUTO), "bf16": {"enabled": AUTO}}
    if req.precision == "bf16":
        return {"bf16": {"enabled": True}}
    if req.precision == "fp16":
        return {"fp16": _fp16_block(req, True)}
    return {}


def _fp16_block(req: ConfigRequest, enabled) -> dict:
    return {
        "enabled": enabled,
        **{
            name: _value(req, name, generated_default(f"fp16.{name}"), hf_filled=False) for name in FP16_KNOBS
        },
    }


def _offload(device: str, nvme_path: str | None) -> dict:
    return {"device": device, "nvme_path": nvme_path} if device == "nvme" else {"device": device}


def zero_section(req: ConfigRequest) -> dict:
    """zero_optimization with only the keys DeepSpeed reads at this stage."""
    zero: dict = {"stage": req.stage}
    if req.stage == 0:
        return zero
    h = req.hidden_size
    model_default = (lambda value: AUTO) if req.hf_auto and h is None else (lambda value: value)
    zero["overlap_comm"] = req.overlap_comm if req.overlap_comm is not None else req.stage == 3
    zero["contiguous_gradients"] = _or(
        req.contiguous_gradients, generated_default(f"{ZERO}.contiguous_gradients")
    )
    # Without a flag or a model the key is left out: DeepSpeed then applies its own default, and our zero1 /
    # zero2 size their buckets so that backward overlaps (sharding.accounting.default_bucket_elements).
    bucket = req.reduce_bucket_size or model_default(h * h if h else None)
    if bucket is not None:
        zero["reduce_bucket_size"] = bucket
    if req.stage in (1, 2):
        zero["allgather_bucket_size"] = req.allgather_bucket_size or generated_default(
            f"{ZERO}.allgather_bucket_size"
        )
    if req.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(req.offload_optimizer, req.nvme_path)
    if req.stage == 3:
        if req.offload_param != "none":
            zero["offload_param"] = _offload(req.offload_param, req.nvme_path)
        zero["stage3_prefetch_bucket_size"] = _or(
            req.prefetch_bucket_size,
            model_default(
                int(0.9 * h * h) if h else deepspeed_default(f"{ZERO}.stage3_prefetch_bucket_size")
            ),
        )
        zero["stage3_param_persistence_threshold"] = _or(
            req.param_persistence_threshold,
            model_default(10 * h if h else deepspeed_default(f"{ZERO}.stage3_param_persistence_threshold")),
        )
        zero["stage3_max_live_parameters"] = _or(
            req.max_live_parameters, generated_default(f"{ZERO}.stage3_max_live_parameters")
        )
        zero["stage3_gather_16bit_weights_on_model_save"] = _or(
            req.gather_16bit_weights,
            req.hf_auto or generated_default(f"{ZERO}.stage3_gather_16bit_weights_on_model_save"),
        )
    return zero


def _or(value, default):
    return default if value is None else value


def generate_config(req: ConfigRequest) -> dict:
    """The DeepSpeed config for `req`.

    Args:
        req: the validated request.

    Returns:
        A JSON-ready dict: batch keys, gradient_clipping, optimizer, scheduler (if any), precision,
        zero_optimization, in that order.
    """
    cfg = batch_section(req)
    cfg["gradient_clipping"] = _value(req, "grad_clip", generated_default("gradient_clipping"))
    cfg["optimizer"] = optimizer_section(req)
    scheduler = scheduler_section(req)
    if scheduler is not None:
        cfg["scheduler"] = scheduler
    cfg.update(precision_section(req))
    cfg["zero_optimization"] = zero_section(req)
    if req.optimizer == "sgd" and req.stage > 0:
        cfg["zero_allow_untested_optimizer"] = True  # torch SGD is not on DeepSpeed's ZeRO-tested list
    return cfg

"""Hugging Face accelerate configs beside the DeepSpeed JSON, and the flags the two must agree on.

    yaml_text = accelerate_config_text(cfg, json_path="ds.json", engine="deepspeed", num_processes=8)
    accelerate launch --config_file accel.yaml scripts/train.py --engine deepspeed ...

`accelerate launch` reads the YAML and starts the ranks (torchrun underneath; DeepSpeed's launcher for
several machines with the DeepSpeed plugin); it passes the YAML's choices to every rank as environment
variables. scripts/train.py does not wrap the model in an Accelerator: it trains with the DeepSpeed JSON
the YAML points at (DeepSpeed plugin), with the fsdp2 engine (FSDP plugin) or with torch DDP (MULTI_GPU, no
plugin; the JSON given by --deepspeed_config), and refuses to start when the YAML and the JSON disagree on what
both describe:

    YAML (environment variable)                      JSON
    mixed_precision (ACCELERATE_MIXED_PRECISION)     bf16.enabled / fp16.enabled (no = fp32)
    deepspeed_config.zero3_init_flag                 zero_optimization.stage == 3 (the model is built
      (ACCELERATE_DEEPSPEED_ZERO3_INIT)                partitioned under deepspeed.zero.Init exactly then)
    fsdp_config.fsdp_reshard_after_forward           zero_optimization.stage (3: true, 2: false)
      (FSDP_RESHARD_AFTER_FORWARD)
    fsdp_config.fsdp_version (FSDP_VERSION)          2 (the fsdp2 engine is fully_shard)

`zero-train config check ds.json --accelerate accel.yaml` runs the same comparison before a launch.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping

import yaml

from zero_train.ds_config.parse import precision_of
from zero_train.registry import DEEPSPEED, ENGINES
from zero_train.runtime.errors import UsageError

MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
DISTRIBUTED_TYPES = {
    **{spec.family: spec.accelerate for spec in ENGINES if spec.family and spec.accelerate},
    **{spec.name: spec.accelerate for spec in ENGINES if not spec.family and spec.accelerate},
}
"""scripts/train.py's --engine -> accelerate's distributed_type (the registry's `accelerate`): a library's
plugin by its family (DEEPSPEED, FSDP), then torch DDP, which takes accelerate's plain multi-process launch
(MULTI_GPU: no plugin, torchrun underneath, CPU ranks too) and reads its JSON from --deepspeed_config."""


def _either(words: list[str]) -> str:
    return " or ".join(", ".join(words).rsplit(", ", 1))


_ENGINES_WORDS = _either(list(DISTRIBUTED_TYPES))
_KINDS_WORDS = _either([f"{kind} (--engine {name})" for name, kind in DISTRIBUTED_TYPES.items()])


def _stage(cfg: dict) -> int:
    zero = cfg.get("zero_optimization") or {}
    return int(zero.get("stage", 0)) if isinstance(zero, dict) else 0


def accelerate_config(
    cfg: dict,
    *,
    json_path: str,
    engine: str = DEEPSPEED,
    num_processes: int = 1,
    num_machines: int = 1,
    machine_rank: int = 0,
    main_process_ip: str | None = None,
    main_process_port: int = 29500,
    block_class: str | None = None,
) -> dict:
    """The accelerate config (YAML as a dict) that launches `cfg` with `engine`.

    Args:
        cfg: the DeepSpeed config (its precision and stage fill the YAML's matching fields).
        json_path: where the JSON is (the DeepSpeed plugin points at it; written absolute).
        engine: "deepspeed" (DeepSpeed plugin), "fsdp2" (FSDP plugin, version 2) or "ddp" (MULTI_GPU, no plugin).
        num_processes: processes over all machines (accelerate's meaning).
        num_machines, machine_rank, main_process_ip, main_process_port: several machines.
        block_class: the transformer block class FSDP wraps (e.g. GPT2Block); None: left to accelerate.

    Returns:
        The YAML fields.
    """
    if engine not in DISTRIBUTED_TYPES:
        raise UsageError(f"--format accelerate needs --engine {_ENGINES_WORDS}, not {engine!r}")
    stage, kind = _stage(cfg), DISTRIBUTED_TYPES[engine]
    result: dict = dict(
        compute_environment="LOCAL_MACHINE",
        distributed_type=kind,
        mixed_precision=MIXED_PRECISION[precision_of(cfg)],
        num_machines=num_machines,
        num_processes=num_processes,
        machine_rank=machine_rank,
        main_training_function="main",
        rdzv_backend="static",
        same_network=True,
        use_cpu=False,  # True would start ONE process (measured with accelerate 1.15 on CPU ranks)
    )
    if num_machines > 1:
        result.update(main_process_ip=main_process_ip or "127.0.0.1", main_process_port=main_process_port)
    if kind == "MULTI_GPU":
        return result
    if kind == "DEEPSPEED":
        result["deepspeed_config"] = dict(
            deepspeed_config_file=str(pathlib.Path(json_path).resolve()),
            zero3_init_flag=stage == 3,
            deepspeed_multinode_launcher="standard",  # torchrun on every machine: no ssh, no hostfile
        )
        return result
    if stage not in (2, 3):
        raise UsageError(f"the fsdp2 engine needs a stage 2 or 3 config (got stage {stage})")
    fsdp = dict(
        fsdp_version=2,
        fsdp_reshard_after_forward=stage == 3,
        fsdp_auto_wrap_policy="TRANSFORMER_BASED_WRAP",
        fsdp_state_dict_type="SHARDED_STATE_DICT",
        fsdp_offload_params=False,
        fsdp_cpu_ram_efficient_loading=False,
        fsdp_activation_checkpointing=False,
    )
    if block_class:
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = block_class
    result["fsdp_config"] = fsdp
    return result


def accelerate_config_text(cfg: dict, **kwargs) -> str:
    """`accelerate_config` as YAML text (same arguments)."""
    return yaml.safe_dump(accelerate_config(cfg, **kwargs), sort_keys=False)


def load_accelerate_config(path: str | os.PathLike) -> dict:
    """Read an accelerate YAML (UsageError: missing, unreadable, or not a mapping)."""
    try:
        data = yaml.safe_load(pathlib.Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise UsageError(f"cannot read accelerate config {path}: {type(err).__name__}") from err
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not an accelerate config (a YAML mapping with distributed_type)")
    return data


def launch_fields(source: Mapping, *, from_env: bool) -> dict | None:
    """The fields that must agree with the JSON, read from a YAML dict or from `accelerate launch`'s env.

    Returns:
        distributed_type, mixed_precision, zero3_init_flag, fsdp_version, reshard_after_forward (None where
        the source says nothing); None when the source is not an accelerate launch at all.
    """
    if from_env:
        if source.get("ACCELERATE_USE_DEEPSPEED") == "true":
            kind = "DEEPSPEED"
        elif source.get("ACCELERATE_USE_FSDP") == "true":
            kind = "FSDP"
        else:
            return None
        flag = source.get("ACCELERATE_DEEPSPEED_ZERO3_INIT")
        reshard = source.get("FSDP_RESHARD_AFTER_FORWARD")
        return dict(
            distributed_type=kind,
            mixed_precision=source.get("ACCELERATE_MIXED_PRECISION"),
            zero3_init_flag=None if flag is None else flag == "true",
            fsdp_version=int(source["FSDP_VERSION"]) if source.get("FSDP_VERSION") else None,
            reshard_after_forward=None if reshard is None else reshard == "true",
            deepspeed_config_file=source.get("ACCELERATE_DEEPSPEED_CONFIG_FILE"),
        )
    ds, fsdp = source.get("deepspeed_config") or {}, source.get("fsdp_config") or {}
    return dict(
        distributed_type=str(source.get("distributed_type", "NO")).upper(),
        mixed_precision=source.get("mixed_precision"),
        zero3_init_flag=ds.get("zero3_init_flag"),
        fsdp_version=fsdp.get("fsdp_version"),
        reshard_after_forward=fsdp.get("fsdp_reshard_after_forward"),
        deepspeed_config_file=ds.get("deepspeed_config_file"),
    )


def agreement_problems(cfg: dict, fields: dict, *, engine: str | None = None) -> list[str]:
    """What the accelerate fields and the DeepSpeed JSON disagree on (one line each, naming the fix).

    Args:
        cfg: the DeepSpeed config.
        fields: from `launch_fields`.
        engine: scripts/train.py's --engine, when known (the plugin must match it).
    """
    problems = []
    kind, stage = fields["distributed_type"], _stage(cfg)
    if kind not in DISTRIBUTED_TYPES.values():
        return [f"accelerate distributed_type {kind!r}: use {_KINDS_WORDS}"]
    wanted_engine = {plugin: name for name, plugin in DISTRIBUTED_TYPES.items()}[kind]
    if engine is not None and engine != wanted_engine:
        problems.append(f"accelerate's {kind} plugin runs --engine {wanted_engine}, not --engine {engine}")
    precision = MIXED_PRECISION[precision_of(cfg)]
    given = fields["mixed_precision"]
    if given is not None and str(given).lower() != precision:
        problems.append(
            f"accelerate mixed_precision is {given!r} but the JSON trains in {precision_of(cfg)}: "
            f"set mixed_precision: {precision} (or change the JSON's bf16/fp16 section)"
        )
    if (
        kind == "DEEPSPEED"
        and fields["zero3_init_flag"] is not None
        and fields["zero3_init_flag"] != (stage == 3)
    ):
        problems.append(
            f"accelerate zero3_init_flag is {str(fields['zero3_init_flag']).lower()} but the JSON is ZeRO stage "
            f"{stage}: set zero3_init_flag: {str(stage == 3).lower()} (true exactly for stage 3)"
        )
    if kind == "FSDP":
        if fields["fsdp_version"] not in (None, 2):
            problems.append(
                f"accelerate fsdp_version is {fields['fsdp_version']}: set fsdp_version: 2 (fully_shard)"
            )
        reshard = fields["reshard_after_forward"]
        if stage not in (2, 3):
            problems.append(f"the fsdp2 engine needs a ZeRO stage 2 or 3 JSON (got stage {stage})")
        elif reshard is not None and reshard != (stage == 3):
            problems.append(
                f"accelerate fsdp_reshard_after_forward is {str(reshard).lower()} but the JSON is stage {stage}: "
                f"set fsdp_reshard_after_forward: {str(stage == 3).lower()} (3: true, 2: false)"
            )
    return problems

"""Which class builds each engine of zero_train.registry, and `build_engine`, which builds one.

    engine = build_engine("zero1", model_fn=lambda: load_model("tiny"), settings=settings,
                          ds_config=resolved_config, dist_info=dist_info)

BUILDERS is keyed by the registry's names (tests/package/test_registry.py: one builder per engine, no other);
every class is imported by name here, so the import graph shows which module builds which engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from zero_train.engines.base import Engine
from zero_train.engines.ddp import DDPEngine
from zero_train.engines.zero1 import Zero1Engine
from zero_train.engines.zero2 import Zero2Engine
from zero_train.engines.zero3 import Zero3Engine
from zero_train.registry import engine_spec, resolve_engine
from zero_train.runtime.errors import UsageError

if TYPE_CHECKING:
    from zero_train.ds_config import TrainSettings
    from zero_train.runtime.dist import DistInfo


def _torch_zero() -> type:
    """Imported when built (start-up: torch.distributed.optim takes seconds to import)."""
    from zero_train.engines.torch_zero import TorchZeroEngine  # expensive: torch.distributed.optim (seconds)

    return TorchZeroEngine


def _fsdp2() -> type:
    """Imported when built (start-up: torch.distributed.fsdp and its checkpoint take seconds to import)."""
    from zero_train.engines.fsdp2 import FSDP2Engine  # expensive: torch.distributed.fsdp (seconds)

    return FSDP2Engine


def _deepspeed() -> type:
    """Imported when built (start-up, and only deepspeed*.py import DeepSpeed)."""
    from zero_train.engines.deepspeed_engine import DeepSpeedEngine  # expensive: DeepSpeed (seconds)

    return DeepSpeedEngine


BUILDERS: dict[str, Callable[[], type]] = {
    "ddp": lambda: DDPEngine,
    "zero1": lambda: Zero1Engine,
    "zero2": lambda: Zero2Engine,
    "torch-zero": _torch_zero,
    "ds0": _deepspeed,
    "ds1": _deepspeed,
    "ds2": _deepspeed,
    "fsdp2-z2": _fsdp2,
    "zero3": lambda: Zero3Engine,
    "ds3": _deepspeed,
    "fsdp2-z3": _fsdp2,
}
"""Registry name -> a function that returns its Engine class (importing it when that is expensive)."""


def engine_class(name: str) -> type:
    """The class that builds the engine `name` of the registry (imports its module)."""
    return BUILDERS[engine_spec(name).name]()


def build_engine(
    name: str,
    *,
    model_fn: Callable[[], torch.nn.Module],
    settings: TrainSettings,
    ds_config: dict,
    dist_info: DistInfo,
) -> Engine:
    """Build the named engine around a freshly built model.

    Args:
        name: an engine of zero_train.registry.ENGINES, or a family alias ("deepspeed", "fsdp2": that library
            at settings.zero_stage).
        model_fn: builds the HF model in fp32 (called once; the deepspeed engine calls it inside
            transformers' ZeRO-3 integration so that the model is created partitioned).
        settings: from `zero_train.ds_config.train_settings` (its world_size must match dist_info).
        ds_config: the resolved DeepSpeed config (`resolve_auto`); only the deepspeed engine reads it.
        dist_info: from `zero_train.runtime.dist.init_distributed()`.

    Returns:
        The engine, with the model on dist_info.device in the settings' precision.
    """
    spec = resolve_engine(name, settings.zero_stage)
    if settings.world_size != dist_info.world_size:
        raise UsageError(
            f"settings were resolved for world size {settings.world_size} but {dist_info.world_size} "
            "ranks are running; resolve the config with the launcher's world size"
        )
    engine = engine_class(spec.name)(
        model_fn=model_fn, settings=settings, ds_config=ds_config, dist_info=dist_info
    )
    engine.name = spec.name
    return engine

"""The facts about a record's model that theory needs, rebuilt from its name on the meta device (no memory).

A run record names its model (a preset such as `tiny`, or a local Hugging Face folder) and counts its
parameters. The memory model also needs the shape (layers, width, vocabulary: activations; the largest
layer: ZeRO-3) and, to explain the per-rank imbalance of whole-tensor sharding (our ZeRO-1, torch's
ZeroRedundancyOptimizer), the size of every parameter tensor.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from zero_train.hf.models import model_config
from zero_train.memory.model.theory import ModelShape, model_shape
from zero_train.runtime.errors import UsageError
from zero_train.train.config import LoraConfig


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelFacts:
    """A model as the report's theory sees it."""

    shape: ModelShape
    """Parameters, largest layer, layers, width, heads, vocabulary (zero_train.memory.model.theory)."""
    param_numels: tuple[int, ...]
    """Elements of every parameter tensor, in `model.parameters()` order (tied weights once)."""
    config: Any = None
    """The transformers config (activations are counted on it), None if unknown."""
    lora: Any = None
    """The run's zero_train.hf.lora.LoraSpec (the shape then has the adapters, only they trainable), or None."""


@dataclass(kw_only=True, slots=True, frozen=True)
class FactsLookup:
    """The facts of one model name, or why there are none (the report then says "n/a" and why)."""

    facts: ModelFacts | None
    """None when the model could not be rebuilt."""
    problem: str | None
    """One line saying why `facts` is None."""


@functools.lru_cache(maxsize=16)
def _facts_of(name: str, lora=None) -> FactsLookup:
    try:
        config = model_config(name)
    except (UsageError, OSError, ValueError) as err:
        return FactsLookup(facts=None, problem=f"model {name!r} cannot be rebuilt here ({err})")
    shape = model_shape(config, lora)  # counted on the meta device once, then read from the store
    facts = ModelFacts(shape=shape, param_numels=shape.param_numels, config=config, lora=lora)
    return FactsLookup(facts=facts, problem=None)


def lora_of(recorded: dict | None):
    """The LoraSpec of a run record's "lora" (train.py's [lora] settings), None without."""
    if not recorded:
        return None

    settings = {key: recorded[key] for key in ("r", "alpha", "dropout", "target_modules") if key in recorded}
    return LoraConfig(**settings).spec()


def model_facts(name: str | None, num_params: int | None, lora: dict | None = None) -> FactsLookup:
    """The facts of the model a record names, checked against the parameter count it recorded.

    Args:
        name: the record's "model" (a preset or a local folder).
        num_params: the record's "num_params" (the model the run really trained, adapters included).
        lora: the record's "lora" (its adapters' settings), None for full fine-tuning.

    Returns:
        A FactsLookup: facts, or the reason there are none (unknown model, or a different size now).
    """
    if not name:
        return FactsLookup(facts=None, problem="the record names no model")
    lookup = _facts_of(name, lora_of(lora))
    if lookup.facts is not None and num_params and lookup.facts.shape.num_params != num_params:
        return FactsLookup(
            facts=None,
            problem=f"model {name!r} now has {lookup.facts.shape.num_params:,} parameters, "
            f"the record {num_params:,} (different vocabulary or config)",
        )
    return lookup

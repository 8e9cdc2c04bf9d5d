"""Engines: one protocol (base.Engine) over DDP, our ZeRO-1, torch's ZeroRedundancyOptimizer and DeepSpeed."""

from zero_train.engines.base import ENGINES, MEMORY_CATEGORIES, Engine, StepResult, build_engine

__all__ = ["ENGINES", "MEMORY_CATEGORIES", "Engine", "StepResult", "build_engine"]

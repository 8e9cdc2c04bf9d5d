"""Engines: one protocol (base.Engine) over DDP, our ZeRO-1/2, torch's ZeroRedundancyOptimizer, FSDP2 and DeepSpeed.

Which engines exist, their names and what each is built from: zero_train.registry.

- ``base``: the Engine protocol, StepResult.
- ``build``: which class builds each engine of the registry; ``build_engine``.
- ``local``: what the engines that drive a torch optimizer themselves share (ddp, zero1, torch-zero).
- ``ddp``: torch DistributedDataParallel + an unsharded optimizer.
- ``zero1``: our ZeRO-1 (zero_train.sharding.Zero1Optimizer) behind the protocol.
- ``zero2``: our ZeRO-2 (gradients sharded too) behind the protocol.
- ``torch_zero``: torch's ZeroRedundancyOptimizer under DDP.
- ``fsdp2``: torch's ``fully_shard`` (FSDP2).
- ``deepspeed_engine``: DeepSpeed ZeRO 0-3 (with ``deepspeed_memory``: where its bytes are); the only engine
  modules that import DeepSpeed.
- ``optim``: the torch optimizer and lr schedule the DeepSpeed config describes.
- ``precision``: fp32 master weights for a bf16/fp16 model and fp16 dynamic loss scaling, as DeepSpeed keeps them.
"""

from zero_train.engines.base import MEMORY_CATEGORIES, Engine, StepResult
from zero_train.engines.build import build_engine

__all__ = ["MEMORY_CATEGORIES", "Engine", "StepResult", "build_engine"]

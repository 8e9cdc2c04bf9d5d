"""Our hand-written ZeRO-1: a plain model, `zero_train.sharding.Zero1Optimizer` does the rest.

No DDP wrapper: gradients accumulate locally over the micro-batches; during the last micro-batch's
backward the sharder reduces them to their owners bucket by bucket (buckets of the DeepSpeed config's
zero_optimization.reduce_bucket_size elements, overlapped with the backward), then clips by the global
norm, updates the fp32 master slice this rank owns with its slice of the optimizer state, and
all-gathers the updated parameters (ZeRO paper, P_os: 4 Psi + K Psi / Nd bytes per rank in mixed
precision). The step reads nothing back from the device (fp16 aside: its overflow decides the step).
"""

from __future__ import annotations

import contextlib

import torch

from zero_train.checkpoint.elastic import load_sharded_optimizer
from zero_train.checkpoint.files import (
    copy_weights_into,
    read_weights,
    unique_state_dict,
)
from zero_train.ds_config.keys import deepspeed_default
from zero_train.ds_config.parse import reduce_bucket_elements
from zero_train.engines.optim import optimizer_spec, scheduled_lr
from zero_train.engines.precision import grad_dtypes, make_loss_scaler
from zero_train.engines.sharded import ShardedEngine
from zero_train.runtime.errors import UsageError
from zero_train.sharding import Zero1Optimizer
from zero_train.sharding.accounting import default_bucket_elements
from zero_train.sharding.zero12 import report, state
from zero_train.sharding.zero12.sharded import ShardedOptimizer


def reduce_bucket_size(ds_config: dict, params) -> int:
    """zero_optimization.reduce_bucket_size if the config sets it (the user's size wins), else a size that cuts
    the trainable tensors into at least MIN_BUCKETS buckets, so that backward overlaps their reductions
    (DeepSpeed's 5e8 default put any model under 500M parameters in one bucket, reduced after backward)."""
    given = reduce_bucket_elements(ds_config)
    if given is not None:
        return given
    cap = deepspeed_default("zero_optimization.reduce_bucket_size")
    return default_bucket_elements([p.numel() for p in params if p.requires_grad], cap)


class Zero1Engine(ShardedEngine):
    """Plain model + Zero1Optimizer (optimizer state and fp32 masters sharded over the ranks)."""

    name = "zero1"

    sharder: type[ShardedOptimizer] = Zero1Optimizer
    """Our optimizer of this stage (Zero2Engine: Zero2Optimizer)."""

    def __init__(self, *, model_fn, settings, ds_config, dist_info):
        super().__init__(model_fn=model_fn, settings=settings, ds_config=ds_config, dist_info=dist_info)
        optimizer_class, kwargs = optimizer_spec(settings, dist_info.device)
        params = list(self.model.parameters())
        self.loss_scaler = make_loss_scaler(settings)  # the optimizer's: it unscales and skips
        self.optimizer = self.sharder(
            params,
            optimizer_class,
            process_group=self.process_group,
            master_dtype=torch.float32,
            loss_scaler=self.loss_scaler,
            bucket_elements=reduce_bucket_size(ds_config, params),  # reduced while backward goes on
            **self._gradient_dtypes(ds_config),
            **{**kwargs, "lr": scheduled_lr(settings, 0)},
        )

    @staticmethod
    def _gradient_dtypes(ds_config: dict) -> dict[str, torch.dtype]:
        """The sharder's grad_dtype from the config (Zero2Engine: reduce_dtype too). ZeRO-1 reduces its gradient
        buffer in place, so the config's communication_data_type must be the accumulation dtype."""
        dtypes = grad_dtypes(ds_config)
        if dtypes["reduce_dtype"] != dtypes["grad_dtype"]:
            raise UsageError(
                f"zero1 reduces its {dtypes['grad_dtype']} gradient buffer in place: set communication_data_type "
                "to the accumulation dtype (data_types.grad_accum_dtype), or use --engine zero2"
            )
        return {"grad_dtype": dtypes["grad_dtype"]}

    def optimizer_shard(self) -> dict:
        return state.state_dict(self.optimizer)

    def sharder_bytes(self) -> dict[str, int]:
        return report.memory_bytes(self.optimizer)

    def _no_sync(self, boundary: bool):
        """The last micro-batch's hooks write gradients already divided by N (one pass fewer) and reduce
        each complete bucket while backward goes on."""
        return self.optimizer.boundary_backward() if boundary else contextlib.nullcontext()

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The model's weights on rank 0, in CPU memory (fp32: exact; bf16/fp16: the fp32 masters, gathered)."""
        masters = self._gathered_masters()
        if not self.dist_info.is_main:
            return None
        return unique_state_dict(self.model, masters)

    def _gathered_masters(self) -> dict[int, torch.Tensor] | None:
        """id(param) -> full fp32 master on rank 0 (collective, one tensor at a time), when the model is not fp32."""
        if self.settings.precision == "fp32":
            return None
        full = state.gathered_master_params(self.optimizer, to=0)  # rank 0: CPU tensors in parameter order
        if full is None:
            return None
        return {id(p): m for p, m in zip(self.model.parameters(), full, strict=True)}

    def load_checkpoint(self, path) -> dict:
        """Restore weights, this rank's optimizer shard and counters; returns this rank's client_state."""
        weights = read_weights(path, self.model)
        copy_weights_into(self.model, {k: v.to(self.model.dtype) for k, v in weights.items()})
        own, optimizer_state = load_sharded_optimizer(  # any saved world size (zero_train.checkpoint.elastic)
            path, rank=self.dist_info.rank, world_size=self.dist_info.world_size
        )
        state.load_state_dict(self.optimizer, optimizer_state)
        self.restore_counters(own["counters"])
        return own["client_state"]

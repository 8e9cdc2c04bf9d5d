"""Our hand-written ZeRO-3 behind the Engine protocol: `zero_train.sharding.Zero3Model` + `Zero3Optimizer`.

    deepspeed --num_gpus 2 scripts/train.py --engine zero3 --model gpt2-25m

The model is built on the meta device (sharding/zero3/meta_build.py) and each rank materialises only its slices, with
the values the unsharded build gives; from then on every parameter exists whole only while its unit is
gathered (ZeRO paper, P_os+g+p: (4 + K) Psi / Nd bytes per rank in mixed precision, 16 Psi / Nd in fp32).
The DeepSpeed config gives the optimizer, schedule, precision, clipping, accumulation and the gradients' dtypes
(data_types.grad_accum_dtype, communication_data_type; fp32 by default: engines/zero1.py grad_dtypes); its ZeRO tuning keys (bucket sizes, stage3_*
thresholds) are DeepSpeed's and do not apply: a unit is the bucket.

Checkpoints: model/ (full fp32 weights, written by rank 0 one tensor at a time) and one optimizer shard per
rank (pieces of state: sharding/zero3/state.py). Resuming reads this rank's pieces of the weights from
model/model.safetensors and its pieces of optimizer state from the shards, at any world size.
"""

from __future__ import annotations

import pathlib

import torch
from safetensors import safe_open

from zero_train.checkpoint.files import (
    MODEL_DIR,
    WEIGHTS_FILE,
    load_rank_file,
    read_elements,
    read_weights,
    saved_tensors,
)
from zero_train.engines.optim import optimizer_spec, scheduled_lr
from zero_train.engines.precision import PRECISION_DTYPES, grad_dtypes, make_loss_scaler
from zero_train.engines.sharded import ShardedEngine
from zero_train.hf.lora import is_lora
from zero_train.runtime.errors import UsageError
from zero_train.sharding.zero3 import report, state
from zero_train.sharding.zero3.meta_build import MetaBuild
from zero_train.sharding.zero3.model import Zero3Model
from zero_train.sharding.zero3.optim import Zero3Optimizer


class Zero3Engine(ShardedEngine):
    """A model sharded by Zero3Model (parameters, gradients, optimizer state: 1/N each) and its optimizer."""

    name = "zero3"

    def __init__(self, *, model_fn, settings, ds_config, dist_info):
        self._start(settings, dist_info)
        dtype = PRECISION_DTYPES[settings.precision]
        with MetaBuild() as build:
            self.model = model_fn()
        _buffers_to(self.model, dist_info.device, dtype)
        self.sharded = Zero3Model(
            self.model,
            process_group=self.process_group,
            device=dist_info.device,
            dtype=dtype,
            **grad_dtypes(ds_config),
            values_of=build.values,
        )
        optimizer_class, kwargs = optimizer_spec(settings, dist_info.device)
        kwargs["lr"] = scheduled_lr(settings, 0)
        self.loss_scaler = make_loss_scaler(settings)  # the optimizer's: it unscales and skips
        self.optimizer = Zero3Optimizer(
            self.sharded, optimizer_class, master_dtype=torch.float32, loss_scaler=self.loss_scaler, **kwargs
        )

    def optimizer_shard(self) -> dict:
        return state.state_dict(self.optimizer)

    def sharder_bytes(self) -> dict[str, int]:
        return report.memory_bytes(self.optimizer)

    # ------------------------------------------------------------- weights
    def _named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """What a checkpoint keeps (checkpoint.files.saved_tensors): each tensor once under its first name (a tied
        lm_head is dropped); for LoRA the adapters alone."""
        return list(saved_tensors(self.model).items())

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The fp32 weights (LoRA: the adapters) on rank 0 in CPU memory (collective: one tensor at a time),
        None elsewhere."""
        weights = {}
        for name, tensor in self._named_tensors():
            if id(tensor) in self.sharded.owner:
                value = state.gathered_param(self.optimizer, tensor, to=0)
            else:  # a buffer: every rank has it whole
                value = tensor.detach().to("cpu", copy=True) if self.dist_info.is_main else None
            if value is not None:
                weights[name] = value.contiguous()
        return weights if self.dist_info.is_main else None

    def load_checkpoint(self, path) -> dict:
        """This rank's pieces of the weights and of the optimizer state, at any saved world size.

        Returns:
            This rank's client_state (rank `rank % saved world size`'s at another world size).
        """
        path = pathlib.Path(path)
        if is_lora(self.model):
            self._load_adapters(path)
        else:
            self._load_weights(path / MODEL_DIR / WEIGHTS_FILE)
        first = load_rank_file(path, 0, mmap=True)
        saved_world_size = int(first["world_size"])
        rank, world_size = self.dist_info.rank, self.dist_info.world_size
        own = (
            first
            if rank % saved_world_size == 0
            else load_rank_file(path, rank % saved_world_size, mmap=True)
        )
        if saved_world_size == world_size:
            state.load_shards(self.optimizer, [own["optimizer"]])
        else:  # re-cut: every saved shard, memory-mapped; each rank reads only what its pieces overlap
            others = [load_rank_file(path, r, mmap=True) for r in range(1, saved_world_size)]
            state.load_shards(self.optimizer, [first["optimizer"]] + [o["optimizer"] for o in others])
        self.restore_counters(own["counters"])
        return own["client_state"]

    def _load_weights(self, weights: pathlib.Path) -> None:
        if not weights.is_file():
            raise UsageError(f"checkpoint has no {MODEL_DIR}/{WEIGHTS_FILE}: was it saved by another engine?")
        names = {id(tensor): name for name, tensor in self._named_tensors()}
        with safe_open(str(weights), "pt") as handle:
            missing = [name for name in names.values() if name not in handle.keys()]
            if missing:
                raise UsageError(
                    f"checkpoint weights lack {missing[0]!r}: it was saved from a different model"
                )
            state.load_weights(
                self.optimizer,
                lambda param, offset, length: read_elements(handle, names[id(param)], offset, length),
            )
            with torch.no_grad():
                for name, tensor in self._named_tensors():
                    if id(tensor) not in self.sharded.owner:
                        tensor.copy_(handle.get_tensor(name))

    def _load_adapters(self, path: pathlib.Path) -> None:
        """A LoRA checkpoint's adapters (a PEFT folder in model/) into their slices; the base is the --model's."""
        adapters = self._named_tensors()
        weights = read_weights(path, self.model)
        for name, param in adapters:
            if name not in weights or weights[name].shape != param.shape:
                raise UsageError(
                    f"checkpoint adapter {name!r} is missing or of another shape: another model?"
                )
        by_id = {id(param): weights[name] for name, param in adapters}
        state.load_weights(
            self.optimizer,
            lambda param, offset, length: by_id[id(param)].reshape(-1)[offset : offset + length],
            params=[param for _, param in adapters],
        )


def _buffers_to(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Move the (real) buffers to the device, floating ones cast to the model dtype, as `model.to` would."""
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None:
                cast = dtype if buffer.is_floating_point() else buffer.dtype
                module._buffers[name] = buffer.to(device=device, dtype=cast)

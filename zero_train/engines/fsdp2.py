"""PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`) behind the Engine protocol.

    deepspeed --num_gpus 2 scripts/train.py --engine fsdp2 --deepspeed_config ds_configs/zero3.json

The same DeepSpeed JSON as every other engine picks the set-up:

- zero_optimization.stage 3 -> `reshard_after_forward=True`: every block's parameters are gathered for
  its forward, freed, gathered again for its backward (the ZeRO-3 analogue, 3 Psi on the wire);
  stage 2 -> `reshard_after_forward=False`: a block's gathered parameters stay from its forward to its
  backward (one all-gather per step: the ZeRO-2 analogue in traffic, 2 Psi, but whole 16-bit
  parameters of every block are alive at the end of forward, which ZeRO-2 always holds anyway).
  Both shard parameters, gradients and optimizer states at rest (the ZeRO-3 memory layout).
- bf16/fp16 -> `MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32)`: the sharded parameters
  stay fp32 (they are the masters), compute runs in 16 bit, gradients are reduce-scattered in fp32
  unless `communication_data_type` says otherwise (DeepSpeed ZeRO reduces in the 16-bit dtype by
  default: a documented convergence difference, docs/fsdp2.md).
- Optimizer, schedule, clipping (global norm over the sharded gradients) and accumulation as the
  other local engines (zero_train.engines.local): gradients are reduce-scattered after every
  micro-batch and accumulate in the sharded gradient, as DeepSpeed ZeRO-2/3 do.

Checkpoints: torch distributed checkpoint (DCP) of the sharded model and optimizer in `dcp/`, which
DCP reshards on load, so a run saved by N ranks resumes on M; plus model/ (full fp32 weights, rank 0)
for `zero-train export` and the per-rank client state.
"""

from __future__ import annotations

import pathlib

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from zero_train.checkpoint.files import saved_tensors
from zero_train.checkpoint.writes import as_staged_writes
from zero_train.engines.base import tensor_bytes
from zero_train.engines.local import LocalEngine
from zero_train.engines.optim import build_optimizer
from zero_train.engines.precision import PRECISION_DTYPES, make_loss_scaler
from zero_train.hf.lora import is_lora
from zero_train.runtime.errors import UsageError

DCP_DIR = "dcp"
RESHARD_AFTER_FORWARD = {2: False, 3: True}  # ZeRO stage of the config -> FSDP2 mode
COMM_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def mixed_precision_policy(precision: str, ds_config: dict) -> MixedPrecisionPolicy:
    """The FSDP2 precision policy a DeepSpeed config describes.

    Args:
        precision: "fp32", "bf16" or "fp16" (the settings').
        ds_config: the resolved config; its `communication_data_type` picks the reduce dtype.

    Returns:
        fp32: no casts at all. 16-bit: parameters cast to it for compute, gradients reduced in fp32
        (or the configured communication dtype); the sharded fp32 parameters are what the optimizer steps.
    """
    comm = ds_config.get("communication_data_type")
    if comm is not None and comm not in COMM_DTYPES:
        raise UsageError(f"communication_data_type {comm!r} is not one of {', '.join(COMM_DTYPES)}")
    if precision == "fp32":
        return MixedPrecisionPolicy(reduce_dtype=COMM_DTYPES[comm] if comm else None)
    return MixedPrecisionPolicy(
        param_dtype=PRECISION_DTYPES[precision],
        reduce_dtype=COMM_DTYPES[comm] if comm else torch.float32,
    )


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules whose class HF lists in `_no_split_modules` (GPT2Block, ...).

    Raises:
        UsageError: the model names none (FSDP2 would then shard it as one unit, i.e. no memory saved
            during forward), so say so instead of training silently unsharded.
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [module for module in model.modules() if type(module).__name__ in names]
    if not blocks:
        raise UsageError(
            f"{type(model).__name__} lists no transformer block class (_no_split_modules); "
            "the fsdp2 engine shards per block: use a transformers model that names its blocks"
        )
    return blocks


def device_mesh(device: torch.device, process_group=None) -> DeviceMesh:
    """A 1-D mesh over the group's ranks (reusing the group and its backend) on this rank's device type.

    fully_shard without a mesh builds one on torch's default accelerator: CUDA on a GPU host even when
    the run chose CPU + gloo (ZT_DEVICE=cpu).
    """
    return DeviceMesh.from_group(process_group or dist.group.WORLD, device_type=device.type)


def _frozen_to(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Store the parameters without gradients (a LoRA run's frozen base) in the compute dtype.

    They are never updated, so an fp32 shard of them would be a master copy of nothing: in bf16 a frozen
    weight costs 2 bytes per parameter (sharded), as DeepSpeed's 16-bit module does. FSDP2 asks for one
    original dtype among the trainable parameters of a group only; the all-gather casts each to param_dtype.
    """
    for param in model.parameters():
        if not param.requires_grad and param.is_floating_point():
            param.data = param.data.to(dtype)


def _local(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class FSDP2Engine(LocalEngine):
    """fully_shard on every transformer block and the root; torch optimizer over the fp32 shards."""

    name = "fsdp2"

    def __init__(self, *, model_fn, settings, ds_config, dist_info):
        if settings.zero_stage not in RESHARD_AFTER_FORWARD:
            raise UsageError(
                f"the fsdp2 engine needs zero_optimization.stage 2 or 3 (got {settings.zero_stage}); "
                "stage 3 reshards after forward, stage 2 keeps parameters gathered until backward"
            )
        self._start(settings, dist_info)
        self.model = model_fn().to(device=dist_info.device, dtype=torch.float32)  # fp32 shards = masters
        _frozen_to(self.model, PRECISION_DTYPES[settings.precision])  # no master for a frozen weight
        self.reshard_after_forward = RESHARD_AFTER_FORWARD[settings.zero_stage]
        shard = dict(
            mesh=device_mesh(dist_info.device, self.process_group),
            reshard_after_forward=self.reshard_after_forward,
            mp_policy=mixed_precision_policy(settings.precision, ds_config),
        )
        for block in transformer_blocks(self.model):
            fully_shard(block, **shard)
        fully_shard(self.model, **shard)
        self.loss_scaler = make_loss_scaler(settings)
        self.optimizer = build_optimizer(
            [p for p in self.model.parameters() if p.requires_grad], settings, dist_info.device
        )

    def _apply_step(self, lr: float) -> tuple[torch.Tensor, bool]:
        """Gradients are already reduce-scattered (averaged); the norm all-reduces the shards' squares and
        stays on the device (the loop reads it; fp16 reads its overflow)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.loss_scaler is not None:
            for param in params:
                param.grad.mul_(1.0 / self.loss_scaler.loss_scale)
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        grad_norm = grad_norm.full_tensor() if isinstance(grad_norm, DTensor) else grad_norm
        skipped = self._step_unless_overflow(grad_norm, params, lr)
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, skipped

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The fp32 weights (a LoRA run's adapters only), gathered on rank 0 (collective); a tied tensor once."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=self._lora)
        state = get_model_state_dict(self.model, options=options)
        if not self.dist_info.is_main:
            return None
        return {
            name: state[name].detach().contiguous() for name in saved_tensors(self.model) if name in state
        }

    @property
    def _lora(self) -> bool:
        return is_lora(self.model)

    def _dcp_options(self) -> StateDictOptions:
        """A LoRA run's DCP holds the adapters and their optimizer state, never the frozen base (the --model)."""
        return StateDictOptions(ignore_frozen_params=self._lora, strict=not self._lora)

    def _dcp_state(self) -> dict:
        """The model and optimizer state DCP saves and loads (a LoRA run's: what saved_tensors keeps)."""
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer, options=self._dcp_options())
        if self._lora:  # ignore_frozen_params keeps a tied alias of a frozen weight (GPT-2's lm_head)
            kept = saved_tensors(self.model)
            model_state = {name: value for name, value in model_state.items() if name in kept}
        return dict(model=model_state, optimizer=optimizer_state)

    def save_checkpoint(self, out, *, client_state: dict) -> None:
        """DCP of model + optimizer shards (every rank), model/ full weights (rank 0), rank files.

        `out` is a StagedWrites (zero_train.checkpoint.writes) or a folder to write into at once. DCP
        coordinates the ranks' writes itself, so its part is written at once even under --async-save.
        """
        writes = as_staged_writes(out)
        state = self._dcp_state()
        writes.now(DCP_DIR, lambda target: dcp.save(state, checkpoint_id=str(target)))
        scaler = None if self.loss_scaler is None else self.loss_scaler.state_dict()
        self.write_checkpoint(writes, self.full_state_dict(), client_state=client_state, loss_scaler=scaler)

    def load_checkpoint(self, path) -> dict:
        """Restore the shards from DCP (resharded to this world size); returns this rank's client_state."""
        path = pathlib.Path(path)
        if not (path / DCP_DIR / ".metadata").is_file():
            raise UsageError(f"checkpoint {path} has no {DCP_DIR}/: it was not saved by the fsdp2 engine")
        state = self._dcp_state()
        dcp.load(state, checkpoint_id=str(path / DCP_DIR))  # every key asked for must be in the checkpoint
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=self._dcp_options(),
        )
        return self.restore_unsharded_state(path)

    def memory_categories(self, device: torch.device | None = None) -> dict[str, int]:
        """This rank's bytes: fp32 shards (params in fp32, master_params in mixed precision), frozen shards
        (params, in the compute dtype), gathered 16-bit parameters still alive, gradient shards, Adam moments; FSDP2's reduce-scatter and
        all-gather buffers live only inside a collective (comm_buffers 0 between steps). device: count
        only tensors on it (None: all)."""

        seen: set = set()
        params = list(self.model.parameters())
        shards = tensor_bytes((_local(p) for p in params if p.requires_grad), seen, device=device)
        frozen = tensor_bytes((_local(p) for p in params if not p.requires_grad), seen, device=device)
        gathered = tensor_bytes(_gathered_parameters(self.model), seen, device=device)
        grads = tensor_bytes((_local(p.grad) for p in self.model.parameters()), seen, device=device)
        states = tensor_bytes(
            (_local(v) for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v)),
            seen,
            device=device,
        )
        mixed = self.settings.precision != "fp32"
        return dict(
            params=gathered + frozen + (0 if mixed else shards),
            grads=grads,
            master_params=shards if mixed else 0,
            optimizer_states=states,
            comm_buffers=0,
        )


def _gathered_parameters(model: torch.nn.Module):
    """The all-gather outputs FSDP2 still holds (unsharded parameters; empty storages once resharded)."""
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = getattr(state(), "_fsdp_param_group", None) if state is not None else None
        for fsdp_param in getattr(group, "fsdp_params", None) or ():
            yield from getattr(fsdp_param, "all_gather_outputs", None) or ()

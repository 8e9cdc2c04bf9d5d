"""Plain data parallelism: torch DistributedDataParallel and an unsharded torch optimizer.

Every rank holds the whole model, its gradients and the whole optimizer state (the ZeRO paper's
16 Psi baseline in mixed precision). DDP all-reduces (averages) gradients in buckets during the
backward of the last micro-batch; earlier micro-batches run under `no_sync` and only accumulate.
In bf16/fp16 the model and its gradients are low precision and the optimizer updates fp32 master
copies, as DeepSpeed does; fp16 adds dynamic loss scaling.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel

from zero_train.checkpoint.files import (
    copy_weights_into,
    load_rank_file,
    read_weights,
    save_rank_file,
    unique_state_dict,
    write_model,
)
from zero_train.checkpoint.writes import as_staged_writes
from zero_train.engines.base import tensor_bytes
from zero_train.engines.local import LocalEngine
from zero_train.engines.optim import build_optimizer
from zero_train.engines.precision import MasterWeights, make_loss_scaler
from zero_train.sharding import norms


class DDPEngine(LocalEngine):
    """DistributedDataParallel + torch optimizer over fp32 (master) parameters."""

    name = "ddp"

    def __init__(self, *, model_fn, settings, ds_config, dist_info):
        super().__init__(model_fn=model_fn, settings=settings, ds_config=ds_config, dist_info=dist_info)
        device_ids = [dist_info.device.index] if dist_info.device.type == "cuda" else None
        self.ddp_model = DistributedDataParallel(
            self.model, device_ids=device_ids, process_group=self.process_group
        )
        self.master = MasterWeights(  # the frozen base (LoRA) needs no fp32 copy, gradient or state
            [p for p in self.model.parameters() if p.requires_grad], precision=settings.precision
        )
        self.loss_scaler = make_loss_scaler(settings)
        self.optimizer = self._build_optimizer(self.master.master_params)

    def _build_optimizer(self, params) -> torch.optim.Optimizer:
        return build_optimizer(params, self.settings, self.dist_info.device)

    def _forward_module(self) -> torch.nn.Module:
        return self.ddp_model

    def _no_sync(self, boundary: bool):
        return contextlib.nullcontext() if boundary else self.ddp_model.no_sync()

    def _apply_step(self, lr: float) -> tuple[torch.Tensor, bool]:
        """Gradients are already averaged by DDP (identical on every rank), so no collective here. The global
        norm accumulates in float64, as our sharders' does from their pieces (zero_train.sharding.norms), so
        that both clip by the same number; it stays on the device (the loop reads it)."""
        inv_scale = 1.0 if self.loss_scaler is None else 1.0 / self.loss_scaler.loss_scale
        self.master.grads_to_master(inv_scale=inv_scale)
        grads = [p.grad for p in self.master.master_params if p.grad is not None]
        grad_norm = norms.total_norm(norms.sum_of_powers(grads, device=grads[0].device if grads else None))
        skipped = self._step_unless_overflow(grad_norm, self.master.master_params, lr)
        if not skipped:
            self.master.master_to_model()
        self.master.zero_grad()
        return grad_norm, skipped

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The fp32 master weights under the model's names (rank 0; None elsewhere)."""
        if not self.dist_info.is_main:
            return None
        return unique_state_dict(self.model, self._master_by_param())

    def _master_by_param(self) -> dict[int, torch.Tensor]:
        return {id(p): m for p, m in zip(self.master.model_params, self.master.master_params, strict=True)}

    def _optimizer_state(self) -> dict | None:
        """The full optimizer state on rank 0 (collective in subclasses that shard it)."""
        return self.optimizer.state_dict() if self.dist_info.is_main else None

    def save_checkpoint(self, out, *, client_state: dict) -> None:
        """Rank 0: model/ (fp32 weights) and the optimizer; every rank: its client_state and counters.

        `out` is a StagedWrites (zero_train.checkpoint.writes) or a folder to write into at once.
        """
        writes = as_staged_writes(out)
        optimizer_state = self._optimizer_state()
        payload = dict(
            client_state=client_state,
            counters=self.counters(),
            loss_scaler=None if self.loss_scaler is None else self.loss_scaler.state_dict(),
        )
        if self.dist_info.is_main:
            write_model(writes, self.model, self.full_state_dict())
            payload["optimizer"] = optimizer_state
        save_rank_file(writes, self.dist_info.rank, payload)

    def load_checkpoint(self, path) -> dict:
        """Restore weights, optimizer, loss scale and counters; returns this rank's client_state.

        A checkpoint from another world size loads too (the state is not sharded); ranks that did not
        exist then get rank 0's client_state.
        """
        copy_weights_into(self.model, read_weights(path, self.model), self._master_by_param())
        self.master.master_to_model()
        main = load_rank_file(path, 0)
        self.optimizer.load_state_dict(main["optimizer"])
        return self.restore_unsharded_state(path, main)

    def memory_categories(self, device: torch.device | None = None) -> dict[str, int]:
        """Bytes held by this rank: whole model, grads, fp32 masters (mixed precision), Adam moments, DDP buckets.

        device: count only tensors on it (None: all). DDP's buckets live with the gradients, on the model's device.
        """
        params = list(self.model.parameters())
        masters = self.master.master_params if self.master.has_copies else []
        on_device = device is None or torch.device(device).type == self.dist_info.device.type
        reducer_buckets = _ddp_bucket_bytes(self.ddp_model) if on_device else 0
        grads = tensor_bytes((p.grad for p in params), device=device)
        return dict(
            params=tensor_bytes(params, device=device),
            grads=grads + tensor_bytes((m.grad for m in masters), device=device),
            master_params=tensor_bytes(masters, device=device),
            optimizer_states=_optimizer_state_bytes(self.optimizer, device),
            comm_buffers=reducer_buckets,
        )


def _optimizer_state_bytes(optimizer: torch.optim.Optimizer, device: torch.device | None = None) -> int:
    """Bytes of every tensor in the optimizer's per-parameter state (Adam: exp_avg, exp_avg_sq, step).

    On CUDA, torch's Adam keeps each "step" counter on the CPU (unless fused/capturable): `device` tells.
    """
    # ZeroRedundancyOptimizer leaves None for the parameters other ranks own once consolidate_state_dict ran
    states = (state for state in optimizer.state.values() if isinstance(state, dict))
    return tensor_bytes(
        (v for state in states for v in state.values() if isinstance(v, torch.Tensor)), device=device
    )


def _ddp_bucket_bytes(ddp_model: DistributedDataParallel) -> int:
    """DDP's flat gradient buckets, when its reducer exposes them, else 0.

    With gradient_as_bucket_view=False (the default) DDP keeps one flat bucket per ~25 MB of
    gradients, the same size as the gradients themselves; torch does not expose the buckets through a
    public API, so they are estimated from the bucket layout the reducer reports.
    """
    logging_data = ddp_model._get_ddp_logging_data() if hasattr(ddp_model, "_get_ddp_logging_data") else {}
    sizes = logging_data.get("bucket_sizes")
    if isinstance(sizes, str):
        return sum(int(s) for s in sizes.split(",") if s.strip())
    if isinstance(sizes, (list, tuple)):
        return sum(int(s) for s in sizes)
    return 0

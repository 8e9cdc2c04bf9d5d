"""DeepSpeed ZeRO stage 0-3 behind the Engine protocol (the only engine module that imports deepspeed).

    engine = DeepSpeedEngine(model_fn=..., settings=..., ds_config=resolve_auto(cfg, settings), dist_info=...)

DeepSpeed does everything itself from the resolved config: precision, optimizer (`torch_adam`), loss
scaling, accumulation (its backward divides the loss by grad_accum), clipping, scheduler. For ZeRO-3 the
model is built while a transformers `HfDeepSpeedConfig` is alive, so `from_config` runs inside
`deepspeed.zero.Init` and no rank ever holds the whole model. Checkpoints are DeepSpeed's own format.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pathlib
import sys
import warnings

import deepspeed
import deepspeed.ops
import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine
from deepspeed.utils import logger as deepspeed_logger
from deepspeed.utils import safe_get_full_fp32_param
from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

from zero_train.checkpoint.deepspeed_universal import load_universal, saved_world_size
from zero_train.checkpoint.files import (
    DEEPSPEED_DIR,
    load_rank_file,
    rank_file,
    refuse_unexpected_pickles,
    save_rank_file,
    saved_tensors,
    write_model,
)
from zero_train.checkpoint.writes import as_staged_writes
from zero_train.engines.base import StepResult
from zero_train.engines.deepspeed_memory import deepspeed_memory_categories
from zero_train.engines.optim import build_optimizer, client_lr_scheduler
from zero_train.hf.lora import is_lora
from zero_train.runtime.errors import UsageError
from zero_train.runtime.extensions import clear_stale_locks

CHECKPOINT_TAG = "state"  # one DeepSpeed tag per checkpoint dir: the dir itself is already per step
# Two messages every run printed that say nothing a user can act on, silenced by their exact text (DeepSpeed
# 0.19.8, torch 2.13): DeepSpeed's collectives call all_gather_into_tensor / reduce_scatter_tensor, which torch
# deprecates with a FutureWarning per call site; WarmupCosineLR's constructor reads its own lr before its first
# step (lr_schedules.py) and logs a warning about it.
warnings.filterwarnings(
    "ignore",
    message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
    category=FutureWarning,
)
deepspeed_logger.addFilter(
    lambda record: (
        record.getMessage() != "Attempting to get learning rate from scheduler before it has started"
    )
)


MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


def import_muon_uncompiled(ds_config: dict) -> None:
    """Import DeepSpeed's Muon module with torch.compile's decorators as no-ops, unless the config trains with Muon.

    Every ZeRO `deepspeed.initialize` imports that module to check the optimizer's type, and its
    `@torch.compile` decorators build inductor's configuration as it is imported: ~2 CPU-s of every rank's
    start, for functions only a Muon optimizer calls (docs/startup.md#deepspeeds-muon-module). A process that
    already imported it keeps what it has; a later Muon run in this process would run those functions eagerly.
    """
    optimizer = ds_config.get("optimizer")
    kind = str(optimizer.get("type", "")) if isinstance(optimizer, dict) else ""
    if "muon" in kind.lower() or MUON_MODULE in sys.modules:
        return
    with _dynamo_decorators_off(), contextlib.suppress(ImportError):  # a DeepSpeed without Muon
        importlib.import_module(MUON_MODULE)


@contextlib.contextmanager
def _dynamo_decorators_off():
    """TORCHDYNAMO_DISABLE=1 inside the block: torch.compile(fn) returns fn itself, building no backend."""
    previous = os.environ.get("TORCHDYNAMO_DISABLE")
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TORCHDYNAMO_DISABLE"]
        else:
            os.environ["TORCHDYNAMO_DISABLE"] = previous


SHM_COMM_OP = "deepspeed_shm_comm"


def skip_inference_collectives() -> None:
    """Keep DeepSpeed from building and loading its CPU shared-memory collectives: deepspeed.comm's TorchBackend
    JIT-compiles them at init_distributed when they are not built (minutes on 2 cores: docs/startup.md), yet
    only `inference_all_reduce` (AutoTP inference) calls them; ZeRO's collectives are torch.distributed's."""
    deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False


class DeepSpeedEngine:
    """deepspeed.initialize over an HF model; ZeRO stage and everything else from the config."""

    name = "deepspeed"

    def __init__(self, *, model_fn, settings, ds_config: dict, dist_info):
        self.settings = settings
        self.dist_info = dist_info
        self.ds_config = ds_config
        self.hf_ds_config = None
        skip_inference_collectives()
        clear_stale_locks()  # DeepSpeed's CPU Adam (offload) would wait forever on a killed build's lock
        # deepspeed.comm must wrap our process group before zero.Init reads the world size
        deepspeed.init_distributed(dist_backend=dist_info.backend)
        if settings.zero_stage == 3:
            # must stay referenced while the model is built (transformers keeps only a weak reference)
            self.hf_ds_config = HfDeepSpeedConfig(ds_config)
        model = model_fn()
        if settings.precision == "fp32" and settings.zero_stage < 3:
            # DeepSpeed casts a model to bf16 / fp16 itself but never to fp32 (a --load-dtype bf16 model);
            # ZeRO-3's zero.Init already built it in the config's dtype
            model = model.float()
        params = [p for p in model.parameters() if p.requires_grad]
        # a config without an "optimizer" section would make DeepSpeed train with no optimizer at all
        client_optimizer = None if "optimizer" in ds_config else build_optimizer(params, settings)
        import_muon_uncompiled(ds_config)
        self.ds_engine, self.optimizer, _, self.lr_scheduler = deepspeed.initialize(
            model=model,
            model_parameters=params,
            optimizer=client_optimizer,
            config=ds_config,
            lr_scheduler=client_lr_scheduler(settings),  # an HF Trainer schedule, as the Trainer passes it
        )
        self.model = self.ds_engine.module
        self.lora = is_lora(self.model)  # its checkpoints leave the frozen base out (the --model rebuilds it)
        self.micro_steps = 0

    def forward_backward(
        self, batch: torch.LongTensor, labels: torch.LongTensor | None = None
    ) -> torch.Tensor:
        """Forward and DeepSpeed backward of one micro-batch (DeepSpeed divides by grad_accum).

        Returns:
            The micro-batch's mean token loss (detached, unscaled, fp32).
        """
        boundary = self.ds_engine.is_gradient_accumulation_boundary()
        batch = batch.to(self.ds_engine.device, non_blocking=True)  # from pinned memory on CUDA: no wait
        labels = batch if labels is None else labels.to(self.ds_engine.device, non_blocking=True)
        loss = self.ds_engine(input_ids=batch, labels=labels).loss
        self.ds_engine.backward(loss)
        if not boundary:
            self.ds_engine.step()  # DeepSpeed counts micro-steps in step(); off the boundary it only counts
        self.micro_steps += 1
        return loss.detach().float()

    def step(self) -> StepResult:
        """The boundary step: DeepSpeed reduces (ZeRO-1/2: at the boundary), clips, steps and schedules."""
        if self.micro_steps % self.settings.grad_accum != 0 or not self.micro_steps:
            raise RuntimeError(
                f"step() after {self.micro_steps} micro-batches; expected a multiple of "
                f"grad_accum={self.settings.grad_accum}"
            )
        assert self.ds_engine.is_gradient_accumulation_boundary()
        lr = self.lr()
        skipped_before = self.ds_engine.skipped_steps
        self.ds_engine.step()
        grad_norm = self.ds_engine.get_global_grad_norm()
        loss_scale = None
        if self.settings.precision == "fp16":
            loss_scale = float(
                getattr(self.optimizer, "cur_scale", getattr(self.optimizer, "loss_scale", 0.0))
            )
        if isinstance(
            grad_norm, torch.Tensor
        ):  # read by the loop when it logs; a copy: DeepSpeed reuses its own
            grad_norm = grad_norm.detach().clone()
        return StepResult(
            grad_norm=grad_norm
            if grad_norm is None or isinstance(grad_norm, torch.Tensor)
            else float(grad_norm),
            skipped=self.ds_engine.skipped_steps > skipped_before,
            lr=lr,
            loss_scale=loss_scale,
        )

    def lr(self) -> float:
        """The learning rate the next optimizer step will use (DeepSpeed's scheduler already set it)."""
        return float(self.ds_engine.get_lr()[0])

    def save_checkpoint(self, out, *, client_state: dict) -> None:
        """DeepSpeed's save_checkpoint into `<out>/deepspeed`; model/config.json; per-rank client state.

        DeepSpeed builds its state dicts and calls its checkpoint engine for each file; ours hands them to
        `writes` instead (zero_train.checkpoint.writes), so a failed write is recorded rather than raised
        between DeepSpeed's barriers, and --async-save can write them later.
        """
        writes = as_staged_writes(out)
        capture = CapturingCheckpointEngine(
            writes, module_keys=set(saved_tensors(self.model)) if self.lora else None
        )
        own_engine, self.ds_engine.checkpoint_engine = self.ds_engine.checkpoint_engine, capture
        # rank 0 copies DeepSpeed's recovery scripts with shutil, past the checkpoint engine
        self.ds_engine._copy_recovery_script = capture.copy_recovery_scripts
        try:
            self.ds_engine.save_checkpoint(
                str(writes.staging / DEEPSPEED_DIR),
                tag=CHECKPOINT_TAG,
                client_state={},
                save_latest=False,
                exclude_frozen_parameters=self.lora,
            )
        finally:
            self.ds_engine.checkpoint_engine = own_engine
            del self.ds_engine._copy_recovery_script
        adapters = self.full_state_dict() if self.lora else None  # small: the PEFT folder in model/
        if self.dist_info.is_main:
            write_model(writes, self.model, adapters)
        save_rank_file(
            writes, self.dist_info.rank, dict(client_state=client_state, micro_steps=self.micro_steps)
        )

    def load_checkpoint(self, path) -> dict:
        """DeepSpeed's load_checkpoint (model, optimizer, scheduler, loss scale); returns this rank's client_state.

        Saved at another world size: through DeepSpeed's universal checkpoint (engines/deepspeed_universal.py).
        """
        path = pathlib.Path(path)
        ds_dir = path / DEEPSPEED_DIR / CHECKPOINT_TAG
        if not ds_dir.is_dir():
            raise UsageError(
                f"checkpoint {path} has no {DEEPSPEED_DIR}/{CHECKPOINT_TAG}; "
                "it was not saved by the deepspeed engine"
            )
        refuse_unexpected_pickles(ds_dir)
        saved_ranks = saved_world_size(ds_dir)
        if saved_ranks not in (None, self.dist_info.world_size):  # partitions for another world size
            load_universal(
                self.ds_engine,
                path / DEEPSPEED_DIR,
                source_tag=CHECKPOINT_TAG,
                dist_info=self.dist_info,
                saved_ranks=saved_ranks,
            )
        else:
            load_path, _ = self.ds_engine.load_checkpoint(
                str(path / DEEPSPEED_DIR),
                tag=CHECKPOINT_TAG,
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
                load_module_strict=not self.lora,  # a LoRA checkpoint has no frozen base
            )
            assert load_path is not None, f"DeepSpeed could not load {ds_dir}"
        own_rank = self.dist_info.rank if rank_file(path, self.dist_info.rank).is_file() else 0
        saved = load_rank_file(path, own_rank)
        self.micro_steps = int(saved["micro_steps"])
        return saved["client_state"]

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """fp32 weights (a LoRA run's adapters only) gathered from DeepSpeed's fp32 partitions (collective), on rank 0.

        ZeRO-1/2/3 with an optimizer hold the authoritative fp32 copy in their partitions (in fp32
        training too); `safe_get_full_fp32_param` all-reduces one parameter at a time, so no rank
        ever holds more than the result plus one parameter. Without a ZeRO optimizer the module's
        own (whole) parameters are the weights.
        """
        result: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        wanted = saved_tensors(self.model)
        for name, param in self.model.named_parameters():
            if id(param) in seen or name not in wanted:
                continue
            seen.add(id(param))
            full = safe_get_full_fp32_param(param)
            if full is None:
                full = param.detach().float()
            if self.dist_info.is_main:
                result[name] = full.detach().to("cpu", copy=True).contiguous()
        if not self.dist_info.is_main:
            return None
        for name, buffer in self.model.named_buffers():
            if name in wanted:
                result[name] = buffer.detach().to("cpu", copy=True).contiguous()
        return _in_state_dict_order(self.model, result)

    def memory_categories(self, device: torch.device | None = None) -> dict[str, int]:
        """Bytes per category read from DeepSpeed's optimizer partitions and buffers (on `device` only if given)."""
        return deepspeed_memory_categories(self.ds_engine, device)

    def close(self) -> None:
        """Release DeepSpeed's engine: its optimizer's buffers and hooks (`destroy()`), the ZeRO-3 config.

        DeepSpeed's hooks keep the engine alive in reference cycles; without this a process that builds
        engine after engine (zero-train bench in one launch) keeps every one of them.
        """
        if self.ds_engine is None:
            return
        self.ds_engine.destroy()
        if self.hf_ds_config is not None:
            unset_hf_deepspeed_config()
        self.ds_engine = self.optimizer = self.lr_scheduler = self.model = self.hf_ds_config = None


def _in_state_dict_order(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` reordered like model.state_dict(); persistent buffers only; a tied duplicate dropped."""
    ordered = {name: tensors[name] for name in model.state_dict() if name in tensors}
    return ordered


class CapturingCheckpointEngine(CheckpointEngine):
    """A DeepSpeed checkpoint engine that hands every file to a StagedWrites instead of writing it.

    Args:
        writes: the StagedWrites.
        module_keys: the model-state names to keep (None: all).

    Folders are created by the writes themselves (below the staging folder only); loading is never done
    through it (it is installed for the duration of one save_checkpoint call).
    """

    def __init__(self, writes, *, module_keys: set[str] | None = None) -> None:
        super().__init__()
        self.name = "zero_train.StagedWrites"
        self.writes = writes
        self.module_keys = module_keys

    def create(self, info) -> None:
        """Nothing to prepare."""

    def makedirs(self, path, exist_ok=False) -> None:
        """Folders appear with their first file."""

    def save(self, state_dict, path: str) -> None:
        """Hand the state dict to the StagedWrites (a snapshot of it, when deferred).

        With `module_keys` (a LoRA run) the model states keep those tensors only: DeepSpeed's
        exclude_frozen_parameters drops the frozen parameters by name but keeps a tied alias of one (GPT-2's
        lm_head), a copy of the base that the --model rebuilds anyway.
        """
        module = state_dict.get("module") if isinstance(state_dict, dict) else None
        if self.module_keys is not None and isinstance(module, dict):
            kept = {key: value for key, value in module.items() if key in self.module_keys}
            state_dict = {**state_dict, "module": kept}
        self.writes.torch_save(self.writes.relpath(path), state_dict)

    def load(self, path: str, map_location=None):
        """Never used: the engine is swapped in for saving only."""
        raise AssertionError("CapturingCheckpointEngine only saves")

    def commit(self, info) -> bool:
        """The StagedWrites' owner commits the checkpoint (zero_train.checkpoint.save)."""
        return True

    def copy_recovery_scripts(self, save_path) -> None:
        """DeepSpeed's zero_to_fp32.py and zero_to_torch.py beside the tag folder, as DeepSpeed copies them."""
        scripts = pathlib.Path(deepspeed.__file__).parent / "utils"
        for script in ("zero_to_fp32.py", "zero_to_torch.py"):
            self.writes.copy(self.writes.relpath(pathlib.Path(save_path) / script), scripts / script)

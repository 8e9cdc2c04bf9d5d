"""The engine runs tests/engines compares: a tiny GPT-2 (~133k parameters) built, trained, saved and resumed by any
engine of the registry inside gloo ranks, with DeepSpeed's config semantics (test_engines.py: our and torch's
engines against DDP; test_deepspeed_engine.py: DeepSpeed's). Ranks import it, so it lives in the package."""

from __future__ import annotations

import copy
import math
import pathlib

import torch
import torch.distributed as dist

from zero_train.ds_config import resolve_auto, train_settings
from zero_train.engines import build_engine
from zero_train.hf.models import build_model, model_config
from zero_train.runtime.dist import DistInfo
from zero_train.sharding.zero12 import report as zero12_report
from zero_train.sharding.zero12.sharded import ShardedOptimizer

VOCAB = 256
STEPS_BEFORE_SAVE = 2
STEPS_AFTER_SAVE = 2
FP16_SKIPPED_STEPS = 3  # overflowing steps from a loss scale of 2**20 (hysteresis 2), measured

# DeepSpeed reduces, norms and clips in its own order: `(norm + 1e-6) / clip` divides the gradients
# where torch multiplies by `clip / (norm + 1e-6)`, and the norm sums partition norms. Each differs
# from torch's by about one float32 ulp; Adam normalizes updates, so after 4 steps at lr 3e-3 the
# parameters stay within ~1e-6 of ddp's (measured). 1e-5 leaves margin, while any
# real difference (a missed clip, a wrong lr, a doubled gradient) moves parameters by ~1e-3.
DEEPSPEED_PARAM_TOLERANCE = 1e-5
BF16_PARAM_TOLERANCE = 2e-4  # see test_bf16_ddp_keeps_fp32_masters_and_matches_deepspeed_zero1

BASE_CONFIG = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.5,  # below the tiny model's gradient norm (~1.5): clipping is exercised
    "steps_per_print": 10**9,
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "torch_adam": True},
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": 1e-3,
            "warmup_max_lr": 3e-3,
            "warmup_num_steps": 2,
            "total_num_steps": 20,
            "warmup_type": "linear",
        },
    },
    "zero_optimization": {"stage": 1, "reduce_bucket_size": 50_000, "allgather_bucket_size": 50_000},
}


def tiny_settings(stage: int, precision: str, world_size: int, scale_power: int = 16):
    cfg = copy.deepcopy(BASE_CONFIG)
    cfg["zero_optimization"]["stage"] = stage
    if stage == 3:
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # partition even tiny params
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": scale_power}
    if precision != "fp32":  # 16-bit gradients, as DDP and DeepSpeed keep them (our engines' default is fp32)
        cfg["data_types"], cfg["communication_data_type"] = {"grad_accum_dtype": precision}, precision
    settings = train_settings(cfg, world_size=world_size)
    return settings, resolve_auto(cfg, settings)


def tiny_model_fn(initial_weights: dict | None = None):
    def build():
        torch.manual_seed(0)
        model = build_model(model_config("tiny", vocab_size=VOCAB))
        if initial_weights is not None:
            model.load_state_dict(initial_weights, strict=False)  # a tied lm_head is not in the dict
        return model

    return build


def build_tiny(
    name: str, rank: int, world_size: int, *, stage=1, precision="fp32", initial_weights=None, scale_power=16
):
    settings, ds_config = tiny_settings(stage, precision, world_size, scale_power)
    dist_info = DistInfo(
        rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"), backend="gloo"
    )
    return build_engine(
        name,
        model_fn=tiny_model_fn(initial_weights),
        settings=settings,
        ds_config=ds_config,
        dist_info=dist_info,
    )


def micro_batches(rank: int, step: int, grad_accum: int) -> list[torch.Tensor]:
    """Deterministic per (rank, step): a resumed run sees exactly the batches of the uninterrupted one."""
    generator = torch.Generator().manual_seed(10_000 * step + rank)
    return [torch.randint(0, VOCAB, (2, 16), generator=generator) for _ in range(grad_accum)]


def train_steps(engine, rank: int, steps, memory_at_boundary: list | None = None) -> list[tuple]:
    """(last micro-batch loss, grad_norm, lr, skipped) per step; optionally memory before each step."""
    history = []
    for step in steps:
        for batch in micro_batches(rank, step, engine.settings.grad_accum):
            loss = engine.forward_backward(batch)
        if memory_at_boundary is not None:
            memory_at_boundary.append(engine.memory_categories())
        result = engine.step()
        history.append((float(loss), float(result.grad_norm), result.lr, result.skipped))
    return history


def max_diff(a: dict | None, b: dict | None) -> float | None:
    """Largest absolute difference between two state dicts (rank 0), inf if their keys differ."""
    if a is None or b is None:
        return None
    if a.keys() != b.keys():
        return math.inf
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def run_with_checkpoint(name: str, rank: int, world_size: int, tmp: str, **build_kwargs) -> dict:
    """Train, save, train on; then a fresh engine loads the checkpoint and trains the same steps.

    Returns plain numbers plus `final` (rank 0's full state dict) for comparisons inside the rank.
    """
    engine = build_tiny(name, rank, world_size, **build_kwargs)
    memory: list[dict] = []
    history = train_steps(engine, rank, range(STEPS_BEFORE_SAVE))
    path = (
        pathlib.Path(tmp) / f"{name}-{build_kwargs.get('stage', 1)}-{build_kwargs.get('precision', 'fp32')}"
    )
    if rank == 0:
        path.mkdir()
    dist.barrier()
    engine.save_checkpoint(path, client_state={"rank": rank, "rng": torch.tensor([rank, 7])})
    dist.barrier()
    later_steps = range(STEPS_BEFORE_SAVE, STEPS_BEFORE_SAVE + STEPS_AFTER_SAVE)
    history += train_steps(engine, rank, later_steps, memory_at_boundary=memory)
    final = engine.full_state_dict()

    resumed = build_tiny(name, rank, world_size, **build_kwargs)
    client_state = resumed.load_checkpoint(path)
    resumed_history = train_steps(resumed, rank, later_steps)
    return dict(
        history=history,
        resumed_history=resumed_history,
        resumed_diff=max_diff(final, resumed.full_state_dict()),
        client_state=(client_state["rank"], client_state["rng"].tolist()),
        memory_boundary=memory[-1],
        memory_after_step=engine.memory_categories(),
        num_params=sum(p.numel() for p in engine.model.parameters()),
        num_tensors=len(list(engine.model.parameters())),
        split_tensors=sum(
            len(zero12_report.pieces_of(engine.optimizer, p)) > 1 for p in engine.model.parameters()
        )
        if isinstance(engine.optimizer, ShardedOptimizer)
        else None,
        final=final,
    )


def without_key_bias(state: dict | None) -> dict | None:
    """`state` with the attention key biases zeroed (GPT-2's c_attn.bias is [query | key | value]).

    Softmax is invariant to adding one constant to every score, so the true gradient of the key bias
    is zero and what backward returns is rounding noise; Adam normalizes that noise into lr-sized
    updates, so two correct bf16 implementations disagree there by ~lr (measured: 9.4e-4 after step 4).
    """
    if state is None:
        return None
    state = dict(state)
    for name in [k for k in state if k.endswith("attn.c_attn.bias")]:
        third = state[name].numel() // 3
        state[name] = state[name].clone()
        state[name][third : 2 * third] = 0
    return state


def without_tensors(run: dict) -> dict:
    return {k: v for k, v in run.items() if k != "final"}


def broadcast_state(state: dict | None) -> dict:
    """Rank 0's state dict on every rank."""
    holder = [state]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]

"""The fsdp2 engine (torch fully_shard) against torch DDP, and its DCP checkpoint at other world sizes.

On 2 gloo ranks and the tiny GPT-2, with accumulation 2 and clipping below the gradient norm:
- fp32: FSDP2 at stage 2 (keep gathered) and stage 3 (reshard after forward) give DDP's losses, gradient
  norms and final weights within float rounding. Not bit for bit: FSDP2 averages by reduce-scattering
  flat per-block buffers (gloo: all-reduce + chunk, the division by N before or after the sum) and
  accumulates the averaged gradient of each micro-batch, DDP sums the micro-batches' local gradients
  and all-reduces once; the global norm is a sum of per-shard squares instead of one sum.
- bf16 (16-bit compute, fp32 reduce and masters) trains and stays near the fp32 run.
- a stage-3 checkpoint saved by 2 ranks loads on 1 and on 3 ranks through DCP with the same fp32
  weights, Adam moments, step counters and learning rate, bit for bit.
"""

from __future__ import annotations

import copy
import pathlib

import pytest
import torch

from zero_train.testing import run_ranks

pytestmark = pytest.mark.tier("multiproc")

VOCAB = 256
STEPS = 4
SAVE_AFTER = 2
CONFIG = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.5,  # below the tiny model's gradient norm (~1.5): clipping is exercised
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": 1e-3,
            "warmup_max_lr": 3e-3,
            "warmup_num_steps": 2,
            "total_num_steps": 20,
            "warmup_type": "linear",
        },
    },  # fmt: skip
    "zero_optimization": {"stage": 3},
}
# fp32 tolerances; measured: losses 2.4e-7 apart at most, final weights 2.7e-6 (why not 0: module docstring)
LOSS_TOLERANCE = 1e-5
WEIGHT_TOLERANCE = 3e-5


def _build(engine: str, rank: int, world_size: int, *, stage: int = 3, precision: str = "fp32"):
    from zero_train.ds_config import resolve_auto, train_settings
    from zero_train.engines import build_engine
    from zero_train.hf.models import build_model, model_config
    from zero_train.runtime.dist import DistInfo

    cfg = copy.deepcopy(CONFIG)
    cfg["zero_optimization"]["stage"] = stage
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    settings = train_settings(cfg, world_size=world_size)

    def model_fn():
        torch.manual_seed(0)
        return build_model(model_config("tiny", vocab_size=VOCAB))

    dist_info = DistInfo(rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"),
                         backend="gloo")  # fmt: skip
    return build_engine(engine, model_fn=model_fn, settings=settings, ds_config=resolve_auto(cfg, settings),
                        dist_info=dist_info)  # fmt: skip


def _train(engine, rank: int, steps) -> list[tuple[float, float, float]]:
    history = []
    for _ in steps:
        generator = torch.Generator().manual_seed(rank)  # the same batches every step: the loss must fall
        losses = [
            float(engine.forward_backward(torch.randint(0, VOCAB, (2, 16), generator=generator)))
            for _ in range(engine.settings.grad_accum)
        ]
        result = engine.step()
        history.append((sum(losses) / len(losses), float(result.grad_norm), result.lr))
    return history


def _numpy(tensors: dict | None) -> dict | None:
    """Tensors as float64 numpy arrays: the result queue would pass tensors as shared memory of a dead child."""
    return None if tensors is None else {k: v.detach().double().numpy() for k, v in tensors.items()}


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float(abs(a[k] - b[k]).max()) for k in a)


def _full_optimizer_state(engine) -> dict[str, torch.Tensor]:
    """name.exp_avg / name.exp_avg_sq / name.step, whole tensors (collective), on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    state = get_optimizer_state_dict(engine.model, engine.optimizer,
                                     options=StateDictOptions(full_state_dict=True))  # fmt: skip
    return _numpy({f"{name}.{key}": torch.as_tensor(value) for name, moments in state["state"].items()
                   for key, value in moments.items()})  # fmt: skip


def _two_ranks(rank: int, world_size: int, tmp: str) -> dict:
    import torch.distributed as dist

    ddp = _build("ddp", rank, world_size)
    runs = {"ddp": _train(ddp, rank, range(STEPS))}
    finals = {"ddp": _numpy(ddp.full_state_dict())}
    for stage in (2, 3):
        engine = _build("fsdp2", rank, world_size, stage=stage)
        history = _train(engine, rank, range(SAVE_AFTER))
        if stage == 3:
            path = pathlib.Path(tmp) / "ckpt"
            if rank == 0:
                path.mkdir()
            dist.barrier()
            engine.save_checkpoint(path, client_state={"rank": rank})
            saved = dict(weights=_numpy(engine.full_state_dict()), optimizer=_full_optimizer_state(engine),
                         lr=engine.lr(), counters=engine.counters())  # fmt: skip
        runs[f"z{stage}"] = history + _train(engine, rank, range(SAVE_AFTER, STEPS))
        finals[f"z{stage}"] = _numpy(engine.full_state_dict())
    bf16 = _build("fsdp2", rank, world_size, stage=3, precision="bf16")
    runs["bf16"] = _train(bf16, rank, range(STEPS))
    memory = bf16.memory_categories()
    result = dict(runs=runs, memory=memory, num_params=sum(p.numel() for p in ddp.model.parameters()))
    if rank == 0:
        result.update(finals=finals, saved=saved)
    return result


def _resume(rank: int, world_size: int, tmp: str) -> dict:
    engine = _build("fsdp2", rank, world_size)
    client_state = engine.load_checkpoint(pathlib.Path(tmp) / "ckpt")
    loaded = dict(weights=_numpy(engine.full_state_dict()), optimizer=_full_optimizer_state(engine), lr=engine.lr(),
                  counters=engine.counters(), client_rank=client_state["rank"])  # fmt: skip
    _train(engine, rank, range(SAVE_AFTER, SAVE_AFTER + 1))  # the resharded state trains on
    return loaded


def test_fsdp2_matches_ddp_and_resumes_at_other_world_sizes(tmp_path):
    results = run_ranks(_two_ranks, world_size=2, args=(str(tmp_path),))
    runs = results[0]["runs"]
    for name in ("z2", "z3"):
        for (ddp_loss, ddp_norm, ddp_lr), (loss, norm, lr) in zip(runs["ddp"], runs[name], strict=True):
            assert abs(loss - ddp_loss) < LOSS_TOLERANCE, (name, runs)
            assert abs(norm - ddp_norm) < LOSS_TOLERANCE * ddp_norm, (name, runs)
            assert lr == ddp_lr
        assert _max_diff(results[0]["finals"]["ddp"], results[0]["finals"][name]) < WEIGHT_TOLERANCE
    assert runs["ddp"][-1][0] < runs["ddp"][0][0] - 0.05  # it learns, so the comparison means something
    assert all(ddp_norm > 0.5 for _, ddp_norm, _ in runs["ddp"])  # clipped at 0.5 every step
    for (loss, _, _), (bf16_loss, _, _) in zip(runs["z3"], runs["bf16"], strict=True):
        assert abs(bf16_loss - loss) < 0.05  # 16-bit compute, fp32 masters and reduce: close, not equal
    # bf16 at rest: fp32 shards (masters) + fp32 gradient shards + two fp32 moments, half each per rank
    memory, half = results[0]["memory"], results[0]["num_params"] / 2
    assert memory["params"] == 0 and memory["comm_buffers"] == 0
    for category, bytes_per_param in (("master_params", 4), ("optimizer_states", 8)):
        assert abs(memory[category] - bytes_per_param * half) < 0.01 * bytes_per_param * half, memory

    saved = results[0]["saved"]
    for world_size in (1, 3):
        loaded = run_ranks(_resume, world_size=world_size, args=(str(tmp_path),))[0]
        assert _max_diff(saved["weights"], loaded["weights"]) == 0.0
        assert _max_diff(saved["optimizer"], loaded["optimizer"]) == 0.0
        assert (loaded["lr"], loaded["counters"], loaded["client_rank"]) == (
            saved["lr"],
            saved["counters"],
            0,
        )


SUMMARY = pathlib.Path(__file__).resolve().parents[2] / "docs" / "fsdp2" / "report" / "cells.json"


def _summary_cells() -> list[dict]:
    import json

    return json.loads(SUMMARY.read_text())["cells"]


@pytest.mark.tier("quick")
@pytest.mark.parametrize("cell", _summary_cells(), ids=lambda cell: cell["cell"])
def test_peak_model_within_10_percent_of_measured_fsdp2_and_deepspeed_runs(cell):
    """docs/fsdp2/report: gpt2-25m, 2 ranks, fp32 and bf16, FSDP2 stage 2/3 beside DeepSpeed ZeRO-2/3 (real runs)."""
    from zero_train.memory.model.peak import backend_for, engine_peak
    from zero_train.report.compare import baseline_other
    from zero_train.report.models import model_facts

    facts = model_facts(cell["model"], cell["num_params"]).facts
    model = engine_peak(cell["engine"], facts.shape, cell["world_size"], precision=cell["precision"],
                        micro_batch_size=cell["micro_batch_size"], block_size=cell["block_size"],
                        ds_config=cell["ds_config"], backend=backend_for(cell["device"]))  # fmt: skip
    measured = max(rank["peak_bytes"] - baseline_other(rank) for rank in cell["ranks"])
    assert model.peak_bytes == pytest.approx(measured, rel=0.10)
    if cell["engine"].startswith("fsdp2"):  # 8 bytes/param at rest: fp32 shard, its gradient, two moments
        states = sum(
            cell["categories"][name] for name in ("params", "grads", "master_params", "optimizer_states")
        )
        assert states / cell["num_params"] == pytest.approx(16 / cell["world_size"], rel=0.001)

"""LoRA (peft) on every engine, on 2 gloo ranks and the tiny GPT-2 with adapters on every linear layer.

- fp32: our ZeRO-1 and torch's ZeroRedundancyOptimizer give DDP's losses, gradient norms and adapters bit for
  bit; our ZeRO-2 and ZeRO-3 too without accumulation (with it, they average every micro-batch where DDP
  averages their sum: losses and gradient norms then agree within 1e-6 relative, as in full fine-tuning,
  tests/engines/test_engines.py, tests/sharding/test_zero3_parity.py); FSDP2 (both modes) and DeepSpeed ZeRO-1/2
  within 1e-5 relative; DeepSpeed ZeRO-3 (built under zero.Init, whose random init differs) within 1e-5 of DDP
  started from ZeRO-3's weights.
- only the adapters change: the frozen base, gathered before and after training, is equal bit for bit.
- a checkpoint holds the adapters and their optimizer state, never the base: model/ is a PEFT adapter folder
  and the whole checkpoint is smaller than the base alone; a fresh engine loads it and repeats the steps
  exactly.
- memory: gradients, fp32 masters and Adam moments exist for the adapters only (bf16: the base stays 16-bit;
  our ZeRO-3 and FSDP2 keep 1/N of it per rank).
"""

from __future__ import annotations

import copy
import pathlib

import pytest
import torch

from zero_train.sharding.zero3 import state as zero3_state
from zero_train.testing import run_ranks

pytestmark = pytest.mark.tier("multiproc")

VOCAB = 256
RANK = 4
STEPS_BEFORE_SAVE = 2
STEPS_AFTER_SAVE = 2
RELATIVE = 1e-5
CONFIG = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.3,  # below the adapters' gradient norm (~0.4): clipping is exercised
    "steps_per_print": 10**9,
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "torch_adam": True},
    },
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 3e-3, "warmup_num_steps": 2}},
    "zero_optimization": {"stage": 1, "reduce_bucket_size": 50_000, "allgather_bucket_size": 50_000},
}  # fmt: skip
_ADAPTER_COPIES = (
    5  # adapters in model/ and in DeepSpeed's module states, fp32 partitions, two moments (+ steps)
)
LOCAL = (
    ("ddp", 1),
    ("zero1", 1),
    ("zero2", 2),
    ("zero3", 3),
    ("torch-zero", 1),
    ("fsdp2-z2", 2),
    ("fsdp2-z3", 3),
)


def _model_fn(initial: dict | None = None):
    def build():
        from zero_train.hf.lora import LoraSpec, apply_lora
        from zero_train.hf.models import build_model, model_config

        torch.manual_seed(0)
        model = apply_lora(build_model(model_config("tiny", vocab_size=VOCAB)),
                           LoraSpec(r=RANK, alpha=16.0, target_modules=("all-linear",)))  # fmt: skip
        if initial is not None:
            missing = model.load_state_dict(initial, strict=False).missing_keys
            assert missing == ["base_model.model.lm_head.weight"], missing  # tied to wte
        return model

    return build


def _build(
    name: str, stage: int, rank: int, world_size: int, *, precision="fp32", initial=None, grad_accum=2
):
    from zero_train.ds_config import resolve_auto, train_settings
    from zero_train.engines import build_engine
    from zero_train.runtime.dist import DistInfo

    cfg = copy.deepcopy(CONFIG)
    cfg["zero_optimization"]["stage"] = stage
    cfg["gradient_accumulation_steps"] = grad_accum
    if stage == 3:
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # partition even tiny params
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    settings = train_settings(cfg, world_size=world_size)
    dist_info = DistInfo(rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"),
                         backend="gloo")  # fmt: skip
    return build_engine(name, model_fn=_model_fn(initial), settings=settings,
                        ds_config=resolve_auto(cfg, settings), dist_info=dist_info)  # fmt: skip


def _train(engine, rank: int, steps) -> list[tuple[float, float]]:
    """(mean micro-batch loss, grad norm) per step; batches fixed per (rank, step)."""
    history = []
    for step in steps:
        generator = torch.Generator().manual_seed(10_000 * step + rank)
        losses = [
            float(engine.forward_backward(torch.randint(0, VOCAB, (2, 16), generator=generator)))
            for _ in range(engine.settings.grad_accum)
        ]
        history.append((sum(losses) / len(losses), float(engine.step().grad_norm)))
    return history


def _full(param: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a parameter on every rank: an FSDP2 DTensor or a DeepSpeed ZeRO-3 partition."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        return param.full_tensor().detach().double().clone()
    if hasattr(param, "ds_id"):
        import deepspeed

        with deepspeed.zero.GatheredParameters([param]):
            return param.detach().double().clone()
    return param.detach().double().clone()


def _weights(engine, *, trainable: bool) -> dict[str, torch.Tensor]:
    named = [(n, p) for n, p in engine.model.named_parameters() if p.requires_grad == trainable]
    if engine.name == "zero3":  # our ZeRO-3: a parameter's bytes exist only while its unit is gathered
        return {n: _gathered_everywhere(engine, p) for n, p in named}
    return {n: _full(p) for n, p in named}


def _gathered_everywhere(engine, param: torch.Tensor) -> torch.Tensor:
    """Our ZeRO-3's whole parameter on every rank, from its pieces (Zero3Optimizer.gathered_param, collective)."""
    world_size, rank = engine.dist_info.world_size, engine.dist_info.rank
    whole = [zero3_state.gathered_param(engine.optimizer, param, to=to) for to in range(world_size)][rank]
    return whole.double()


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _stored_elements(path: pathlib.Path) -> int:
    """Tensor elements in every file of a checkpoint (safetensors, torch pickles, DCP shards): its contents
    without the per-file and per-tensor overhead, which on a model this small outweighs the adapters."""
    from safetensors import safe_open
    from torch.distributed.checkpoint import FileSystemReader

    def elements(value) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel()
        if isinstance(value, dict):
            return sum(elements(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return sum(elements(v) for v in value)
        return 0

    total = 0
    for file in path.rglob("*"):
        if file.suffix == ".safetensors":
            with safe_open(str(file), "pt") as opened:
                total += sum(torch.Size(opened.get_slice(key).get_shape()).numel() for key in opened.keys())
        elif file.suffix == ".pt":
            total += elements(torch.load(file, map_location="cpu", weights_only=False))
        elif file.name == ".metadata":
            metadata = FileSystemReader(str(file.parent)).read_metadata().state_dict_metadata
            total += sum(entry.size.numel() for entry in metadata.values() if hasattr(entry, "size"))
    return total


def _run_engine(name: str, stage: int, rank: int, world_size: int, tmp: str, initial=None) -> dict:
    """Train, save, train on; a fresh engine loads the checkpoint and trains the same steps."""
    import torch.distributed as dist

    engine = _build(name, stage, rank, world_size, initial=initial)
    base_before, adapters_before = _weights(engine, trainable=False), _weights(engine, trainable=True)
    history = _train(engine, rank, range(STEPS_BEFORE_SAVE))
    path = pathlib.Path(tmp) / f"{name}-{stage}"
    if rank == 0:
        path.mkdir()
    dist.barrier()
    engine.save_checkpoint(path, client_state={"rank": rank})
    dist.barrier()
    later = range(STEPS_BEFORE_SAVE, STEPS_BEFORE_SAVE + STEPS_AFTER_SAVE)
    history += _train(engine, rank, later)
    adapters_after = _weights(engine, trainable=True)
    result = dict(
        history=history,
        base_changed=_max_diff(base_before, _weights(engine, trainable=False)),
        adapters_changed=_max_diff(adapters_before, adapters_after),
        memory=engine.memory_categories(),
        final=engine.full_state_dict(),
    )
    resumed = _build(name, stage, rank, world_size, initial=initial)
    resumed.load_checkpoint(path)
    result["resumed_history"] = _train(resumed, rank, later)
    result["resumed_diff"] = _max_diff(adapters_after, _weights(resumed, trainable=True))
    for closing in (engine, resumed):
        getattr(closing, "close", lambda: None)()
    if rank == 0:
        result["stored_elements"] = _stored_elements(path)
        result["model_files"] = sorted(f.name for f in (path / "model").iterdir())
    return result


def _sizes(engine) -> dict:
    params = {id(p): p for p in engine.model.parameters()}.values()
    adapters = [p for p in params if p.requires_grad]
    return dict(
        adapter_params=sum(p.numel() for p in adapters),
        adapter_tensors=len(adapters),
        base_params=sum(int(getattr(p, "ds_numel", p.numel())) for p in params if not p.requires_grad),
    )


def _local_ranks(rank: int, world_size: int, tmp: str) -> dict:
    runs = {name: _run_engine(name, stage, rank, world_size, tmp) for name, stage in LOCAL}
    bf16 = {}
    for name, stage in (("ddp", 1), ("zero1", 1), ("zero3", 3), ("fsdp2-z3", 3)):
        engine = _build(name, stage, rank, world_size, precision="bf16")
        _train(engine, rank, range(2))
        bf16[name] = engine.memory_categories()
        bf16["sizes"] = _sizes(engine)
    runs["bf16"] = bf16
    runs["sizes"] = _sizes(_build("ddp", 1, rank, world_size))
    runs["no_accumulation"] = {
        name: _train(_build(name, stage, rank, world_size, grad_accum=1), rank, range(4))
        for name, stage in (("ddp", 1), ("zero2", 2), ("zero3", 3))
    }
    return runs


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory, rank_pool):
    return rank_pool(2).run(_local_ranks, (str(tmp_path_factory.mktemp("lora-local")),))


@pytest.mark.parametrize("name", ["zero1", "torch-zero"])
def test_sharders_match_ddp_bit_for_bit_in_fp32(local_runs, name):
    for rank_runs in local_runs:
        assert rank_runs[name]["history"] == rank_runs["ddp"]["history"]  # losses and grad norms
    final, reference = local_runs[0][name]["final"], local_runs[0]["ddp"]["final"]
    assert final.keys() == reference.keys() and all(torch.equal(final[k], reference[k]) for k in final)


@pytest.mark.parametrize("name", ["zero2", "zero3"])
def test_our_zero2_zero3_match_ddp_bit_for_bit_without_accumulation_and_within_rounding_with_it(
    local_runs, name
):
    for rank_runs in local_runs:
        assert rank_runs["no_accumulation"][name] == rank_runs["no_accumulation"]["ddp"]
        for (loss, norm), (ddp_loss, ddp_norm) in zip(
            rank_runs[name]["history"], rank_runs["ddp"]["history"], strict=True
        ):
            assert loss == pytest.approx(ddp_loss, rel=1e-6) and norm == pytest.approx(ddp_norm, rel=1e-6)


@pytest.mark.parametrize("name", ["fsdp2-z2", "fsdp2-z3"])
def test_fsdp2_matches_ddp_within_1e_5(local_runs, name):
    for rank_runs in local_runs:
        for (loss, norm), (ddp_loss, ddp_norm) in zip(
            rank_runs[name]["history"], rank_runs["ddp"]["history"], strict=True
        ):
            assert loss == pytest.approx(ddp_loss, rel=RELATIVE) and norm == pytest.approx(
                ddp_norm, rel=RELATIVE
            )


@pytest.mark.parametrize("name", [name for name, _ in LOCAL])
def test_only_the_adapters_change_and_a_checkpoint_resumes_exactly(local_runs, name):
    history = local_runs[0]["ddp"]["history"]
    assert all(norm > CONFIG["gradient_clipping"] for _, norm in history)  # clipping is exercised
    for rank_runs in local_runs:
        run = rank_runs[name]
        assert run["base_changed"] == 0.0
        assert run["adapters_changed"] > 1e-3
        assert run["resumed_history"] == run["history"][STEPS_BEFORE_SAVE:]
        assert run["resumed_diff"] == 0.0
    run, sizes = local_runs[0][name], local_runs[0]["sizes"]
    assert run["model_files"] == ["adapter_config.json", "adapter_model.safetensors", "config.json"]
    assert (
        run["stored_elements"] <= _ADAPTER_COPIES * sizes["adapter_params"] + 100 < sizes["base_params"] / 2
    )
    assert set(run["final"]) == set(_adapter_names(local_runs))


def _adapter_names(local_runs) -> list[str]:
    return list(local_runs[0]["ddp"]["final"])


def test_gradients_masters_and_moments_exist_for_the_adapters_only(local_runs):
    sizes = local_runs[0]["sizes"]
    adam = 8 * sizes["adapter_params"] + 4 * sizes["adapter_tensors"]  # two fp32 moments, one fp32 step each
    ddp = local_runs[0]["ddp"]["memory"]
    assert ddp["optimizer_states"] == adam and ddp["master_params"] == 0
    assert ddp["params"] == 4 * (sizes["base_params"] + sizes["adapter_params"])
    for name in ("zero1", "torch-zero"):
        assert sum(rank_runs[name]["memory"]["optimizer_states"] for rank_runs in local_runs) == adam
    bf16 = local_runs[0]["bf16"]
    assert bf16["ddp"]["master_params"] == 4 * sizes["adapter_params"]  # fp32 masters of the adapters alone
    assert bf16["ddp"]["params"] == 2 * (sizes["base_params"] + sizes["adapter_params"])  # all 16-bit
    assert (
        sum(rank_runs["bf16"]["zero1"]["master_params"] for rank_runs in local_runs)
        == 4 * sizes["adapter_params"]
    )
    # FSDP2: the frozen base sharded in bf16 (2 bytes), the adapters' fp32 shards are the masters
    fsdp2 = [rank_runs["bf16"]["fsdp2-z3"] for rank_runs in local_runs]
    assert sum(m["master_params"] for m in fsdp2) == pytest.approx(4 * sizes["adapter_params"], rel=0.01)
    assert sum(m["params"] for m in fsdp2) == pytest.approx(2 * sizes["base_params"], rel=0.01)
    # our ZeRO-3: base and adapters as bf16 slices (1/N each, a unit's padding aside), fp32 masters and moments
    # of the adapters' slices only; no gradient outlives the step
    zero3 = [rank_runs["bf16"]["zero3"] for rank_runs in local_runs]
    assert sum(m["params"] for m in zero3) == pytest.approx(
        2 * (sizes["base_params"] + sizes["adapter_params"]), rel=0.01
    )
    assert sum(m["master_params"] for m in zero3) == pytest.approx(4 * sizes["adapter_params"], rel=0.01)
    assert sum(m["optimizer_states"] for m in zero3) == pytest.approx(adam, rel=0.01)
    assert all(m["grads"] == 0 for m in zero3)


def _deepspeed_ranks(rank: int, world_size: int, tmp: str) -> dict:
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    ddp = _build("ddp", 1, rank, world_size)
    runs = {"ddp": dict(history=_train(ddp, rank, range(STEPS_BEFORE_SAVE + STEPS_AFTER_SAVE)))}
    runs["ds2"] = _run_engine("ds2", 2, rank, world_size, tmp)
    zero3 = _build("ds3", 3, rank, world_size)
    initial = {n: w.float() for n, w in _weights(zero3, trainable=False).items()}
    initial.update({n: w.float() for n, w in _weights(zero3, trainable=True).items()})
    zero3.close()
    runs["ds3"] = _run_engine("ds3", 3, rank, world_size, tmp)
    unset_hf_deepspeed_config()  # the ddp model must not be built under zero.Init
    ddp_from_zero3 = _build("ddp", 1, rank, world_size, initial=initial)
    runs["ds3"]["ddp_history"] = _train(ddp_from_zero3, rank, range(STEPS_BEFORE_SAVE + STEPS_AFTER_SAVE))
    ds1 = _build("ds1", 1, rank, world_size)
    runs["ds1"] = dict(history=_train(ds1, rank, range(STEPS_BEFORE_SAVE + STEPS_AFTER_SAVE)))
    ds1.close()
    bf16 = _build("ds2", 2, rank, world_size, precision="bf16")
    _train(bf16, rank, range(2))
    runs["bf16"] = dict(memory=bf16.memory_categories(), sizes=_sizes(bf16))
    bf16.close()
    return {name: {k: v for k, v in run.items() if k != "final"} for name, run in runs.items()}


@pytest.fixture(scope="module")
def deepspeed_runs(tmp_path_factory):
    return run_ranks(_deepspeed_ranks, 2, (str(tmp_path_factory.mktemp("lora-ds")),), timeout_s=300)


def test_deepspeed_zero_1_2_3_match_ddp_within_1e_5_and_train_the_adapters_only(deepspeed_runs):
    for rank_runs in deepspeed_runs:
        pairs = [(rank_runs[name]["history"], rank_runs["ddp"]["history"]) for name in ("ds1", "ds2")]
        pairs.append((rank_runs["ds3"]["history"], rank_runs["ds3"]["ddp_history"]))
        for history, reference in pairs:
            for (loss, norm), (ddp_loss, ddp_norm) in zip(history, reference, strict=True):
                assert loss == pytest.approx(ddp_loss, rel=RELATIVE) and norm == pytest.approx(
                    ddp_norm, rel=RELATIVE
                )
        for name in ("ds2", "ds3"):
            run = rank_runs[name]
            assert run["base_changed"] == 0.0 and run["adapters_changed"] > 1e-3
            assert run["resumed_history"] == run["history"][STEPS_BEFORE_SAVE:]
            assert run["resumed_diff"] == 0.0


def test_deepspeed_checkpoints_leave_the_base_out_and_bf16_keeps_it_16_bit(deepspeed_runs):
    run = deepspeed_runs[0]
    sizes = run["bf16"]["sizes"]
    for name in ("ds2", "ds3"):
        assert run[name]["model_files"] == ["adapter_config.json", "adapter_model.safetensors", "config.json"]
        assert run[name]["stored_elements"] <= _ADAPTER_COPIES * sizes["adapter_params"] + 100, name
    memory = run["bf16"]["memory"]
    assert memory["params"] == 2 * (
        sizes["base_params"] + sizes["adapter_params"]
    )  # the whole module in bf16
    total_masters = sum(rank_runs["bf16"]["memory"]["master_params"] for rank_runs in deepspeed_runs)
    assert total_masters == 4 * sizes["adapter_params"]

"""Our ZeRO engines' gradient settings (engines/zero1.py, zero2.py, zero3.py): bucket sizes and gradient dtypes.

- buckets: without zero_optimization.reduce_bucket_size every model is cut into at least 4 buckets (the shipped
  configs' 5e8 used to put any model under 500M parameters in one, so nothing overlapped backward); a user's
  explicit size wins;
- gradient dtypes: zero1 refuses to sum in another dtype than it accumulates in (its buffer is reduced in
  place); a bf16 run accumulates its 8 micro-batches and sums the ranks in fp32 by default, and in
  bf16 when data_types.grad_accum_dtype / communication_data_type ask for it. Against the exact average of the
  very gradients backward produced (summed in float64), fp32 accumulation must be strictly closer than bf16's,
  for zero1, zero2 and zero3 (the numbers: docs/zero2.md#gradient-dtypes). The averaged gradient is read
  through the public step: SGD with lr 2**20 moves each fp32 master by exactly -2**20 x its gradient.
"""

from __future__ import annotations

import pytest
import torch

from zero_train.testing import run_ranks

pytestmark = pytest.mark.tier("multiproc")

ACCUM, LR = 8, 2.0**20
SHAPE = dict(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=128,
             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)  # fmt: skip
BF16_GRADIENTS = {"data_types": {"grad_accum_dtype": "bf16"}, "communication_data_type": "bf16"}


def _model_fn():
    import transformers

    from zero_train.hf.models import build_model

    torch.manual_seed(0)
    return build_model(transformers.GPT2Config(**SHAPE))


def _config(stage: int, extra: dict | None = None) -> dict:
    return {
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": ACCUM,
        "gradient_clipping": 0.0, "steps_per_print": 10**9, "bf16": {"enabled": True},
        "optimizer": {"type": "SGD", "params": {"lr": LR, "momentum": 0.0, "weight_decay": 0.0}},
        "zero_optimization": {"stage": stage}, **(extra or {}),
    }  # fmt: skip


def _batch(rank: int, micro: int) -> torch.Tensor:
    return torch.randint(
        0, SHAPE["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(100 * rank + micro)
    )


def _build(name: str, config: dict, world_size: int):
    from zero_train.ds_config import resolve_auto, train_settings
    from zero_train.engines import build_engine
    from zero_train.runtime.dist import init_distributed

    settings = train_settings(config, world_size=world_size)
    return build_engine(name, model_fn=_model_fn, settings=settings, ds_config=resolve_auto(config, settings),
                        dist_info=init_distributed())  # fmt: skip


def _reference(world_size: int) -> dict[str, torch.Tensor]:
    """The exact average over ranks and micro-batches of the bf16 model's own gradients (float64 sums)."""
    model = _model_fn().to(torch.bfloat16)
    total = {name: torch.zeros(p.shape, dtype=torch.float64) for name, p in model.named_parameters()}
    for rank in range(world_size):
        for micro in range(ACCUM):
            model.zero_grad(set_to_none=True)
            tokens = _batch(rank, micro)
            (model(input_ids=tokens, labels=tokens).loss / ACCUM).backward()
            for name, param in model.named_parameters():
                total[name] += param.grad.double()
    return {name: (value / world_size).float() for name, value in total.items()}


def _averaged_gradients(rank: int, world_size: int, name: str, extra: dict | None) -> dict | None:
    """One step of `name` in bf16 over ACCUM micro-batches; the averaged gradient it applied, on rank 0."""
    engine = _build(name, _config({"zero1": 1, "zero2": 2, "zero3": 3}[name], extra), world_size)
    before = engine.full_state_dict()
    for micro in range(ACCUM):
        engine.forward_backward(_batch(rank, micro))
    engine.step()
    after = engine.full_state_dict()
    if before is None:
        return None
    return {key: ((before[key].double() - after[key].double()) / LR).float() for key in after}


def _errors(rank: int, world_size: int) -> dict | None:
    reference = _reference(world_size)
    errors = {}
    for name in ("zero1", "zero2", "zero3"):
        for label, extra in (("fp32", None), ("bf16", BF16_GRADIENTS)):
            applied = _averaged_gradients(rank, world_size, name, extra)
            if applied is not None:
                num = sum(float((applied[k] - reference[k]).double().norm() ** 2) for k in applied)
                den = sum(float(reference[k].double().norm() ** 2) for k in applied)
                errors[name, label] = (num / den) ** 0.5
    return errors if rank == 0 else None


@pytest.fixture(scope="module")
def errors() -> dict:
    return run_ranks(_errors, 2, timeout_s=300)[0]


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3"])
def test_fp32_accumulation_is_strictly_closer_to_the_exact_average_than_bf16(errors, name):
    fp32, bf16 = errors[name, "fp32"], errors[name, "bf16"]
    print(f"{name}: relative error of the averaged gradient, fp32 accumulation {fp32:.2e}, bf16 {bf16:.2e}")
    assert fp32 < 1e-5  # fp32 sums of 16 bf16 gradients: the master's rounding alone
    assert bf16 > 1e-4  # bf16 rounds every add (8 bits of mantissa)
    assert fp32 < bf16 / 10


def _bucket_sizes(rank: int, world_size: int) -> dict:
    sizes = {}
    for name, stage in (("zero1", 1), ("zero2", 2)):
        for label, zero in (("default", {}), ("given", {"reduce_bucket_size": 5_000})):
            config = _config(stage)
            config["zero_optimization"].update(zero)
            optimizer = _build(name, config, world_size).optimizer
            sizes[name, label] = (optimizer.bucket_elements, len(optimizer._schedule.order))
    return sizes


def test_buckets_default_to_at_least_four_and_a_given_size_wins():
    from zero_train.sharding.accounting import MIN_BUCKETS, default_bucket_elements

    sizes = run_ranks(_bucket_sizes, 1, timeout_s=120)[0]
    numels = [p.numel() for p in _model_fn().parameters()]
    for name in ("zero1", "zero2"):
        elements, buckets = sizes[name, "default"]
        assert elements == default_bucket_elements(numels, 500_000_000) and buckets >= MIN_BUCKETS
        assert sizes[name, "given"][0] == 5_000  # the config's reduce_bucket_size wins


@pytest.mark.tier("quick")
def test_zero1_refuses_a_communication_dtype_other_than_its_accumulation_dtype():
    from zero_train.engines.zero1 import Zero1Engine
    from zero_train.engines.zero2 import Zero2Engine
    from zero_train.runtime.errors import UsageError

    mixed = _config(1, {"communication_data_type": "bf16"})  # accumulates in fp32, sums in bf16
    with pytest.raises(UsageError, match="communication_data_type .* or use --engine zero2"):
        Zero1Engine._gradient_dtypes(mixed)  # ZeRO-1 sums its accumulation buffer in place
    assert Zero2Engine._gradient_dtypes(mixed) == dict(grad_dtype=torch.float32, reduce_dtype=torch.bfloat16)
    assert Zero1Engine._gradient_dtypes(_config(1, BF16_GRADIENTS)) == dict(grad_dtype=torch.bfloat16)

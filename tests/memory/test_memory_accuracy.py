"""The memory accuracy targets, measured through MemoryProbe on real engines (DDP, our ZeRO-1).

- model-state bytes (params + grads + fp32 masters + Adam moments) per rank within 2% of the ZeRO
  paper's formula, fp32 (4 + 4 + 8/N... for ZeRO-1) and bf16 (K = 12; our ZeRO-1 keeps its gradients in fp32 by
  default, 2 Psi above the paper's 16-bit ones), at world sizes 1 and 3;
- the attribution agrees with the allocator: the allocator growth from before the model to the last
  optimizer step is the attributed categories within 5% (so "other" holds no hidden model state);
- the run record follows the schema and categories + other sum to allocator_bytes;
- our per-phase peak model (zero_train.memory.model.peak) within 10% of the measured peak minus the measured
  "other", for ddp, our ZeRO-1 and torch's ZeroRedundancyOptimizer.

One spawned job per world size; each rank trains every (engine, precision) for 3 steps on a ~0.9M
parameter GPT-2 (balanced; see SHAPE) after a warm-up run per precision (the first engine of a process pays
one-time allocations: gloo, lazy library state, which would otherwise land in "other").
"""

from __future__ import annotations

import gc

import pytest
import torch

from zero_train.testing import run_ranks

pytestmark = pytest.mark.tier("multiproc")

STEPS = 3
# Four layers and a 1024-token vocabulary: no tensor above 15% of the model, so our whole-tensor greedy
# partition is balanced within 0.1% at N = 2, 3 (1.9% at N = 4) and the paper's even split applies.
# (With a 4096 vocabulary the embedding is 56% of the model and one rank owns far more than 1/N.)
SHAPE = dict(n_layer=4, n_embd=128, n_head=4, n_positions=64, vocab_size=1024,
             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)  # fmt: skip
CONFIG = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "steps_per_print": 10**9,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": 0},
}
ENGINES = ("ddp", "zero1")
PEAK_ENGINES = (*ENGINES, "torch-zero")  # torch-zero's model states depart from the paper: peak test only
PRECISIONS = ("fp32", "bf16")
STAGE_OF = {"ddp": 0, "zero1": 1, "torch-zero": 1}


def _model_fn():
    import transformers

    from zero_train.hf.models import build_model

    torch.manual_seed(0)
    return build_model(transformers.GPT2Config(**SHAPE))


def _profile(name: str, precision: str, rank: int, world_size: int) -> dict | None:
    """Train `name` for STEPS steps under a MemoryProbe; the run record on rank 0."""
    from zero_train.ds_config import resolve_auto, train_settings
    from zero_train.engines import build_engine
    from zero_train.memory.probe import MemoryProbe
    from zero_train.runtime.dist import init_distributed

    config = dict(CONFIG, **({"bf16": {"enabled": True}} if precision == "bf16" else {}))
    dist_info = init_distributed()
    settings = train_settings(config, world_size=world_size)
    gc.collect()
    probe = MemoryProbe(dist_info)
    with probe.phase("engine_initialized"):
        engine = build_engine(
            name,
            model_fn=_model_fn,
            settings=settings,
            ds_config=resolve_auto(config, settings),
            dist_info=dist_info,
        )
    probe.attach(engine)
    generator = torch.Generator().manual_seed(rank)
    for step in range(STEPS):
        with probe.phase("forward"):
            engine.forward_backward(torch.randint(0, SHAPE["vocab_size"], (2, 32), generator=generator))
        with probe.phase("step"):
            engine.step()
        probe.on_step_end(engine, step)
    num_params = sum(p.numel() for p in engine.model.parameters())
    meta = dict(engine=name, zero_stage=STAGE_OF[name], num_params=num_params, precision=precision,
                world_size=world_size, micro_batch_size=2, grad_accum=1, block_size=32, device="cpu")  # fmt: skip
    record = probe.finish(engine, meta=meta, step_times_s=[1.0] * STEPS, tokens_per_step=64 * world_size)
    del engine, probe
    gc.collect()
    return record


def _all_cells(rank: int, world_size: int) -> dict:
    # warm-up: the first engine of a process pays one-time allocations (gloo, lazy library state), and the
    # first bf16 one another ~11 bytes/param of library caches (measured: a second bf16 DDP engine in the
    # same process holds 16.3 bytes/param after its step, the first 27.4); those belong in "other"
    for precision in PRECISIONS:
        _profile("ddp", precision, rank, world_size)
    return {
        (name, precision): _profile(name, precision, rank, world_size)
        for name in PEAK_ENGINES
        for precision in PRECISIONS
    }


@pytest.fixture(scope="module", params=[1, 3], ids=lambda n: f"world{n}")
def records(request) -> tuple[int, dict]:
    return request.param, run_ranks(_all_cells, request.param, timeout_s=240)[0]


def _model_states(categories: dict) -> int:
    return sum(categories[name] for name in ("params", "grads", "master_params", "optimizer_states"))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", ENGINES)
def test_model_states_within_2_percent_of_the_paper(records, name, precision):
    from zero_train.memory.model.theory import paper_bytes

    world_size, by_cell = records
    record = by_cell[(name, precision)]
    expected = paper_bytes(record["num_params"], world_size, STAGE_OF[name], precision=precision)
    if name == "zero1" and precision != "fp32":
        expected += 2 * record["num_params"]  # the paper's gradients are 16-bit (2 Psi), ours fp32 (4 Psi)
    for rank in record["ranks"]:
        measured = _model_states(rank["categories"])
        assert measured == pytest.approx(expected, rel=0.02), (rank["rank"], measured / record["num_params"])


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", ENGINES)
def test_attribution_matches_the_allocator_growth(records, name, precision):
    from zero_train.memory.record import CATEGORIES, validate_record

    _, by_cell = records
    record = validate_record(by_cell[(name, precision)])
    for rank in record["ranks"]:
        categories = rank["categories"]
        assert sum(categories[c] for c in CATEGORIES) == rank["allocator_bytes"]
        grown = rank["allocator_bytes"] - categories["activations"] - rank["baseline_bytes"]
        attributed = _model_states(categories) + categories["comm_buffers"]
        assert grown == pytest.approx(attributed, rel=0.05)
        assert categories["activations"] > 0
        phases = {phase["name"]: phase for phase in rank["phases"]}
        assert phases["forward"]["peak_bytes"] - rank["baseline_bytes"] >= attributed - categories["grads"]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", ENGINES)
def test_our_model_within_10_percent_of_the_attributed_bytes(records, name, precision):
    import transformers

    from zero_train.memory.model.peak import engine_categories
    from zero_train.memory.model.theory import model_shape

    world_size, by_cell = records
    record = by_cell[(name, precision)]
    shape = model_shape(transformers.GPT2Config(**SHAPE))
    assert shape.num_params == record["num_params"]
    for rank in record["ranks"]:
        ours = engine_categories(name, shape, world_size, precision=precision, micro_batch_size=2, block_size=32,
                                 backend="gloo", rank=rank["rank"])  # fmt: skip
        attributed = {k: v for k, v in rank["categories"].items() if k != "other"}
        assert sum(ours.values()) == pytest.approx(sum(attributed.values()), rel=0.10), (ours, attributed)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", PEAK_ENGINES)
def test_our_peak_within_10_percent_of_the_measured_peak_minus_other(records, name, precision):
    """The peak model, nothing hidden: ours alone against the measured peak minus the measured "other"."""
    import transformers

    from zero_train.memory.model.peak import engine_peak
    from zero_train.memory.model.theory import model_shape

    world_size, by_cell = records
    record = by_cell[(name, precision)]
    shape = model_shape(transformers.GPT2Config(**SHAPE))
    for rank in record["ranks"]:
        model = engine_peak(name, shape, world_size, precision=precision, micro_batch_size=2, block_size=32,
                            backend="gloo", rank=rank["rank"])  # fmt: skip
        measured = rank["peak_bytes"] - rank["categories"]["other"]
        assert model.peak_bytes == pytest.approx(measured, rel=0.10), (
            rank["rank"],
            model.phase_bytes,
            measured,
        )

"""The peak model at any world size: the distinct-rank answer equals the every-rank loop, and costs the same.

The oracle is the loop the model ran before it scaled (every rank's slice of DeepSpeed's flat buffer, cut tensor
by tensor; every rank's slice of our sharders' flat buffer from their own partition, buckets and accounting;
torch-zero's greedy scanning every rank; every rank's phases, then the highest): at small N the answer must be
the same to the byte, rank included. Then the cost: estimate at 10^6 ranks and plan at 2048 do about the work of 10^3 ranks and 512.
"""

from __future__ import annotations

import itertools
import random
import sys

import pytest

from zero_train.memory.model import offload
from zero_train.memory.model.flat_partition import Partition, distinct_partitions, partition_of
from zero_train.memory.model.peak import PeakModel, _state, engine_peak
from zero_train.memory.model.peak_engines import (
    ddp_phases,
    deepspeed_boundary,
    deepspeed_phases,
    zero1_phases,
    zero2_phases,
)
from zero_train.memory.model.peak_fsdp2 import fsdp2_boundary, fsdp2_phases
from zero_train.memory.model.peak_terms import DeepSpeedSettings, Run, activations
from zero_train.memory.model.peak_zero3 import zero3_phases
from zero_train.memory.model.sharder_layout import (
    Share,
    sharder_layout,
    whole_tensor_layout,
    zero1_comm_buffers,
    zero2_buffers,
)
from zero_train.memory.model.theory import ModelShape
from zero_train.registry import ENGINES
from zero_train.sharding import accounting
from zero_train.sharding.comm.buckets import gradient_buckets

pytestmark = pytest.mark.tier("quick")

ENGINE_STAGES = {spec.name: spec.stage for spec in ENGINES if spec.peak_model}
"""The engines the peak model describes, with their ZeRO stage."""


def every_slice(run: Run) -> list[Partition]:
    """Every rank's slice of the flat buffer, each tensor's piece computed (the loop before it scaled)."""
    psi, world_size, numels = run.shape.num_params, run.world_size, run.shape.param_numels
    size = -(-psi // world_size)
    if not numels:
        return [Partition(rank=0, elements=size, touched=size, largest_piece=min(run.largest_tensor, size))]
    starts = [0, *itertools.accumulate(numels)][:-1]
    partitions = []
    for rank in range(world_size):
        low, high = rank * size, min((rank + 1) * size, psi)
        pieces = [min(start + n, high) - max(start, low) for start, n in zip(starts, numels, strict=True)]
        touched = sum(n for n, piece in zip(numels, pieces, strict=True) if piece > 0)
        partitions.append(
            Partition(rank=rank, elements=size, touched=touched, largest_piece=max(max(pieces), 0))
        )
    return partitions


def flat_shares(run: Run) -> list[Share]:
    """Every rank's slice of our ZeRO-1/2's flat buffer, from the sharders' own partition (small N only)."""
    numels, world_size = run.shape.param_numels, run.world_size
    if not numels:
        even = -(-run.shape.num_params // world_size)
        return [Share(rank=0, owned=even, largest=min(run.largest_tensor, even))]
    partition = accounting.partition_of(numels, world_size)
    loads = partition.loads()
    return [
        Share(rank=rank, owned=loads[rank], largest=max((piece.length for piece in partition.pieces(rank)), default=0))
        for rank in range(world_size)
    ]  # fmt: skip


def whole_tensor_shares(run: Run) -> list[Share]:
    """Every rank's tensors under torch's ZeroRedundancyOptimizer, the plain way: sorted-greedy, largest first,
    to the least loaded rank (lowest on ties), scanning every rank for every tensor."""
    world_size, numels = run.world_size, run.shape.param_numels
    if not numels:
        return [Share(rank=0, owned=-(-run.shape.num_params // world_size), largest=run.largest_tensor)]
    loads, largest = [0] * world_size, [0] * world_size
    for numel in sorted(numels, reverse=True):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        loads[rank] += numel
        largest[rank] = max(largest[rank], numel)
    return [Share(rank=r, owned=loads[r], largest=largest[r]) for r in range(world_size)]


def our_buffers(run: Run) -> tuple[int, int, int]:
    """(ZeRO-1's comm_buffers, ZeRO-2's comm_buffers, ZeRO-2's largest bucket) from the sharders' accounting."""
    numels, bucket = run.shape.param_numels, run.deepspeed.reduce_bucket_size
    partition = (accounting.partition_of(numels, run.world_size) if numels
                 else accounting.even_partition(run.shape.num_params, run.world_size))  # fmt: skip
    zero1 = accounting.zero1_buffers(partition, run.element_bytes, run.backend, bucket).comm_buffers
    zero2 = accounting.zero2_buffers(partition, run.element_bytes, run.backend, bucket).comm_buffers
    return zero1, zero2, max((b.size for b in gradient_buckets(partition, bucket)), default=0)


def every_rank_peak(
    engine: str, shape: ModelShape, world_size: int, *, ds_config=None, ranks=(None,), **settings
) -> list[PeakModel]:
    """engine_peak as every rank's model, then the highest or the one asked for (the oracle), per `ranks`."""
    run = Run(shape=shape, world_size=world_size, deepspeed=DeepSpeedSettings.from_config(ds_config, ENGINE_STAGES[engine]),
              **settings)  # fmt: skip
    stage, models = ENGINE_STAGES[engine], []
    if engine.startswith("fsdp2"):
        models = [(PeakModel(engine=engine, rank=0, phases=fsdp2_phases(run, stage), boundary=_state(fsdp2_boundary(run))), None)]  # fmt: skip
    elif engine.startswith("ds"):
        for part in every_slice(run):
            model = PeakModel(engine=engine, rank=part.rank, phases=deepspeed_phases(run, stage, part),
                              boundary=_state(deepspeed_boundary(run, stage, part)))  # fmt: skip
            models.append((model, part))
    else:
        shares = {"ddp": [Share(rank=0, owned=shape.num_params, largest=run.largest_tensor)],
                  "torch-zero": whole_tensor_shares(run)}.get(engine) or flat_shares(run)  # fmt: skip
        layout = sharder_layout(
            run
        )  # its buffers are checked against the accounting's (test_sharder_layout_...)
        for share in shares:
            phases = {"zero1": zero1_phases, "zero2": zero2_phases, "zero3": zero3_phases}.get(engine)
            phases = phases(run, share, layout) if phases else ddp_phases(run, share)
            models.append((PeakModel(engine=engine, rank=share.rank, phases=phases, boundary=_state(phases["step"])), None))  # fmt: skip
    settings_offload = offload.OffloadSettings.from_config(ds_config)
    if engine.startswith("ds") and settings_offload.active:
        offloaded = []
        for model, part in models:
            inputs = offload.rank_inputs(stage, run, part)
            phases = offload.device_phases(model.phases, inputs, settings_offload)
            if run.backend == "gloo":
                phases = offload.one_memory(phases, offload.host_terms(inputs, settings_offload))
            boundary = offload.host_boundary(
                model.boundary, inputs, settings_offload, one=run.backend == "gloo"
            )
            offloaded.append(
                (PeakModel(engine=engine, rank=model.rank, phases=phases, boundary=boundary), part)
            )
        models = offloaded
    highest = max((m for m, _ in models), key=lambda m: (m.peak_bytes, -m.rank))
    answers, alike = [], len(models) == 1
    for rank in ranks:
        model = next((model for model, _ in models if model.rank == rank), highest)
        answers.append(PeakModel(engine=engine, rank=(rank or 0) if alike else model.rank, phases=model.phases,
                                 boundary=dict(model.boundary, activations=activations(run))))  # fmt: skip
    return answers


def random_shapes(count: int, seed: int) -> list[ModelShape]:
    """Tensor lists with ties, tiny and huge tensors, zero-sized ones, a tied first tensor on every other."""
    rng = random.Random(seed)
    shapes = [ModelShape(num_params=1_000_000, param_numels=(100_000, 400_000, 300_000, 200_000),
                         tied_embedding_params=100_000, vocab_size=1000, hidden_size=100, num_layers=2),
              ModelShape(num_params=7_654_321)]  # fmt: skip
    for index in range(count):
        numels = tuple(
            rng.choice([0, 1, 7, 64, 1000, 4096, 4096, 65_536, 300_000]) for _ in range(rng.randint(1, 30))
        )
        shapes.append(ModelShape(num_params=max(sum(numels), 1), param_numels=numels, hidden_size=64, vocab_size=128,
                                 num_layers=2, tied_embedding_params=numels[0] if index % 2 else 0))  # fmt: skip
    return shapes


SHAPES = random_shapes(5, seed=0)
WORLD_SIZES = (1, 2, 3, 8, 13, 40)


def test_one_ranks_slice_and_the_distinct_slices_equal_every_slice_cut_tensor_by_tensor():
    for shape, world_size in itertools.product(random_shapes(30, seed=1), (*WORLD_SIZES, 97, 1000)):
        run = Run(shape=shape, world_size=world_size, precision="bf16", micro_batch_size=1, block_size=1,
                  deepspeed=DeepSpeedSettings())  # fmt: skip
        every = every_slice(run)
        if not shape.param_numels:
            assert (
                list(distinct_partitions(shape, world_size)) == every == [partition_of(shape, world_size, 0)]
            )
            continue
        assert [partition_of(shape, world_size, rank) for rank in range(world_size)] == every
        lowest = {}
        for part in every:
            lowest.setdefault(part.key, part)
        assert list(distinct_partitions(shape, world_size)) == list(lowest.values())
        assert len(distinct_partitions(shape, world_size)) <= 2 * len(shape.param_numels) + 6


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_sharder_layout_is_the_sharders_own_layout_buffers_included(backend):
    for shape, world_size, bucket in itertools.product(
        random_shapes(30, seed=2), (*WORLD_SIZES, 97), (1, 5000, 10**6)
    ):
        run = Run(shape=shape, world_size=world_size, precision="fp32", micro_batch_size=1, block_size=1,
                  deepspeed=DeepSpeedSettings(reduce_bucket_size=bucket, reduce_bucket_given=bucket),
                  backend=backend)  # fmt: skip
        ranks = range(world_size if shape.param_numels else 1)
        # our equal slices' phases read `owned` only (foreach / fused optimizers); torch-zero's whole tensors
        # also size AdamW's single-tensor temporaries by the largest tensor a rank updates
        for layout, every, key in (
            (sharder_layout(run), flat_shares(run), lambda share: share.owned),
            (whole_tensor_layout(run), whole_tensor_shares(run), lambda share: (share.owned, share.largest)),
        ):
            assert [layout.share(rank) for rank in ranks] == every
            lowest: dict = {}
            for share in every:
                lowest.setdefault(key(share), share)
            assert list(layout.shares) == sorted(lowest.values(), key=lambda share: share.rank)
        layout = sharder_layout(run)
        zero1, zero2, largest_bucket = our_buffers(run)
        assert zero1_comm_buffers(run, layout) == zero1
        assert zero2_buffers(run, layout) == (zero2, largest_bucket)


CONFIGS = {
    "defaults": None,
    "small buckets, overlap": {"zero_optimization": {"reduce_bucket_size": 1000, "overlap_comm": True}},
    "torch_adam, ZeRO-3 limits": {"optimizer": {"params": {"torch_adam": True}},
                                  "zero_optimization": {"reduce_bucket_size": 50_000,
                                                        "stage3_param_persistence_threshold": 5000,
                                                        "stage3_max_live_parameters": 10_000}},
    "optimizer offload": {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
    "both offloaded": {"zero_optimization": {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}},
    "nvme": {"zero_optimization": {"offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "nvme"},
                                   "sub_group_size": 1000}},
}  # fmt: skip


def _cases(engine: str):
    """Shapes x world sizes x configs x backends x (precision, accumulation, checkpointing), trimmed to seconds."""
    names = list(CONFIGS) if engine.startswith("ds") else ["defaults", "small buckets, overlap"]
    for shape, world_size, name, backend in itertools.product(SHAPES, WORLD_SIZES, names, ("gloo", "nccl")):
        yield shape, world_size, name, backend, ("bf16", 1, False)
        if name in ("defaults", "optimizer offload"):
            yield shape, world_size, name, backend, ("fp32", 4, True)


@pytest.mark.parametrize("engine", list(ENGINE_STAGES))
def test_engine_peak_equals_every_ranks_model_to_the_byte(engine):
    for shape, world_size, name, backend, (precision, accum, checkpointing) in _cases(engine):
        settings = dict(precision=precision, micro_batch_size=1, block_size=8, backend=backend, grad_accum=accum,
                        gradient_checkpointing=checkpointing)  # fmt: skip
        ranks = (None, world_size - 1) if backend == "gloo" else (None, 0, world_size + 3)
        oracles = every_rank_peak(engine, shape, world_size, ds_config=CONFIGS[name], ranks=ranks, **settings)
        for rank, oracle in zip(ranks, oracles, strict=True):
            ours = engine_peak(engine, shape, world_size, ds_config=CONFIGS[name], rank=rank, **settings)
            assert ours.as_dict() == oracle.as_dict(), (name, world_size, backend, precision, rank, shape)


def _python_calls(answer, sizes: tuple[int, ...]) -> dict[int, int]:
    """The Python function calls answer(size) makes, per size: the work done, counted the same on every
    machine whatever its load (a timed ratio of two millisecond-long answers failed in CI at load)."""
    answer(sizes[0])  # activations are counted once per process (count_activations caches them)
    calls = dict.fromkeys(sizes, 0)
    for size in sizes:

        def count(frame, event, arg, size=size):
            if event == "call":
                calls[size] += 1

        sys.setprofile(count)
        try:
            answer(size)
        finally:
            sys.setprofile(None)
    return calls


def test_estimate_at_a_million_ranks_does_the_work_of_a_thousand():
    """The estimate evaluates a bounded set of distinct ranks, never every rank: its work stops growing
    once the partitions' shapes are all seen (about 1,000 ranks for Llama-2-70B)."""
    from zero_train.hf.models import model_config
    from zero_train.memory.model.estimate import estimate_setup

    config, answers = model_config("llama-2-70b"), {}

    def answer(world_size: int) -> None:
        answers[world_size] = estimate_setup(config, world_size=world_size, block_size=512, gpu_memory_bytes=80e9,
                                             gradient_checkpointing=True, host_memory_bytes=2000e9)  # fmt: skip

    calls = _python_calls(answer, (8, 1024, 10**6))
    assert calls[10**6] <= 1.5 * calls[1024] and calls[10**6] <= 8 * calls[8], calls
    zero3 = answers[10**6].stages[3]
    assert zero3.fits and zero3.paper_bytes == 16 * answers[10**6].num_params / 10**6


def test_plan_for_llama_2_70b_on_2048_gpus_does_the_work_of_512():
    from zero_train.hf.models import model_config
    from zero_train.memory.model.plan import PlanRequest, make_plan
    from zero_train.memory.model.theory import model_shape

    config = model_config("llama-2-70b")
    shape, plans = model_shape(config), {}

    def answer(nodes: int) -> None:
        request = PlanRequest(shape=shape, config=config, nodes=nodes, gpus_per_node=8, gpu_memory_gb=80,
                              host_memory_gb=2000, global_batch_size=8 * nodes, block_size=512)  # fmt: skip
        plans[nodes] = make_plan(request)

    calls = _python_calls(answer, (1, 64, 256))
    assert calls[256] <= 1.1 * calls[64] and calls[256] <= 2 * calls[1], calls
    for plan in plans.values():
        assert all(c.device_bytes <= plan.request.usable_bytes for c in plan.fitting)
    assert plans[256].chosen.setup.engine == "ds3" and not plans[256].chosen.setup.offload_optimizer

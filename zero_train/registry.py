"""The engines, each defined once: name, label, ZeRO stage, and what the rest of the code derives.

    engine_spec("ds2").label              # "DeepSpeed ZeRO-2"
    resolve_engine("deepspeed", stage=3)  # the ds3 entry: `--engine deepspeed` follows the config's stage
    engine_names()                        # every engine, in the report's order

One naming scheme everywhere a user looks: `--engine ds2` (train.py), `--engines ddp,ds2` (profile, bench), the
run record's "engine", the report's rows and plots, the peak model. `--engine deepspeed` and `--engine fsdp2`
stay accepted as aliases (FAMILIES): that library at the config's ZeRO stage, resolved to the engine's name once,
when the run is planned. Every other list of engines (train.py's choices, profile's and bench's defaults, the
report's order, labels and markers, the memory matrix, the paper's stage of each engine, the peak model's
dispatch, plan's candidates) is derived from ENGINES; tests/package/test_registry.py fails on a hand-written one.

Adding an engine is one EngineSpec here, its class in zero_train.engines (named in engines/build.py's BUILDERS) (and, for the memory report, the per-phase model
its `peak_model` names in zero_train.memory.model). Pure data that imports nothing heavy: memory, engines,
train, report, bench and cli all read it (the bottom of the import layers, above runtime's errors only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zero_train.runtime.errors import UsageError

SHARDINGS = ("replicated", "whole-tensor", "flat", "per-tensor")
"""How an engine splits the optimizer states over ranks: not at all; whole tensors to owners (sorted greedy:
torch's ZeroRedundancyOptimizer); one flat buffer cut into equal slices (DeepSpeed, and our ZeRO-1/2:
zero_train.sharding.partition); every tensor cut evenly on dim 0 (FSDP2)."""


COMM_PHASES = ("backward", "backward_blocking", "after_step", "forward", "backward_gather")
"""When a collective of an engine's step runs, which says what can hide it (zero_train.timing):
backward: launched per bucket or unit as backward produces gradients, waited at its end (all but the last
bucket can hide behind backward); backward_blocking: launched and waited in backward (nothing hides);
after_step: after the optimizer step (nothing hides); forward / backward_gather: a unit's parameters gathered
before its forward / backward with the next unit's prefetched (all but the first can hide)."""


REFERENCE = "ddp"
"""The engine every other is compared with: the report's reference row, the ZeRO stage 0 of `zero-train
estimate`."""
DEEPSPEED, FSDP2 = "deepspeed", "fsdp2"
"""The two library families (`--engine deepspeed`, `--engine fsdp2`; EngineSpec.family)."""


@dataclass(frozen=True, slots=True)
class BenchTarget:
    """One of `zero-train bench`'s targets: this engine's figure over another cell's (zero_train.bench.targets)."""

    than: str
    """The engine it is compared with; with `peer`, the engine whose config the Hugging Face Trainer runs."""
    what: str
    """"step" (median step times), "tokens" (tokens/s, the inverse) or "wire" (bytes sent per step)."""
    comparison: str
    """The ratio it must meet, e.g. "<= 1"; "-": no target, shown."""
    peer: bool = False
    """Compared with the Hugging Face Trainer on `than`'s config (the bench's hf-NAME cell)."""


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective of an engine's training step, as the CommLedger records it (docs/bench.md)."""

    op: str
    """"all_reduce", "reduce_scatter", "all_gather" or "broadcast"."""
    of: str
    """What it moves: "grads" (model dtype), "grads_fp32" (fp32 whatever the precision), "params" (model dtype)
    or "masters" (the fp32 master weights)."""
    phase: str
    """When it runs (one of COMM_PHASES)."""
    per: str
    """How many calls: "ddp_bucket" (DDP's 25 MB buckets), "bucket" (the config's reduce_bucket_size), "unit"
    (one per wrapped block), "tensor" (one per parameter tensor) or "step" (one call)."""
    every_micro_step: bool = False
    """Runs for every micro-batch of an accumulation (not only at the optimizer step's boundary)."""


_DDP_REDUCE = Collective("all_reduce", "grads", "backward", "ddp_bucket")
_STEP_GATHER = Collective("all_gather", "params", "after_step", "step")
_UNIT_REDUCE = Collective("reduce_scatter", "grads", "backward", "unit", every_micro_step=True)
_FSDP2_REDUCE = Collective(
    "reduce_scatter", "grads_fp32", "backward", "unit", every_micro_step=True
)  # docs/fsdp2.md
_DS_REDUCE = Collective("all_reduce", "grads", "backward_blocking", "bucket")
"""DeepSpeed ZeRO-1/2's gradient reduction: stage_1_and_2.py average_tensor hands each bucket to
allreduce_and_scatter (an all-reduce of the bucket, each rank keeping its partition) under the defaults
reduce_scatter=True and use_multi_rank_bucket_allreduce=True (zero/config.py), on every accelerator; with
reduce_scatter=False, gradient_reduction_w_predivide all-reduces too. The CommLedger measures it so (all_reduce,
one Psi a step, docs/bench.md)."""
_UNIT_GATHERS = (
    Collective("all_gather", "params", "forward", "unit", every_micro_step=True),
    Collective("all_gather", "params", "backward_gather", "unit", every_micro_step=True),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineSpec:
    """One engine: what a user calls it and everything the code derives from it."""

    name: str
    """The one name users see: `--engine NAME`, profile's and bench's `--engines`, run records, the report."""
    label: str
    """Words for tables and plots, e.g. "DeepSpeed ZeRO-2"."""
    stage: int
    """ZeRO stage: the paper's row it is compared with and the stage of the DeepSpeed config generated for it
    (FSDP2's two modes are named by the config stage that picks them, though both shard parameters at rest)."""
    family: str | None = None
    """`--engine FAMILY` (an alias) picks this engine when the config's ZeRO stage is `stage`; None: no alias."""
    family_default: bool = False
    """The engine `--engine FAMILY` runs without a --deepspeed_config (the generated config's stage is `stage`)."""
    ours: bool = False
    """Our hand-written sharder (zero_train.sharding), not a library's."""
    sharding: str
    """How it splits the optimizer states over ranks (one of SHARDINGS)."""
    peak_model: str | None
    """The function of zero_train.memory.model that gives its per-phase peak (e.g. "zero1_phases"); None: none
    (the report then compares it with the paper only)."""
    marker: str
    """Its matplotlib marker in the report's plots."""
    default: bool = True
    """In the default `--engines` of `zero-train profile` and `zero-train bench`."""
    matrix: bool = False
    """In the out-of-sample memory matrix (zero_train.report.matrix): its design fixes six engines."""
    matrix_added: bool = False
    """In the memory matrix as an engine added after its design was fixed: its own 8 cells are appended, the
    design's stay as they were (so measured cells are reused)."""
    planned: bool = False
    """A set-up `zero-train plan` may choose (it writes a DeepSpeed JSON for DDP, DeepSpeed or FSDP2)."""
    hf_peer: bool = False
    """`zero-train bench` also runs the Hugging Face Trainer on its config (cell `hf-NAME`)."""
    collectives: tuple[Collective, ...] = ()
    """The collectives of its training step, for the step-time model (zero_train.timing); () on one rank."""
    bench_targets: tuple[BenchTarget, ...] = ()
    """`zero-train bench`'s targets with this engine as the numerator, in the bench's order."""
    bench_compute: bool = False
    """In the --engines of bench's compute scenario (forward and backward most of a step)."""
    accelerate: str | None = None
    """accelerate's distributed_type for `--engine NAME` (or its family) in `zero-train config --format
    accelerate`; None: accelerate has no launch for it."""
    stage_model: bool = False
    """The engine `zero-train estimate` models its ZeRO stage by (DDP, then DeepSpeed ZeRO-1/2/3)."""
    matrix_large: bool = False
    """In the wide memory matrix's 0.36B-parameter cells (zero_train.report.matrix)."""
    kept_whole: tuple[str, ...] = ()
    """Memory categories the paper shards at this stage that it keeps whole on every rank (the report says
    why its figure departs from the paper's)."""
    partitioned_early: tuple[str, ...] = ()
    """Memory categories the paper counts whole at this stage that it holds only as a partition at the step
    boundary (the report says why)."""
    grads_at_first_reduction: bool = False
    """Allocates its gradient partition at its first reduction, where our peak model puts it at the start of
    backward: a forward-phase gap on every rank but the last (the report says so)."""

    def __post_init__(self) -> None:
        if self.sharding not in SHARDINGS:
            raise ValueError(f"{self.name}: sharding {self.sharding!r} is not one of {', '.join(SHARDINGS)}")
        for collective in self.collectives:
            if collective.phase not in COMM_PHASES:
                raise ValueError(
                    f"{self.name}: phase {collective.phase!r} is not one of {', '.join(COMM_PHASES)}"
                )


ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec(name="ddp", label="torch DDP", stage=0,
               sharding="replicated", peak_model="ddp_phases", marker="o", matrix=True, planned=True,
               hf_peer=True, accelerate="MULTI_GPU", stage_model=True, bench_compute=True,
               collectives=(_DDP_REDUCE,)),
    EngineSpec(name="zero1", label="our ZeRO-1", stage=1, ours=True,
               sharding="flat", peak_model="zero1_phases", marker="s", matrix=True,
               matrix_large=True, bench_compute=True,
               bench_targets=(BenchTarget("ddp", "step", "<= 1"), BenchTarget("ds1", "step", "<= 1"),
                              BenchTarget("torch-zero", "step", "<= 1"), BenchTarget("ddp", "wire", "<= 1"),
                              BenchTarget("ds1", "tokens", ">= 1", peer=True)),
               collectives=(Collective("reduce_scatter", "grads", "backward", "bucket"), _STEP_GATHER)),
    EngineSpec(name="zero2", label="our ZeRO-2", stage=2, ours=True,
               sharding="flat", peak_model="zero2_phases", marker="X",
               matrix_large=True,
               bench_targets=(BenchTarget("ds2", "step", "<= 0.8"),
                              BenchTarget("zero1", "step", "-"),  # measured: the price of sharding gradients
                              BenchTarget("ddp", "wire", "<= 1")),
               collectives=(Collective("reduce_scatter", "grads", "backward", "bucket", every_micro_step=True),
                            _STEP_GATHER)),
    EngineSpec(name="torch-zero", label="torch ZeroRedundancyOptimizer", stage=1,
               sharding="whole-tensor",
               peak_model="ddp_phases", marker="D", matrix=True,
               kept_whole=("master_params",),
               collectives=(_DDP_REDUCE, Collective("broadcast", "masters", "after_step", "tensor"))),
    EngineSpec(name="ds0", label="DeepSpeed ZeRO-0, nothing sharded", stage=0, family=DEEPSPEED,
               sharding="replicated", peak_model=None, marker="h", default=False,
               accelerate="DEEPSPEED",
               collectives=(Collective("all_reduce", "grads", "backward_blocking", "bucket"),)),
    EngineSpec(name="ds1", label="DeepSpeed ZeRO-1", stage=1, family=DEEPSPEED,
               sharding="flat", peak_model="deepspeed_phases", marker="^", matrix=True, planned=True, hf_peer=True,
               accelerate="DEEPSPEED", stage_model=True, bench_compute=True, partitioned_early=("grads",),
               bench_targets=(BenchTarget("ds1", "tokens", ">= 1", peer=True),),
               collectives=(_DS_REDUCE, _STEP_GATHER)),
    EngineSpec(name="ds2", label="DeepSpeed ZeRO-2", stage=2, family=DEEPSPEED,
               family_default=True, sharding="flat", peak_model="deepspeed_phases", marker="v", matrix=True,
               planned=True, hf_peer=True,
               accelerate="DEEPSPEED", stage_model=True, matrix_large=True, grads_at_first_reduction=True,
               collectives=(replace(_DS_REDUCE, every_micro_step=True), _STEP_GATHER)),
    EngineSpec(name="fsdp2-z2", label="torch FSDP2, parameters kept gathered", stage=2,
               family=FSDP2, sharding="per-tensor", peak_model="fsdp2_phases", marker="p",
               planned=True, accelerate="FSDP",
               collectives=(_FSDP2_REDUCE, _UNIT_GATHERS[0])),
    EngineSpec(name="zero3", label="our ZeRO-3", stage=3, ours=True,
               sharding="flat", peak_model="zero3_phases", marker="8", matrix_added=True,
               planned=True, matrix_large=True,
               bench_targets=(BenchTarget("ds3", "step", "<= 0.8"), BenchTarget("fsdp2-z3", "step", "<= 1")),
               collectives=(_UNIT_REDUCE, *_UNIT_GATHERS)),
    EngineSpec(name="ds3", label="DeepSpeed ZeRO-3", stage=3, family=DEEPSPEED,
               sharding="flat", peak_model="deepspeed_phases", marker="P", matrix=True, planned=True, hf_peer=True,
               accelerate="DEEPSPEED", stage_model=True,
               collectives=(Collective("reduce_scatter", "grads", "backward", "bucket", every_micro_step=True),
                            *_UNIT_GATHERS)),
    EngineSpec(name="fsdp2-z3", label="torch FSDP2, resharded after forward", stage=3,
               family=FSDP2, family_default=True, sharding="per-tensor",
               peak_model="fsdp2_phases", marker="*", planned=True, accelerate="FSDP", matrix_large=True,
               collectives=(_FSDP2_REDUCE, *_UNIT_GATHERS)),
)  # fmt: skip
"""Every engine, in the order tables and plots list them (by stage; a library's after ours at a stage)."""

_BY_NAME = {spec.name: spec for spec in ENGINES}
FAMILIES = tuple(dict.fromkeys(spec.family for spec in ENGINES if spec.family))
"""The aliases `--engine` also accepts ("deepspeed", "fsdp2"): that library at the config's ZeRO stage."""


def engine_names(*, default_only: bool = False) -> tuple[str, ...]:
    """Every engine's name in table order (default_only: those in profile's and bench's default --engines)."""
    return tuple(spec.name for spec in ENGINES if spec.default or not default_only)


def find_engine(name: str | None) -> EngineSpec | None:
    """The engine called `name`, None if there is none (an old record, a bench peer)."""
    return _BY_NAME.get(name) if name else None


def engine_spec(name: str) -> EngineSpec:
    """The engine called `name` (UsageError naming the choices if there is none)."""
    spec = find_engine(name)
    if spec is None:
        raise UsageError(f"unknown engine {name!r}; choose one of {', '.join(_BY_NAME)}")
    return spec


def family_engines(family: str) -> tuple[EngineSpec, ...]:
    """The engines `--engine family` can resolve to, by stage."""
    return tuple(spec for spec in ENGINES if spec.family == family)


def resolve_engine(name: str, stage: int | None = None) -> EngineSpec:
    """The engine `--engine name` runs on a config of ZeRO stage `stage`.

    Args:
        name: an engine's name or a family alias (FAMILIES).
        stage: the config's zero_optimization.stage; None: no config given (a family runs its default engine,
            whose stage the generated config then takes).

    Returns:
        The engine; UsageError for an unknown name, a family without an engine at that stage, or an engine of
        a library whose name fixes a stage other than the config's.
    """
    if name in FAMILIES:
        engines = family_engines(name)
        if stage is None:
            return next(spec for spec in engines if spec.family_default)
        chosen = [spec for spec in engines if spec.stage == stage]
        if not chosen:
            stages = " or ".join(str(spec.stage) for spec in engines)
            raise UsageError(f"--engine {name} needs a config of ZeRO stage {stages} (got stage {stage})")
        return chosen[0]
    spec = engine_spec(name)
    if stage is not None and spec.family is not None and stage != spec.stage:
        same = [other.name for other in family_engines(spec.family) if other.stage == stage]
        fix = f"--engine {same[0]}" if same else f"a stage {spec.stage} config"
        raise UsageError(
            f"--engine {name} runs ZeRO stage {spec.stage} but the config sets stage {stage}; use {fix} "
            f"(or --engine {spec.family}: the config's stage)"
        )
    return spec


def engine_help() -> str:
    """Every engine and alias in words (train.py's --engine help)."""
    engines = "; ".join(f"{spec.name}: {spec.label}" for spec in ENGINES)
    aliases = "; ".join(
        f"{family}: {' / '.join(spec.name for spec in family_engines(family))} by the config's ZeRO stage"
        for family in FAMILIES
    )
    return f"{engines}; or an alias, {aliases}"

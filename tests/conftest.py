"""Shared pytest setup: offline, CPU only, one torch thread, a repo-root fixture, a pool of gloo ranks, tiers.

Rank pool: `rank_pool(world_size)` is a zero_train.testing.RankPool of spawned gloo ranks that lives for
the whole session, so a test that only needs a world pays no spawn, no imports, no group set-up:

    @pytest.fixture(scope="module")
    def runs(rank_pool):
        return rank_pool(2).run(_my_module_level_fn, (arg,))   # fn(rank, world_size, arg) on each rank

Use it for torch.distributed work in the default group (our sharders, DDP, collectives, data). Keep
zero_train.testing.run_ranks (fresh processes, forked in ~0.05 s from a forkserver that imported torch,
transformers, zero_train and DeepSpeed once) for what leaves process-wide state behind: DeepSpeed
(deepspeed.comm, ZeRO-3's hooks), environment changes, a test that kills or times out a rank. A failed
call closes that pool; the next rank_pool(n) starts a fresh one.

Tiers, marked by hand per module (`pytestmark = pytest.mark.tier("quick")`, a test of another tier marks
itself): `quick` single process (bash scripts/test.sh -m quick, the inner loop), `multiproc` spawns gloo ranks,
`slow` launches processes. Collection stops on a test without a tier, or marked quick while its code or
fixtures call run_ranks / rank_pool / RankPool or subprocess.

Layout: tests/PKG/test_MOD.py tests zero_train/PKG/MOD.py; the suites that cover several modules are mapped in
CONTRIBUTING.md#finding-the-tests-of-what-you-change. Helpers that ranks import live in zero_train/testing/.

ZT_DEVICE=cpu (and DeepSpeed's DS_ACCELERATOR=cpu) hold on a GPU machine too: the tests compare against
bit-exact CPU references and run gloo rings; the CUDA branches are exercised by tests that force them
(tests/engines/test_gpu_paths.py), and scripts/gpu_check.sh runs the real thing on GPUs.
"""

import functools
import inspect
import os
import pathlib
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ZT_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["ZT_DEVICE"] = "cpu"
# counts stored by earlier sessions are not read: the session's estimates count (zero_train.memory.model.stored)
os.environ.setdefault("ZT_CACHE_DIR", tempfile.mkdtemp(prefix="zt-counts-"))
os.environ["DS_ACCELERATOR"] = "cpu"

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def repo_root() -> pathlib.Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def rank_pool():
    """rank_pool(world_size) -> the session's RankPool of that many gloo ranks (see the module docstring)."""
    from zero_train.testing import RankPool

    pools: dict[int, RankPool] = {}

    def get(world_size: int) -> RankPool:
        if world_size not in pools or pools[world_size].broken is not None:
            pools[world_size] = RankPool(world_size)
        return pools[world_size]

    yield get
    for pool in pools.values():
        pool.close()


@pytest.fixture
def cli_main():
    """cli_main(*argv) -> CompletedProcess: `zero-train ARGV` in this process, the console script's main with its
    exit code and output (what a launched process shows) without a fresh interpreter's imports."""
    import contextlib
    import io
    from subprocess import CompletedProcess

    from zero_train.cli.main import main

    def run(*argv: str) -> CompletedProcess:
        stdout, stderr = io.StringIO(), io.StringIO()
        with (
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
            pytest.raises(SystemExit) as end,
        ):
            main(list(argv))
        return CompletedProcess(argv, end.value.code, stdout.getvalue(), stderr.getvalue())

    return run


@pytest.fixture(autouse=True)
def no_zero3_left_on():
    """Fail the test that leaves transformers' process-wide ZeRO-3 switch on (a live HfDeepSpeedConfig of
    stage 3), rather than the later test of the same worker whose from_config then runs deepspeed.zero.Init
    (seen in CI: tests/hf/test_models.py failing on mpi4py after tests/ds_config/test_generate.py's --hf-auto test)."""
    yield
    import sys

    integration = sys.modules.get("transformers.integrations.deepspeed")
    if integration is not None and integration.is_deepspeed_zero3_enabled():
        integration.unset_hf_deepspeed_config()
        pytest.fail(
            "this test left a ZeRO-3 HfDeepSpeedConfig alive: unset_hf_deepspeed_config() before it ends"
        )


@pytest.fixture(autouse=True)
def no_memory_sampler_left_on():
    """Stop the CPU memory sampler (zero_train.memory.measure) a test started in this worker: idle, it would
    read the allocator every millisecond for the rest of the session. The rank pool does the same per task."""
    yield
    import sys

    measure = sys.modules.get("zero_train.memory.measure")
    if measure is not None:
        measure.stop_cpu_tracker()


TIERS = ("quick", "multiproc", "slow")
SPAWNS = ("run_ranks(", "rank_pool(", "RankPool(")
LAUNCHES = ("subprocess.", "Popen(")


def _sources(item) -> str:
    """The test function's source and that of every fixture it uses (what it runs, directly or not)."""
    functions = [getattr(item, "function", None)]
    for defs in (
        getattr(item, "_fixtureinfo", None).name2fixturedefs.values() if hasattr(item, "_fixtureinfo") else ()
    ):
        functions += [definition.func for definition in defs]
    return "\n".join(_source(function) for function in functions)


@functools.cache
def _source(function) -> str:
    """A function's source, once per function (parametrized tests and shared fixtures ask again)."""
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _tier(item) -> str | None:
    """The closest `tier(...)` mark: the test's own, else its module's `pytestmark`."""
    marker = item.get_closest_marker("tier")
    return marker.args[0] if marker is not None and marker.args and marker.args[0] in TIERS else None


def pytest_collection_modifyitems(config, items) -> None:
    """Give every test the marker of its tier (`-m quick|multiproc|slow`), marked by hand: a module declares
    `pytestmark = pytest.mark.tier("quick")` (single process), "multiproc" (spawns gloo ranks) or "slow"
    (launches processes), and a test of another tier carries its own `@pytest.mark.tier(...)`. A test without
    one, or marked quick while it (or a fixture it uses) spawns ranks or launches processes, stops collection."""
    problems = []
    for item in items:
        tier = _tier(item)
        if tier is None:
            problems.append(
                f'{item.nodeid}: no tier: add pytestmark = pytest.mark.tier("quick"|"multiproc"|"slow")'
            )
            continue
        if tier == "quick":
            source = _sources(item)
            if any(word in source for word in SPAWNS):
                problems.append(f'{item.nodeid} spawns gloo ranks: mark it tier("multiproc")')
            elif any(word in source for word in LAUNCHES):
                problems.append(f'{item.nodeid} launches processes: mark it tier("slow")')
        item.add_marker(getattr(pytest.mark, tier))
    if problems:
        raise pytest.UsageError("\n".join(problems))
    _heaviest_files_first(items)


def _heaviest_files_first(items) -> None:
    """Order files: those that launch processes, then those that spawn ranks, then single-process ones.

    scripts/test.sh runs two pytest-xdist workers, each taking whole files in this order (--dist loadfile):
    started first, the long launcher files overlap each other and the short single-process files fill the
    gaps at the end, instead of one long file running alone at the tail. Tests keep their order inside a file.
    """
    weight: dict[str, int] = {}
    for item in items:
        tier = 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("multiproc") else 2
        weight[item.fspath.strpath] = min(weight.get(item.fspath.strpath, 2), tier)
    items.sort(key=lambda item: weight[item.fspath.strpath])  # stable: file and test order kept within a tier

"""The engine registry: every engine defined once (zero_train.registry), every other list derived from it."""

from __future__ import annotations

import ast
import pathlib

import pytest

from zero_train.registry import DEEPSPEED, ENGINES, FAMILIES, engine_names, engine_spec, resolve_engine
from zero_train.runtime.errors import UsageError

pytestmark = pytest.mark.tier("quick")

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMES = set(engine_names())
DELIBERATE_SUBSETS = {
    ("scripts/sharding_reading_budget.py", ("zero1", "zero2", "zero3")): "issue 38's three reading budgets",
}
"""Lists of engine names that are a choice, not a list to grow with the registry, and why."""
BUILDER_MAP = "zero_train/engines/build.py"
"""The name -> class map, keyed by the registry's names (test_every_engine_has_one_builder holds it)."""


def _literal_name_lists(path: pathlib.Path) -> list[tuple[int, tuple[str, ...]]]:
    """(line, names) of every tuple, list, set or dict-keys literal made only of engine names or family aliases,
    two engines or more."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elements = node.elts
        elif isinstance(node, ast.Dict):
            elements = [key for key in node.keys if key is not None]
        else:
            continue
        values = [
            e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None for e in elements
        ]
        engines = [value for value in values if value in NAMES]
        if len(engines) >= 2 and all(value in NAMES or value in FAMILIES for value in values):
            found.append((node.lineno, tuple(values)))
    return found


def test_no_engine_list_is_written_by_hand_outside_the_registry():
    """A second hand-written list of engines is the bug the registry removes: the next engine would miss it."""
    sources = [*(ROOT / "zero_train").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    assert len(sources) > 100
    found = []
    for path in sources:
        relative = path.relative_to(ROOT).as_posix()
        if relative in ("zero_train/registry.py", BUILDER_MAP):
            continue
        found += [
            f"{relative}:{line} {names}"
            for line, names in _literal_name_lists(path)
            if (relative, names) not in DELIBERATE_SUBSETS
        ]
    assert found == []


def test_the_scan_finds_a_hand_written_list(tmp_path):
    """The scan above would see the tables the registry replaced (a check that cannot fail proves nothing)."""
    source = tmp_path / "old.py"
    source.write_text(
        'ENGINE_STAGES = {"ddp": 0, "ds1": 1}\nMATRIX = ("ddp", "zero1")\nCHOICES = ["deepspeed", "zero1", "ddp"]\n'
        'TARGET = ("zero1 / ddp", "zero1", "ddp")\nONE = ("ds3",)\n'
    )
    assert [line for line, _ in _literal_name_lists(source)] == [1, 2, 3]


def test_every_engine_has_one_builder_and_it_builds_an_engine():
    """engines/build.py's map has the registry's names, no other; each gives a class of zero_train.engines
    that follows the Engine protocol (DeepSpeed's is read from the source: importing it imports DeepSpeed)."""
    from zero_train.engines.build import BUILDERS

    assert tuple(BUILDERS) == engine_names()
    source = (ROOT / "zero_train/engines/deepspeed_engine.py").read_text()
    assert "class DeepSpeedEngine:" in source
    for name, builder in BUILDERS.items():
        if engine_spec(name).family == DEEPSPEED:
            assert "DeepSpeedEngine" in builder.__code__.co_names, name
            continue
        engine_class = builder()
        assert engine_class.__module__.startswith("zero_train.engines."), name
        assert callable(engine_class.step) and callable(engine_class.forward_backward), name


def test_names_markers_and_family_defaults_are_one_each():
    assert len(NAMES) == len(ENGINES) and not NAMES & set(FAMILIES)
    assert len({spec.marker for spec in ENGINES}) == len(ENGINES)  # plots tell every engine apart
    for family in FAMILIES:
        assert sum(spec.family_default for spec in ENGINES if spec.family == family) == 1


def test_every_peak_model_is_a_function_of_the_peak_model():
    from zero_train.memory.model.peak import PHASE_MODELS

    assert {spec.peak_model for spec in ENGINES if spec.peak_model} == set(PHASE_MODELS)


@pytest.mark.parametrize(
    ("name", "stage", "expected"),
    [
        ("deepspeed", None, "ds2"),  # no config: the generated default's stage, as before the registry
        ("deepspeed", 0, "ds0"),
        ("deepspeed", 3, "ds3"),
        ("fsdp2", None, "fsdp2-z3"),
        ("fsdp2", 2, "fsdp2-z2"),
        ("ds1", 1, "ds1"),
        ("zero1", 0, "zero1"),  # our engines read any config of their stage or below (a warning above it)
        ("ddp", None, "ddp"),
    ],
)
def test_an_alias_resolves_to_its_library_at_the_configs_stage(name, stage, expected):
    assert resolve_engine(name, stage).name == expected


@pytest.mark.parametrize(
    ("name", "stage", "message"),
    [
        ("fsdp2", 1, "--engine fsdp2 needs a config of ZeRO stage 2 or 3 (got stage 1)"),
        ("ds2", 3, "--engine ds2 runs ZeRO stage 2 but the config sets stage 3; use --engine ds3"),
        ("fsdp2-z3", 1, "use a stage 3 config (or --engine fsdp2"),
        ("fsdp", None, "unknown engine 'fsdp'; choose one of ddp, zero1"),
    ],
)
def test_a_name_that_contradicts_the_config_is_a_usage_error(name, stage, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_engine(name, stage)


def test_derived_tables_keep_their_order():
    """The report's order, the memory matrix's six engines and plan's candidates, as they were hand-written."""
    from zero_train.memory.model.plan import TRAFFIC_ORDER
    from zero_train.report.matrix import MATRIX_ENGINES

    assert engine_names(default_only=True) == (
        "ddp", "zero1", "zero2", "torch-zero", "ds1", "ds2", "fsdp2-z2", "zero3", "ds3", "fsdp2-z3"
    )  # fmt: skip
    assert MATRIX_ENGINES == ("ddp", "zero1", "torch-zero", "ds1", "ds2", "ds3")
    assert TRAFFIC_ORDER == ("ddp", "ds1", "ds2", "fsdp2-z2", "zero3", "ds3", "fsdp2-z3")
    assert engine_spec("ds3").stage == 3 and engine_spec("torch-zero").sharding == "whole-tensor"


def test_train_takes_every_engine_name_and_alias():
    from zero_train.train.args import build_parser

    engine = next(action for action in build_parser()._actions if action.dest == "engine.engine")
    assert tuple(engine.choices) == (*engine_names(), *FAMILIES)


ENGINE_MODULES = ("zero_train/registry.py", "zero_train/engines/")
"""Where an engine's name may be compared with a literal: the registry and the engines' own modules."""
PREFIXES = {name[:cut] for name in NAMES for cut in range(2, len(name) + 1)}


def _literal_comparisons(path: pathlib.Path) -> list[str]:
    """`x == "zero3"`, `x in ("ddp", ...)`, `name.startswith("ds")`, and a family alias compared with whatever
    names an engine or family (`spec.family == "deepspeed"`): the branches on an engine's name that a new
    engine would miss."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            literals = []
            for operand in operands:
                elements = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                literals += [
                    e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)
                ]
            others = " ".join(ast.unparse(operand) for operand in operands)
            about_engines = "engine" in others or "family" in others
            if any(value in NAMES or (value in FAMILIES and about_engines) for value in literals):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith", "removeprefix")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in PREFIXES
            and "engine" in ast.unparse(node.func.value)
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_engine_name_is_compared_with_a_literal_outside_its_modules():
    """The report, bench, accelerate, estimate and the rest branch on what the registry says of an engine
    (its stage, family, sharding, bench targets, the categories it holds), never on its name."""
    found = []
    for path in (ROOT / "zero_train").rglob("*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if not relative.startswith(ENGINE_MODULES):
            found += [f"{relative}:{hit}" for hit in _literal_comparisons(path)]
    assert found == []


def test_the_comparison_scan_finds_each_form(tmp_path):
    source = tmp_path / "old.py"
    source.write_text(
        'a = row["engine"] == "ds2"\nb = engine in ("zero2", "zero3")\nc = row["engine"].startswith("ds")\n'
        'd = spec.family == "deepspeed"\ne = launch.launcher == "deepspeed"\nf = engine == REFERENCE\n'
    )
    assert [hit.split(":")[0] for hit in _literal_comparisons(source)] == ["1", "2", "3", "4"]

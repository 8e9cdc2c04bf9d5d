"""tests/ mirrors zero_train/: a newcomer finds the tests of a module by its name or by CONTRIBUTING's map."""

from __future__ import annotations

import pathlib
import re

import pytest

pytestmark = pytest.mark.tier("quick")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _packages() -> list[str]:
    return sorted(
        path.parent.name
        for path in (ROOT / "zero_train").glob("*/__init__.py")
        if path.parent.name != "assets"
    )


def test_every_package_has_its_tests_folder():
    """zero_train/PKG/ has tests/PKG/ with at least one test file, and every tests/ folder but package/ (what
    spans the package) names a package."""
    packages = _packages()
    assert {"engines", "sharding", "report", "bench", "ds_config"} <= set(packages)  # the walk found them
    missing = [name for name in packages if not list((ROOT / "tests" / name).glob("test_*.py"))]
    assert missing == []
    folders = {
        path.name for path in (ROOT / "tests").iterdir() if path.is_dir() and path.name != "__pycache__"
    }
    assert folders - set(packages) == {"package"}


def _map_rows() -> list[tuple[str, str]]:
    """CONTRIBUTING.md's map, (suite, covers) per table row of "Finding the tests of what you change"."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Finding the tests") :]
    section = section[: section.index("\n## ", 1)]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| ") and "/" in line]
    return [(suite.strip(), covers.strip()) for suite, covers in rows]


def _modules() -> list[str]:
    """Every module of zero_train/ a test can be about, as its path relative to zero_train/."""
    package = ROOT / "zero_train"
    return sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    )


def test_contributing_map_names_suites_that_exist():
    """Every suite CONTRIBUTING.md's map names is a file under tests/ (a renamed suite updates the map)."""
    rows = [suite for suite, _ in _map_rows()]
    assert len(rows) > 15
    missing = []
    for row in rows:
        folder = row.split("/")[0]
        for name in re.findall(r"test_[a-z0-9_*]+\.py", row):
            if not list((ROOT / "tests" / folder).glob(name)):
                missing.append(f"tests/{folder}/{name}")
    assert missing == []


def test_no_test_file_exceeds_400_lines():
    """A suite a reader takes in at one sitting, as the package's modules (tests/package/test_layout.py)."""
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in (ROOT / "tests").rglob("*.py")
    }
    assert len(sizes) > 60  # the walk found the suite
    assert {path: lines for path, lines in sizes.items() if lines > 400} == {}


def test_no_two_test_files_share_a_name():
    """tests/ folders are not packages, so pytest imports every test file by its basename: two of one name fail
    collection ("import file mismatch") on whichever runs second. Name the second after what it tests."""
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert len(names) > 60  # the walk found the suite
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}


def _others(suite: str) -> list[pathlib.Path]:
    """Where a name in the map that is no module may be: a script, a package file, a suite, a helper."""
    return [ROOT, ROOT / "zero_train", ROOT / "tests", ROOT / "tests" / suite.split("/")[0]]


def test_every_module_has_a_test_file_of_its_name_or_a_map_row():
    """A newcomer changing zero_train/PKG/MOD.py (or PKG/SUB/MOD.py) finds its tests without grep:
    tests/PKG/test_MOD.py exists (tests/package/ for a module at the top), or a row of CONTRIBUTING.md's map
    names the module in its second column, by its path under zero_train/ or an unambiguous tail of it
    (`zero12/zero2.py`, `cells.py`). A test file of the name in another folder does not count (tests/report/
    test_build.py is report/build.py's, not engines/build.py's). A name in that column that is no module, or
    fits two, is a stale or ambiguous row: it fails here too."""
    modules = _modules()
    assert len(modules) > 150  # the walk found the package
    mapped, unclear = set(), []
    for suite, covers in _map_rows():
        for name in re.findall(r"[\w/]+\.py", covers):
            name = name.removeprefix("zero_train/")
            fits = [module for module in modules if module == name or module.endswith("/" + name)]
            if len(fits) == 1:
                mapped.add(fits[0])
            elif fits or not any(folder.joinpath(name).is_file() for folder in _others(suite)):
                unclear.append(f"{suite}: {name} fits {fits or 'no module'}")
    assert not unclear, "CONTRIBUTING.md's map, write the module's path under zero_train/: " + "; ".join(
        unclear
    )
    unfound = [module for module in modules if module not in mapped and not _own_test(module).is_file()]
    assert not unfound, (
        f"{len(unfound)} modules of zero_train/ whose tests a newcomer cannot find: {', '.join(unfound)}. Add "
        "tests/PKG/test_MOD.py, or name the module in the row of the suite that exercises it in CONTRIBUTING.md's "
        "map (## Finding the tests of what you change)"
    )


def _own_test(module: str) -> pathlib.Path:
    """tests/PKG/test_MOD.py for PKG/[SUB/]MOD.py; tests/package/ for a module at the package's top."""
    folder = module.split("/")[0] if "/" in module else "package"
    return ROOT / "tests" / folder / ("test_" + module.rsplit("/", 1)[-1])

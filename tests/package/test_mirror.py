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


def test_contributing_map_names_suites_that_exist():
    """Every suite CONTRIBUTING.md's map names is a file under tests/ (a renamed suite updates the map)."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Finding the tests") :]
    section = section[: section.index("\n## ", 1)]
    rows = [
        line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ") and "/" in line
    ]
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
